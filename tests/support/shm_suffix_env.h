// ShmSuffixEnv: an Env whose named shared-memory segments are the real Env's with a suffix, so
// that two holders of the same job in one test process keep their backup arenas apart, as two
// hosts' /dev/shm would. Every other call goes to the real Env.
#ifndef TRAINGUARD_TESTS_SUPPORT_SHM_SUFFIX_ENV_H_
#define TRAINGUARD_TESTS_SUPPORT_SHM_SUFFIX_ENV_H_

#include <cstdint>
#include <string>
#include <utility>

#include "trainguard/env.h"

namespace trainguard::testing {

class ShmSuffixEnv : public EnvWrapper {
 public:
  explicit ShmSuffixEnv(std::string suffix)
      : EnvWrapper(Env::Default()), suffix_(std::move(suffix)) {}

  // The name a segment called `name` has in the real /dev/shm.
  std::string Real(const std::string& name) const { return name + suffix_; }

  absl::StatusOr<int> OpenSharedMemory(const std::string& name, bool writable) override {
    return target()->OpenSharedMemory(Real(name), writable);
  }
  absl::StatusOr<int> CreateSharedMemory(const std::string& name) override {
    return target()->CreateSharedMemory(Real(name));
  }
  absl::Status ReserveSharedMemory(int fd, const std::string& name, uint64_t bytes) override {
    return target()->ReserveSharedMemory(fd, Real(name), bytes);
  }
  absl::Status RemoveSharedMemory(const std::string& name) override {
    return target()->RemoveSharedMemory(Real(name));
  }

 private:
  const std::string suffix_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_SHM_SUFFIX_ENV_H_
