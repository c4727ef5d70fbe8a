// LauncherWatch: ends this process when the `trainguard run` that started it is gone.
//
// A rank whose launcher died (SIGKILL, a crash) or stays stopped (SIGSTOP) has nobody to replace
// its peers, and its store (hosted by the launcher) no longer answers: it would sit in store calls
// until their timeouts (minutes) ran out, holding its GPU. The launcher's own safeguards do not
// reach every such process: PR_SET_PDEATHSIG covers only its direct child, and it cannot signal the
// ranks' process groups once it is killed. So every process that runs a Runtime under `trainguard
// run`, however deep below a wrapper script, watches the launcher itself: through a pidfd (its exit
// is seen at once, and the pid cannot be confused with a later process) and its /proc state (a
// stop). When the launcher has exited, or has been stopped for `stopped_timeout`, the watch tells
// its observer, writes one line to stderr, sends this process SIGTERM (a trainer may handle it)
// and, `term_grace` later, SIGKILL.
//
// The launcher names itself in the environment: TRAINGUARD_LAUNCHER_PID,
// TRAINGUARD_LAUNCHER_START_TIME (field 22 of /proc/<pid>/stat) and TRAINGUARD_LAUNCHER_TIMEOUT_MS
// (its --heartbeat-timeout: the launcher replaces a rank silent that long, and a rank leaves a
// launcher stopped that long).
//
// Thread safety: one thread of its own, started by Start() and joined by the destructor;
// SetObserver may be called from any thread.
#ifndef TRAINGUARD_SDK_RUNTIME_LAUNCHER_WATCH_H_
#define TRAINGUARD_SDK_RUNTIME_LAUNCHER_WATCH_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"

namespace trainguard {

class Clock;

struct LauncherWatchOptions {
  pid_t launcher_pid = -1;
  // The launcher's start time as /proc/<pid>/stat field 22; empty: not checked.
  std::string launcher_start_time;
  absl::Duration stopped_timeout = absl::Seconds(30);
  absl::Duration term_grace = absl::Seconds(10);
  absl::Duration poll_interval = absl::Milliseconds(200);
  Clock* clock = nullptr;  // nullptr: Clock::Real()
};

class LauncherWatch {
 public:
  // Called once, on the watch's thread, with why the launcher is considered gone.
  using Observer = std::function<void(absl::string_view why)>;

  // nullptr when this process was not started by `trainguard run` (no TRAINGUARD_LAUNCHER_PID).
  // InvalidArgument names a malformed variable.
  static absl::StatusOr<std::unique_ptr<LauncherWatch>> FromEnvironment(Clock* clock);
  static absl::StatusOr<std::unique_ptr<LauncherWatch>> Start(const LauncherWatchOptions& options);

  ~LauncherWatch();
  LauncherWatch(const LauncherWatch&) = delete;
  LauncherWatch& operator=(const LauncherWatch&) = delete;

  void SetObserver(Observer observer);

 private:
  LauncherWatch(LauncherWatchOptions options, int pidfd, int stop_fd);
  void Run();
  // Empty while the launcher is there; otherwise why it is not.
  std::string Check(int64_t* stopped_since_ns);
  void Leave(const std::string& why);

  const LauncherWatchOptions options_;
  Clock* const clock_;
  const int pidfd_;    // readable once the launcher exits; -1 when it was already gone
  const int stop_fd_;  // an eventfd the destructor writes
  Mutex mu_;
  Observer observer_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_LAUNCHER_WATCH_H_
