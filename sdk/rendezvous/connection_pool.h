// ConnectionPool: the connections a store client keeps open to its server, taken by a call for its
// duration and given back, with a cap on how many its short requests hold.
//
// A short request (a get, a set, an add: one round trip) takes a slot of the cap and an idle
// connection, or opens one when none is idle. When every slot is taken it waits, within its
// timeout, in arrival order, for the first to come free, instead of opening another connection:
// a process with many threads on one client (a host agent's turn, its heartbeat and its lease
// renewal) then holds a bounded number of the server's connections and of its own descriptors.
//
// A parked request (a wait that the server answers when its keys appear) holds its connection for
// as long as its caller asks. Counted in the cap, a few of them would hold up every short request
// (a rank's heartbeats behind its generation watch) and one another (a wait that runs out waiting
// for a connection while its keys are there), so a parked request takes no slot: it takes an idle
// connection or opens its own. The client then holds at most `max_connections` connections plus
// one per parked request in flight; idle connections are kept only within the cap.
//
// A connection given back is kept whatever its state: one whose server closed it reconnects on its
// next call, so a dead connection frees its slot like any other.
//
// Thread safety: thread-safe. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_CONNECTION_POOL_H_
#define TRAINGUARD_SDK_RENDEZVOUS_CONNECTION_POOL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"

namespace trainguard {

template <typename Connection>
class ConnectionPool {
 public:
  enum class Use {
    kShort,   // one round trip: takes a slot of the cap
    kParked,  // answered when the server's keys appear: takes none
  };
  using Factory = std::function<std::unique_ptr<Connection>()>;

  // `make` creates a connection (which connects on its first call). REQUIRES: max_connections >= 1.
  ConnectionPool(int max_connections, Factory make)
      : max_connections_(static_cast<size_t>(std::max(max_connections, 1))),
        make_(std::move(make)) {}
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A connection for one call: an idle one, or a new one. A short request waits up to `timeout`
  // for a slot, in arrival order; nullptr when none came free in that time.
  std::unique_ptr<Connection> Take(Use use, absl::Duration timeout) {
    std::unique_ptr<Connection> connection;
    {
      MutexLock lock(&mu_);
      if (use == Use::kShort && !TakeSlotLocked(timeout)) return nullptr;
      if (!idle_.empty()) {
        connection = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (connection == nullptr) connection = make_();
    return connection;
  }

  // Gives back what Take returned for `use`: kept for later calls while the idle and the short
  // requests' connections stay within the cap, else closed.
  void Give(std::unique_ptr<Connection> connection, Use use) {
    std::unique_ptr<Connection> closed;  // destroyed outside the lock: closing is a system call
    MutexLock lock(&mu_);
    if (use == Use::kShort) --short_in_use_;
    if (idle_.size() + short_in_use_ < max_connections_) {
      idle_.push_back(std::move(connection));
    } else {
      closed = std::move(connection);
    }
  }

  // A snapshot, for tests: connections held by short requests, kept idle, and short requests
  // waiting for a slot.
  size_t short_in_use() {
    MutexLock lock(&mu_);
    return short_in_use_;
  }
  size_t idle() {
    MutexLock lock(&mu_);
    return idle_.size();
  }
  size_t waiting() {
    MutexLock lock(&mu_);
    return waiting_.size();
  }

 private:
  // Takes a slot when this request is the first waiting and one is free, within `timeout`.
  bool TakeSlotLocked(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiting_.empty() && short_in_use_ < max_connections_) {
      ++short_in_use_;
      return true;
    }
    const uint64_t ticket = next_ticket_++;
    waiting_.push_back(ticket);
    // An infinite timeout, bounded so that the condition variable's deadline does not overflow.
    const bool mine = mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return waiting_.front() == ticket && short_in_use_ < max_connections_;
        },
        std::min(timeout, absl::Hours(24 * 365)));
    if (!mine) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
      return false;
    }
    waiting_.pop_front();
    ++short_in_use_;
    return true;
  }

  const size_t max_connections_;
  const Factory make_;
  Mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mu_);
  size_t short_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);  // tickets, in arrival order
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_CONNECTION_POOL_H_
