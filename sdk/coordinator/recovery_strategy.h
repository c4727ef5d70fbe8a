// RecoveryStrategy: how a `trainguard run` job recovers from a rank's or a host's fault, chosen
// once when the job starts. Two exist:
//   - StandbyReplacement (standby_replacement.h), the default: a dead rank goes to a parked standby
//     process (JobCoordinator's replacements) and every other rank keeps its process and memory.
//   - RestartAll (restart_all.h), `--restart-all=M`, torchrun's baseline: any fault stops every
//     process of the job and starts every rank again in a new restart round, at most M times.
// The launcher (sdk/launch/launch_agent.cc) and the job's JobCoordinator call the same methods
// whichever it is, on one host and on several: one host is one agent and one coordinator in one
// process. The coordinator finds the faults (the deaths its agents report through the store, the
// hosts it declares dead, the ranks' requests for a new generation) and hands each to the strategy,
// which decides; what it decides is carried out through its hooks (the processes are the
// launcher's, the kills of this host's ranks its HostAgent's) and, for StandbyReplacement, through
// the coordinator's replacements.
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_RECOVERY_STRATEGY_H_
#define TRAINGUARD_SDK_COORDINATOR_RECOVERY_STRATEGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainguard/membership.h"

namespace trainguard {

// A rank of this agent's own host that died, seen by its launcher (its exit).
struct RankDeath {
  int rank = -1;
  std::string label;  // "rank 1", as the launcher's output names it
  std::string how;    // "killed by SIGKILL", "exited with status 1" (WorkerExit::Describe)
};

// A death that a host's agent reported through the store (agents/deaths/<member>), as the
// coordinator read it (JobCoordinator::ReadDeathReports): once per member.
struct ReportedDeath {
  std::string member;  // the member id the report was filed under
  int rank = -1;       // the rank the report names; -1 when its text did not decode
  // How it died ("exited with status 1"); the report's whole text when it did not decode, since
  // the text still says that the member died.
  std::string how;
  std::string cause;  // the agent's evidence of the death (CauseLine); may be empty
};

// A host the coordinator declared dead (JobCoordinator::DeclareHostDead): its fence written, its
// parked standbys forgotten, its death said and recorded.
struct DeadHost {
  std::string host;
  std::vector<int> ranks;  // the ranks of the current membership it held that had not finished
  std::string why;         // why it was declared dead ("no heartbeat for 3s", an eviction)
  absl::Time last_beat;    // when its heartbeat last advanced: its recovery's start
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
  // generation 0 had `formed` or not. On one host the launcher hands its own ranks' deaths here
  // (InProcessRankReports); on several the agents report them through the store, and the
  // coordinator hands each to OnDeathReported.
  virtual void OnRankDeath(const RankDeath& death, bool formed, absl::Time now) = 0;
  // The current round's generation 0 could not form (`why`: the rendezvous' error).
  virtual void OnNotFormed(const absl::Status& why) = 0;

  // The JobCoordinator's hand-offs (OnDeathReported and OnHostDeclaredDead on several hosts,
  // OnRestartRequested on one host too), each made once its gate (the coordinator lease) let it
  // act; a death is handed over after the coordinator recorded it in the job's FailureHistory and
  // marked it taken, so none is handed over twice.
  //
  // An agent reported `death` through the store. `current`: the membership of the rendezvous
  // coordinator when the reports were read (generation -1: the current round's generation 0 has
  // not formed). Returns whether the coordinator goes on to the next report in this turn: false
  // once the job failed, or once this death decided what the others of its turn lead to (they are
  // handed over at the next turn).
  virtual bool OnDeathReported(const ReportedDeath& death, const Membership& current) = 0;
  // The coordinator declared `dead` dead; `current` as for OnDeathReported.
  virtual void OnHostDeclaredDead(const DeadHost& dead, const Membership& current) = 0;
  // The ranks asked for a new generation and RenewalPolicy answers with a restart of every rank
  // (its RestartAll action, under --restart-all only); `why`: the first request's line.
  virtual void OnRestartRequested(const std::string& why) = 0;

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
