// LeaseKeeper: whether this agent is the job's coordinator, and what it says when that changes.
// Several hosts: one agent at a time holds the coordinator lease (CoordinatorLease, fenced by its
// term); the keeper watches or takes it (Update, every agent tick) and renews it (on a thread of
// its own: see below), says "coordinating the job (lease term N; generation G)" when it takes it
// (and hands the takeover to Hooks::took_over: the membership and every fact the previous holder
// acted on are read back from the store), "no longer coordinating (<why>)" when it loses it
// (Hooks::deposed drops what it had queued), and "coordinating the job again" when a renewal that
// came after its acting deadline finds that nobody took it meanwhile. Coordinating() is the gate
// of every coordinator act. One host: no lease, the launcher's coordinator always acts (the same
// calls, a lease of nobody to lose).
//
// The renewal. A holder renews its lease on a thread of its own (StartRenewing, RenewOnce every
// `interval`), not in the agent's turn: one slow turn (a store call that waits, a loaded machine)
// would otherwise let the lease lapse and cost the job a needless failover. A holder whose process
// is dead or stopped (SIGSTOP) renews no more, so the lease still passes within its expiry; so does
// a holder whose loop has not turned (Update) for `loop_stall_bound`: an agent wedged for that long
// coordinates nothing, and its lease is better in another agent's hands. The fencing stays the
// lease's: the gate closes at the acting deadline of the last confirmed renewal, whichever thread
// made it, and at once when a renewal finds the lease taken (deposed); only the loop watches and
// takes the lease, and a term is acted on only once the loop has taken it over (Update ran the
// takeover: the state read back from the store). Where no renewal thread runs (a test that turns
// the loop by hand), Update renews the lease itself, as every turn did before.
//
// The gate is read by the lease's clock (CoordinatorLease::HeldAt). Tests drive two keepers of
// one job on an in-memory store and a ManualClock, calling RenewOnce for the renewal thread
// (tests/unit/lease_keeper_test.cc).
//
// Thread safety: one thread (the agent's loop, a test) calls Update, Coordinating, Release,
// StartRenewing and StopRenewing; the renewal thread (or a test standing in for it) calls
// RenewOnce.
#ifndef TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_
#define TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/core/duty_thread.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/coordinator_lease.h"

namespace trainguard {

class LeaseKeeper {
 public:
  struct Hooks {
    // Says one line of the launcher's output (without the "trainguard run: " prefix).
    std::function<void(const std::string&)> say;
    // This agent took the lease: loads the newest published generation from the store (its answer
    // said when it is neither OK nor NotFound: before generation 0 there is none).
    std::function<absl::Status()> resume;
    // The newest published generation this agent knows (for the lines said).
    std::function<int64_t()> generation;
    // After the takeover was said: the coordinator's state starts afresh from the store.
    std::function<void()> took_over;
    // This agent lost the lease: what it queued and measured is its successor's.
    std::function<void()> deposed;
  };

  // `lease`: this agent's coordinator lease; nullptr on one host (always coordinating).
  // REQUIRES: `lease` outlives the keeper; every hook is set. `call_timeout`: how long one Update
  // or renewal may wait on the store. `loop_stall_bound`: a holder whose loop has not called
  // Update for this long (by the lease's clock) is renewed no more (see above).
  LeaseKeeper(CoordinatorLease* lease, absl::Duration call_timeout, Hooks hooks,
              absl::Duration loop_stall_bound = absl::InfiniteDuration());
  // Stops the renewal thread (StopRenewing).
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Starts the renewal thread (a DutyThread): a wait of `interval` (real time, cut short by
  // StopRenewing), then RenewOnce, until StopRenewing. From then on Update leaves a claimed lease
  // to it. Nothing on one host (no lease), nor when it runs already. REQUIRES: `interval` > 0.
  void StartRenewing(absl::Duration interval);
  // Stops and joins the renewal thread: at most one renewal under way (call_timeout) is waited
  // for. Nothing when it does not run.
  void StopRenewing();
  // The renewal thread's step: renews the lease when this agent claims it (CoordinatorLease::
  // Renew; deposed at once when another agent took it), unless the loop has not turned for
  // loop_stall_bound. Never watches or takes the lease, never calls a hook.
  void RenewOnce();

  // The loop's turn: watches or takes the lease (and renews it where no renewal thread runs), and
  // says what changed since the last call (see above), whichever thread changed it: a deposition
  // by the renewal thread is said, and Hooks::deposed called, here.
  void Update();

  // The gate of every coordinator act, checked right before the act writes to the store (or says
  // what it decided), not once per loop: one store call may wait longer than the lease lasts (a
  // partition) and every act after it would run on a stale check. True on one host; on several,
  // while this agent holds the lease by its clock, short of its acting deadline, under the term
  // whose takeover Update ran. The first call to find the gate closed while the lease is still
  // claimed (not renewed in time) says "no longer coordinating (lease term N was not renewed in
  // time: ...)", before any act is refused.
  bool Coordinating();

  // Gives the lease up for a successor to take at once (CoordinatorLease::Release, within
  // `timeout`), once the renewal thread stopped: an agent that leaves the job.
  void Release(absl::Duration timeout);

 private:
  // Update's sayings and hooks: the lease claimed at the last Update was lost (deposed, expired,
  // released); the lease was taken (term_seen_).
  void SayDeposed();
  void TakeOver();

  CoordinatorLease* const lease_;
  const absl::Duration call_timeout_;
  const Hooks hooks_;
  const absl::Duration loop_stall_bound_;
  // "coordinating the job" was said, and "no longer coordinating" not since.
  bool said_coordinating_ = false;
  // What the last Update found: whether the lease was claimed, and its term then.
  bool claimed_seen_ = false;
  int64_t term_seen_ = 0;
  // When the loop last called Update (the lease's clock, monotonic ns): read by the renewal thread.
  std::atomic<int64_t> loop_turned_ns_;

  std::unique_ptr<DutyThread> renewer_;  // while renewing
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_
