// SignalOwnProcess: the one way a test sends a signal to a process. kill(2) given 0 or -1 signals
// the caller's process group or every process of the user (a pid read from an empty pid file, or a
// failed fork's -1, did exactly that), and a pid read from a stale file may by now name a stranger.
// So before anything is sent, the pid must be positive and name a process of this test:
//
//   - this process itself, or a descendant of it (its parent chain in /proc reaches getpid()); or
//   - when the caller passes `environment_entry` ("NAME=VALUE", e.g. the launcher's
//     "TRAINGUARD_RUN_DIR=<the test's temporary run dir>"), a process whose /proc/<pid>/environ
//     holds that exact entry: a rank whose launcher died was reparented, and is no longer a
//     descendant, yet it is still the test's to kill.
//
// The check and the signal go through a pidfd opened first, so a process that dies and whose pid
// is reused between the check and the signal is never the one signalled.
//
// Header-only on purpose (no gtest): bench/bench_store.cc shares etcd_process.h, which uses it.
// Thread-safe: reads /proc and keeps no state.
#ifndef TRAINGUARD_TESTS_SUPPORT_OWN_PROCESS_H_
#define TRAINGUARD_TESTS_SUPPORT_OWN_PROCESS_H_

#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "sdk/core/proc_stat.h"

namespace trainguard::testing {

namespace own_process_internal {

inline std::string SignalName(int signal) {
  const char* name = sigabbrev_np(signal);
  return name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", signal);
}

// Fields of /proc/<pid>/stat after "pid (comm)": the state letter and the parent pid. False if the
// process does not exist (any more).
inline bool ReadStat(pid_t pid, char* state, pid_t* parent) {
  absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
  if (!stat.ok()) return false;
  *state = stat->state;
  *parent = stat->ppid;
  return true;
}

inline bool IsSelfOrDescendant(pid_t pid) {
  const pid_t self = getpid();
  // A parent chain is short; the bound only guards against a /proc that changes under the walk.
  for (int depth = 0; depth < 128 && pid > 1; ++depth) {
    if (pid == self) return true;
    char state = 0;
    pid_t parent = 0;
    if (!ReadStat(pid, &state, &parent)) return false;
    pid = parent;
  }
  return false;
}

inline bool EnvironmentHolds(pid_t pid, absl::string_view entry) {
  if (entry.empty()) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  const std::string environ_text{std::istreambuf_iterator<char>(in),
                                 std::istreambuf_iterator<char>()};
  for (absl::string_view e : absl::StrSplit(environ_text, '\0')) {
    if (e == entry) return true;
  }
  return false;
}

}  // namespace own_process_internal

// OK when `pid` is positive and names this process, a descendant of it, or (with a non-empty
// `environment_entry`) a process whose environment holds that entry; otherwise an error saying
// which and why.
inline absl::Status CheckOwnProcess(pid_t pid, absl::string_view environment_entry = {}) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pid ", pid, " is not a process (kill() would signal ",
                     pid == 0 ? "the whole process group" : "every process of the user",
                     "); it probably came from an empty pid file or a failed fork"));
  }
  if (own_process_internal::IsSelfOrDescendant(pid)) return absl::OkStatus();
  if (own_process_internal::EnvironmentHolds(pid, environment_entry)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("pid ", pid, " is not this test's: neither a descendant of pid ", getpid(),
                   environment_entry.empty()
                       ? std::string()
                       : absl::StrCat(" nor a process whose environment holds ", environment_entry),
                   " (it may have exited, and its pid been reused)"));
}

// Sends `signal` to `pid` once CheckOwnProcess passes. Signal 0 only probes. Returns the check's
// error, or the errno of the send (ESRCH: the process is gone and reaped).
inline absl::Status SignalOwnProcess(pid_t pid, int signal,
                                     absl::string_view environment_entry = {}) {
  const std::string what = absl::StrCat(own_process_internal::SignalName(signal), " to pid ", pid);
  if (pid <= 0) {
    absl::Status refused = CheckOwnProcess(pid, environment_entry);
    return absl::Status(refused.code(),
                        absl::StrCat("refusing to send ", what, ": ", refused.message()));
  }
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("sending ", what, ": pidfd_open"));
  }
  if (absl::Status own = CheckOwnProcess(pid, environment_entry); !own.ok()) {
    close(pidfd);
    return absl::Status(own.code(), absl::StrCat("refusing to send ", what, ": ", own.message()));
  }
  const bool sent = syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0) == 0;
  const int error = errno;
  close(pidfd);
  if (!sent) return absl::ErrnoToStatus(error, absl::StrCat("sending ", what));
  return absl::OkStatus();
#else
  // No pidfds: the check and the kill are separate, leaving the reuse window the pidfd closes.
  if (absl::Status own = CheckOwnProcess(pid, environment_entry); !own.ok()) {
    return absl::Status(own.code(), absl::StrCat("refusing to send ", what, ": ", own.message()));
  }
  if (kill(pid, signal) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("sending ", what));
  return absl::OkStatus();
#endif
}

// Whether a process of this test (as CheckOwnProcess defines it) still runs under `pid`: false once
// it is gone, a zombie, or the pid names someone else's process. What a test asserts after a
// shutdown that should have ended its processes.
inline bool OwnProcessIsRunning(pid_t pid, absl::string_view environment_entry = {}) {
  if (!CheckOwnProcess(pid, environment_entry).ok()) return false;
  char state = 0;
  pid_t parent = 0;
  return own_process_internal::ReadStat(pid, &state, &parent) && state != 'Z' && state != 'X';
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_OWN_PROCESS_H_
