#include "sdk/checkpoint/backup_rate_limiter.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "trainguard/clock.h"

namespace trainguard {
namespace {

// How often a wait for a reservation re-checks the caller's cancel flag.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

}  // namespace

BackupRateLimiter::BackupRateLimiter(uint64_t bytes_per_second, Clock* clock)
    : rate_(bytes_per_second), clock_(clock != nullptr ? clock : Clock::Real()) {}

bool BackupRateLimiter::Acquire(uint64_t bytes, absl::Time deadline,
                                const std::atomic<bool>* cancel) {
  auto cancelled = [cancel] {
    return cancel != nullptr && cancel->load(std::memory_order_relaxed);
  };
  if (cancelled()) return false;
  if (rate_ == 0) return true;
  constexpr int64_t kFar = INT64_MAX / 4;  // beyond any deadline; sums of two do not overflow
  const int64_t cost = static_cast<int64_t>(std::min(
      static_cast<double>(kFar), static_cast<double>(bytes) * 1e9 / static_cast<double>(rate_)));
  int64_t now = clock_->MonotonicNanos();
  const absl::Duration left = deadline - clock_->Now();
  const int64_t deadline_ns =
      now + (left >= absl::Nanoseconds(kFar)    ? kFar
             : left <= absl::Nanoseconds(-kFar) ? -kFar
                                                : absl::ToInt64Nanoseconds(left));
  int64_t start = 0;
  int64_t expected = next_free_ns_.load(std::memory_order_relaxed);
  do {
    start = std::max(expected, now);
    if (start > deadline_ns) return false;
  } while (!next_free_ns_.compare_exchange_weak(expected, start + cost, std::memory_order_relaxed));
  while ((now = clock_->MonotonicNanos()) < start) {
    if (cancelled()) return false;
    clock_->SleepFor(std::min(absl::Nanoseconds(start - now), kCancelPoll));
  }
  return true;
}

}  // namespace trainguard
