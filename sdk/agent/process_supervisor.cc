#include "sdk/agent/process_supervisor.h"

#include <string.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace trainguard {

WorkerExit WorkerExit::FromWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) return Killed(WTERMSIG(wait_status));
  return Exited(WEXITSTATUS(wait_status));
}

std::string WorkerExit::Describe() const {
  if (signal == 0) return absl::StrCat("exited with status ", exit_code);
  const char* name = sigabbrev_np(signal);
  return absl::StrCat("killed by SIG", name != nullptr ? name : absl::StrCat(signal));
}

}  // namespace trainguard
