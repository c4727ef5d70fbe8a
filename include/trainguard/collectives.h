// CollectiveTracker: which collectives this rank has entered and not yet left, per communicator,
// with a sequence number each, so that a hang names the collective it is stuck in (op,
// communicator, sequence number, bytes, peer, age) and so that ranks can be compared ("rank 5 never
// entered all_reduce #812 of comm dp0").
//
//     tracker->RegisterCommunicator(kDp, "dp", [comm] { ncclCommAbort(comm); });
//     {
//       sdk::ScopedCollective c(tracker.get(), "all_reduce", kDp, bytes);   // CPU collective
//       gloo::allreduce(options);
//     }
//     // GPU collectives: bracketed by CUDA events on the collective's stream (see nccl.h).
//     sdk::CollectiveHandle h = tracker->BeginOnStream("all_reduce", kDp, bytes, -1, stream);
//     ncclAllReduce(..., stream);
//     tracker->EndOnStream(h, stream);
//
// A collective in flight longer than its learned bound is a hang. The bound is learned per op name
// with the watchdog's rule (watchdog.h): max(floor, factor x the longest of the op's recent
// completed collectives), or the warm-up bound until the op has enough history. The Watchdog polls
// the tracker on its monitor thread (WatchdogOptions::tracker): it completes GPU collectives, finds
// overdue ones, and on a hang calls each communicator's abort function (once per registration),
// which is how a rank stuck inside NCCL or gloo gets unblocked with an error its guard classifies
// as a communication failure.
//
// GPU path: EnableGpu() creates two CUDA timing events per in-flight slot, once. BeginOnStream /
// EndOnStream record them on the caller's stream; only the poller (the watchdog thread) looks at
// them, with cudaEventQuery, never a synchronising call. A GPU collective counts as in flight from
// the poll that first sees its start event done (it may sit queued behind other work before that),
// and completes at the poll that first sees its end event done; the duration it teaches the bound
// is the device time between the two events. GPU collectives therefore need a running watchdog (or
// calls to Poll) to complete and free their slots.
//
// Cost: Begin/End allocate nothing and take no lock (the FlightRecorder append, when a recorder is
// given, is lock-free, and the monitor thread's appends to it never make them wait): a clock read,
// a scan of the registered communicators and op names, a compare-and-swap to claim a slot, relaxed
// stores (bench/bench_watchdog.cc measures it).
//
// Misuse (an unregistered communicator, a full slot table, a stale or doubly ended handle) never
// crashes: the call does nothing, an invalid handle is returned, and usage_errors() counts it.
//
// Thread safety: Begin/End/BeginOnStream/EndOnStream, SetStep and the accessors from any thread,
// with one thread at a time per communicator (NCCL and gloo require that order anyway; the
// per-communicator counters are not read-modify-write).
// RegisterCommunicator/UnregisterCommunicator/EnableGpu from any thread, outside the hot path. Poll
// and AbortCommunicators from one polling thread at a time (the watchdog's).
#ifndef TRAINGUARD_COLLECTIVES_H_
#define TRAINGUARD_COLLECTIVES_H_

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

class Clock;
class FlightRecorder;
struct Options;

namespace watchdog_internal {
class GpuEvents;
}  // namespace watchdog_internal

// The learned-bound rule (see watchdog.h; Options keys watchdog_*), shared by phases
// (WatchdogOptions::bound) and collectives (CollectiveTrackerOptions::bound): until
// warmup_samples instances have completed the bound is warmup_bound; then it is
// max(floor, bound_factor_pct/100 x the longest of the last `history` instances).
struct LearnedBoundOptions {
  int warmup_samples = 5;
  absl::Duration warmup_bound = absl::Minutes(10);
  int bound_factor_pct = 300;
  absl::Duration floor = absl::Seconds(2);
  int history = 200;

  // The watchdog_* keys of `options` that set the rule.
  static LearnedBoundOptions FromOptions(const Options& options);
  // Errors name the field as "<owner>: bound.<field>".
  absl::Status Validate(std::string_view owner) const;
};

struct CollectiveTrackerOptions {
  // Communicators that can be registered at the same time.
  int max_communicators = 64;
  // Collectives in flight at the same time (GPU collectives stay in flight until a poll sees them
  // finish). Begin on a full table is a usage error.
  int max_in_flight = 256;
  // Distinct op names ("all_reduce", "send", ...); further names share one "<other ops>" entry.
  int max_ops = 64;

  // How long an op's collective may stay in flight.
  LearnedBoundOptions bound;

  // nullptr: Clock::Real(). Not owned; must outlive the tracker.
  Clock* clock = nullptr;
  // Where kCollectiveBegin/kCollectiveEnd records go; nullptr: nowhere. Not owned.
  FlightRecorder* recorder = nullptr;

  // The watchdog_* keys of `options`, and options.clock.
  static CollectiveTrackerOptions FromOptions(const Options& options);
  // Errors name the field.
  absl::Status Validate() const;
};

// Names one collective in flight. Cheap to copy; invalid when Begin refused.
struct CollectiveHandle {
  int32_t slot = -1;
  uint32_t generation = 0;
  int64_t comm_seq = -1;  // the collective's sequence number on its communicator (0, 1, 2, ...)

  bool valid() const { return slot >= 0; }
};

// A collective in flight, as the poller saw it.
struct InFlightCollective {
  std::string op;
  uint64_t comm_id = 0;
  std::string comm_name;
  int64_t comm_seq = -1;
  uint64_t bytes = 0;
  int peer = -1;
  int64_t step = -1;
  bool on_gpu = false;
  absl::Duration age;     // in flight for this long (GPU: since a poll first saw it start)
  absl::Duration bound;   // its op's learned bound
  uint64_t instance = 0;  // unique per collective in this tracker
};

// What one Poll found.
struct CollectivePoll {
  // The collective in flight longest, if any.
  std::optional<InFlightCollective> oldest;
  // Collectives that passed their bound since the previous poll (each reported by one poll only).
  std::vector<InFlightCollective> overdue;
  // Collectives in flight now.
  int in_flight = 0;
  // GPU collectives this poll saw finish.
  int gpu_completed = 0;
};

// Per-communicator counters: Mycroft-style "last enqueued / last completed" evidence.
struct CommunicatorProgress {
  uint64_t comm_id = 0;
  std::string name;
  int64_t begun = 0;      // collectives entered (the next sequence number)
  int64_t completed = 0;  // collectives left
};

class CollectiveTracker {
 public:
  static absl::StatusOr<std::unique_ptr<CollectiveTracker>> Create(
      const CollectiveTrackerOptions& options);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Registers a communicator under a caller-chosen id; its sequence numbers start at 0. `abort`
  // (may be empty) is what a hang calls to unblock a rank stuck in it, e.g. ncclCommAbort(comm) or
  // closing a gloo context's connections; it runs on the watchdog thread, at most once per
  // registration. AlreadyExists for a registered id, ResourceExhausted when max_communicators are
  // registered.
  absl::Status RegisterCommunicator(uint64_t comm_id, std::string name,
                                    std::function<void()> abort);
  // Forgets a communicator (before destroying it, so that no abort can reach it). NotFound when it
  // is not registered. REQUIRES: none of its collectives is in flight.
  absl::Status UnregisterCommunicator(uint64_t comm_id);

  // Creates the CUDA events of the GPU path on device `device`. Unimplemented when trainguard was
  // built without CUDA. Call once, before the first BeginOnStream.
  absl::Status EnableGpu(int device);

  // The step recorded with each collective.
  void SetStep(int64_t step);

  // Enters a host-side collective of `bytes` bytes on `comm_id` (with `peer` for point-to-point).
  CollectiveHandle Begin(std::string_view op, uint64_t comm_id, uint64_t bytes, int peer = -1);
  // Leaves it; `failed`: it did not complete (gloo threw, a peer died, an abort woke it): its time
  // teaches no bound, and the flight recorder keeps the rank in it (the hang diagnosis reads the
  // ring as it was when the failure came). A stale or doubly ended handle is a usage error; an
  // invalid one (Begin refused and already counted that) is ignored.
  void End(CollectiveHandle handle, bool failed = false);

  // The GPU path: records the slot's start (end) event on `stream`, a cudaStream_t. REQUIRES:
  // EnableGpu() succeeded (otherwise a usage error and an invalid handle).
  CollectiveHandle BeginOnStream(std::string_view op, uint64_t comm_id, uint64_t bytes, int peer,
                                 void* stream);
  void EndOnStream(CollectiveHandle handle, void* stream);

  // For the poller (the watchdog thread): completes GPU collectives whose end event fired, and
  // reports what is in flight at `now_ns` (this tracker's clock) and what became overdue.
  CollectivePoll Poll(int64_t now_ns);
  // Calls the abort function of every registered communicator not yet aborted; returns how many.
  int AbortCommunicators();
  // The same for the communicators of `comm_ids` only. A hang aborts those registered when it was
  // declared: the training thread may leave the hung collective by itself while the hang's
  // handlers run (a peer died) and register its next generation's communicator, which is healthy.
  int AbortCommunicators(const std::vector<uint64_t>& comm_ids);
  // Takes back the overdue report of collective `instance` (InFlightCollective::instance): it was
  // found waiting for a peer that is still making progress (WatchdogOptions::peer_progress). The
  // next Poll reports it overdue again while it is, and when it completes its duration teaches its
  // op's bound like a healthy collective's. No-op when it is no longer in flight. Poller only.
  void ExcuseOverdue(uint64_t instance);
  // True while collective `instance` (InFlightCollective::instance) has not completed.
  bool InFlight(uint64_t instance) const;

  // The learned in-flight bound of op `op` (the warm-up bound for an op never seen).
  absl::Duration BoundFor(std::string_view op) const;
  std::vector<CommunicatorProgress> Progress() const;
  // The durations of every collective completed so far (host and GPU, failed ones too), summed,
  // on this tracker's clock: with the steps' durations, how much of a step was not communication
  // (the fail-slow metrics, docs/GUIDE.md). Any thread.
  absl::Duration completed_time() const;
  // The bytes of those collectives (each Begin's `bytes`), summed: with completed_time(), the
  // throughput of the rank's collectives. Any thread.
  int64_t completed_bytes() const;
  int64_t usage_errors() const;
  // The first usage error, or OK.
  absl::Status usage_status() const;
  Clock& clock() const;

 private:
  friend class CollectiveTrackerTestPeer;
  class Impl;  // sdk/watchdog/collective_tracker_impl.h
  explicit CollectiveTracker(std::unique_ptr<Impl> impl);
  const std::unique_ptr<Impl> impl_;
};

// Begin in the constructor, End in the destructor; a destructor run by an exception thrown since
// the constructor (the collective failed) ends it as failed. A null tracker makes it a no-op.
class ScopedCollective {
 public:
  ScopedCollective(CollectiveTracker* tracker, std::string_view op, uint64_t comm_id,
                   uint64_t bytes, int peer = -1)
      : tracker_(tracker),
        handle_(tracker != nullptr ? tracker->Begin(op, comm_id, bytes, peer)
                                   : CollectiveHandle{}) {}
  ~ScopedCollective() {
    if (tracker_ != nullptr) tracker_->End(handle_, std::uncaught_exceptions() > uncaught_);
  }
  ScopedCollective(const ScopedCollective&) = delete;
  ScopedCollective& operator=(const ScopedCollective&) = delete;

  const CollectiveHandle& handle() const { return handle_; }

 private:
  CollectiveTracker* const tracker_;
  const CollectiveHandle handle_;
  const int uncaught_ = std::uncaught_exceptions();
};

}  // namespace trainguard

#endif  // TRAINGUARD_COLLECTIVES_H_
