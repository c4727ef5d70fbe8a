// BusyPoll: how long a TcpStore socket is polled without sleeping before its thread blocks on it.
//
// A store call is a round trip whose answer usually comes back within microseconds, yet a thread
// that blocks for it sleeps, and waking a sleeping thread means waking an idle CPU: in a virtual
// machine whose guest halts idle vCPUs at once (no halt polling) that exit and re-entry costs tens
// of microseconds, on each side of every round trip. Polling the socket for a short budget before
// blocking keeps both threads awake across a quick exchange.
//
// Polling burns the CPU it waits on, so the budget is withdrawn where it does not pay: after a
// wait that used its whole budget without an answer (a miss), the next 1, 3, 7, ... waits (at most
// kMaxSkippedWaits) block at once, and one answered within the budget (a hit) restores polling
// for every wait. A thread of many clients sharing a server, or a server whose clients are idle,
// thus polls on one wait in kMaxSkippedWaits + 1 at most.
//
// Threads that poll at the same time compete for the CPUs with each other and with the threads
// that must produce their answers; PollingSlots bounds how many of a process's threads poll at
// once (the others sleep at once).
//
// BusyPoll's decisions are a pure function of the outcomes recorded; the polling itself (which
// socket, which clock) is the caller's. Thread safety: BusyPoll has none (each connection or event
// loop owns its own); PollingSlots is thread-safe.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_BUSY_POLL_H_
#define TRAINGUARD_SDK_RENDEZVOUS_BUSY_POLL_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "trainguard/clock.h"

namespace trainguard {

class BusyPoll {
 public:
  // The most waits that block at once after consecutive misses.
  static constexpr int kMaxSkippedWaits = 31;

  // REQUIRES: budget >= 0. A zero budget never polls.
  explicit BusyPoll(absl::Duration budget) : budget_(budget) {}

  // How long the next wait polls before it blocks: the budget, or zero while waits are skipped
  // after a miss. A wait given a nonzero budget must report its outcome to Record.
  absl::Duration NextWait();

  // Reports whether the wait that NextWait gave a budget was answered within it.
  void Record(bool answered);

  absl::Duration budget() const { return budget_; }

 private:
  const absl::Duration budget_;
  // The waits to block at once after the latest miss (0 after a hit), and those still left.
  int skip_after_miss_ = 0;
  int skip_ = 0;
};

// A bounded number of threads allowed to poll at once.
class PollingSlots {
 public:
  // REQUIRES: slots >= 0.
  explicit PollingSlots(int slots) : free_(slots) {}

  PollingSlots(const PollingSlots&) = delete;
  PollingSlots& operator=(const PollingSlots&) = delete;

  // Takes a slot if one is free; a thread that got one polls, then gives it back with Release.
  bool TryAcquire();
  void Release();

 private:
  std::atomic<int> free_;
};

// Calls `ready` until it returns true or `budget` has passed on `clock`'s monotonic time; returns
// whether it did. `ready` is called at least once; between calls, `relax` (the CPU's spin-wait
// hint by default). The thread does not sched_yield(2): under the kernel's EEVDF scheduler every
// yield pushes the thread's deadline back by a whole slice, so a thread that yielded at each poll
// then waited milliseconds for its turn. A thread that the scheduler preempts instead comes back
// past the budget, and that ends the polling without another call (a miss): on a CPU so busy,
// sleeping gets the thread back sooner than polling.
template <typename Ready, typename Relax>
bool PollFor(absl::Duration budget, Ready&& ready, Clock& clock, Relax&& relax) {
  const int64_t end = clock.MonotonicNanos() + absl::ToInt64Nanoseconds(budget);
  if (ready()) return true;
  while (clock.MonotonicNanos() < end) {
    relax();
    if (clock.MonotonicNanos() >= end) return false;
    if (ready()) return true;
  }
  return false;
}

// The CPU's hint that the thread spins (x86 `pause`, Arm `yield`); nothing elsewhere.
inline void SpinPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <typename Ready>
bool PollFor(absl::Duration budget, Ready&& ready) {
  return PollFor(budget, ready, *Clock::Real(), SpinPause);
}

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_BUSY_POLL_H_
