// LeaseKeeper: whether this agent is the job's coordinator, and what it says when that changes.
// Several hosts: one agent at a time holds the coordinator lease (CoordinatorLease, fenced by its
// term); the keeper renews, watches or takes it (Update, every agent tick), says "coordinating the
// job (lease term N; generation G)" when it takes it (and hands the takeover to Hooks::took_over:
// the membership and every fact the previous holder acted on are read back from the store), "no
// longer coordinating (<why>)" when it loses it (Hooks::deposed drops what it had queued), and
// "coordinating the job again" when a renewal that came after its acting deadline finds that
// nobody took it meanwhile. Coordinating() is the gate of every coordinator act. One host: no
// lease, the launcher's coordinator always acts (the same calls, a lease of nobody to lose).
//
// The gate is read by the lease's clock (CoordinatorLease::HeldAt). Tests drive two keepers of
// one job on an in-memory store and a ManualClock (tests/unit/lease_keeper_test.cc).
//
// Thread safety: not thread-safe; one thread (the agent's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_
#define TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
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
  // may wait on the store.
  LeaseKeeper(CoordinatorLease* lease, absl::Duration call_timeout, Hooks hooks);
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Renews, watches or takes the lease once, and says what changed (see above).
  void Update();

  // The gate of every coordinator act, checked right before the act writes to the store (or says
  // what it decided), not once per loop: one store call may wait longer than the lease lasts (a
  // partition) and every act after it would run on a stale check. True on one host; on several,
  // while this agent holds the lease by its clock, short of its acting deadline. The first call to
  // find the gate closed while the lease is still claimed (not renewed in time) says "no longer
  // coordinating (lease term N was not renewed in time: ...)", before any act is refused.
  bool Coordinating();

 private:
  CoordinatorLease* const lease_;
  const absl::Duration call_timeout_;
  const Hooks hooks_;
  // "coordinating the job" was said, and "no longer coordinating" not since.
  bool said_coordinating_ = false;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_LEASE_KEEPER_H_
