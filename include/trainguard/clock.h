// Clock: the time seam of trainguard.
//
// Everything in the SDK that reads time goes through a Clock, so tests can substitute a ManualClock
// and make timing-dependent behaviour deterministic. Two time bases are exposed: wall time
// (absl::Time), used for event timestamps only, and a monotonic nanosecond counter, used for every
// duration and deadline.
//
// Thread safety: every method of every Clock in this header may be called concurrently.
#ifndef TRAINGUARD_CLOCK_H_
#define TRAINGUARD_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace trainguard {

class Clock {
 public:
  virtual ~Clock() = default;

  // Wall-clock time. May jump (NTP); never use it to measure durations.
  virtual absl::Time Now() = 0;

  // Nanoseconds from an arbitrary fixed origin; never decreases.
  virtual int64_t MonotonicNanos() = 0;

  // Blocks the calling thread for about `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) = 0;

  // The process-wide real clock (CLOCK_MONOTONIC and CLOCK_REALTIME). Never deleted.
  static Clock* Real();
};

// A clock that moves only when told to. SleepFor(d) advances it by d and returns at once, so code
// under test that sleeps runs instantly and deterministically.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch()) : start_(start) {}

  absl::Time Now() override { return start_ + absl::Nanoseconds(nanos_.load()); }
  int64_t MonotonicNanos() override { return nanos_.load(); }
  void SleepFor(absl::Duration d) override { Advance(d); }

  // REQUIRES: d >= 0.
  void Advance(absl::Duration d) { nanos_.fetch_add(absl::ToInt64Nanoseconds(d)); }

 private:
  const absl::Time start_;
  std::atomic<int64_t> nanos_{0};
};

}  // namespace trainguard

#endif  // TRAINGUARD_CLOCK_H_
