// sdk::guard: runs one train step and turns whatever goes wrong in it into a classified StepResult.
//
//     sdk::StepResult r = sdk::guard(*rt, step, [&](sdk::Step& s) { ...train step... });
//     if (!r.ok()) { absl::StatusOr<int64_t> next = rt->recover(r); ... }
//
// The guard times the step, beats the Runtime's heartbeat on entry and exit (the seam a watchdog
// reads), notifies StepObservers, catches everything the body throws, classifies it (see errors.h),
// writes a kStepFault Event with the evidence, and returns. It never swallows a fault (a failure is
// always in the result and in the event file), never terminates the process and never longjmps:
// what to do next is the trainer's decision, helped by Runtime::recover().
//
// Guards do not nest: a guard entered on a Runtime while another step is active on it (on any
// thread) does not run its body and returns a kUsageError result. After a fatal device error (a
// sticky CUDA error), every later guard on the Runtime is rejected the same way: such a process
// cannot train on.
//
// StepScope is the same thing as an RAII object for trainers that cannot pass a lambda.
//
// Cost: on the happy path the guard allocates nothing, performs no system call other than reading
// the monotonic clock (vDSO), and does no device synchronisation (bench/bench_guard measures it).
//
// Thread safety: a guard runs on the calling thread. Step and StepScope belong to that thread.
#ifndef TRAINGUARD_GUARD_H_
#define TRAINGUARD_GUARD_H_

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

class Runtime;
class StepScope;

enum class FaultKind {
  kNone = 0,
  kStepFailure = 1,           // RecoverableError, Step::ReportFault, a non-sticky device error
  kCommunicationFailure = 2,  // CommunicationError, NcclError (other than an unhandled CUDA error)
  kFatalDeviceError = 3,      // a sticky CUDA error: the process's device context is lost
  kUnclassified = 4,  // any other exception: its safety is unknown, so it is treated as fatal
  kUsageError = 5,    // the guard itself was misused (nested guards, a guard after a fatal fault)
};

// What the trainer should do about a step. recover() carries it out as far as the SDK can.
enum class StepAction {
  kContinue = 0,      // the step succeeded
  kSkip = 1,          // drop this step's update and go on with the next step
  kRollback = 2,      // restore the last committed checkpoint (needs checkpointing)
  kReRendezvous = 3,  // rebuild the job's communicators with the surviving and replacement ranks
  kFatal = 4,         // this process cannot continue; exit and let the launcher replace it
};

std::string_view FaultKindName(FaultKind kind);      // "none", "step_failure", ...
std::string_view StepActionName(StepAction action);  // "continue", "skip", ...
// The action the guard attaches to each kind of fault.
StepAction DefaultActionFor(FaultKind kind);

struct StepResult {
  int64_t step = -1;
  StepAction action = StepAction::kContinue;
  FaultKind fault = FaultKind::kNone;
  // OK on success; otherwise a message naming the rank, the step and what failed.
  absl::Status status;
  // Evidence as ordered key/value pairs, e.g. {"exception_type", "trainguard::DeviceError"},
  // {"what", "..."}, {"cuda_error", "700"}, {"sticky", "true"}. Empty on success.
  std::vector<std::pair<std::string, std::string>> evidence;
  absl::Duration duration;  // wall time the step took, measured on the monotonic clock

  bool ok() const { return action == StepAction::kContinue; }
  // The value of evidence `key`, or "" when absent.
  std::string_view Evidence(std::string_view key) const;
};

// The handle a step body receives.
class Step {
 public:
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  int64_t number() const;
  Runtime& runtime() const;

  // Marks the step failed without throwing (e.g. a non-finite loss seen on the host). The body goes
  // on running; the guard reports the most severe fault of the step. REQUIRES: kind != kNone.
  void ReportFault(FaultKind kind, std::string_view message);

  // Checks a buffer for NaN/Inf, meant for gradients before their reduction so that the rank where
  // a non-finite value was born is the one named. A host buffer is checked now (vectorised); a CUDA
  // buffer by a kernel on `cuda_stream` whose result is read when the step ends, without
  // synchronising (a check still running then is reported at the end of a later step). A
  // non-finite buffer fails the step (kStepFailure) with a message naming the buffer, the rank, the
  // step, the count of bad elements and the first bad index. Returns false when a host buffer is
  // not finite (true for a device buffer: its answer comes later).
  bool CheckFinite(std::string_view buffer_name, const void* data, size_t count, DType dtype,
                   Device device = Device::Host(), void* cuda_stream = nullptr);

  // Judges this step's loss against the recent ones (the Runtime's LossSpikeDetector, tuned by the
  // loss_spike_* options). A NaN or Inf loss, or a spike (more than loss_spike_mads scaled MADs
  // above the median of the window), fails the step (kStepFailure) with a message naming the rank,
  // the step, the loss, the median and the score, and returns false. A loss enters the window only
  // when its step succeeds, so the replay of a failed step is judged as its first try was; the
  // window is part of every checkpoint (Runtime::LossWindowState). Call it once per step, with the
  // loss this rank computed.
  bool CheckLoss(double loss);

  // Silent data corruption: compares a host buffer that every rank of this rank's data-parallel
  // group must hold bit-identical at this point, typically the gradients right after their
  // reduction, across the group, out of band (two requests to the job's store; the group's last
  // rank to call it reads the others'). A rank whose buffer differs from its group's majority is
  // named with `name` (a silent_corruption event, a line of `trainguard run`), and with
  // silent_corruption=repair or evict every rank goes back to the last committed snapshot (at its
  // next guard) as after a disagreeing snapshot; the step itself is not failed. Every rank of the
  // group calls it with the same `name`, once per step. Nothing is compared without a store or
  // with silent_corruption=off. InvalidArgument for an empty name; the store's error otherwise.
  absl::Status CheckReplicated(std::string_view name, const void* data, size_t bytes);

 private:
  friend class StepScope;
  explicit Step(StepScope* scope) : scope_(scope) {}
  StepScope* const scope_;
};

// RAII form of the guard:
//
//     sdk::StepScope scope(*rt, step);
//     if (scope.active() && !scope.superseded_at_entry()) {
//       try { train_step(scope.step()); } catch (...) {
//       scope.RecordException(std::current_exception()); }
//     }
//     sdk::StepResult r = scope.Finish();
//
// If the owner never calls Finish(), the destructor does, and a step left by an exception that the
// owner did not record is reported as a kUnclassified fault in the event file.
class StepScope {
 public:
  StepScope(Runtime& runtime, int64_t step);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  // False when the guard was rejected (see the header comment): the step body must not run.
  bool active() const { return active_; }
  // True when this rank's generation was already superseded when the step began (a newer one was
  // published: a peer died, or this rank was itself replaced while it ran). The step has failed
  // (kCommunicationFailure) before its body: guard() does not run the body, and a step that runs
  // no collective (which would fail on its own) cannot go on alone in the old generation;
  // recover() takes the rank to the next generation, or tells it that it was replaced. Also true
  // when this rank leaves its generation to repair a silent data corruption (silent_corruption =
  // repair): the same failure, and recover() takes every rank back to the last committed snapshot.
  bool superseded_at_entry() const { return superseded_at_entry_; }
  Step& step() { return handle_; }

  // Records an exception thrown by the body; classified by Finish().
  void RecordException(std::exception_ptr exception);
  // Same as Step::ReportFault.
  void ReportFault(FaultKind kind, std::string_view message);

  // Ends the step and returns its result. A second call returns a kUsageError result.
  StepResult Finish();

 private:
  friend class Step;

  // Reads the device finite checks that finished; a non-finite one is reported as a fault.
  void CollectDeviceChecks();
  // Turns the recorded exception and reported fault into the result's fault, action and evidence.
  void Classify(StepResult& result) const;

  Runtime& runtime_;
  const int64_t step_;
  const int uncaught_at_entry_;
  int64_t start_ns_ = 0;
  bool active_ = false;
  bool superseded_at_entry_ = false;
  bool finished_ = false;
  Step handle_{this};
  std::exception_ptr exception_;
  FaultKind reported_kind_ = FaultKind::kNone;
  std::string reported_message_;
  std::string rejection_;  // why the scope is inactive
};

// Runs `body` as step `step` of `runtime`. `body` is invocable as body(Step&) or body().
template <typename Body>
StepResult guard(Runtime& runtime, int64_t step, Body&& body) {
  static_assert(std::is_invocable_v<Body&, Step&> || std::is_invocable_v<Body&>,
                "the guarded body must be callable as body(sdk::Step&) or body()");
  StepScope scope(runtime, step);
  if (scope.active() && !scope.superseded_at_entry()) {
    try {
      if constexpr (std::is_invocable_v<Body&, Step&>) {
        body(scope.step());
      } else {
        body();
      }
    } catch (...) {
      scope.RecordException(std::current_exception());
    }
  }
  return scope.Finish();
}

}  // namespace trainguard

#endif  // TRAINGUARD_GUARD_H_
