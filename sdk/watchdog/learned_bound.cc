#include "sdk/watchdog/learned_bound.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace trainguard {
namespace watchdog_internal {

int64_t BoundRule::Bound(int64_t samples, int64_t window_max_ns) const {
  if (samples < warmup_samples) return warmup_bound_ns;
  const __int128 scaled = static_cast<__int128>(window_max_ns) * factor_pct / 100;
  const int64_t learned = scaled > std::numeric_limits<int64_t>::max()
                              ? std::numeric_limits<int64_t>::max()
                              : static_cast<int64_t>(scaled);
  return std::max(floor_ns, learned);
}

SampleWindow::SampleWindow(int capacity)
    : capacity_(std::max(capacity, 1)), samples_(new std::atomic<int64_t>[capacity_]) {
  for (int i = 0; i < capacity_; ++i) samples_[i].store(0, std::memory_order_relaxed);
}

int64_t SampleWindow::Max() const {
  const int64_t n = std::min<int64_t>(count(), capacity_);
  int64_t max = 0;
  for (int64_t i = 0; i < n; ++i) {
    max = std::max(max, samples_[i].load(std::memory_order_acquire));
  }
  return max;
}

}  // namespace watchdog_internal
}  // namespace trainguard
