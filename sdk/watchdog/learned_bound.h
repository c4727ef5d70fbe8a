// Learned bounds: how long something may take before the watchdog calls it hung, learned from how
// long the same thing took recently (private to sdk/watchdog).
//
// A SampleWindow keeps the last `capacity` samples of one quantity (a phase's duration, the longest
// silence between its ticks, a collective's time in flight). A BoundRule turns a window into a
// bound:
//
//   fewer than warmup_samples samples:  warmup_bound
//   otherwise:                          max(floor, factor_pct / 100 x the largest sample in the
//   window)
//
// The high quantile is the window's maximum rather than an estimated p99: with the default window
// of 200, an empirical p99 lies between the two largest samples anyway, and for the heavy-tailed
// durations of RL generation (p99/median around 10) the difference between them is noise. The
// maximum is never below a healthy instance seen in the window, which is what "no false alarm"
// needs; the factor gives the headroom for a new, slightly longer healthy instance. The watchdog
// keeps hung instances out of the window, so one past hang does not inflate the bound.
//
// Thread safety: SampleWindow::Add from one thread at a time (see Add for what a second concurrent
// writer costs), concurrently with readers on any thread: every slot is an atomic, and a reader
// racing the writer sees the window at most one sample behind or ahead. BoundRule is a value.
#ifndef TRAINGUARD_SDK_WATCHDOG_LEARNED_BOUND_H_
#define TRAINGUARD_SDK_WATCHDOG_LEARNED_BOUND_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "trainguard/collectives.h"

namespace trainguard {
namespace watchdog_internal {

// LearnedBoundOptions in nanoseconds, the form the monitor compares against its clock readings.
struct BoundRule {
  explicit BoundRule(const LearnedBoundOptions& options = {});

  int warmup_samples;
  int64_t warmup_bound_ns;
  int factor_pct;
  int64_t floor_ns;

  // The bound for a quantity of which `samples` were seen in all, the largest recent one being
  // `window_max_ns`. Saturates instead of overflowing.
  int64_t Bound(int64_t samples, int64_t window_max_ns) const;
};

class SampleWindow {
 public:
  // Allocates the window once. REQUIRES: capacity >= 1.
  explicit SampleWindow(int capacity);
  SampleWindow(const SampleWindow&) = delete;
  SampleWindow& operator=(const SampleWindow&) = delete;

  // Records a sample, replacing the oldest once the window is full. No allocation, no
  // read-modify-write: meant for one writer at a time. Two threads adding at the same instant may
  // lose one of the two samples, which only delays learning by a sample.
  void Add(int64_t sample) {
    const int next = next_.load(std::memory_order_relaxed);  // wraps without a division
    samples_[next].store(sample, std::memory_order_release);
    next_.store(next + 1 == capacity_ ? 0 : next + 1, std::memory_order_relaxed);
    count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Samples recorded in all (not only those still in the window).
  int64_t count() const { return count_.load(std::memory_order_acquire); }

  // The largest sample still in the window; 0 when empty. O(capacity).
  int64_t Max() const;

  // rule.Bound(count(), Max()).
  int64_t Bound(const BoundRule& rule) const { return rule.Bound(count(), Max()); }

 private:
  const int capacity_;
  const std::unique_ptr<std::atomic<int64_t>[]> samples_;
  std::atomic<int> next_{0};  // the slot the next sample goes to
  std::atomic<int64_t> count_{0};
};

}  // namespace watchdog_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_LEARNED_BOUND_H_
