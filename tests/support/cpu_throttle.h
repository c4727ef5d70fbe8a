// CpuThrottle: a CPU cgroup that caps the processes put in it at a share of one CPU, for
// fail-slow tests and benchmarks (a throttled host). Uses cgroup v2's cpu.max under
// /sys/fs/cgroup when the cpu controller is there, else cgroup v1's cpu.cfs_quota_us under
// /sys/fs/cgroup/cpu (this machine mounts the v1 cpu controller; v2 has no cpu controller here).
//
// A process joins by writing its pid to Procs() (`echo $$ > PROCS && exec trainer`): its children
// inherit the cgroup. The destructor removes the cgroup, polling (bounded) until the processes in
// it are gone; the test ends them first (SimCluster::KillHost).
//
// Needs root. Not thread-safe: one thread makes and destroys it.
#ifndef TRAINGUARD_TESTS_SUPPORT_CPU_THROTTLE_H_
#define TRAINGUARD_TESTS_SUPPORT_CPU_THROTTLE_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainguard::testing {

class CpuThrottle {
 public:
  // A fresh cgroup `name` capped at `cpu_share` (0 < share <= 1) of one CPU. FailedPrecondition
  // naming the path when no CPU controller can be used here.
  static absl::StatusOr<std::unique_ptr<CpuThrottle>> Create(const std::string& name,
                                                             double cpu_share) {
    constexpr int64_t kPeriodUs = 100'000;
    const int64_t quota = static_cast<int64_t>(cpu_share * kPeriodUs);
    std::string controllers;
    std::getline(std::ifstream("/sys/fs/cgroup/cgroup.controllers"), controllers);
    const bool v2 = controllers.find("cpu") != std::string::npos;
    const std::string dir = v2 ? "/sys/fs/cgroup/" + name : "/sys/fs/cgroup/cpu/" + name;
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("mkdir ", dir, ": ", std::strerror(errno),
                       " (no usable CPU cgroup controller: neither cgroup v2's cpu nor v1's)"));
    }
    std::unique_ptr<CpuThrottle> throttle(new CpuThrottle(dir));
    const std::string file = v2 ? dir + "/cpu.max" : dir + "/cpu.cfs_quota_us";
    const std::string value = v2 ? absl::StrCat(quota, " ", kPeriodUs) : absl::StrCat(quota);
    if (!v2) {
      if (absl::Status s = Write(dir + "/cpu.cfs_period_us", absl::StrCat(kPeriodUs)); !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = Write(file, value); !s.ok()) return s;
    return throttle;
  }

  ~CpuThrottle() {
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (rmdir(dir_.c_str()) == 0 || errno == ENOENT) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // The file a process writes its pid to, to join.
  std::string Procs() const { return dir_ + "/cgroup.procs"; }

 private:
  explicit CpuThrottle(std::string dir) : dir_(std::move(dir)) {}

  static absl::Status Write(const std::string& path, const std::string& value) {
    std::ofstream out(path);
    out << value << "\n";
    out.close();
    if (!out) {
      return absl::FailedPreconditionError(absl::StrCat("writing '", value, "' to ", path));
    }
    return absl::OkStatus();
  }

  std::string dir_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_CPU_THROTTLE_H_
