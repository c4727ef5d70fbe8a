// trainguard._C.Runtime, StepScope and StepResult: the C++ Runtime and guard, with DLPack buffers.
//
// Buffers arrive as DLPack tensors (torch, numpy, anything with __dlpack__): host, pinned host
// (cuda_host) or CUDA memory. The registry keeps raw pointers, so the Runtime object holds every
// registered ndarray (and so the producer's storage) until close().
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bindings.h"
#include "status_error.h"
#include "store_binding.h"
#include "trainguard/checkpoint.h"
#include "trainguard/collectives.h"
#include "trainguard/events.h"
#include "trainguard/guard.h"
#include "trainguard/options.h"
#include "trainguard/runtime.h"
#include "trainguard/watchdog.h"

namespace nb = nanobind;

namespace trainguard::python {
namespace {

using Array = nb::ndarray<>;

// Keeps the last RecoveryReport (Start(), recover()) for Python to read.
class RecoveryRecorder final : public StepObserver {
 public:
  void OnStepBegin(int64_t) override {}
  void OnStepEnd(const StepResult&) override {}
  void OnRecovery(const RecoveryReport& report) override { last_ = report; }
  const std::optional<RecoveryReport>& last() const { return last_; }

 private:
  std::optional<RecoveryReport> last_;
};

struct BufferView {
  void* data = nullptr;
  size_t bytes = 0;
  size_t count = 0;
  DType dtype = DType::kU8;
  bool known_dtype = true;  // false: registered as raw bytes (bool, int8, int16, complex, ...)
  std::vector<int64_t> shape;
  Device device;
};

// The dtype an SDK buffer records for a DLPack dtype; nullopt for those it has no name for.
std::optional<DType> DTypeOf(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return std::nullopt;
  const auto code = static_cast<Code>(t.code);
  if (code == Code::Float && t.bits == 32) return DType::kF32;
  if (code == Code::Float && t.bits == 16) return DType::kF16;
  if (code == Code::Float && t.bits == 64) return DType::kF64;
  if (code == Code::Bfloat && t.bits == 16) return DType::kBF16;
  if (code == Code::Int && t.bits == 32) return DType::kI32;
  if (code == Code::Int && t.bits == 64) return DType::kI64;
  if (code == Code::UInt && t.bits == 8) return DType::kU8;
  return std::nullopt;
}

// The memory of `a` as one span of bytes. A tensor whose elements fill a span without gaps in some
// order of its dimensions (contiguous, transposed, permuted) is accepted and recorded flat; one
// with gaps (a slice) cannot be snapshotted in place and is refused, naming `name`.
BufferView ViewOf(const std::string& name, const Array& a) {
  BufferView v;
  const int32_t device_type = a.device_type();
  if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value) {
    v.device = Device::Host();
  } else if (device_type == nb::device::cuda::value) {
    v.device = Device::Cuda(a.device_id());
  } else {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("buffer '", name, "': DLPack device type ", device_type,
                     " is not supported (cpu, pinned cpu and cuda are)")));
  }
  const nb::dlpack::dtype t = a.dtype();
  const size_t item = (static_cast<size_t>(t.bits) * t.lanes + 7) / 8;
  std::optional<DType> dtype = DTypeOf(t);
  v.count = a.size();
  v.bytes = v.count * item;
  v.data = const_cast<void*>(a.data());

  // Dimensions ordered by stride: each stride must be the product of the sizes below it.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size), size-1 dimensions left out
  bool contiguous = true;
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) == 1) continue;
    if (a.stride(i) != expected) contiguous = false;
    expected *= a.shape(i);
    dims.emplace_back(a.stride(i), a.shape(i));
  }
  if (!contiguous) {
    std::sort(dims.begin(), dims.end());
    int64_t span = 1;
    for (const auto& [stride, size] : dims) {
      if (stride != span) {
        throw StatusError(absl::InvalidArgumentError(absl::StrCat(
            "buffer '", name,
            "': its elements do not fill one span of memory (a slice or a strided view); "
            "register the tensor it views, or a contiguous copy that training uses")));
      }
      span *= size;
    }
  }
  if (dtype.has_value()) {
    v.dtype = *dtype;
    if (contiguous) {
      for (size_t i = 0; i < a.ndim(); ++i) v.shape.push_back(a.shape(i));
    } else {
      v.shape = {static_cast<int64_t>(v.count)};
    }
  } else {
    v.known_dtype = false;
    v.dtype = DType::kU8;
    v.shape = {static_cast<int64_t>(v.bytes)};
  }
  return v;
}

// The aborts the watchdog asks of communicators registered from Python. The watchdog's thread
// must never wait for the GIL (the training thread may hold it while hung), so the abort function
// it calls only queues the communicator's id here; a Python thread of trainguard.torch waits for
// the request (GIL released) and aborts the torch process group. The Runtime's superseded handler
// wakes that thread the same way (Wake), so that it aborts a superseded generation's group at once.
// Thread-safe.
class AbortRequests {
 public:
  void Request(uint64_t comm_id) {
    absl::MutexLock lock(&mu_);
    pending_.push_back(comm_id);
  }
  // Ends the current (or the next) Wait early, with nullopt.
  void Wake() {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }
  // The next requested id, or nullopt after `timeout`, after a Wake or once closed.
  std::optional<uint64_t> Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return closed_ || woken_ || !pending_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    woken_ = false;
    if (pending_.empty()) return std::nullopt;
    const uint64_t id = pending_.front();
    pending_.erase(pending_.begin());
    return id;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  bool closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

class PyRuntime {
 public:
  explicit PyRuntime(const Options& options) {
    std::unique_ptr<Runtime> rt;
    {
      nb::gil_scoped_release release;
      rt = ValueOrThrow(Runtime::Create(options));
      rt->AddObserver(&recorder_);
      rt->AddSupersededHandler([aborts = aborts_](int64_t) { aborts->Wake(); });
    }
    runtime_ = std::move(rt);
  }
  ~PyRuntime() { Close(); }

  Runtime& get() const {
    if (runtime_ == nullptr) {
      throw StatusError(absl::FailedPreconditionError("trainguard Runtime: closed"));
    }
    return *runtime_;
  }

  void RegisterBuffer(const std::string& name, const std::string& group, Array array,
                      bool replicated) {
    BufferView v = ViewOf(name, array);
    StateBuffer b;
    b.name = name;
    b.group = group;
    b.replicated = replicated;
    b.data = v.data;
    b.bytes = v.bytes;
    b.dtype = v.dtype;
    b.shape = v.shape;
    b.device = v.device;
    ThrowIfError(get().state().Register(std::move(b)));
    arrays_.push_back(std::move(array));
  }

  // Waits for the checkpoint in flight, destroys the Runtime (joins its threads), then lets go of
  // the registered arrays.
  void Close() {
    aborts_->Close();
    if (runtime_ != nullptr) {
      nb::gil_scoped_release release;
      (void)runtime_->WaitForCheckpoints(absl::Minutes(10));
      runtime_.reset();
    }
    arrays_.clear();
  }
  bool closed() const { return runtime_ == nullptr; }
  const std::shared_ptr<AbortRequests>& aborts() const { return aborts_; }

  nb::object LastRecovery() const {
    if (!recorder_.last().has_value()) return nb::none();
    const RecoveryReport& r = *recorder_.last();
    nb::dict d;
    d["failed_step"] = r.failed_step;
    d["decision"] = r.decision;
    d["ok"] = r.status.ok();
    d["message"] = std::string(r.status.message());
    d["next_step"] = r.next_step;
    d["restored_from"] = r.restored_from;
    d["restore_skipped"] = r.restore_skipped;
    d["generation"] = r.generation;
    d["joined_generation"] = r.joined_generation;
    d["state_source_rank"] = r.state_source_rank;
    d["job_stopped"] = r.job_stopped;
    return d;
  }

 private:
  RecoveryRecorder recorder_;  // outlives runtime_ (declared first, destroyed last)
  std::unique_ptr<Runtime> runtime_;
  std::vector<Array> arrays_;
  std::shared_ptr<AbortRequests> aborts_ = std::make_shared<AbortRequests>();
};

class PyStepScope {
 public:
  PyStepScope(PyRuntime& runtime, int64_t step) {
    Runtime& rt = runtime.get();
    nb::gil_scoped_release release;  // the guard entry fences the previous snapshot
    scope_ = std::make_unique<StepScope>(rt, step);
  }

  bool active() const { return scope_ != nullptr && scope_->active(); }
  bool superseded_at_entry() const { return scope_ != nullptr && scope_->superseded_at_entry(); }

  void ReportFault(int kind, const std::string& message) {
    if (kind <= 0 || kind > static_cast<int>(FaultKind::kUsageError)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat("report_fault: kind ", kind)));
    }
    Scope().ReportFault(static_cast<FaultKind>(kind), message);
  }

  bool CheckLoss(double loss) { return Scope().step().CheckLoss(loss); }

  bool CheckFinite(const std::string& name, const Array& array, uintptr_t cuda_stream) {
    BufferView v = ViewOf(name, array);
    if (!v.known_dtype || (v.dtype != DType::kF32 && v.dtype != DType::kF16 &&
                           v.dtype != DType::kBF16 && v.dtype != DType::kF64)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "check_finite('", name, "'): a floating-point buffer is needed (float32, float16, "
          "bfloat16, float64)")));
    }
    StepScope& scope = Scope();
    nb::gil_scoped_release release;
    return scope.step().CheckFinite(name, v.data, v.count, v.dtype, v.device,
                                    reinterpret_cast<void*>(cuda_stream));
  }

  void CheckReplicated(const std::string& name, const Array& array) {
    BufferView v = ViewOf(name, array);
    if (v.device.kind != Device::Kind::kHost) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("check_replicated('", name,
                       "'): a host buffer is needed (copy a device tensor to the "
                       "CPU first)")));
    }
    StepScope& scope = Scope();
    nb::gil_scoped_release release;
    ThrowIfError(scope.step().CheckReplicated(name, v.data, v.bytes));
  }

  StepResult Finish() {
    StepScope& scope = Scope();
    StepResult r;
    {
      nb::gil_scoped_release release;  // may begin a snapshot
      r = scope.Finish();
    }
    scope_.reset();
    return r;
  }

 private:
  StepScope& Scope() {
    if (scope_ == nullptr) {
      throw StatusError(absl::FailedPreconditionError("the step has already finished"));
    }
    return *scope_;
  }
  std::unique_ptr<StepScope> scope_;
};

CollectiveTracker& Tracker(PyRuntime& r) {
  CollectiveTracker* t = r.get().collectives();
  if (t == nullptr) {
    throw StatusError(absl::FailedPreconditionError(
        absl::StrCat("rank ", r.get().rank(), ": this Runtime has no collective tracker")));
  }
  return *t;
}

Options OptionsFromTextproto(const std::string& text) {
  return ValueOrThrow(Options::FromTextproto(text, "trainguard.Runtime(...)"));
}

}  // namespace

void BindRuntime(nb::module_& m) {
  m.attr("FAULT_STEP_FAILURE") = static_cast<int>(FaultKind::kStepFailure);
  m.attr("FAULT_COMMUNICATION_FAILURE") = static_cast<int>(FaultKind::kCommunicationFailure);
  m.attr("FAULT_FATAL_DEVICE_ERROR") = static_cast<int>(FaultKind::kFatalDeviceError);
  m.attr("FAULT_UNCLASSIFIED") = static_cast<int>(FaultKind::kUnclassified);
  // The names of trainguard's event kinds (EventKindName, in declaration order): trainguard.EventKind.
  std::vector<std::string> kinds;
  for (EventKind kind : AllEventKinds()) kinds.emplace_back(EventKindName(kind));
  m.attr("EVENT_KINDS") = kinds;

  nb::class_<StepResult>(m, "StepResult", "The outcome of one guarded step.")
      .def_ro("step", &StepResult::step)
      .def_prop_ro("ok", &StepResult::ok)
      .def_prop_ro("fault", [](const StepResult& r) { return std::string(FaultKindName(r.fault)); })
      .def_prop_ro("action",
                   [](const StepResult& r) { return std::string(StepActionName(r.action)); })
      .def_prop_ro("message", [](const StepResult& r) { return std::string(r.status.message()); })
      .def_prop_ro("evidence",
                   [](const StepResult& r) {
                     std::map<std::string, std::string> e(r.evidence.begin(), r.evidence.end());
                     return e;
                   })
      .def_prop_ro("duration",
                   [](const StepResult& r) { return absl::ToDoubleSeconds(r.duration); })
      .def("__repr__", [](const StepResult& r) {
        return absl::StrCat("StepResult(step=", r.step, ", ok=", r.ok() ? "True" : "False",
                            ", fault='", std::string(FaultKindName(r.fault)), "', action='",
                            std::string(StepActionName(r.action)), "', message=", "'",
                            std::string(r.status.message()), "')");
      });

  nb::class_<PyStepScope>(m, "StepScope")
      .def(nb::init<PyRuntime&, int64_t>(), nb::arg("runtime"), nb::arg("step"),
           nb::keep_alive<1, 2>())
      .def_prop_ro("active", &PyStepScope::active)
      .def_prop_ro("superseded_at_entry", &PyStepScope::superseded_at_entry)
      .def("report_fault", &PyStepScope::ReportFault, nb::arg("kind"), nb::arg("message"))
      .def("check_loss", &PyStepScope::CheckLoss, nb::arg("loss"))
      .def("check_replicated", &PyStepScope::CheckReplicated, nb::arg("name"), nb::arg("array"))
      .def("check_finite", &PyStepScope::CheckFinite, nb::arg("name"), nb::arg("array"),
           nb::arg("cuda_stream") = 0)
      .def("finish", &PyStepScope::Finish);

  nb::class_<PyRuntime>(m, "Runtime")
      .def_static(
          "from_textproto",
          [](const std::string& text) { return new PyRuntime(OptionsFromTextproto(text)); },
          nb::arg("text"), nb::rv_policy::take_ownership)
      .def_static(
          "from_environment",
          [](const std::map<std::string, std::string>& variables) {
            return new PyRuntime(ValueOrThrow(Options::FromEnvironment(variables)));
          },
          nb::arg("variables"), nb::rv_policy::take_ownership)
      .def_prop_ro("rank", [](const PyRuntime& r) { return r.get().rank(); })
      .def_prop_ro("world_size", [](const PyRuntime& r) { return r.get().world_size(); })
      .def_prop_ro("local_world_size",
                   [](const PyRuntime& r) {
                     const Options& o = r.get().options();
                     return o.local_world_size > 0 ? o.local_world_size : r.get().world_size();
                   })
      .def_prop_ro("role", [](const PyRuntime& r) { return r.get().options().role; })
      .def_prop_ro("recovery_plan",
                   [](const PyRuntime& r) -> nb::object {
                     const std::optional<RecoveryPlan>& plan = r.get().recovery_plan();
                     if (!plan.has_value()) return nb::none();
                     nb::dict d;
                     d["generation"] = plan->generation;
                     d["resume_step"] = plan->resume_step;
                     d["state_source_rank"] = plan->state_source_rank;
                     d["new_ranks"] = plan->new_ranks;
                     return d;
                   })
      .def_prop_ro("generation", [](const PyRuntime& r) { return r.get().generation(); })
      .def_prop_ro("job_id", [](const PyRuntime& r) { return r.get().options().job_id; })
      .def_prop_ro("run_dir", [](const PyRuntime& r) { return r.get().run_dir(); })
      .def_prop_ro("checkpointing", [](const PyRuntime& r) { return r.get().checkpointing(); })
      .def(
          "checkpoint_due_after",
          [](const PyRuntime& r, int64_t step) { return r.get().CheckpointDueAfter(step); },
          nb::arg("step"))
      .def_prop_ro("local_rank",
                   [](const PyRuntime& r) {
                     // A standby learns its rank when it is assigned; ranks are laid out host by
                     // host, local_world_size per host (as trainguard run and torchrun do).
                     const Options& o = r.get().options();
                     if (o.role == "rank") return o.local_rank;
                     const int per_host = o.local_world_size > 0 ? o.local_world_size
                                                                 : r.get().world_size();
                     return r.get().rank() % per_host;
                   })
      .def_prop_ro("fatal", [](const PyRuntime& r) { return r.get().fatal(); })
      .def_prop_ro("superseded_generation",
                   [](PyRuntime& r) { return r.get().superseded_generation(); })
      .def_prop_ro("closed", &PyRuntime::closed)
      .def_prop_ro("last_restore_source",
                   [](const PyRuntime& r) { return r.get().last_restore_source(); })
      .def_prop_ro("last_recovery", &PyRuntime::LastRecovery)
      .def("resume_step", [](const PyRuntime& r) { return r.get().resume_step(); })
      .def("start",
           [](PyRuntime& r) {
             Runtime& rt = r.get();
             nb::gil_scoped_release release;
             return ValueOrThrow(rt.Start());
           })
      .def(
          "recover",
          [](PyRuntime& r, const StepResult& result) {
            Runtime& rt = r.get();
            nb::gil_scoped_release release;
            return ValueOrThrow(rt.recover(result));
          },
          nb::arg("result"))
      .def("restore_checkpoint",
           [](PyRuntime& r) {
             Runtime& rt = r.get();
             nb::gil_scoped_release release;
             return ValueOrThrow(rt.RestoreCheckpoint());
           })
      .def(
          "checkpoint",
          [](PyRuntime& r, int64_t resume_step) {
            Runtime& rt = r.get();
            nb::gil_scoped_release release;
            ThrowIfError(rt.Checkpoint(resume_step));
          },
          nb::arg("resume_step"))
      .def(
          "wait_for_checkpoints",
          [](PyRuntime& r, double timeout) {
            Runtime& rt = r.get();
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            ThrowIfError(rt.WaitForCheckpoints(t));
          },
          nb::arg("timeout"))
      .def("register_buffer", &PyRuntime::RegisterBuffer, nb::arg("name"), nb::arg("group"),
           nb::arg("array"), nb::arg("replicated") = false)
      .def(
          "set_blob",
          [](PyRuntime& r, const std::string& name, const nb::bytes& value) {
            ThrowIfError(r.get().state().SetBlob(name, std::string(value.c_str(), value.size())));
          },
          nb::arg("name"), nb::arg("value"))
      .def(
          "get_blob",
          [](PyRuntime& r, const std::string& name) {
            std::string v = ValueOrThrow(r.get().state().GetBlob(name));
            return nb::bytes(v.data(), v.size());
          },
          nb::arg("name"))
      // Runtime::LossWindowState / LoadLossWindow: the check_loss window, which
      // trainguard.torch.broadcast_state passes from the source rank to a replacement.
      .def("loss_window_state",
           [](PyRuntime& r) {
             std::string v = r.get().LossWindowState();
             return nb::bytes(v.data(), v.size());
           })
      .def(
          "load_loss_window",
          [](PyRuntime& r, const nb::bytes& state) {
            ThrowIfError(r.get().LoadLossWindow(std::string_view(state.c_str(), state.size())));
          },
          nb::arg("state"))
      .def("buffer_names",
           [](PyRuntime& r) {
             std::vector<std::string> names;
             for (const StateBuffer& b : r.get().state().buffers()) names.push_back(b.name);
             return names;
           })
      // Runtime::EmitEvent: an event in this rank's event file, with the rank, generation and
      // time filled in; `step` -1 when not tied to a step. With `kind` (an EventKindName), an
      // event of that kind (EventOfKind: its type, what=<kind> first); without, a custom one.
      .def(
          "emit_event",
          [](PyRuntime& r, const std::string& message, int64_t step,
             const std::map<std::string, std::string>& attributes,
             const std::optional<std::string>& kind) {
            Event event;
            event.type = EventType::kCustom;
            if (kind.has_value()) {
              const std::optional<EventKind> parsed = ParseEventKind(*kind);
              if (!parsed.has_value()) {
                ThrowIfError(absl::InvalidArgumentError(
                    absl::StrCat("emit_event: no event kind is named '", *kind, "'")));
              }
              if (attributes.count("what") != 0) {
                ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
                    "emit_event: an event of kind ", *kind, " has what=", *kind,
                    "; leave out the attribute 'what'")));
              }
              event = EventOfKind(*parsed);
            }
            event.step = step;
            event.message = message;
            event.attributes.insert(event.attributes.end(), attributes.begin(), attributes.end());
            Runtime& rt = r.get();
            nb::gil_scoped_release release;
            ThrowIfError(rt.EmitEvent(std::move(event)));
          },
          nb::arg("message"), nb::arg("step"), nb::arg("attributes"), nb::arg("kind") = nb::none())
      .def(
          "begin_phase",
          [](PyRuntime& r, const std::string& name) {
            if (Watchdog* w = r.get().watchdog()) w->BeginPhase(name);
          },
          nb::arg("name"))
      .def("end_phase",
           [](PyRuntime& r) {
             if (Watchdog* w = r.get().watchdog()) w->EndPhase();
           })
      .def(
          "tick",
          [](PyRuntime& r, int64_t amount) {
            if (Watchdog* w = r.get().watchdog()) w->Tick(amount);
          },
          nb::arg("amount") = 1)
      .def(
          "store",
          [](PyRuntime& r) -> PyStore* {
            Store* s = r.get().store();
            if (s == nullptr) return nullptr;
            return new PyStore(s);
          },
          nb::rv_policy::take_ownership, nb::keep_alive<0, 1>())
      // The collective tracker (collectives.h), for collectives run outside the SDK (a torch
      // process group's allreduce in the DDP hook): each is recorded in the flight recorder and
      // watched against its learned bound. When a hang aborts the communicators, the abort
      // function of one registered from Python queues its id for wait_communicator_abort (the
      // watchdog thread cannot call into torch: it would need the GIL the training thread may
      // hold); trainguard.torch's abort thread takes it and aborts the process group.
      .def(
          "register_communicator",
          [](PyRuntime& r, uint64_t comm_id, const std::string& name) {
            std::shared_ptr<AbortRequests> aborts = r.aborts();
            ThrowIfError(Tracker(r).RegisterCommunicator(
                comm_id, name, [aborts, comm_id] { aborts->Request(comm_id); }));
          },
          nb::arg("comm_id"), nb::arg("name"))
      .def(
          "wait_communicator_abort",
          [](PyRuntime& r, double timeout_s) -> std::optional<uint64_t> {
            std::shared_ptr<AbortRequests> aborts = r.aborts();
            nb::gil_scoped_release release;
            return aborts->Wait(absl::Seconds(timeout_s));
          },
          nb::arg("timeout_s"),
          "The id of a communicator registered from Python that a hang asked to abort, or None "
          "after timeout_s, as soon as this rank learns that its generation was superseded (read "
          "superseded_generation then), or once the Runtime is closed. Releases the GIL while it "
          "waits.")
      .def(
          "unregister_communicator",
          [](PyRuntime& r, uint64_t comm_id) {
            ThrowIfError(Tracker(r).UnregisterCommunicator(comm_id));
          },
          nb::arg("comm_id"))
      .def(
          "collective_begin",
          [](PyRuntime& r, const std::string& op, uint64_t comm_id, uint64_t bytes) {
            CollectiveHandle h = Tracker(r).Begin(op, comm_id, bytes);
            return std::make_tuple(h.slot, h.generation, h.comm_seq);
          },
          nb::arg("op"), nb::arg("comm_id"), nb::arg("bytes"))
      .def(
          "collective_end",
          [](PyRuntime& r, const std::tuple<int32_t, uint32_t, int64_t>& handle) {
            CollectiveHandle h;
            std::tie(h.slot, h.generation, h.comm_seq) = handle;
            Tracker(r).End(h);
          },
          nb::arg("handle"))
      .def("collective_usage_errors", [](PyRuntime& r) { return Tracker(r).usage_errors(); })
      .def("close", &PyRuntime::Close);
}

}  // namespace trainguard::python
