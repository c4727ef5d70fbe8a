// RestartAll: the RecoveryStrategy of `trainguard run --restart-all=M` (recovery_strategy.h),
// torchrun's baseline. torchrun's elastic agent answers any failure by stopping the whole worker
// group and starting it again through a new rendezvous round; so does this, in restart rounds, on
// one host as on several.
//
// The coordinator publishes round K + 1 for a fault of round K (store key agents/restart, "<K+1>
// <why>"; for a host's death first a plan that gives its group rank to a standby host, as
// DecideRestartRound decides) and fails the job at the (M + 1)-th fault instead, naming it. Every
// agent, the coordinator's own first, kills its processes and starts its ranks of the round under
// the round's job id (RoundJobId), whose store namespace holds nothing yet: generation 0 forms anew
// there, and with no snapshot in the store, no arena and no peer backup of the round, every rank
// restores the newest checkpoint on disk.
//
// The decisions, all here:
//   - a fault of round K publishes round K + 1 once: a rank's fault while one is already pending is
//     the same fault's (its peers die of it); a host's death is kept, as its group rank must move;
//   - a rank lost before the restarted job formed restarts again ("... before the restarted job
//     formed"), as does a round that did not form; before the first start formed, the command
//     cannot start and the job fails;
//   - a rank stopped (SIGSTOP) before its round formed is killed after --heartbeat-timeout
//     (Hooks::kill_stopped), a rank lost before the restarted job formed.
// The acts are the hooks': starting the round (the launcher's processes), killing this host's
// stopped ranks (its HostAgent), failing the job. Every store write and every word of a decision
// is behind the gate (Hooks::coordinating): a deposed coordinator publishes nothing.
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_RESTART_ALL_H_
#define TRAINGUARD_SDK_COORDINATOR_RESTART_ALL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/agent/restart_rounds.h"
#include "sdk/core/agent_keys.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {

struct RestartAllOptions {
  std::string host_id;  // this agent's host: never silent to itself
  int limit = 0;        // --restart-all=M: at most M restart rounds
  int ranks_per_host = 1;
  // --heartbeat-timeout: a rank stopped this long before its round formed is killed.
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  absl::Duration call_timeout = absl::Milliseconds(750);  // one store call of the agent's loop
  // What a restart restarts, as said: "every rank", or on several hosts "every rank on every host".
  std::string scope = "every rank";
};

class RestartAll final : public RecoveryStrategy {
 public:
  using Attributes = std::vector<std::pair<std::string, std::string>>;
  struct Hooks {
    // The gate of every act: true while this agent may act as the coordinator.
    std::function<bool()> coordinating;
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    std::function<void(int rank, EventKind kind, const std::string& message, Attributes attributes)>
        record;
    // Fails the job for `why`.
    std::function<void(const std::string& why)> fail;
    // Carries out the move from round `from` to round `to` on this host: every process of the job
    // killed, round `from`'s shared memory removed, this host's ranks of round `to` (its plan)
    // started under RoundJobId(job, to). round() is `to` already.
    std::function<void(int64_t from, int64_t to)> start_round;
    // Kills this host's ranks stopped for `bound` or longer, `context` saying when
    // (HostAgent::KillRanksStoppedFor).
    std::function<void(absl::Duration bound, const std::string& context)> kill_stopped;
  };

  // REQUIRES: `store` (the agents', the job's namespace), `clock` and `coordinator` outlive the
  // strategy; every hook is set. `coordinator` knows which hosts are dead or silent and keeps the
  // recoveries (each restart is one, measured by the launcher); its owner hands it this strategy
  // (JobCoordinator::set_recovery_strategy) for the faults it finds.
  RestartAll(Store* store, Clock* clock, JobCoordinator* coordinator, RestartAllOptions options,
             Hooks hooks)
      : store_(store),
        clock_(clock),
        coordinator_(coordinator),
        options_(std::move(options)),
        hooks_(std::move(hooks)) {}

  bool ReplacesRanks() const override { return false; }
  int64_t round() const override { return round_; }
  void OnRankDeath(const RankDeath& death, bool formed, absl::Time now) override;
  void OnNotFormed(const absl::Status& why) override;
  // A death of the current round is a rank's death as one host's own (OnRankDeath, its label
  // naming the member: "rank 3 (h1:200:round1:rank3)"), and the reports after it in the turn wait
  // for the next (false): they are the same fault's. A death of an earlier round is of the restart
  // itself, or of its peers' deaths: ignored, as is a report under a member id that names no
  // process of any round (said).
  bool OnDeathReported(const ReportedDeath& death, const Membership& current) override;
  // A training host's death (one that the plan, agents/plan, gives a group rank) restarts every
  // rank, its group rank given to a standby host in the round's plan (the round's recovery from
  // its last beat); a standby host's restarts nothing (it held no process); before the first start
  // formed the job fails.
  void OnHostDeclaredDead(const DeadHost& dead, const Membership& current) override;
  // RequestRestart(why).
  void OnRestartRequested(const std::string& why) override { RequestRestart(why); }
  // Publishes and starts the next round for each pending fault (the limit reached fails the job).
  void Coordinate(absl::Time now) override;
  // Starts the round at agents/restart when it is newer than this agent's.
  void FollowRound() override;
  void KillStoppedBeforeFormation(bool formed) override;

  // A fault every rank restarts for, of the current round: `why` says it; `dead_host`, when not
  // empty, is a host whose death it is (its group rank goes to a standby host in the round's plan);
  // `since`: when the fault began (a dead host's last heartbeat; InfinitePast: when it is carried
  // out). Carried out by the next Coordinate. (OnRankDeath, OnNotFormed, OnHostDeclaredDead and
  // OnRestartRequested.)
  void RequestRestart(const std::string& why, const std::string& dead_host = "",
                      absl::Time since = absl::InfinitePast());
  // Whether a fault waits for Coordinate.
  bool restart_pending() const { return !pending_.empty(); }

 private:
  struct Fault {
    std::string why;
    std::string dead_host;
    absl::Time since;
  };
  // One round for `fault`; false when the job failed or the gate closed (nothing more to do).
  bool StartNextRound(const Fault& fault);
  // What the coordinator knows of the hosts for a host's death: the plan, the joined hosts, those
  // that left (the store), those dead or silent (the coordinator's records).
  absl::StatusOr<RestartRoundHosts> ReadHosts(std::string* master_addr, int* master_port);

  Store* const store_;
  Clock* const clock_;
  JobCoordinator* const coordinator_;
  const RestartAllOptions options_;
  const Hooks hooks_;
  int64_t round_ = 0;
  std::vector<Fault> pending_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_RESTART_ALL_H_
