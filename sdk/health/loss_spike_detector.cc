// LossSpikeDetector: median and MAD of a ring buffer of recent losses, found with nth_element on a
// scratch copy allocated once (O(window) per Observe(), no allocation).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "trainguard/health.h"

namespace trainguard {
namespace {

// Makes the MAD of Gaussian noise an estimate of its standard deviation.
constexpr double kMadToSigma = 1.4826;
// Below this, a MAD is treated as this (relative to the median, and absolute): a flat series has a
// MAD of 0, and a jump from it must still get a finite score.
constexpr double kRelativeMadFloor = 1e-6;
constexpr double kAbsoluteMadFloor = 1e-12;
constexpr int kMinWarmup = 20;

}  // namespace

absl::StatusOr<LossSpikeDetector> LossSpikeDetector::Create(const LossSpikeOptions& options) {
  if (options.warmup < kMinWarmup || options.window < options.warmup) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LossSpikeOptions: need %d <= warmup <= window, got warmup %d and window %d", kMinWarmup,
        options.warmup, options.window));
  }
  if (!(options.threshold > 0) || !std::isfinite(options.threshold)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "LossSpikeOptions: threshold must be positive and finite, got %g", options.threshold));
  }
  return LossSpikeDetector(options);
}

LossSpikeDetector::LossSpikeDetector(const LossSpikeOptions& options)
    : options_(options),
      window_(static_cast<size_t>(options.window)),
      scratch_(static_cast<size_t>(options.window)) {}

double LossSpikeDetector::ScratchMedian(int n) {
  const auto begin = scratch_.begin();
  const auto mid = begin + n / 2;
  std::nth_element(begin, mid, begin + n);
  if (n % 2 == 1) return *mid;
  // nth_element leaves the lower half in front of `mid`: its largest is the other middle value.
  return (*std::max_element(begin, mid) + *mid) / 2;
}

std::optional<LossSpike> LossSpikeDetector::Observe(int64_t step, double loss) {
  const bool finite = std::isfinite(loss);
  if (finite && size_ < options_.warmup) {
    window_[static_cast<size_t>(next_)] = loss;
    next_ = (next_ + 1) % options_.window;
    ++size_;
    return std::nullopt;
  }
  LossSpike report;
  report.step = step;
  report.loss = loss;
  if (size_ > 0) {
    std::copy_n(window_.begin(), size_, scratch_.begin());
    report.median = ScratchMedian(size_);
    for (int i = 0; i < size_; ++i) {
      scratch_[static_cast<size_t>(i)] = std::fabs(window_[static_cast<size_t>(i)] - report.median);
    }
    report.mad = kMadToSigma * ScratchMedian(size_);
  }
  if (!finite) {
    report.kind = LossSpike::Kind::kNonFinite;
    return report;
  }
  const double scale =
      std::max({report.mad, kRelativeMadFloor * std::fabs(report.median), kAbsoluteMadFloor});
  report.score = (loss - report.median) / scale;
  if (report.score > options_.threshold) return report;  // kept out of the window
  window_[static_cast<size_t>(next_)] = loss;
  next_ = (next_ + 1) % options_.window;
  size_ = std::min(size_ + 1, options_.window);
  return std::nullopt;
}

}  // namespace trainguard
