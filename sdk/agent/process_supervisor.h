// ProcessSupervisor: how `trainguard run` starts its workers (ranks and parked standbys), signals
// them and learns what became of them. The shape of torchelastic's PContext, cut to what the
// launcher needs: Spawn a worker from a WorkerSpec, Signal its whole process group, Poll for
// events (a line of its output, its exit, a stop, a continue) with a timeout, and ask whether a
// live worker is stopped right now.
//
// The launcher's loop owns one supervisor and is its only caller. PosixProcessSupervisor
// (posix_process_supervisor.h) runs real processes; tests/support/fake_process_supervisor.h is a
// test double whose workers a test makes print, stop, continue and exit.
//
// A worker's life as Poll reports it: zero or more kOutput events (its stdout and stderr, merged,
// one line each), interleaved with kStopped and kContinued; one kExited; then possibly more
// kOutput, written by processes of its group before they died. A kStopped comes after every line
// the worker wrote before it stopped, and kExited after every line it wrote before it ended (a last
// line without a newline included). A stop or a continue that the worker's exit follows before
// Poll looks may go unreported (waitpid reports the exit first). Once a worker has exited it is
// never signalled again, so a signal cannot reach a process that reused its pid.
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_AGENT_PROCESS_SUPERVISOR_H_
#define TRAINGUARD_SDK_AGENT_PROCESS_SUPERVISOR_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

// Names a worker for the supervisor's life: never reused, unlike a pid.
using WorkerId = int64_t;

// What to start.
struct WorkerSpec {
  // "rank 0", "standby 1": names the worker in errors.
  std::string label;
  // argv[0] is looked up in this process's PATH (execvpe). Not empty.
  std::vector<std::string> argv;
  // The worker's whole environment, "NAME=value" each: the launcher builds it from its own, less
  // the variables it sets for ranks, plus those.
  std::vector<std::string> env;
  // Everything the worker writes (stdout and stderr) is appended to this file, byte for byte.
  std::string log_path;
  // Written with the worker's pid and a newline once it runs, atomically (a reader sees no pid or
  // the whole pid, never half of one); empty: none.
  std::string pid_file;
};

// How a worker ended: an exit status, or the signal that killed it.
struct WorkerExit {
  int exit_code = -1;  // -1 when a signal killed it
  int signal = 0;      // 0 when it exited

  // Decodes a wait status (waitpid) of an ended process.
  static WorkerExit FromWaitStatus(int wait_status);
  static WorkerExit Exited(int code) { return {code, 0}; }
  static WorkerExit Killed(int signal) { return {-1, signal}; }

  bool succeeded() const { return signal == 0 && exit_code == 0; }
  // "exited with status 3", "killed by SIGKILL": as the launcher prints a death.
  std::string Describe() const;

  friend bool operator==(const WorkerExit&, const WorkerExit&) = default;
};

struct WorkerEvent {
  enum class Kind {
    kOutput,     // `line`: one line of output, without its newline
    kStopped,    // `stop_signal` stopped it (SIGSTOP, SIGTSTP, ...)
    kContinued,  // SIGCONT resumed it
    kExited,     // `exit`; the worker is no longer live
  };
  Kind kind = Kind::kOutput;
  WorkerId worker = 0;
  std::string line;
  int stop_signal = 0;
  WorkerExit exit;
};

class ProcessSupervisor {
 public:
  virtual ~ProcessSupervisor() = default;

  // Starts a worker in a process group of its own, with stdin from /dev/null and its output
  // captured; it is killed when the launcher dies (PosixProcessSupervisor says how).
  // FailedPrecondition naming the command and `spec.label` when argv[0] cannot be executed; the
  // error of the file when the log or the pid file cannot be written (nothing is left running
  // then).
  virtual absl::StatusOr<WorkerId> Spawn(const WorkerSpec& spec) = 0;

  // Sends `signal` to the live worker's whole process group (its command and everything it
  // started). FailedPrecondition when the worker has exited (nothing is sent), NotFound when the
  // supervisor never started it.
  virtual absl::Status Signal(WorkerId worker, int signal) = 0;

  // The events since the last call (per worker in the order above); waits up to `timeout` for the
  // first when there is none.
  virtual std::vector<WorkerEvent> Poll(absl::Duration timeout) = 0;

  // Whether the live worker is stopped now (SIGSTOP, a debugger); false once it has exited.
  virtual bool IsStopped(WorkerId worker) = 0;

  // Writes the live worker's pid to `path` as Spawn writes WorkerSpec::pid_file (a standby that
  // takes a rank gets the rank's pid file). FailedPrecondition when it has exited.
  virtual absl::Status WritePidFile(WorkerId worker, const std::string& path) = 0;

  // The worker's pid (its process group's id too); -1 for a worker never started or released.
  virtual pid_t pid(WorkerId worker) const = 0;

  // Forgets an exited worker: its output not yet read is dropped. FailedPrecondition while it is
  // live.
  virtual absl::Status Release(WorkerId worker) = 0;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_PROCESS_SUPERVISOR_H_
