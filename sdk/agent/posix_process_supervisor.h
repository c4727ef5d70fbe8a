// PosixProcessSupervisor: the ProcessSupervisor (process_supervisor.h) of real processes, as
// `trainguard run` starts its ranks and standbys on Linux.
//
// A worker is fork()ed and exec'd (execvpe) with:
//   - its own process group (setpgid in the child and in the parent, whichever runs first), so a
//     signal reaches its command and everything that command started;
//   - PR_SET_PDEATHSIG = SIGKILL: it dies with the thread that spawned it (the launcher's loop);
//   - stdin from /dev/null (in a group of its own, a read of the terminal would stop it with
//     SIGTTIN), stdout and stderr into one pipe, and an empty signal mask;
//   - a second pipe through which a failed exec reports its errno, so Spawn fails at once with
//     the reason instead of reporting an exit of status 127 later.
// Its output is appended to WorkerSpec::log_path as it comes and split into lines for Poll. A
// pidfd per live worker (when the kernel has pidfd_open) ends Poll's wait as soon as one exits.
//
// When a worker has exited, what is left of its process group (processes its command started)
// is SIGKILLed at once, before Poll reports the exit: the group's id is not reused while the group
// exists, and it is never signalled again afterwards.
//
// REQUIRES: nothing else in the process reaps the workers (no waitpid(-1), SIGCHLD not SIG_IGN).
// The destructor SIGKILLs and reaps the workers still live (a bounded wait).
//
// Thread safety: not thread-safe; one thread (the one that spawns, see PDEATHSIG above) uses it.
#ifndef TRAINGUARD_SDK_AGENT_POSIX_PROCESS_SUPERVISOR_H_
#define TRAINGUARD_SDK_AGENT_POSIX_PROCESS_SUPERVISOR_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/agent/process_supervisor.h"
#include "trainguard/env.h"

namespace trainguard {

struct PosixProcessSupervisorOptions {
  // A descriptor whose readability ends Poll's wait early; the supervisor never reads it (the
  // launcher's signalfd, so that SIGINT and SIGTERM are seen at once). -1: none.
  int wake_fd = -1;
  // Opens the logs and writes the pid files. Not owned; null: Env::Default().
  Env* env = nullptr;
};

class PosixProcessSupervisor final : public ProcessSupervisor {
 public:
  explicit PosixProcessSupervisor(PosixProcessSupervisorOptions options = {});
  ~PosixProcessSupervisor() override;
  PosixProcessSupervisor(const PosixProcessSupervisor&) = delete;
  PosixProcessSupervisor& operator=(const PosixProcessSupervisor&) = delete;

  absl::StatusOr<WorkerId> Spawn(const WorkerSpec& spec) override;
  absl::Status Signal(WorkerId worker, int signal) override;
  std::vector<WorkerEvent> Poll(absl::Duration timeout) override;
  bool IsStopped(WorkerId worker) override;
  absl::Status WritePidFile(WorkerId worker, const std::string& path) override;
  pid_t pid(WorkerId worker) const override;
  absl::Status Release(WorkerId worker) override;

 private:
  struct Worker;

  // Reads what `worker`'s pipe holds without blocking, appends it to its log and adds a kOutput
  // event per complete line; the last partial line too when `flush` or at the pipe's end.
  void ReadOutput(WorkerId id, Worker& worker, bool flush, std::vector<WorkerEvent>* events);
  // Adds the stops, continues and exits that waitpid reports for the live workers.
  void CollectStateChanges(std::vector<WorkerEvent>* events);
  // SIGKILLs the live worker's group and reaps it, waiting a bounded time.
  void KillAndReap(Worker& worker);
  // The live worker `id`: NotFound when it was never started here, FailedPrecondition ("<label>
  // (pid P) has exited: <refused>") once it has exited.
  absl::StatusOr<const Worker*> LiveWorker(WorkerId id, std::string_view refused) const;

  const PosixProcessSupervisorOptions options_;
  Env* const env_;
  WorkerId next_id_ = 1;
  std::map<WorkerId, std::unique_ptr<Worker>> workers_;  // by id: in the order they were spawned
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_POSIX_PROCESS_SUPERVISOR_H_
