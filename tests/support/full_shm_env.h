// FullShmEnv: an Env whose /dev/shm holds `capacity` bytes, for tests of a full /dev/shm without
// filling the machine's. A segment's reservation past the capacity fails as the POSIX Env reports
// ENOSPC from posix_fallocate; every other call goes to the real Env.
#ifndef TRAINGUARD_TESTS_SUPPORT_FULL_SHM_ENV_H_
#define TRAINGUARD_TESTS_SUPPORT_FULL_SHM_ENV_H_

#include <cerrno>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "trainguard/env.h"

namespace trainguard::testing {

class FullShmEnv : public EnvWrapper {
 public:
  explicit FullShmEnv(uint64_t capacity) : EnvWrapper(Env::Default()), capacity_(capacity) {}

  absl::Status ReserveSharedMemory(int fd, const std::string& name, uint64_t bytes) override {
    if (bytes > capacity_) {
      ++refusals_;
      last_refused_bytes_ = bytes;
      // As the POSIX Env words it (env_posix.cc), with this Env's capacity as the file system's.
      return ErrnoToStatus(
          ENOSPC,
          absl::StrCat("posix_fallocate of ", bytes, " bytes for shared-memory segment ", name,
                       " (/dev/shm", name, "; its file system holds ", capacity_, " bytes)"));
    }
    return target()->ReserveSharedMemory(fd, name, bytes);
  }
  absl::StatusOr<int> CreateSharedMemory(const std::string& name) override {
    absl::StatusOr<int> fd = target()->CreateSharedMemory(name);
    if (fd.ok()) created_.insert(name);
    return fd;
  }
  absl::Status RemoveSharedMemory(const std::string& name) override {
    absl::Status s = target()->RemoveSharedMemory(name);
    if (s.ok()) created_.erase(name);
    return s;
  }

  int refusals() const { return refusals_; }
  // The size of the last reservation refused; 0 before any.
  uint64_t last_refused_bytes() const { return last_refused_bytes_; }
  // Segments created through this Env and not removed through it since.
  const std::set<std::string>& left_behind() const { return created_; }

 private:
  const uint64_t capacity_;
  int refusals_ = 0;
  uint64_t last_refused_bytes_ = 0;
  std::set<std::string> created_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_FULL_SHM_ENV_H_
