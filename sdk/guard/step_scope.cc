// The guard: StepScope's entry, exit and fault classification. The happy path (an active scope
// whose body neither throws nor reports a fault) must stay allocation-free: bench/bench_guard and
// tests/unit/guard_allocation_test.cc hold it to that.
#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/runtime/runtime_impl.h"
#include "trainguard/clock.h"
#include "trainguard/errors.h"
#include "trainguard/guard.h"
#include "trainguard/runtime.h"

namespace trainguard {
namespace {

std::string Demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(mangled);
}

// What one exception says about the step.
struct Classification {
  FaultKind kind = FaultKind::kUnclassified;
  std::string what;
  std::vector<std::pair<std::string, std::string>> evidence;
};

Classification ClassifyException(const std::exception_ptr& exception) {
  Classification c;
  auto describe = [&c](const std::exception& e) {
    c.what = e.what();
    c.evidence.emplace_back("exception_type", Demangle(typeid(e).name()));
    c.evidence.emplace_back("what", c.what);
  };
  try {
    std::rethrow_exception(exception);
  } catch (const DeviceError& e) {
    describe(e);
    c.kind = e.sticky() ? FaultKind::kFatalDeviceError : FaultKind::kStepFailure;
    c.evidence.emplace_back("cuda_error", absl::StrCat(e.code()));
    c.evidence.emplace_back("sticky", e.sticky() ? "true" : "false");
  } catch (const NcclError& e) {
    describe(e);
    c.kind = e.is_device_fault() ? FaultKind::kFatalDeviceError : FaultKind::kCommunicationFailure;
    c.evidence.emplace_back("nccl_error", absl::StrCat(e.code()));
  } catch (const CommunicationError& e) {
    describe(e);
    c.kind = FaultKind::kCommunicationFailure;
    if (e.peer() >= 0) c.evidence.emplace_back("peer", absl::StrCat(e.peer()));
  } catch (const RecoverableError& e) {
    describe(e);
    c.kind = FaultKind::kStepFailure;
  } catch (const std::exception& e) {
    describe(e);
    c.kind = FaultKind::kUnclassified;
  } catch (...) {
    c.what = "an exception not derived from std::exception";
    c.evidence.emplace_back("exception_type", "unknown (not a std::exception)");
    c.kind = FaultKind::kUnclassified;
  }
  return c;
}

absl::StatusCode CodeFor(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone:
      return absl::StatusCode::kOk;
    case FaultKind::kStepFailure:
      return absl::StatusCode::kAborted;
    case FaultKind::kCommunicationFailure:
      return absl::StatusCode::kUnavailable;
    case FaultKind::kFatalDeviceError:
      return absl::StatusCode::kInternal;
    case FaultKind::kUnclassified:
      return absl::StatusCode::kUnknown;
    case FaultKind::kUsageError:
      return absl::StatusCode::kFailedPrecondition;
  }
  return absl::StatusCode::kUnknown;
}

// Fills the result for a step that failed with `kind` because of `what`.
void Fail(StepResult& result, int rank, FaultKind kind, absl::string_view what) {
  result.fault = kind;
  result.action = DefaultActionFor(kind);
  result.status =
      absl::Status(CodeFor(kind), absl::StrCat("rank ", rank, " step ", result.step, ": ",
                                               std::string(FaultKindName(kind)), ": ", what));
}

}  // namespace

int64_t Step::number() const { return scope_->step_; }
Runtime& Step::runtime() const { return scope_->runtime_; }
void Step::ReportFault(FaultKind kind, std::string_view message) {
  scope_->ReportFault(kind, message);
}

bool Step::CheckFinite(std::string_view buffer_name, const void* data, size_t count, DType dtype,
                       Device device, void* cuda_stream) {
  RuntimeImpl& rt = RuntimeImpl::Of(scope_->runtime_);
  if (device.kind == Device::Kind::kHost) {
    const FiniteCheckResult r = CheckFiniteHost(data, count, dtype);
    if (r.all_finite()) return true;
    scope_->ReportFault(
        FaultKind::kStepFailure,
        absl::StrCat("non-finite values in buffer \"",
                     absl::string_view(buffer_name.data(), buffer_name.size()), "\" on rank ",
                     rt.rank(), " at step ", scope_->step_, ": ", r.nonfinite_count, " of ", count,
                     " elements (", r.has_nan ? "nan" : "", r.has_nan && r.has_inf ? "," : "",
                     r.has_inf ? "inf" : "", "), first at index ", r.first_bad_index));
    return false;
  }
  FiniteChecker* checker = rt.finite_checker();
  absl::Status s = checker == nullptr
                       ? absl::FailedPreconditionError("no finite checker")
                       : checker->Check(buffer_name, data, count, dtype, device, cuda_stream);
  if (!s.ok()) {
    scope_->ReportFault(FaultKind::kStepFailure,
                        absl::StrCat("cannot check buffer \"",
                                     absl::string_view(buffer_name.data(), buffer_name.size()),
                                     "\" on rank ", rt.rank(), ": ", s.message()));
  }
  return true;
}

absl::Status Step::CheckReplicated(std::string_view name, const void* data, size_t bytes) {
  return RuntimeImpl::Of(scope_->runtime_).CheckReplicated(scope_->step_, name, data, bytes);
}

bool Step::CheckLoss(double loss) {
  RuntimeImpl& rt = RuntimeImpl::Of(scope_->runtime_);
  const std::optional<LossSpike> spike = rt.loss_spike_detector().Judge(scope_->step_, loss);
  if (!spike.has_value()) {
    rt.NoteLossAccepted(loss);
    return true;
  }
  if (spike->kind == LossSpike::Kind::kNonFinite) {
    scope_->ReportFault(FaultKind::kStepFailure,
                        absl::StrCat("loss is not finite (", loss, ") on rank ", rt.rank(),
                                     " at step ", scope_->step_));
  } else {
    scope_->ReportFault(
        FaultKind::kStepFailure,
        spike->log_scale
            ? absl::StrFormat("loss spike on rank %d at step %d: loss %g is %.1f scaled MADs above "
                              "the median %g of the last %d losses on the log scale (%.3gx the "
                              "median; scaled MAD of log(loss) %g)",
                              rt.rank(), scope_->step_, loss, spike->score, spike->median,
                              rt.loss_spike_detector().window_size(), loss / spike->median,
                              spike->mad)
            : absl::StrFormat("loss spike on rank %d at step %d: loss %g is %.1f scaled MADs above "
                              "the median %g of the last %d losses (scaled MAD %g)",
                              rt.rank(), scope_->step_, loss, spike->score, spike->median,
                              rt.loss_spike_detector().window_size(), spike->mad));
  }
  return false;
}

StepScope::StepScope(Runtime& facade, int64_t step)
    : runtime_(facade), step_(step), uncaught_at_entry_(std::uncaught_exceptions()) {
  RuntimeImpl& runtime = RuntimeImpl::Of(facade);
  if (runtime.fatal()) {
    rejection_ =
        absl::StrCat("guard rejected: the runtime is fatal since ", runtime.fatal_reason());
    return;
  }
  if (!runtime.TryBeginStep()) {
    rejection_ =
        "guard rejected: another guarded step is active on this runtime (guards do not nest)";
    return;
  }
  active_ = true;
  runtime.FenceSnapshot();
  if (Watchdog* watchdog = runtime.watchdog(); watchdog != nullptr) {
    watchdog->SetStep(step);
    watchdog->BeginPhase(kStepPhase);
  } else if (runtime.collectives() != nullptr) {
    runtime.collectives()->SetStep(step);
  }
  start_ns_ = runtime.clock().MonotonicNanos();
  runtime.mutable_heartbeat().Enter(step, start_ns_);
  if (const int64_t superseded = runtime.superseded_generation();
      superseded >= 0 && superseded == runtime.generation()) {
    superseded_at_entry_ = true;
    ReportFault(FaultKind::kCommunicationFailure,
                absl::StrFormat("generation %d was superseded before step %d began (a peer died, "
                                "asked for a re-rendezvous, or this rank was replaced): the step "
                                "is not run in it",
                                superseded, step));
  } else if (std::optional<std::string> repair = runtime.TakeRepairRequest(); repair) {
    // A silent-corruption repair: this rank leaves the generation before the step, as if it
    // were superseded; recover() asks for a new one and every rank restores there.
    superseded_at_entry_ = true;
    ReportFault(FaultKind::kCommunicationFailure,
                absl::StrFormat("step %d not run: %s", step, *repair));
  }
  for (StepObserver* observer : runtime.observers()) observer->OnStepBegin(step);
}

StepScope::~StepScope() {
  if (finished_) return;
  if (active_ && !exception_ && std::uncaught_exceptions() > uncaught_at_entry_) {
    ReportFault(
        FaultKind::kUnclassified,
        "an exception left the StepScope without RecordException() (the step was abandoned)");
  }
  (void)Finish();  // the result is in the event file
}

void StepScope::RecordException(std::exception_ptr exception) {
  if (!exception_) exception_ = std::move(exception);
}

void StepScope::ReportFault(FaultKind kind, std::string_view message) {  // NOLINT: failure path
  if (kind == FaultKind::kNone) return;
  // Keep the fault that asks for the most drastic action; the first one among equals.
  if (reported_kind_ == FaultKind::kNone ||
      DefaultActionFor(kind) > DefaultActionFor(reported_kind_)) {
    reported_kind_ = kind;
    reported_message_ = std::string(message);
  }
}

StepResult StepScope::Finish() {
  StepResult result;
  result.step = step_;
  if (finished_) {
    Fail(result, runtime_.rank(), FaultKind::kUsageError, "StepScope::Finish() called twice");
    return result;
  }
  finished_ = true;
  if (!active_) {
    Fail(result, runtime_.rank(), FaultKind::kUsageError, rejection_);
    result.evidence.emplace_back("reason", rejection_);
    RuntimeImpl::Of(runtime_).RecordStepFault(result);
    return result;
  }
  const int64_t end_ns = runtime_.clock().MonotonicNanos();
  result.duration = absl::Nanoseconds(end_ns - start_ns_);
  if (RuntimeImpl::Of(runtime_).existing_finite_checker() != nullptr) CollectDeviceChecks();
  std::optional<HangReport> hang;
  if (Watchdog* watchdog = runtime_.watchdog(); watchdog != nullptr) {
    watchdog->EndPhase();
    // A step that failed by itself takes a hang as it stands: waiting for the hang's handlers
    // (the dump of every thread's stack, then their verdict) would only delay the recovery.
    const bool failed = exception_ || reported_kind_ != FaultKind::kNone;
    RuntimeImpl::Of(runtime_).NoteStepEnding(failed);
    hang = failed ? watchdog->TakeHangNow() : watchdog->TakeHang();
    if (hang.has_value()) {
      ReportFault(FaultKind::kCommunicationFailure,
                  absl::StrCat("the watchdog declared a hang: ", hang->ToString()));
    }
  }
  if (exception_ || reported_kind_ != FaultKind::kNone) Classify(result);
  if (hang.has_value()) {
    result.evidence.emplace_back("hang_phase", hang->phase);
    result.evidence.emplace_back("hang_step", absl::StrCat(hang->step));
    if (hang->collective.has_value()) {
      result.evidence.emplace_back("hang_collective", hang->collective->op);
      result.evidence.emplace_back("hang_comm_seq", absl::StrCat(hang->collective->comm_seq));
    }
    result.evidence.insert(result.evidence.end(), hang->evidence.begin(), hang->evidence.end());
  }
  RuntimeImpl::Of(runtime_).mutable_heartbeat().Exit(end_ns - start_ns_, end_ns);
  RuntimeImpl::Of(runtime_).EndStep();
  // Before the snapshot the step may start: the window it saves holds this step's loss.
  RuntimeImpl::Of(runtime_).SettleLosses(result.ok());
  if (result.ok()) {
    RuntimeImpl::Of(runtime_).NoteStepSucceeded(step_);
    RuntimeImpl::Of(runtime_).MaybeCheckpoint(step_);
  } else {
    RuntimeImpl::Of(runtime_).RecordStepFault(result);
  }
  for (StepObserver* observer : RuntimeImpl::Of(runtime_).observers()) observer->OnStepEnd(result);
  return result;
}

void StepScope::CollectDeviceChecks() {
  absl::StatusOr<std::vector<BufferCheck>> checks =
      RuntimeImpl::Of(runtime_).existing_finite_checker()->Collect();
  if (!checks.ok()) {
    ReportFault(FaultKind::kStepFailure,
                absl::StrCat("collecting finite checks on rank ", runtime_.rank(), ": ",
                             checks.status().message()));
    return;
  }
  for (const BufferCheck& c : *checks) {
    if (c.pending || c.result.all_finite()) continue;
    ReportFault(FaultKind::kStepFailure,
                absl::StrCat("non-finite values in device buffer \"", c.buffer_name, "\" on rank ",
                             runtime_.rank(), " (checked at or before step ", step_,
                             "): ", c.result.nonfinite_count, " of ", c.count,
                             " elements, first at index ", c.result.first_bad_index));
  }
}

void StepScope::Classify(StepResult& result) const {
  FaultKind kind = reported_kind_;
  std::string what = reported_message_;
  if (exception_) {
    Classification c = ClassifyException(exception_);
    result.evidence = std::move(c.evidence);
    if (kind == FaultKind::kNone || DefaultActionFor(c.kind) > DefaultActionFor(kind)) {
      kind = c.kind;
      what = std::move(c.what);
    }
  }
  if (reported_kind_ != FaultKind::kNone) {
    result.evidence.emplace_back("reported_fault", std::string(FaultKindName(reported_kind_)));
    result.evidence.emplace_back("reported_message", reported_message_);
  }
  Fail(result, runtime_.rank(), kind, what);
}

}  // namespace trainguard
