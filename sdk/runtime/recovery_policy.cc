#include "sdk/runtime/recovery_policy.h"

#include <algorithm>

namespace trainguard {

RecoveryLimits RecoveryLimits::FromOptions(const Options& options) {
  return RecoveryLimits{.max_consecutive_step_failures = options.max_consecutive_step_failures,
                        .max_rollbacks_per_step = options.max_rollbacks_per_step,
                        .skip_batches_on_repeat = options.repeated_fault_action == "skip"};
}

void RecoveryPolicy::ForgetRollbacks() {
  history_.rollback_step = -1;
  history_.rollbacks_to_step = 0;
  history_.rollback_failed_step = RecoveryHistory::kNoRollback;
  history_.skipped_batches = false;
}

void RecoveryPolicy::CountFailure(int64_t step) {
  if (history_.consecutive_failures++ == 0) history_.first_failed_step = step;
}

RecoveryPolicy::FaultDecision RecoveryPolicy::OnStepFailed(StepAction action, int64_t step,
                                                           bool checkpointing) {
  FaultDecision d;
  bool rollback = false;
  switch (action) {
    case StepAction::kContinue:
      d.verdict = FaultVerdict::kContinue;
      return d;
    case StepAction::kSkip:
      CountFailure(step);
      d.consecutive_failures = history_.consecutive_failures;
      if (history_.consecutive_failures <= limits_.max_consecutive_step_failures) {
        d.verdict = FaultVerdict::kSkip;
        return d;
      }
      // Too many in a row: roll back, or, with nothing to roll back to, stop.
      if (!checkpointing) {
        d.verdict = FaultVerdict::kStopJob;
        return d;
      }
      rollback = true;
      break;
    case StepAction::kRollback:
      CountFailure(step);
      d.consecutive_failures = history_.consecutive_failures;
      if (!checkpointing) {
        d.verdict = FaultVerdict::kRollbackOff;
        return d;
      }
      rollback = true;
      break;
    case StepAction::kReRendezvous:
      d.verdict = FaultVerdict::kReRendezvous;
      return d;
    case StepAction::kFatal:
      d.verdict = FaultVerdict::kFatal;
      return d;
  }
  if (!rollback) {
    d.verdict = FaultVerdict::kUnknown;
    return d;
  }
  // The rollback ends the run of failures, whatever it restores.
  d.verdict = FaultVerdict::kRollback;
  d.first_failed_step = history_.first_failed_step >= 0 ? history_.first_failed_step : step;
  history_.consecutive_failures = 0;
  history_.first_failed_step = -1;
  return d;
}

RecoveryPolicy::RestoreDecision RecoveryPolicy::OnRestored(int64_t restored_step,
                                                           int64_t failed_step,
                                                           int64_t first_failed_step) {
  if (restored_step != history_.rollback_step) {
    ForgetRollbacks();
    history_.rollback_step = restored_step;
  }
  ++history_.rollbacks_to_step;
  history_.rollback_failed_step = failed_step;
  RestoreDecision d;
  if (history_.rollbacks_to_step <= limits_.max_rollbacks_per_step) {
    d.verdict = RestoreVerdict::kResume;
    d.next_step = restored_step;
    return d;
  }
  if (limits_.skip_batches_on_repeat && !history_.skipped_batches) {
    // The replay reproduces the state that failed; going on without the batches that led to it
    // (PaLM's remedy for loss spikes) is the trainer's choice, made by the option.
    history_.skipped_batches = true;
    d.verdict = RestoreVerdict::kSkipBatches;
    d.next_step = std::max(first_failed_step + 1, restored_step);
    return d;
  }
  d.verdict = RestoreVerdict::kStopJob;
  d.rollbacks_before = history_.rollbacks_to_step - 1;
  d.skipped_batches = history_.skipped_batches;
  return d;
}

}  // namespace trainguard
