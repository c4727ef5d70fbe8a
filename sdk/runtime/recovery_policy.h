// RecoveryPolicy: what recover() does about a failed step, decided from the step's action, the
// rank's run of consecutive failures and its rollbacks to the same committed step, and the limits
// of the options (private to sdk/runtime).
//
// The policy only counts and decides: it touches no store, no checkpoint and no thread, and never
// reads a clock. The Runtime carries out its verdicts (restores the newest committed checkpoint,
// meets the peers in a new generation, publishes job/stop) and words the events and errors. A
// decision is two questions when the step is rolled back, since what the rollback restores is only
// known once it is restored:
//
//   OnStepFailed(action, step, checkpointing)  -> continue | skip | rollback | re-rendezvous |
//                                                 fatal | stop the job | rollback impossible
//   OnRestored(restored, failed, first_failed) -> resume at the restored step | skip the batches
//                                                 up to the first failed step | stop the job
//
// Its whole state is a RecoveryHistory, a value: a test sets up any history and asks.
//
// Thread safety: none; it belongs to the training thread, as recover() does.
#ifndef TRAINGUARD_SDK_RUNTIME_RECOVERY_POLICY_H_
#define TRAINGUARD_SDK_RUNTIME_RECOVERY_POLICY_H_

#include <cstdint>

#include "trainguard/guard.h"
#include "trainguard/options.h"

namespace trainguard {

// The options recover() obeys.
struct RecoveryLimits {
  // Options::max_consecutive_step_failures: skipped steps in a row before the policy rolls back.
  int max_consecutive_step_failures = 3;
  // Options::max_rollbacks_per_step: rollbacks to the same committed step before the fault counts
  // as recurring.
  int max_rollbacks_per_step = 1;
  // Options::repeated_fault_action == "skip": a recurring fault skips the batches up to the first
  // failed step once, rather than stopping the job.
  bool skip_batches_on_repeat = false;

  static RecoveryLimits FromOptions(const Options& options);
};

// What the policy remembers between steps.
struct RecoveryHistory {
  static constexpr int64_t kNoRollback = INT64_MAX;
  int consecutive_failures = 0;
  int64_t first_failed_step = -1;  // the first step of the current run of failures
  // Rollbacks to the same committed step: the step (-1: none), how many, the failed step that
  // caused the last one (kNoRollback when none), and whether its batches were skipped already.
  int64_t rollback_step = -1;
  int rollbacks_to_step = 0;
  int64_t rollback_failed_step = kNoRollback;
  bool skipped_batches = false;

  friend bool operator==(const RecoveryHistory&, const RecoveryHistory&) = default;
};

class RecoveryPolicy {
 public:
  explicit RecoveryPolicy(RecoveryLimits limits, RecoveryHistory history = {})
      : limits_(limits), history_(history) {}

  // The answer to a step that ended with a StepAction.
  enum class FaultVerdict {
    kContinue,      // the step did not fail: run the next one
    kSkip,          // drop the step's update and run the next one (within the failure limit)
    kRollback,      // restore the newest committed checkpoint, then ask OnRestored
    kRollbackOff,   // the step asked for a rollback and checkpointing is off: an error for this
                    // process, not a verdict on the job
    kStopJob,       // too many consecutive failures and nothing to roll back to: the job stops
    kReRendezvous,  // meet the peers in a new generation
    kFatal,         // this process cannot go on
    kUnknown,       // an action this policy does not know
  };
  struct FaultDecision {
    FaultVerdict verdict = FaultVerdict::kFatal;
    // The failures in a row, this one included (what kStopJob reports).
    int consecutive_failures = 0;
    // kRollback: the first failed step of the run the rollback ends (what OnRestored is given).
    int64_t first_failed_step = -1;
  };
  // Counts the failure of `step` and decides. `checkpointing`: whether the Runtime checkpoints (a
  // rollback has something to restore). A kRollback verdict ends the run of failures.
  FaultDecision OnStepFailed(StepAction action, int64_t step, bool checkpointing);

  // The answer once the rollback restored a checkpoint.
  enum class RestoreVerdict {
    kResume,       // resume at the restored step
    kSkipBatches,  // the fault recurred: resume past the batches that led to it (once)
    kStopJob,      // the fault recurred past every remedy: the job stops
  };
  struct RestoreDecision {
    RestoreVerdict verdict = RestoreVerdict::kStopJob;
    int64_t next_step = -1;        // kResume, kSkipBatches: the step to run next
    int rollbacks_before = 0;      // kStopJob: rollbacks to the restored step before this one
    bool skipped_batches = false;  // kStopJob: whether the batches were skipped already
  };
  // Counts the rollback of the failed step `failed_step` to the committed step `restored_step`
  // and decides. `first_failed_step`: OnStepFailed's, for the rollback.
  RestoreDecision OnRestored(int64_t restored_step, int64_t failed_step, int64_t first_failed_step);

  // A step succeeded: the run of failures ends, and past the step whose failure caused the last
  // rollback the fault did not recur. Two compares: it runs after every step.
  void OnStepSucceeded(int64_t step) {
    history_.consecutive_failures = 0;
    if (step > history_.rollback_failed_step) ForgetRollbacks();
  }
  // The run of failures ends without a step's success: a kContinue result, or a new generation.
  void EndFailureRun() { history_.consecutive_failures = 0; }

  const RecoveryLimits& limits() const { return limits_; }
  const RecoveryHistory& history() const { return history_; }

 private:
  void ForgetRollbacks();
  // One more failure in a row.
  void CountFailure(int64_t step);

  RecoveryLimits limits_;
  RecoveryHistory history_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_RECOVERY_POLICY_H_
