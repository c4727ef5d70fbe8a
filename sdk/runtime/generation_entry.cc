#include "sdk/runtime/generation_entry.h"

namespace trainguard {

RestoreOutcome ClassifyRestore(const absl::Status& restore, bool superseded) {
  if (restore.ok()) return RestoreOutcome::kRestored;
  if (absl::IsNotFound(restore)) return RestoreOutcome::kNothingCommitted;
  // Aborted alone is no reason to try again: only a newer generation, where the others meet, is.
  if (absl::IsAborted(restore) && superseded) return RestoreOutcome::kSupersededMeanwhile;
  // Committed state exists and cannot be restored: starting without it would silently lose the
  // job's progress.
  return RestoreOutcome::kFailed;
}

StateSource DecideStateSource(bool restored, const std::optional<RecoveryPlan>& plan) {
  if (restored || !plan.has_value()) return StateSource::kOwn;
  return plan->state_source_rank >= 0 ? StateSource::kBroadcast : StateSource::kLost;
}

EntryFailure BroadcastFailure(int rank, int root) {
  return rank == root ? EntryFailure::kRetry : EntryFailure::kRetryWithoutState;
}

EntryRetryDecision DecideAfterFailedTry(EntryFailure failure, bool has_store, int attempts,
                                        int max_attempts, int64_t ready_step) {
  using Action = EntryRetryDecision::Action;
  if (failure == EntryFailure::kStopJob) return {Action::kStopJob};
  if (failure == EntryFailure::kFinal || !has_store) return {Action::kFail};
  if (attempts >= max_attempts) return {Action::kGiveUp};
  // A rank whose state a failed broadcast overwrote has none to offer.
  return {Action::kRetry, failure == EntryFailure::kRetryWithoutState ? int64_t{-1} : ready_step};
}

}  // namespace trainguard
