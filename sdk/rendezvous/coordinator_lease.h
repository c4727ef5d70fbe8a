// CoordinatorLease: which host agent coordinates a multi-host job, chosen through the job's store so
// that coordination does not die with one host.
//
// The lease is one store key, `coord/lease`, holding "<term> <holder> <beat>". Every agent calls
// Update() periodically (every expiry/8 or so):
//   - the holder renews it by compare-and-set of the value it wrote last to the same term with the
//     beat advanced; a failed compare-and-set means another agent took the lease (this one was
//     partitioned or stopped for longer than the expiry): it is deposed at once;
//   - any other agent watches the value, and when it has not changed for `expiry` of its own clock
//     (monotonic: a wall-clock jump never deposes anyone), takes the lease by compare-and-set to
//     term+1. Of several agents that try at once, exactly one wins.
// A holder that cannot reach the store for `expiry` of its own clock stops calling itself the holder
// even before anyone else took over, so that a partitioned coordinator stops acting on a stale view.
// The term fences the coordinator's acts: the membership generations it publishes are claimed in the
// store (RendezvousCoordinator::Publish), so a deposed holder that still acts cannot overwrite its
// successor's decisions.
//
// Thread safety: not thread-safe; one thread (the agent's loop) owns a CoordinatorLease.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_
#define TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/agent_keys.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {

class CoordinatorLease {
 public:
  // REQUIRES: `store` and `clock` outlive the lease; `holder_id` non-empty, without spaces.
  CoordinatorLease(Store* store, std::string holder_id, absl::Duration expiry,
                   Clock* clock = Clock::Real());
  CoordinatorLease(const CoordinatorLease&) = delete;
  CoordinatorLease& operator=(const CoordinatorLease&) = delete;

  // Renews, watches or takes the lease (see above). Returns whether this agent holds it after the
  // call. An error means the store could not be reached; the lease is then still held only while
  // the last renewal is younger than `expiry`.
  absl::StatusOr<bool> Update(absl::Duration timeout);
  // Gives the lease up (marks it released if this agent still holds it), so that a successor takes
  // it at its next Update instead of waiting for the expiry: an agent that exits.
  void Release(absl::Duration timeout);

  // Whether this agent holds the lease now: it took or renewed it, and its last renewal (timed from
  // before the write) is younger than the expiry by its own clock. A holder whose renewals stall
  // (the store unreachable, its loop late) stops holding at the expiry whether or not Update() is
  // called meanwhile, so it stops acting before any watcher, which waits out the expiry from its
  // own first sight of the last value written, can take the lease over.
  bool held() const {
    return held_ && clock_->MonotonicNanos() - renewed_ns_ < absl::ToInt64Nanoseconds(expiry_);
  }
  // Whether this agent still claims the lease (took it and was not deposed), expired or not: what
  // Update() changes. A claimed lease that expired is held again once a renewal succeeds (its value
  // was still this agent's: nobody took it).
  bool claimed() const { return held_; }
  // The term this agent holds (0 when it never held the lease).
  int64_t term() const { return term_; }
  // The newest term of the lease this agent has seen, held or read (0 before its first Update):
  // what fences the coordinator's requests to the agents (store_keys::KillRequest).
  int64_t latest_term() const { return latest_term_; }
  // The holder named in the value this agent read last ("" when there was none).
  const std::string& last_holder() const { return last_holder_; }
  const std::string& holder_id() const { return holder_id_; }
  // The holder named by the value this agent replaced when it took the lease last: "" when the key
  // was absent, kReleasedHolder when it was released, else the agent whose lease expired.
  const std::string& taken_from() const { return taken_from_; }

  static constexpr const char* kKey = store_keys::kCoordLease;
  // The holder named by a released lease (Release): the next agent to look takes it at once.
  static constexpr char kReleasedHolder[] = "-";

 private:
  std::string Value(int64_t term, int64_t beat) const;
  bool TryTake(const std::optional<std::string>& expected, int64_t term, absl::Duration timeout);

  Store* const store_;
  const std::string holder_id_;
  const absl::Duration expiry_;
  Clock* const clock_;
  bool held_ = false;
  int64_t term_ = 0;
  int64_t latest_term_ = 0;
  int64_t beat_ = 0;
  std::string written_;                  // the value this agent wrote last
  int64_t renewed_ns_ = 0;               // clock_ time of the last successful write
  std::optional<std::string> observed_;  // a non-holder's view of the key
  int64_t observed_since_ns_ = 0;
  std::string last_holder_;
  std::string taken_from_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_COORDINATOR_LEASE_H_
