// RecoveryPolicy (sdk/runtime/recovery_policy.h): what recover() does about a failed step, on
// hand-made histories, with no Runtime, store or checkpoint.
#include "sdk/runtime/recovery_policy.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

using FaultVerdict = RecoveryPolicy::FaultVerdict;
using RestoreVerdict = RecoveryPolicy::RestoreVerdict;

RecoveryLimits Limits(int failures, int rollbacks, bool skip_batches = false) {
  return RecoveryLimits{.max_consecutive_step_failures = failures,
                        .max_rollbacks_per_step = rollbacks,
                        .skip_batches_on_repeat = skip_batches};
}

TEST(RecoveryLimits, AreTheOptionsRecoverObeys) {
  Options options;
  options.max_consecutive_step_failures = 5;
  options.max_rollbacks_per_step = 2;
  options.repeated_fault_action = "skip";
  const RecoveryLimits limits = RecoveryLimits::FromOptions(options);
  EXPECT_EQ(limits.max_consecutive_step_failures, 5);
  EXPECT_EQ(limits.max_rollbacks_per_step, 2);
  EXPECT_TRUE(limits.skip_batches_on_repeat);
  options.repeated_fault_action = "stop";
  EXPECT_FALSE(RecoveryLimits::FromOptions(options).skip_batches_on_repeat);
}

TEST(RecoveryPolicy, ContinueCountsNoFailure) {
  RecoveryPolicy policy(Limits(3, 1));
  EXPECT_EQ(policy.OnStepFailed(StepAction::kContinue, 7, true).verdict, FaultVerdict::kContinue);
  EXPECT_EQ(policy.history(), RecoveryHistory{});
}

TEST(RecoveryPolicy, SkipsUpToTheLimitOfConsecutiveFailures) {
  RecoveryPolicy policy(Limits(2, 1));
  RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kSkip, 10, false);
  EXPECT_EQ(d.verdict, FaultVerdict::kSkip);
  EXPECT_EQ(d.consecutive_failures, 1);
  EXPECT_EQ(policy.history().first_failed_step, 10);
  d = policy.OnStepFailed(StepAction::kSkip, 11, false);
  EXPECT_EQ(d.verdict, FaultVerdict::kSkip);
  EXPECT_EQ(d.consecutive_failures, 2);
  EXPECT_EQ(policy.history().first_failed_step, 10) << "the run began at step 10";
}

TEST(RecoveryPolicy, OneFailurePastTheLimitStopsTheJobWithoutCheckpointing) {
  RecoveryPolicy policy(Limits(1, 1));
  EXPECT_EQ(policy.OnStepFailed(StepAction::kSkip, 10, false).verdict, FaultVerdict::kSkip);
  const RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kSkip, 11, false);
  EXPECT_EQ(d.verdict, FaultVerdict::kStopJob);
  EXPECT_EQ(d.consecutive_failures, 2);
  EXPECT_EQ(policy.history().consecutive_failures, 2);
}

TEST(RecoveryPolicy, OneFailurePastTheLimitRollsBackToTheFirstFailedStepsCheckpoint) {
  RecoveryPolicy policy(Limits(1, 1));
  EXPECT_EQ(policy.OnStepFailed(StepAction::kSkip, 10, true).verdict, FaultVerdict::kSkip);
  const RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kSkip, 11, true);
  EXPECT_EQ(d.verdict, FaultVerdict::kRollback);
  EXPECT_EQ(d.first_failed_step, 10);
  // The rollback ends the run of failures.
  EXPECT_EQ(policy.history().consecutive_failures, 0);
  EXPECT_EQ(policy.history().first_failed_step, -1);
}

TEST(RecoveryPolicy, ARollbackActionRollsBackAtOnce) {
  RecoveryPolicy policy(Limits(3, 1));
  const RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kRollback, 20, true);
  EXPECT_EQ(d.verdict, FaultVerdict::kRollback);
  EXPECT_EQ(d.first_failed_step, 20);
  EXPECT_EQ(policy.history().consecutive_failures, 0);
}

TEST(RecoveryPolicy, ARollbackEndsARunOfSkipsThatBeganEarlier) {
  RecoveryPolicy policy(Limits(3, 1));
  EXPECT_EQ(policy.OnStepFailed(StepAction::kSkip, 20, true).verdict, FaultVerdict::kSkip);
  const RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kRollback, 21, true);
  EXPECT_EQ(d.verdict, FaultVerdict::kRollback);
  EXPECT_EQ(d.first_failed_step, 20);
}

TEST(RecoveryPolicy, ARollbackWithoutCheckpointingIsAnErrorThatKeepsTheCount) {
  RecoveryPolicy policy(Limits(3, 1));
  const RecoveryPolicy::FaultDecision d = policy.OnStepFailed(StepAction::kRollback, 20, false);
  EXPECT_EQ(d.verdict, FaultVerdict::kRollbackOff);
  EXPECT_EQ(d.consecutive_failures, 1);
  EXPECT_EQ(policy.history().consecutive_failures, 1);
  EXPECT_EQ(policy.history().first_failed_step, 20);
}

TEST(RecoveryPolicy, ReRendezvousFatalAndUnknownActionsCountNoFailure) {
  RecoveryPolicy policy(Limits(3, 1));
  EXPECT_EQ(policy.OnStepFailed(StepAction::kReRendezvous, 5, true).verdict,
            FaultVerdict::kReRendezvous);
  EXPECT_EQ(policy.OnStepFailed(StepAction::kFatal, 5, true).verdict, FaultVerdict::kFatal);
  EXPECT_EQ(policy.OnStepFailed(static_cast<StepAction>(42), 5, true).verdict,
            FaultVerdict::kUnknown);
  EXPECT_EQ(policy.history(), RecoveryHistory{});
}

TEST(RecoveryPolicy, ResumesAtTheRestoredStepWithinTheRollbackLimit) {
  RecoveryPolicy policy(Limits(3, 2));
  RecoveryPolicy::RestoreDecision d = policy.OnRestored(100, 105, 105);
  EXPECT_EQ(d.verdict, RestoreVerdict::kResume);
  EXPECT_EQ(d.next_step, 100);
  EXPECT_EQ(policy.history().rollback_step, 100);
  EXPECT_EQ(policy.history().rollbacks_to_step, 1);
  EXPECT_EQ(policy.history().rollback_failed_step, 105);
  d = policy.OnRestored(100, 105, 105);
  EXPECT_EQ(d.verdict, RestoreVerdict::kResume);
  EXPECT_EQ(policy.history().rollbacks_to_step, 2);
}

TEST(RecoveryPolicy, ARecurringFaultStopsTheJob) {
  RecoveryPolicy policy(Limits(3, 1));
  EXPECT_EQ(policy.OnRestored(100, 105, 105).verdict, RestoreVerdict::kResume);
  const RecoveryPolicy::RestoreDecision d = policy.OnRestored(100, 105, 105);
  EXPECT_EQ(d.verdict, RestoreVerdict::kStopJob);
  EXPECT_EQ(d.rollbacks_before, 1);
  EXPECT_FALSE(d.skipped_batches);
}

TEST(RecoveryPolicy, ARecurringFaultSkipsTheBatchesOnceWhenTheOptionSaysSo) {
  RecoveryPolicy policy(Limits(3, 1, /*skip_batches=*/true));
  EXPECT_EQ(policy.OnRestored(100, 105, 103).verdict, RestoreVerdict::kResume);
  RecoveryPolicy::RestoreDecision d = policy.OnRestored(100, 105, 103);
  EXPECT_EQ(d.verdict, RestoreVerdict::kSkipBatches);
  EXPECT_EQ(d.next_step, 104) << "past the first failed step of the run";
  EXPECT_TRUE(policy.history().skipped_batches);
  d = policy.OnRestored(100, 106, 104);
  EXPECT_EQ(d.verdict, RestoreVerdict::kStopJob);
  EXPECT_EQ(d.rollbacks_before, 2);
  EXPECT_TRUE(d.skipped_batches);
}

TEST(RecoveryPolicy, SkippingTheBatchesNeverResumesBeforeTheRestoredStep) {
  // The run of failures began before the checkpoint that was restored.
  RecoveryPolicy policy(
      Limits(3, 1, /*skip_batches=*/true),
      RecoveryHistory{.rollback_step = 100, .rollbacks_to_step = 1, .rollback_failed_step = 101});
  const RecoveryPolicy::RestoreDecision d = policy.OnRestored(100, 101, 90);
  EXPECT_EQ(d.verdict, RestoreVerdict::kSkipBatches);
  EXPECT_EQ(d.next_step, 100);
}

TEST(RecoveryPolicy, ARollbackToAnotherStepStartsItsCountAfresh) {
  RecoveryPolicy policy(Limits(3, 1), RecoveryHistory{.rollback_step = 100,
                                                      .rollbacks_to_step = 1,
                                                      .rollback_failed_step = 105,
                                                      .skipped_batches = true});
  const RecoveryPolicy::RestoreDecision d = policy.OnRestored(200, 205, 205);
  EXPECT_EQ(d.verdict, RestoreVerdict::kResume);
  EXPECT_EQ(d.next_step, 200);
  EXPECT_EQ(policy.history().rollback_step, 200);
  EXPECT_EQ(policy.history().rollbacks_to_step, 1);
  EXPECT_FALSE(policy.history().skipped_batches);
}

TEST(RecoveryPolicy, ASuccessPastTheFailedStepForgetsTheRollbacks) {
  const RecoveryHistory rolled_back{.consecutive_failures = 2,
                                    .first_failed_step = 104,
                                    .rollback_step = 100,
                                    .rollbacks_to_step = 1,
                                    .rollback_failed_step = 105};
  RecoveryPolicy policy(Limits(3, 1), rolled_back);
  // The replay up to the failed step: the rollbacks are remembered, the run of failures ends.
  policy.OnStepSucceeded(105);
  EXPECT_EQ(policy.history().consecutive_failures, 0);
  EXPECT_EQ(policy.history().rollbacks_to_step, 1);
  EXPECT_EQ(policy.history().rollback_step, 100);
  // Past it: the fault did not recur.
  policy.OnStepSucceeded(106);
  EXPECT_EQ(policy.history().rollback_step, -1);
  EXPECT_EQ(policy.history().rollbacks_to_step, 0);
  EXPECT_EQ(policy.history().rollback_failed_step, RecoveryHistory::kNoRollback);
}

TEST(RecoveryPolicy, AFaultThatDoesNotRecurCanBeRolledBackAgain) {
  RecoveryPolicy policy(Limits(3, 1));
  ASSERT_EQ(policy.OnStepFailed(StepAction::kRollback, 105, true).verdict, FaultVerdict::kRollback);
  ASSERT_EQ(policy.OnRestored(100, 105, 105).verdict, RestoreVerdict::kResume);
  for (int64_t step = 100; step <= 110; ++step) policy.OnStepSucceeded(step);
  ASSERT_EQ(policy.OnStepFailed(StepAction::kRollback, 111, true).verdict, FaultVerdict::kRollback);
  EXPECT_EQ(policy.OnRestored(100, 111, 111).verdict, RestoreVerdict::kResume);
}

TEST(RecoveryPolicy, EndingTheRunOfFailuresKeepsTheRollbacks) {
  RecoveryPolicy policy(Limits(1, 1), RecoveryHistory{.consecutive_failures = 1,
                                                      .first_failed_step = 7,
                                                      .rollback_step = 5,
                                                      .rollbacks_to_step = 1,
                                                      .rollback_failed_step = 7});
  policy.EndFailureRun();
  EXPECT_EQ(policy.history().consecutive_failures, 0);
  EXPECT_EQ(policy.history().rollbacks_to_step, 1);
  // A new run: its first failure is within the limit again.
  EXPECT_EQ(policy.OnStepFailed(StepAction::kSkip, 8, false).verdict, FaultVerdict::kSkip);
  EXPECT_EQ(policy.history().first_failed_step, 8);
}

}  // namespace
}  // namespace trainguard
