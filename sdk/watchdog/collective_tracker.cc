#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "sdk/watchdog/collective_tracker_impl.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/gpu_events.h"
#include "sdk/watchdog/learned_bound.h"
#include "sdk/watchdog/name_table.h"
#include "sdk/watchdog/recorder_append.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/options.h"

namespace trainguard {

using watchdog_internal::BoundRule;
using watchdog_internal::GpuEvents;
using watchdog_internal::GpuEventState;
using watchdog_internal::NameTable;
using watchdog_internal::SampleWindow;

// NameTable::CopyPadded fills FlightRecord::name whole, NULs included.
static_assert(sizeof(FlightRecord::name) == NameTable::kMaxNameBytes + 1);

namespace {

// A slot's life: kFree -> kClaimed (Begin fills it) -> kInFlight -> kCompleting (End) -> kFree.
// GPU slots: kInFlight -> kGpuEnded (EndOnStream recorded the end event) or kGpuFailed (it could
// not) -> kFree, the last step always by the poller, which is therefore the only thread that
// writes a GPU slot's poller fields while the slot is live.
enum SlotState : uint32_t {
  kFree = 0,
  kClaimed = 1,
  kInFlight = 2,
  kCompleting = 3,
  kGpuEnded = 4,
  kGpuFailed = 5,
};

// FlightRecord::flags bits of collective records.
constexpr uint16_t kFlagGpu = kFlightRecordOnGpu;
constexpr uint16_t kFlagFailed = kFlightRecordFailed;

constexpr std::string_view kOtherOps = "<other ops>";

// InFlightCollective::instance is (generation << kSlotBits) | slot: unique without a shared
// counter.
constexpr int kSlotBits = 24;

uint64_t InstanceOf(int slot, uint32_t generation) {
  return (static_cast<uint64_t>(generation) << kSlotBits) | static_cast<uint64_t>(slot);
}
uint64_t SlotOf(uint64_t instance) { return instance & ((uint64_t{1} << kSlotBits) - 1); }
uint32_t GenerationOf(uint64_t instance) { return static_cast<uint32_t>(instance >> kSlotBits); }

}  // namespace

// Every field is an atomic: the poller reads slots while their owners rewrite them. `generation`
// works as a sequence lock: it changes before a claim rewrites the fields (with release stores),
// and the poller discards what it read (with acquire loads) when the generation changed meanwhile.
struct CollectiveTracker::Impl::Slot {
  std::atomic<uint32_t> state{kFree};
  std::atomic<uint32_t> generation{0};
  std::atomic<uint64_t> instance{0};
  std::atomic<int32_t> op{-1};
  std::atomic<int32_t> comm{-1};
  std::atomic<int64_t> comm_seq{-1};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int32_t> peer{-1};
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> begin_ns{0};
  std::atomic<bool> on_gpu{false};
  // Poller fields: when a poll first saw the start event done (0: not yet); the generation the
  // poller reported overdue (its duration is then kept out of the op's history).
  std::atomic<int64_t> gpu_started_ns{0};
  std::atomic<uint32_t> reported_generation{0};
};

// The hot path reads `live`, `id` and the counters; `name`, `abort` and `aborted` belong to
// comms_mu_.
//
// The counters are written without read-modify-write: next_seq and completed_host by the thread
// issuing the communicator's collectives (one at a time, as NCCL and gloo require anyway),
// completed_gpu by the poller.
struct CollectiveTracker::Impl::Communicator {
  std::atomic<bool> live{false};
  std::atomic<uint64_t> id{0};
  std::atomic<int64_t> next_seq{0};
  std::atomic<int64_t> completed_host{0};
  std::atomic<int64_t> completed_gpu{0};
  std::string name;
  std::function<void()> abort;
  bool aborted = false;
};

CollectiveTrackerOptions CollectiveTrackerOptions::FromOptions(const Options& options) {
  CollectiveTrackerOptions o;
  o.bound = LearnedBoundOptions::FromOptions(options);
  o.clock = options.clock;
  return o;
}

absl::Status CollectiveTrackerOptions::Validate() const {
  auto bad = [](std::string_view field, std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("collective tracker options: %s %s", field, why));
  };
  if (max_communicators < 1) return bad("max_communicators", "must be >= 1");
  if (max_in_flight < 1 || max_in_flight > (1 << kSlotBits)) {
    return bad("max_in_flight", "must be in [1, 16777216]");
  }
  if (max_ops < 1) return bad("max_ops", "must be >= 1");
  return bound.Validate("collective tracker options");
}

absl::StatusOr<std::unique_ptr<CollectiveTracker>> CollectiveTracker::Create(
    const CollectiveTrackerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<CollectiveTracker>(new CollectiveTracker(std::make_unique<Impl>(options)));
}

CollectiveTracker::CollectiveTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveTracker::~CollectiveTracker() = default;

// The public face forwards to the Impl: one pointer hop, no virtual call, no allocation.
absl::Status CollectiveTracker::RegisterCommunicator(uint64_t comm_id, std::string name,
                                                     std::function<void()> abort) {
  return impl_->RegisterCommunicator(comm_id, std::move(name), std::move(abort));
}
absl::Status CollectiveTracker::UnregisterCommunicator(uint64_t comm_id) {
  return impl_->UnregisterCommunicator(comm_id);
}
absl::Status CollectiveTracker::EnableGpu(int device) { return impl_->EnableGpu(device); }
void CollectiveTracker::SetStep(int64_t step) { impl_->SetStep(step); }
CollectiveHandle CollectiveTracker::Begin(std::string_view op, uint64_t comm_id, uint64_t bytes,
                                          int peer) {
  return impl_->Begin(op, comm_id, bytes, peer);
}
void CollectiveTracker::End(CollectiveHandle handle, bool failed) { impl_->End(handle, failed); }
CollectiveHandle CollectiveTracker::BeginOnStream(std::string_view op, uint64_t comm_id,
                                                  uint64_t bytes, int peer, void* stream) {
  return impl_->BeginOnStream(op, comm_id, bytes, peer, stream);
}
void CollectiveTracker::EndOnStream(CollectiveHandle handle, void* stream) {
  impl_->EndOnStream(handle, stream);
}
CollectivePoll CollectiveTracker::Poll(int64_t now_ns) { return impl_->Poll(now_ns); }
int CollectiveTracker::AbortCommunicators() { return impl_->AbortCommunicators(nullptr); }
int CollectiveTracker::AbortCommunicators(const std::vector<uint64_t>& comm_ids) {
  return impl_->AbortCommunicators(&comm_ids);
}
void CollectiveTracker::ExcuseOverdue(uint64_t instance) { impl_->ExcuseOverdue(instance); }
bool CollectiveTracker::InFlight(uint64_t instance) const { return impl_->InFlight(instance); }
absl::Duration CollectiveTracker::BoundFor(std::string_view op) const {
  return impl_->BoundFor(op);
}
std::vector<CommunicatorProgress> CollectiveTracker::Progress() const { return impl_->Progress(); }
absl::Duration CollectiveTracker::completed_time() const {
  return absl::Nanoseconds(impl_->completed_ns());
}
int64_t CollectiveTracker::completed_bytes() const { return impl_->completed_bytes(); }
int64_t CollectiveTracker::usage_errors() const { return impl_->usage_errors(); }
absl::Status CollectiveTracker::usage_status() const { return impl_->usage_status(); }
Clock& CollectiveTracker::clock() const { return impl_->clock(); }

CollectiveTracker::Impl::Impl(const CollectiveTrackerOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      recorder_(options.recorder),
      slot_count_(options.max_in_flight),
      slots_(new Slot[options.max_in_flight]),
      comms_(new Communicator[options.max_communicators]),
      ops_(std::make_unique<NameTable>(options.max_ops + 1)),
      rule_(std::make_unique<BoundRule>(options.bound)) {
  // Index 0 collects the ops that do not fit, so a full table degrades learning, not tracking.
  ops_->FindOrAdd(kOtherOps);
  op_durations_.reserve(options.max_ops + 1);
  for (int i = 0; i <= options.max_ops; ++i) {
    op_durations_.push_back(std::make_unique<SampleWindow>(options.bound.history));
  }
}

CollectiveTracker::Impl::~Impl() = default;

absl::Status CollectiveTracker::Impl::RegisterCommunicator(uint64_t comm_id, std::string name,
                                                           std::function<void()> abort) {
  MutexLock lock(&comms_mu_);
  const int used = comm_count_.load(std::memory_order_relaxed);
  int free_index = -1;
  for (int i = 0; i < used; ++i) {
    Communicator& c = comms_[i];
    if (!c.live.load(std::memory_order_relaxed)) {
      if (free_index < 0) free_index = i;
    } else if (c.id.load(std::memory_order_relaxed) == comm_id) {
      return absl::AlreadyExistsError(
          absl::StrFormat("collective tracker: communicator %d is already registered (as \"%s\")",
                          comm_id, c.name));
    }
  }
  if (free_index < 0) {
    if (used == options_.max_communicators) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("collective tracker: cannot register communicator %d (\"%s\"): all %d "
                          "communicator slots are registered (max_communicators)",
                          comm_id, name, options_.max_communicators));
    }
    free_index = used;
  }
  Communicator& c = comms_[free_index];
  c.id.store(comm_id, std::memory_order_relaxed);
  c.next_seq.store(0, std::memory_order_relaxed);
  c.completed_host.store(0, std::memory_order_relaxed);
  c.completed_gpu.store(0, std::memory_order_relaxed);
  if (recorder_ != nullptr) {
    // The ring says which communicators this rank is a member of (FindLaggards compares ranks in
    // their own groups only).
    FlightRecord r;
    r.type = FlightRecordType::kCommunicator;
    r.comm_id = comm_id;
    watchdog_internal::SetRecordName(r, name);
    recorder_->Append(r);
  }
  c.name = std::move(name);
  c.abort = std::move(abort);
  c.aborted = false;
  c.live.store(true, std::memory_order_release);
  if (free_index == used) comm_count_.store(used + 1, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status CollectiveTracker::Impl::UnregisterCommunicator(uint64_t comm_id) {
  MutexLock lock(&comms_mu_);
  const int index = FindCommunicator(comm_id);
  if (index < 0) {
    return absl::NotFoundError(
        absl::StrFormat("collective tracker: communicator %d is not registered", comm_id));
  }
  comms_[index].live.store(false, std::memory_order_release);
  comms_[index].abort = nullptr;
  return absl::OkStatus();
}

absl::Status CollectiveTracker::Impl::EnableGpu(int device) {
#if defined(TRAINGUARD_HAVE_CUDA)
  absl::StatusOr<std::unique_ptr<GpuEvents>> events =
      watchdog_internal::CreateCudaEvents(device, slot_count_);
  if (!events.ok()) return events.status();
  return UseGpuEvents(*std::move(events));
#else
  return absl::UnimplementedError(absl::StrFormat(
      "collective tracker: GPU tracking on device %d needs trainguard built with CUDA", device));
#endif
}

absl::Status CollectiveTracker::Impl::UseGpuEvents(std::unique_ptr<GpuEvents> events) {
  if (gpu_enabled_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("collective tracker: GPU tracking is already enabled");
  }
  gpu_ = std::move(events);
  gpu_enabled_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

int CollectiveTracker::Impl::FindCommunicator(uint64_t comm_id) const {
  const int used = comm_count_.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    const Communicator& c = comms_[i];
    if (c.live.load(std::memory_order_acquire) && c.id.load(std::memory_order_relaxed) == comm_id) {
      return i;
    }
  }
  return -1;
}

int CollectiveTracker::Impl::OpIndex(std::string_view op) {
  const int index = ops_->FindOrAdd(op);
  if (index >= 0) return index;
  UsageError(absl::StrFormat(
      "collective tracker: op \"%s\" does not fit (max_ops %d); it shares the \"%s\" bound", op,
      options_.max_ops, kOtherOps));
  return 0;
}

void CollectiveTracker::Impl::UsageError(std::string message) {
  usage_errors_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&usage_mu_);
  if (first_usage_error_.ok()) first_usage_error_ = absl::FailedPreconditionError(message);
}

absl::Status CollectiveTracker::Impl::usage_status() const {
  MutexLock lock(&usage_mu_);
  return first_usage_error_;
}

CollectiveHandle CollectiveTracker::Impl::Claim(int op, int comm, uint64_t bytes, int peer,
                                                bool on_gpu, int64_t now_ns) {
  for (int tries = 0; tries < slot_count_; ++tries) {
    // The cursor is only a hint where to look first: racing updates of it are harmless.
    const int index = next_slot_.load(std::memory_order_relaxed);
    next_slot_.store(index + 1 == slot_count_ ? 0 : index + 1, std::memory_order_relaxed);
    Slot& s = slots_[index];
    uint32_t expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
      continue;
    }
    // The new generation first; the fields with release stores, so a poller that reads any new
    // field also sees the new generation when it checks it again (a sequence lock without fences,
    // which ThreadSanitizer does not model).
    const uint32_t generation = s.generation.load(std::memory_order_relaxed) + 1;
    s.generation.store(generation, std::memory_order_release);
    std::atomic<int64_t>& next_seq = comms_[comm].next_seq;
    const int64_t seq = next_seq.load(std::memory_order_relaxed);
    next_seq.store(seq + 1, std::memory_order_relaxed);
    s.instance.store(InstanceOf(index, generation), std::memory_order_release);
    s.op.store(op, std::memory_order_release);
    s.comm.store(comm, std::memory_order_release);
    s.comm_seq.store(seq, std::memory_order_release);
    s.bytes.store(bytes, std::memory_order_release);
    s.peer.store(peer, std::memory_order_release);
    s.step.store(step_.load(std::memory_order_relaxed), std::memory_order_release);
    s.begin_ns.store(now_ns, std::memory_order_release);
    s.on_gpu.store(on_gpu, std::memory_order_release);
    s.gpu_started_ns.store(0, std::memory_order_release);
    // Returned by value, built in registers: a handle filled field by field through a reference
    // and then returned whole made the caller wait for a store-to-load forward that cannot work.
    return CollectiveHandle{index, generation, seq};
  }
  UsageError(absl::StrFormat(
      "collective tracker: all %d in-flight slots are taken (max_in_flight; GPU collectives free "
      "their slot only when a poll sees them finish)",
      slot_count_));
  return CollectiveHandle{};
}

CollectiveHandle CollectiveTracker::Impl::Begin(std::string_view op, uint64_t comm_id,
                                                uint64_t bytes, int peer) {
  CollectiveHandle handle;
  const int comm = FindCommunicator(comm_id);
  if (comm < 0) {
    UsageError(
        absl::StrFormat("collective tracker: %s on unregistered communicator %d", op, comm_id));
    return handle;
  }
  const int op_index = OpIndex(op);
  const int64_t now = clock_->MonotonicNanos();
  handle = Claim(op_index, comm, bytes, peer, /*on_gpu=*/false, now);
  if (!handle.valid()) return handle;
  Slot& s = slots_[handle.slot];
  Record(s, op_index, comm, /*end=*/false, now, 0, 0);
  s.state.store(kInFlight, std::memory_order_release);
  return handle;
}

CollectiveTracker::Impl::Slot* CollectiveTracker::Impl::Resolve(CollectiveHandle handle,
                                                                uint32_t expected,
                                                                std::string_view what) {
  if (handle.slot >= slot_count_) {
    UsageError(absl::StrFormat("collective tracker: %s with a handle of another tracker", what));
    return nullptr;
  }
  Slot& s = slots_[handle.slot];
  // No compare-and-swap: only the holder of the handle moves a slot out of kInFlight (the poller
  // never does), so a second End of the same handle finds another state or generation.
  if (s.generation.load(std::memory_order_acquire) != handle.generation ||
      s.state.load(std::memory_order_acquire) != expected) {
    UsageError(absl::StrFormat(
        "collective tracker: %s of comm seq %d: the handle was already ended (or is stale)", what,
        handle.comm_seq));
    return nullptr;
  }
  s.state.store(kCompleting, std::memory_order_relaxed);
  return &s;
}

void CollectiveTracker::Impl::End(CollectiveHandle handle, bool failed) {
  if (!handle.valid()) return;
  Slot* s = Resolve(handle, kInFlight, "End");
  if (s == nullptr) return;
  if (s->on_gpu.load(std::memory_order_relaxed)) {
    s->state.store(kInFlight, std::memory_order_release);
    UsageError("collective tracker: End of a collective begun with BeginOnStream");
    return;
  }
  const int64_t now = clock_->MonotonicNanos();
  Complete(*s, now, now - s->begin_ns.load(std::memory_order_relaxed), failed);
}

CollectiveHandle CollectiveTracker::Impl::BeginOnStream(std::string_view op, uint64_t comm_id,
                                                        uint64_t bytes, int peer, void* stream) {
  CollectiveHandle handle;
  if (!gpu_enabled_.load(std::memory_order_acquire)) {
    UsageError(absl::StrFormat("collective tracker: BeginOnStream(%s) before EnableGpu", op));
    return handle;
  }
  const int comm = FindCommunicator(comm_id);
  if (comm < 0) {
    UsageError(
        absl::StrFormat("collective tracker: %s on unregistered communicator %d", op, comm_id));
    return handle;
  }
  const int op_index = OpIndex(op);
  const int64_t now = clock_->MonotonicNanos();
  handle = Claim(op_index, comm, bytes, peer, /*on_gpu=*/true, now);
  if (!handle.valid()) return handle;
  Slot& s = slots_[handle.slot];
  if (!gpu_->RecordStart(handle.slot, stream)) {
    // The sequence number is spent: the communicator's numbering shows the gap.
    s.state.store(kFree, std::memory_order_release);
    UsageError(
        absl::StrFormat("collective tracker: cudaEventRecord of %s's start event failed", op));
    return CollectiveHandle{};
  }
  Record(s, op_index, comm, /*end=*/false, now, kFlagGpu, 0);
  s.state.store(kInFlight, std::memory_order_release);
  return handle;
}

void CollectiveTracker::Impl::EndOnStream(CollectiveHandle handle, void* stream) {
  if (!handle.valid()) return;
  Slot* s = Resolve(handle, kInFlight, "EndOnStream");
  if (s == nullptr) return;
  if (!s->on_gpu.load(std::memory_order_relaxed)) {
    s->state.store(kInFlight, std::memory_order_release);
    UsageError("collective tracker: EndOnStream of a collective begun with Begin");
    return;
  }
  // The poller frees GPU slots, also a failed one, so it never polls a slot reused under it.
  const bool recorded = gpu_->RecordEnd(handle.slot, stream);
  s->state.store(recorded ? kGpuEnded : kGpuFailed, std::memory_order_release);
}

void CollectiveTracker::Impl::Complete(Slot& slot, int64_t now_ns, int64_t duration_ns,
                                       bool failed) {
  const int op = slot.op.load(std::memory_order_relaxed);
  const int comm = slot.comm.load(std::memory_order_relaxed);
  const uint32_t generation = slot.generation.load(std::memory_order_relaxed);
  // A collective reported hung is not a sample of a healthy one.
  if (!failed && slot.reported_generation.load(std::memory_order_relaxed) != generation) {
    op_durations_[op]->Add(duration_ns);
  }
  std::atomic<int64_t>& completed = slot.on_gpu.load(std::memory_order_relaxed)
                                        ? comms_[comm].completed_gpu
                                        : comms_[comm].completed_host;
  completed.store(completed.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  completed_ns_.fetch_add(duration_ns, std::memory_order_relaxed);
  completed_bytes_.fetch_add(static_cast<int64_t>(slot.bytes.load(std::memory_order_relaxed)),
                             std::memory_order_relaxed);
  uint16_t flags = failed ? kFlagFailed : 0;
  if (slot.on_gpu.load(std::memory_order_relaxed)) flags |= kFlagGpu;
  Record(slot, op, comm, /*end=*/true, now_ns, flags, duration_ns);
  slot.state.store(kFree, std::memory_order_release);
}

void CollectiveTracker::Impl::Record(const Slot& slot, int op, int comm, bool end, int64_t now_ns,
                                     uint16_t flags, int64_t duration_ns) {
  if (recorder_ == nullptr) return;
  FlightRecord r;
  r.time_ns = now_ns;
  r.step = slot.step.load(std::memory_order_relaxed);
  r.type = end ? FlightRecordType::kCollectiveEnd : FlightRecordType::kCollectiveBegin;
  r.flags = flags;
  r.peer = slot.peer.load(std::memory_order_relaxed);
  r.comm_id = comms_[comm].id.load(std::memory_order_relaxed);
  r.comm_seq = slot.comm_seq.load(std::memory_order_relaxed);
  r.bytes = slot.bytes.load(std::memory_order_relaxed);
  r.value = duration_ns;
  ops_->CopyPadded(op, r.name);
  recorder_->Append(r);
}

InFlightCollective CollectiveTracker::Impl::Describe(const Slot& slot, int64_t now_ns,
                                                     int64_t start_ns, int op, int comm,
                                                     int64_t bound_ns) const {
  InFlightCollective c;
  c.op = std::string(ops_->Name(op));
  c.comm_id = comms_[comm].id.load(std::memory_order_relaxed);
  {
    MutexLock lock(&comms_mu_);
    c.comm_name = comms_[comm].name;
  }
  c.comm_seq = slot.comm_seq.load(std::memory_order_acquire);
  c.bytes = slot.bytes.load(std::memory_order_acquire);
  c.peer = slot.peer.load(std::memory_order_acquire);
  c.step = slot.step.load(std::memory_order_acquire);
  c.on_gpu = slot.on_gpu.load(std::memory_order_acquire);
  c.age = absl::Nanoseconds(now_ns - start_ns);
  c.bound = absl::Nanoseconds(bound_ns);
  c.instance = slot.instance.load(std::memory_order_acquire);
  return c;
}

CollectivePoll CollectiveTracker::Impl::Poll(int64_t now_ns) {
  MutexLock lock(&poll_mu_);
  CollectivePoll result;
  const bool gpu = gpu_enabled_.load(std::memory_order_acquire);
  if (gpu) gpu_->BindThread();
  int64_t oldest_start = 0;
  for (int i = 0; i < slot_count_; ++i) {
    Slot& s = slots_[i];
    const uint32_t generation = s.generation.load(std::memory_order_acquire);
    const uint32_t state = s.state.load(std::memory_order_acquire);
    if (state != kInFlight && state != kGpuEnded && state != kGpuFailed) continue;
    const bool on_gpu = s.on_gpu.load(std::memory_order_acquire);
    const int op = s.op.load(std::memory_order_acquire);
    const int comm = s.comm.load(std::memory_order_acquire);
    int64_t start = s.begin_ns.load(std::memory_order_acquire);
    if (s.generation.load(std::memory_order_relaxed) != generation) continue;  // reused meanwhile

    if (on_gpu) {
      // Only this thread frees a GPU slot, so it stays this generation's until Complete below.
      if (state == kGpuFailed) {
        Complete(s, now_ns, 0, /*failed=*/true);
        continue;
      }
      start = s.gpu_started_ns.load(std::memory_order_relaxed);
      if (start == 0) {
        const GpuEventState started = gpu_->QueryStart(i);
        if (started == GpuEventState::kDone) {
          start = now_ns;
          s.gpu_started_ns.store(start, std::memory_order_relaxed);
        }
      }
      if (state == kGpuEnded) {
        const GpuEventState ended = gpu_->QueryEnd(i);
        if (ended != GpuEventState::kPending) {
          const bool failed = ended == GpuEventState::kError;
          Complete(s, now_ns, failed ? 0 : gpu_->ElapsedNanos(i), failed);
          ++result.gpu_completed;
          continue;
        }
      }
      if (start == 0) continue;  // queued behind other work on its stream: not in flight yet
    }

    ++result.in_flight;
    const int64_t bound = op_durations_[op]->Bound(*rule_);
    const bool oldest = !result.oldest.has_value() || start < oldest_start;
    const bool overdue = now_ns - start > bound &&
                         s.reported_generation.load(std::memory_order_relaxed) != generation;
    if (!oldest && !overdue) continue;
    InFlightCollective c = Describe(s, now_ns, start, op, comm, bound);
    if (s.generation.load(std::memory_order_relaxed) != generation) continue;  // ended meanwhile
    if (overdue) {
      s.reported_generation.store(generation, std::memory_order_relaxed);
      result.overdue.push_back(c);
    }
    if (oldest) {
      oldest_start = start;
      result.oldest = std::move(c);
    }
  }
  // Oldest first.
  std::sort(result.overdue.begin(), result.overdue.end(),
            [](const InFlightCollective& a, const InFlightCollective& b) { return a.age > b.age; });
  return result;
}

int CollectiveTracker::Impl::AbortCommunicators(const std::vector<uint64_t>* comm_ids) {
  std::vector<std::pair<std::string, std::function<void()>>> aborts;
  {
    MutexLock lock(&comms_mu_);
    const int used = comm_count_.load(std::memory_order_relaxed);
    for (int i = 0; i < used; ++i) {
      Communicator& c = comms_[i];
      if (!c.live.load(std::memory_order_relaxed) || c.aborted || !c.abort) continue;
      if (comm_ids != nullptr &&
          std::find(comm_ids->begin(), comm_ids->end(), c.id.load(std::memory_order_relaxed)) ==
              comm_ids->end()) {
        continue;
      }
      c.aborted = true;
      aborts.emplace_back(c.name, c.abort);
    }
  }
  for (auto& [name, abort] : aborts) {
    try {
      abort();
    } catch (const std::exception& e) {
      UsageError(absl::StrFormat("collective tracker: abort of communicator \"%s\" threw: %s", name,
                                 e.what()));
    } catch (...) {
      UsageError(absl::StrFormat("collective tracker: abort of communicator \"%s\" threw", name));
    }
  }
  return static_cast<int>(aborts.size());
}

void CollectiveTracker::Impl::ExcuseOverdue(uint64_t instance) {
  const uint64_t index = SlotOf(instance);
  if (index >= static_cast<uint64_t>(slot_count_)) return;
  uint32_t reported = GenerationOf(instance);
  // Only a report of this very collective is taken back; a reused slot keeps its own.
  slots_[index].reported_generation.compare_exchange_strong(reported, 0, std::memory_order_relaxed);
}

bool CollectiveTracker::Impl::InFlight(uint64_t instance) const {
  const uint64_t index = SlotOf(instance);
  if (index >= static_cast<uint64_t>(slot_count_)) return false;
  const Slot& s = slots_[index];
  const uint32_t state = s.state.load(std::memory_order_acquire);
  return s.generation.load(std::memory_order_acquire) == GenerationOf(instance) &&
         (state == kInFlight || state == kGpuEnded);
}

absl::Duration CollectiveTracker::Impl::BoundFor(std::string_view op) const {
  const int index = ops_->Find(op);
  if (index < 0) return absl::Nanoseconds(rule_->warmup_bound_ns);
  return absl::Nanoseconds(op_durations_[index]->Bound(*rule_));
}

std::vector<CommunicatorProgress> CollectiveTracker::Impl::Progress() const {
  std::vector<CommunicatorProgress> progress;
  MutexLock lock(&comms_mu_);
  const int used = comm_count_.load(std::memory_order_relaxed);
  for (int i = 0; i < used; ++i) {
    const Communicator& c = comms_[i];
    if (!c.live.load(std::memory_order_relaxed)) continue;
    CommunicatorProgress p;
    p.comm_id = c.id.load(std::memory_order_relaxed);
    p.name = c.name;
    p.begun = c.next_seq.load(std::memory_order_relaxed);
    p.completed = c.completed_host.load(std::memory_order_relaxed) +
                  c.completed_gpu.load(std::memory_order_relaxed);
    progress.push_back(std::move(p));
  }
  return progress;
}

}  // namespace trainguard
