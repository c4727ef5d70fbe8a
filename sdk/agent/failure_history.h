// FailureHistory: the deaths `trainguard run` saw in a job, so that the message that finally fails
// the job names the first one and its cause. A job seldom fails of its first fault: a rank whose
// arena does not fit in /dev/shm exits at start-up, its peers wait for it until they are killed,
// and the death that finds no standby left is one of those later ones. The line that ends the job
// names that later death (ReplacementPolicy's and the launcher's messages do); FinalMessage adds
// what started it.
//
// A death's evidence is its cause: why the launcher killed the process (a stale heartbeat, a
// hang's suspect, ...), else the last line the process printed that reads as an error (CauseLine
// keeps it while the output streams by), else nothing. A host's death has the reason it was
// declared dead. On several hosts the evidence crosses hosts in the death report
// (store_keys::DeathReport::cause), and the coordinator records the deaths.
//
// The unit is pure: no I/O, no clock, no store; the launcher records deaths in the order it learns
// of them, and tests drive it with hand-made deaths.
//
// Thread safety: not thread-safe; one thread (the launcher's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_AGENT_FAILURE_HISTORY_H_
#define TRAINGUARD_SDK_AGENT_FAILURE_HISTORY_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace trainguard {

// One death and its evidence.
struct Death {
  std::string who;    // "rank 2", "rank 2 (h1:41:rank2)", "host h2"
  std::string how;    // "exited with status 1", "killed by SIGKILL", "died"
  std::string cause;  // the evidence; empty when there is none

  // "rank 2 exited with status 1: <cause>"; without ": <cause>" when there is none.
  std::string Describe() const;
};

// The last line of one process's output that reads as an error: the cause of its death when it
// exits non-zero. A line reads as an error when it says so in words ("error", "failed", "cannot",
// "fatal", "exception", "abort", "panic", "no space left", "out of memory", "segmentation fault",
// "terminate called", in any case), or when it is the trainguard runtime's own word on why it ends
// the rank ("trainguard: rank N: ...", "trainguard: watchdog: ..."). Progress lines printed after
// it do not replace it.
class CauseLine {
 public:
  // Keeps `line` when it reads as an error.
  void Observe(std::string_view line);
  // The last such line; empty when there was none.
  const std::string& line() const { return line_; }

  static bool ReadsAsAnError(std::string_view line);

 private:
  std::string line_;
};

class FailureHistory {
 public:
  // A cause longer than this loses its middle (its start and its end stay, " ... " between): the
  // job's last line must stay one readable line.
  static constexpr size_t kMaxCauseBytes = 512;

  // Counts `death`; the first one recorded is kept as the job's first failure.
  void Record(Death death);

  int deaths() const { return deaths_; }
  // The first death recorded; nullopt before any.
  const std::optional<Death>& first() const { return first_; }

  // The message that fails the job for `why`: `why`, then "; first failure: <first death>" (e.g.
  // "rank 4 died (killed by SIGKILL) and no standby is available: ...; first failure: rank 2
  // exited with status 1: <its error line>"). Just `why` when no death was recorded, or when the
  // only one has no cause: the launcher wrote `why` about that death, which then says all there is.
  std::string FinalMessage(std::string_view why) const;

 private:
  int deaths_ = 0;
  std::optional<Death> first_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_FAILURE_HISTORY_H_
