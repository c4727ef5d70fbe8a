// StandbyReplacement: the default RecoveryStrategy of `trainguard run` (recovery_strategy.h). A
// dead rank is given to a parked standby process in a new generation; every other rank keeps its
// process, its memory and its communicators. The deaths are counted and backed off by the
// ReplacementPolicy (--max-replacements, --restart-backoff) and queued with the JobCoordinator,
// which makes the replacements. On several hosts the coordinator finds the deaths (the agents'
// reports, the hosts it declares dead) and hands them here, and this strategy hands them back to
// the coordinator's standby path (JobCoordinator::QueueReportedDeath, QueueDeadHost), which counts
// a rank's deaths with the same ReplacementPolicy.
//
// Thread safety: not thread-safe; the agent's loop (or a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_STANDBY_REPLACEMENT_H_
#define TRAINGUARD_SDK_COORDINATOR_STANDBY_REPLACEMENT_H_

#include <functional>
#include <string>

#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/coordinator/recovery_strategy.h"

namespace trainguard {

class StandbyReplacement final : public RecoveryStrategy {
 public:
  struct Hooks {
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // Fails the job for `why`.
    std::function<void(const std::string& why)> fail;
  };
  // REQUIRES: `policy` and `coordinator` outlive the strategy; every hook is set.
  StandbyReplacement(ReplacementPolicy* policy, JobCoordinator* coordinator, Hooks hooks)
      : policy_(policy), coordinator_(coordinator), hooks_(std::move(hooks)) {}

  bool ReplacesRanks() const override { return true; }
  int64_t round() const override { return 0; }
  // Before generation 0 formed the command cannot start: the job fails. After, the policy decides:
  // the job fails at the bound, or the rank is queued to be replaced not before its backoff.
  void OnRankDeath(const RankDeath& death, bool formed, absl::Time now) override;
  void OnNotFormed(const absl::Status& why) override;
  // JobCoordinator::QueueReportedDeath: the rank queued, a standby forgotten, or the job failed
  // before generation 0 formed (then false).
  bool OnDeathReported(const ReportedDeath& death, const Membership& current) override {
    return coordinator_->QueueReportedDeath(death, current);
  }
  // JobCoordinator::QueueDeadHost: the host's ranks queued in one entry.
  void OnHostDeclaredDead(const DeadHost& dead, const Membership& current) override {
    coordinator_->QueueDeadHost(dead, current);
  }
  // Not called: the ranks' requests renew the generation with the same ranks instead
  // (JobCoordinator::RenewGenerationWhenAsked, RenewalPolicy without --restart-all).
  void OnRestartRequested(const std::string&) override {}
  // The queued replacements (JobCoordinator::TryReplacements).
  void Coordinate(absl::Time now) override { coordinator_->TryReplacements(now); }
  void FollowRound() override {}
  // A stopped rank is the hang path's and the host timeout's (the launcher's liveness checks).
  void KillStoppedBeforeFormation(bool) override {}

 private:
  ReplacementPolicy* const policy_;
  JobCoordinator* const coordinator_;
  const Hooks hooks_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_STANDBY_REPLACEMENT_H_
