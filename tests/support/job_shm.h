// What a test's jobs leave in /dev/shm. Every segment of a job is named
// "trainguard.<job id>.<suffix>" (snapshot arenas, flight-recorder rings, backup arenas), and a
// rank that is killed leaves its own behind on purpose (its replacement restores from it). A test
// removes its jobs' segments when it is done with them: the suite fails on any left behind
// (tests/shm_leak_check.sh). Plain functions; thread-safe.
#ifndef TRAINGUARD_TESTS_SUPPORT_JOB_SHM_H_
#define TRAINGUARD_TESTS_SUPPORT_JOB_SHM_H_

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainguard::testing {

// Removes every /dev/shm segment of job `job_id` (a process that still maps one keeps its mapping).
inline void RemoveJobSharedMemory(const std::string& job_id) {
  const std::string prefix = absl::StrCat("trainguard.", job_id, ".");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (absl::StartsWith(entry.path().filename().string(), prefix)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

// Removes job `job_id`'s segments when it goes out of scope: declared before what runs the job,
// it is destroyed after it.
class JobSharedMemoryCleanup {
 public:
  explicit JobSharedMemoryCleanup(std::string job_id) : job_id_(std::move(job_id)) {}
  ~JobSharedMemoryCleanup() { RemoveJobSharedMemory(job_id_); }
  JobSharedMemoryCleanup(const JobSharedMemoryCleanup&) = delete;
  JobSharedMemoryCleanup& operator=(const JobSharedMemoryCleanup&) = delete;

 private:
  std::string job_id_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_JOB_SHM_H_
