// CoordinatorLease: which host agent coordinates a multi-host job, chosen through the job's store
// so that coordination does not die with one host.
//
// The lease is one store key, `coord/lease`, holding "<term> <holder> <beat>". Every agent calls
// Update() periodically (every expiry/8 or so; a holder's renewal thread calls Renew() instead,
// LeaseKeeper):
//   - the holder renews it by compare-and-set of the value it wrote last to the same term with the
//     beat advanced; a failed compare-and-set means another agent took the lease (this one was
//     partitioned or stopped for longer than the expiry): it is deposed at once;
//   - any other agent watches the value, and when it has not changed for `expiry` of its own clock
//     (monotonic: a wall-clock jump never deposes anyone), timed from after the read that first
//     showed it, takes the lease by compare-and-set to term+1. Of several agents that try at once,
//     exactly one wins.
//
// Acting. The holder may act as the coordinator only until its acting deadline: the start of the
// write that its last confirmed renewal (or its take) made, plus the expiry, less the acting
// margin. Every watcher first saw that value after the write started, so the holder stops acting
// at least `acting_margin` of its own clock before any watcher can take the lease over, whether or
// not Update() is called meanwhile (a partitioned holder, a loop stalled in a long store call).
// The margin absorbs the holders' clocks running at slightly different rates and the time a write
// sent just before the deadline takes to reach the store. Each coordinator act checks HeldAt (or
// CheckHeld) right before its write, not once per loop iteration: a check made before a store call
// that can outlast the lease says nothing about the moment after it.
// The term fences the coordinator's acts further: the membership generations it publishes are
// claimed in the store (RendezvousCoordinator::Publish), so a deposed holder whose write was
// already under way cannot overwrite its successor's decisions, and its kill requests carry the
// term (store_keys::KillRequest).
//
// Thread safety: thread-safe. Update, Renew and Release run one at a time (a mutex held across
// their store calls serializes them): the agent's loop watches and takes the lease while a renewal
// thread of its own renews it (LeaseKeeper::StartRenewing), so that a slow turn of the loop does
// not cost the lease. The accessors never wait for a store call: HeldAt, held and CheckHeld (the
// gate, checked by a helper thread that publishes a generation right before its write too),
// claimed, term and latest_term read atomics, last_holder and taken_from a short critical section.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_
#define TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/mutex.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {

class CoordinatorLease {
 public:
  // REQUIRES: `store` and `clock` outlive the lease; `holder_id` non-empty, without spaces;
  // 0 <= `acting_margin` < `expiry` (nullopt: DefaultActingMargin(expiry)).
  CoordinatorLease(Store* store, std::string holder_id, absl::Duration expiry,
                   Clock* clock = Clock::Real(),
                   std::optional<absl::Duration> acting_margin = std::nullopt);
  CoordinatorLease(const CoordinatorLease&) = delete;
  CoordinatorLease& operator=(const CoordinatorLease&) = delete;

  // A quarter of the expiry: with renewals every expiry/8 or so, a holder whose store answers
  // within the margin never stops acting, and one that is cut off stops a quarter of the expiry
  // before anyone can take over.
  static absl::Duration DefaultActingMargin(absl::Duration expiry) { return expiry / 4; }

  // Renews, watches or takes the lease (see above). Returns whether this agent holds it after the
  // call (held()). An error means the store could not be reached; the lease is then still held
  // only until the acting deadline of the last confirmed renewal.
  absl::StatusOr<bool> Update(absl::Duration timeout);
  // Update, for a holder only: renews the lease when this agent claims it (deposed at once when
  // another agent took it), and does nothing otherwise (returns false): what a renewal thread
  // calls, so that it never watches or takes the lease behind the loop's back.
  absl::StatusOr<bool> Renew(absl::Duration timeout);
  // Gives the lease up (marks it released if this agent still holds it), so that a successor takes
  // it at its next Update instead of waiting for the expiry: an agent that exits.
  void Release(absl::Duration timeout);

  // The gate of every coordinator act: whether this agent may act as the coordinator at `now_ns`
  // (its clock's monotonic time): it claims the lease and `now_ns` is before its acting deadline
  // (see above). A lease that a renewal then confirms (nobody took it meanwhile) is held again.
  bool HeldAt(int64_t now_ns) const {
    return now_ns < acting_deadline_ns_.load(std::memory_order_acquire);
  }
  // HeldAt(now), by the lease's clock.
  bool held() const { return HeldAt(clock_->MonotonicNanos()); }
  // OK while held(); else Aborted, naming this agent, the term it held and how long ago its acting
  // deadline passed: what a coordinator act refused by the gate returns.
  absl::Status CheckHeld() const;
  // The acting deadline (clock monotonic ns; the lowest int64 when the lease is not claimed).
  int64_t acting_deadline_ns() const {
    return acting_deadline_ns_.load(std::memory_order_acquire);
  }
  absl::Duration acting_margin() const { return acting_margin_; }
  // Whether this agent still claims the lease (took it and was not deposed), expired or not: what
  // Update() changes. A claimed lease that expired is held again once a renewal succeeds (its value
  // was still this agent's: nobody took it).
  bool claimed() const { return claimed_.load(std::memory_order_acquire); }
  // The term this agent holds (0 when it never held the lease).
  int64_t term() const { return term_.load(std::memory_order_acquire); }
  // The newest term of the lease this agent has seen, held or read (0 before its first Update):
  // what fences the coordinator's requests to the agents (store_keys::KillRequest).
  int64_t latest_term() const { return latest_term_.load(std::memory_order_acquire); }
  // The holder named in the value this agent read last ("" when there was none).
  std::string last_holder() const {
    MutexLock lock(&names_mu_);
    return last_holder_;
  }
  const std::string& holder_id() const { return holder_id_; }
  // The holder named by the value this agent replaced when it took the lease last: "" when the key
  // was absent, kReleasedHolder when it was released, else the agent whose lease expired.
  std::string taken_from() const {
    MutexLock lock(&names_mu_);
    return taken_from_;
  }
  // The clock the lease is timed by.
  Clock* clock() const { return clock_; }

  static constexpr const char* kKey = store_keys::kCoordLease;
  // The holder named by a released lease (Release): the next agent to look takes it at once.
  static constexpr char kReleasedHolder[] = "-";

 private:
  std::string Value(int64_t term, int64_t beat) const;
  bool TryTake(const std::optional<std::string>& expected, int64_t term, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  absl::StatusOr<bool> RenewLocked(absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  absl::StatusOr<bool> WatchLocked(absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  // Records a confirmed write of this agent's value whose first attempt started at `started_ns`:
  // the acting deadline counts from there.
  void Renewed(int64_t started_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  // Not held from now on (deposed, released, or its last renewal's expiry passed).
  void StopHolding() ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  void SawTerm(int64_t term);
  void SetLastHolder(std::string holder);

  static constexpr int64_t kNotHeld = std::numeric_limits<int64_t>::min();

  Store* const store_;
  const std::string holder_id_;
  const absl::Duration expiry_;
  Clock* const clock_;
  const absl::Duration acting_margin_;
  // Held across the store calls of Update, Renew and Release: one at a time.
  Mutex update_mu_;
  // Written under update_mu_; atomic so that the accessors read them without waiting for a call.
  std::atomic<bool> claimed_{false};
  std::atomic<int64_t> term_{0};
  std::atomic<int64_t> latest_term_{0};
  int64_t beat_ ABSL_GUARDED_BY(update_mu_) = 0;
  std::string written_ ABSL_GUARDED_BY(update_mu_);  // the value this agent wrote last
  // clock_ time when the write of the last confirmed value started.
  int64_t renewed_ns_ ABSL_GUARDED_BY(update_mu_) = 0;
  // When the first attempt to write beat_ + 1 started (a renewal whose reply was lost may have been
  // applied: its value then dates from that attempt, not from the call that finds it).
  std::optional<int64_t> renewal_attempt_ns_ ABSL_GUARDED_BY(update_mu_);
  // renewed_ns_ + expiry - margin while claimed, else kNotHeld: the gate's one field.
  std::atomic<int64_t> acting_deadline_ns_{kNotHeld};
  std::optional<std::string> observed_
      ABSL_GUARDED_BY(update_mu_);  // a non-holder's view of the key
  int64_t observed_since_ns_ ABSL_GUARDED_BY(update_mu_) = 0;
  mutable Mutex names_mu_;  // never held across a store call
  std::string last_holder_ ABSL_GUARDED_BY(names_mu_);
  std::string taken_from_ ABSL_GUARDED_BY(names_mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_
