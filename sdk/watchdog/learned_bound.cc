#include "sdk/watchdog/learned_bound.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "trainguard/collectives.h"
#include "trainguard/options.h"

namespace trainguard {

LearnedBoundOptions LearnedBoundOptions::FromOptions(const Options& options) {
  LearnedBoundOptions o;
  o.warmup_samples = options.watchdog_warmup_samples;
  o.warmup_bound = absl::Milliseconds(options.watchdog_warmup_bound_ms);
  o.bound_factor_pct = options.watchdog_bound_factor_pct;
  o.floor = absl::Milliseconds(options.watchdog_floor_ms);
  o.history = options.watchdog_history;
  return o;
}

absl::Status LearnedBoundOptions::Validate(std::string_view owner) const {
  auto bad = [owner](std::string_view field, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: bound.%s %s", owner, field, why));
  };
  if (warmup_samples < 0) return bad("warmup_samples", "must be >= 0");
  if (warmup_bound <= absl::ZeroDuration()) return bad("warmup_bound", "must be > 0");
  if (bound_factor_pct < 100) return bad("bound_factor_pct", "must be >= 100");
  if (floor < absl::ZeroDuration()) return bad("floor", "must be >= 0");
  if (history < 1) return bad("history", "must be >= 1");
  return absl::OkStatus();
}

namespace watchdog_internal {

BoundRule::BoundRule(const LearnedBoundOptions& options)
    : warmup_samples(options.warmup_samples),
      warmup_bound_ns(absl::ToInt64Nanoseconds(options.warmup_bound)),
      factor_pct(options.bound_factor_pct),
      floor_ns(absl::ToInt64Nanoseconds(options.floor)) {}

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
