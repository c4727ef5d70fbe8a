// Generation entry's decisions (sdk/runtime/generation_entry.h), as pure functions on hand-made
// outcomes: no store, no communicator, no clock.
#include "sdk/runtime/generation_entry.h"

#include <optional>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "trainguard/membership.h"
#include "trainguard/runtime.h"

namespace trainguard {
namespace {

using Action = EntryRetryDecision::Action;

constexpr int kMax = Runtime::kMaxGenerationAttempts;

RecoveryPlan PlanWithSource(int source) {
  RecoveryPlan plan;
  plan.generation = 2;
  plan.resume_step = 40;
  plan.state_source_rank = source;
  return plan;
}

TEST(GenerationEntry, NothingCommittedIsAFreshJobNotAFailure) {
  EXPECT_EQ(ClassifyRestore(absl::NotFoundError("no committed checkpoint"), false),
            RestoreOutcome::kNothingCommitted);
  EXPECT_EQ(ClassifyRestore(absl::OkStatus(), false), RestoreOutcome::kRestored);
}

TEST(GenerationEntry, ARestoreAbortedIsTriedAgainOnlyWhenANewerGenerationExists) {
  const absl::Status aborted = absl::AbortedError("a peer left the collective restore");
  EXPECT_EQ(ClassifyRestore(aborted, /*superseded=*/true), RestoreOutcome::kSupersededMeanwhile);
  EXPECT_EQ(ClassifyRestore(aborted, /*superseded=*/false), RestoreOutcome::kFailed);
  // Committed state that cannot be read ends the entry, superseded or not: starting without it
  // would lose the job's progress.
  EXPECT_EQ(ClassifyRestore(absl::DataLossError("bad checksum"), true), RestoreOutcome::kFailed);
}

TEST(GenerationEntry, TheStateComesFromTheSourceRankUnlessRestoredAndIsLostWithoutOne) {
  EXPECT_EQ(DecideStateSource(/*restored=*/false, std::nullopt), StateSource::kOwn);
  EXPECT_EQ(DecideStateSource(/*restored=*/true, std::nullopt), StateSource::kOwn);
  EXPECT_EQ(DecideStateSource(false, PlanWithSource(1)), StateSource::kBroadcast);
  EXPECT_EQ(DecideStateSource(true, PlanWithSource(1)), StateSource::kOwn);
  // Every rank of the generation is new, and nothing was restored.
  EXPECT_EQ(DecideStateSource(false, PlanWithSource(-1)), StateSource::kLost);
  EXPECT_EQ(DecideStateSource(true, PlanWithSource(-1)), StateSource::kOwn);
}

TEST(GenerationEntry, OnlyTheRootOfAFailedBroadcastStillHasStateToOffer) {
  EXPECT_EQ(BroadcastFailure(/*rank=*/0, /*root=*/0), EntryFailure::kRetry);
  EXPECT_EQ(BroadcastFailure(/*rank=*/3, /*root=*/0), EntryFailure::kRetryWithoutState);
  const EntryRetryDecision root = DecideAfterFailedTry(EntryFailure::kRetry, true, 1, kMax, 40);
  EXPECT_EQ(root.action, Action::kRetry);
  EXPECT_EQ(root.offered_step, 40);
  const EntryRetryDecision other =
      DecideAfterFailedTry(EntryFailure::kRetryWithoutState, true, 1, kMax, 40);
  EXPECT_EQ(other.action, Action::kRetry);
  EXPECT_EQ(other.offered_step, -1);
}

TEST(GenerationEntry, FailedTriesAreRetriedUpToTheLimitThenGivenUp) {
  for (int attempts = 1; attempts < kMax; ++attempts) {
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, true, attempts, kMax, 7).action,
              Action::kRetry)
        << attempts;
  }
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, true, kMax, kMax, 7).action,
            Action::kGiveUp);
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetryWithoutState, true, kMax, kMax, 7).action,
            Action::kGiveUp);
}

TEST(GenerationEntry, AStaticJobNeverRetriesAndALostStateStopsTheJobWhateverTheAttempts) {
  // Without a store there is no next generation to meet in.
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kRetry, /*has_store=*/false, 1, kMax, 7).action,
            Action::kFail);
  EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kFinal, true, 1, kMax, 7).action, Action::kFail);
  for (int attempts = 1; attempts <= kMax; ++attempts) {
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kStopJob, true, attempts, kMax, 7).action,
              Action::kStopJob);
    EXPECT_EQ(DecideAfterFailedTry(EntryFailure::kStopJob, false, attempts, kMax, 7).action,
              Action::kStopJob);
  }
}

}  // namespace
}  // namespace trainguard
