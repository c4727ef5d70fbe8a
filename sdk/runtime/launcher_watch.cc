#include "sdk/runtime/launcher_watch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sdk/core/proc_stat.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

// Fields 3 (state) and 22 (start time) of /proc/<pid>/stat; false when the process is gone.
bool ReadProcessStat(pid_t pid, char* state, std::string* start_time) {
  absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
  if (!stat.ok()) return false;
  *state = stat->state;
  *start_time = absl::StrCat(stat->start_time_ticks);
  return true;
}

const char* Variable(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): nobody sets it
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LauncherWatch>> LauncherWatch::FromEnvironment(Clock* clock) {
  const char* pid_text = Variable("TRAINGUARD_LAUNCHER_PID");
  if (pid_text == nullptr) return nullptr;
  LauncherWatchOptions options;
  options.clock = clock;
  int pid = 0;
  if (!absl::SimpleAtoi(pid_text, &pid) || pid <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TRAINGUARD_LAUNCHER_PID '", pid_text, "' is not a process id above 1"));
  }
  options.launcher_pid = pid;
  if (const char* start = Variable("TRAINGUARD_LAUNCHER_START_TIME"); start != nullptr) {
    options.launcher_start_time = start;
  }
  if (const char* ms_text = Variable("TRAINGUARD_LAUNCHER_TIMEOUT_MS"); ms_text != nullptr) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(ms_text, &ms) || ms < 1) {
      return absl::InvalidArgumentError(absl::StrCat("TRAINGUARD_LAUNCHER_TIMEOUT_MS '", ms_text,
                                                     "' is not a positive number of ms"));
    }
    options.stopped_timeout = absl::Milliseconds(ms);
  }
  return Start(options);
}

absl::StatusOr<std::unique_ptr<LauncherWatch>> LauncherWatch::Start(
    const LauncherWatchOptions& options) {
  if (options.launcher_pid <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher watch: pid ", options.launcher_pid, " is not a process id above 1"));
  }
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    return absl::InternalError(absl::StrCat("launcher watch: eventfd: ", strerror(errno)));
  }
  // A pidfd refers to this very process for good; the start time then tells whether the pid
  // still names the launcher rather than a process that reused it (ESRCH: gone already, and
  // -1 makes the first check say so).
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, options.launcher_pid, 0));
  if (pidfd >= 0 && !options.launcher_start_time.empty()) {
    char state = 0;
    std::string start;
    if (!ReadProcessStat(options.launcher_pid, &state, &start) ||
        start != options.launcher_start_time) {
      close(pidfd);
      pidfd = -1;
    }
  } else if (pidfd < 0 && errno != ESRCH) {
    const int err = errno;
    close(stop_fd);
    return absl::InternalError(
        absl::StrCat("launcher watch: pidfd_open(", options.launcher_pid, "): ", strerror(err)));
  }
  return std::unique_ptr<LauncherWatch>(new LauncherWatch(options, pidfd, stop_fd));
}

LauncherWatch::LauncherWatch(LauncherWatchOptions options, int pidfd, int stop_fd)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      pidfd_(pidfd),
      stop_fd_(stop_fd) {
  thread_ = std::thread([this] { Run(); });
}

LauncherWatch::~LauncherWatch() {
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  thread_.join();
  if (pidfd_ >= 0) close(pidfd_);
  close(stop_fd_);
}

void LauncherWatch::SetObserver(Observer observer) {
  MutexLock lock(&mu_);
  observer_ = std::move(observer);
}

std::string LauncherWatch::Check(int64_t* stopped_since_ns) {
  const pid_t pid = options_.launcher_pid;
  if (pidfd_ < 0) return absl::StrCat("the launcher (pid ", pid, ") was gone at start-up");
  pollfd exited = {pidfd_, POLLIN, 0};
  char state = 0;
  std::string start;
  // A zombie (Z, X) has exited too: its parent just has not reaped it yet.
  if (poll(&exited, 1, 0) == 1 || !ReadProcessStat(pid, &state, &start) || state == 'Z' ||
      state == 'X') {
    return absl::StrCat("the launcher (pid ", pid, ") exited");
  }
  if (state != 'T' && state != 't') {
    *stopped_since_ns = -1;
    return "";
  }
  const int64_t now = clock_->MonotonicNanos();
  if (*stopped_since_ns < 0) *stopped_since_ns = now;
  if (now - *stopped_since_ns < absl::ToInt64Nanoseconds(options_.stopped_timeout)) return "";
  return absl::StrCat("the launcher (pid ", pid, ") has been stopped for ",
                      absl::FormatDuration(options_.stopped_timeout));
}

void LauncherWatch::Run() {
  int64_t stopped_since_ns = -1;
  while (true) {
    std::string why = Check(&stopped_since_ns);
    if (!why.empty()) return Leave(why);
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    // Woken at once by the launcher's exit or by the destructor; the stop state is polled.
    const int n = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(options_.poll_interval)));
    if (n > 0 && (fds[0].revents & POLLIN) != 0) return;
  }
}

void LauncherWatch::Leave(const std::string& why) {
  Observer observer;
  {
    MutexLock lock(&mu_);
    observer = observer_;
  }
  if (observer) observer(why);
  const std::string line =
      absl::StrCat("trainguard: ", why, ": this process leaves the job (SIGTERM, then SIGKILL in ",
                   absl::FormatDuration(options_.term_grace), ")\n");
  // Its stderr may be a pipe to the dead launcher: SIGPIPE then ends this process at once, which is
  // what the rest of this function does more slowly.
  (void)!write(STDERR_FILENO, line.data(), line.size());
  kill(getpid(), SIGTERM);
  // The grace is not cut short by the destructor: a trainer that handles SIGTERM by shutting down
  // may still block in store calls against the dead launcher, and nothing else would end it.
  clock_->SleepFor(options_.term_grace);
  kill(getpid(), SIGKILL);
}

}  // namespace trainguard
