// RecoveryStrategy: how a `trainguard run` job recovers from a rank's or a host's fault, chosen once
// when the job starts. Two exist:
//   - StandbyReplacement (standby_replacement.h), the default: a dead rank goes to a parked standby
//     process (JobCoordinator's replacements) and every other rank keeps its process and memory.
//   - RestartAll (restart_all.h), `--restart-all=M`, torchrun's baseline: any fault stops every
//     process of the job and starts every rank again in a new restart round, at most M times.
// The launcher (tools/launcher.cc) calls the same methods whichever it is, on one host and on
// several: one host is one agent and one coordinator in one process. A strategy decides; what it
// decides is carried out through its hooks (the processes are the launcher's, the kills of this
// host's ranks its HostAgent's).
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_RECOVERY_STRATEGY_H_
#define TRAINGUARD_SDK_COORDINATOR_RECOVERY_STRATEGY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainguard {

// A rank of this agent's own host that died, seen by its launcher (its exit).
struct RankDeath {
  int rank = -1;
  std::string label;  // "rank 1", as the launcher's output names it
  std::string how;    // "killed by SIGKILL", "exited with status 1" (WorkerExit::Describe)
};

class RecoveryStrategy {
 public:
  virtual ~RecoveryStrategy() = default;

  // Whether a dead rank is given to a standby process (and the job keeps standbys: --standby
  // spares, a standby host's standbys) rather than every rank being restarted.
  virtual bool ReplacesRanks() const = 0;
  // The restart round the ranks run in: 0 at the job's first start, and always under standby
  // replacement. A round's ranks run under a job id of their own (see RoundJobId).
  virtual int64_t round() const = 0;

  // A rank of this host died (its process exited unsuccessfully) when the current round's
  // generation 0 had `formed` or not. On several hosts only the coordinator decides about deaths,
  // from the agents' reports (JobCoordinator); on one host the launcher hands its own ranks'
  // deaths here.
  virtual void OnRankDeath(const RankDeath& death, bool formed, absl::Time now) = 0;
  // The current round's generation 0 could not form (`why`: the rendezvous' error).
  virtual void OnNotFormed(const absl::Status& why) = 0;

  // The coordinator, at every turn of the agent's loop while it holds the gate: carries out what
  // was decided and is due at `now` (a replacement, a restart round).
  virtual void Coordinate(absl::Time now) = 0;
  // Every agent, every tick: follows what another host's coordinator published (a restart round).
  virtual void FollowRound() = 0;
  // Every agent, every tick: a rank of this host that is stopped (SIGSTOP) while its round forms
  // has no heartbeat to go stale; `formed`: whether the current round's generation 0 formed.
  virtual void KillStoppedBeforeFormation(bool formed) = 0;
};

// The job id a round's ranks run under: the job's in round 0, "<job id>.round<K>" in round K, so
// that a round's store keys and shared-memory segments are its own.
std::string RoundJobId(const std::string& job_id, int64_t round);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_RECOVERY_STRATEGY_H_
