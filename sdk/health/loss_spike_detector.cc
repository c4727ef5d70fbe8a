// LossSpikeDetector: median and MAD of a ring buffer of recent losses (or of their logs, kept in a
// second ring so Judge() takes no log of the window), found with nth_element on a scratch copy
// allocated once (O(window) per Observe(), no allocation).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

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
// SaveState()'s layout: this magic and version, a uint32 count, then `count` doubles.
constexpr char kStateMagic[4] = {'T', 'G', 'L', 'W'};
constexpr uint32_t kStateVersion = 1;
constexpr size_t kStateHeaderBytes = sizeof(kStateMagic) + 2 * sizeof(uint32_t);

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
      log_window_(static_cast<size_t>(options.window)),
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
  std::optional<LossSpike> report = Judge(step, loss);
  if (!report.has_value()) Accept(loss);
  return report;
}

std::optional<LossSpike> LossSpikeDetector::Judge(int64_t step, double loss) {
  const bool finite = std::isfinite(loss);
  if (finite && size_ < options_.warmup) return std::nullopt;
  LossSpike report;
  report.step = step;
  report.loss = loss;
  // Non-finite: the scale does not matter, the median is reported as the loss's.
  report.log_scale = finite && loss > 0 && nonpositive_ == 0;
  const std::vector<double>& values = report.log_scale ? log_window_ : window_;
  double median = 0;
  if (size_ > 0) {
    std::copy_n(values.begin(), size_, scratch_.begin());
    median = ScratchMedian(size_);
    for (int i = 0; i < size_; ++i) {
      scratch_[static_cast<size_t>(i)] = std::fabs(values[static_cast<size_t>(i)] - median);
    }
    report.mad = kMadToSigma * ScratchMedian(size_);
  }
  report.median = report.log_scale ? std::exp(median) : median;
  if (!finite) {
    report.kind = LossSpike::Kind::kNonFinite;
    return report;
  }
  if (report.log_scale) {
    report.score = (std::log(loss) - median) / std::max(report.mad, kRelativeMadFloor);
  } else {
    const double scale =
        std::max({report.mad, kRelativeMadFloor * std::fabs(median), kAbsoluteMadFloor});
    report.score = (loss - median) / scale;
  }
  if (report.score > options_.threshold) return report;
  return std::nullopt;
}

void LossSpikeDetector::Accept(double loss) {
  if (!std::isfinite(loss)) return;  // Judge() reports every one: never part of the window
  const size_t at = static_cast<size_t>(next_);
  if (size_ == options_.window && window_[at] <= 0) --nonpositive_;  // the oldest goes
  window_[at] = loss;
  if (loss > 0) {
    log_window_[at] = std::log(loss);
  } else {
    ++nonpositive_;
  }
  next_ = (next_ + 1) % options_.window;
  size_ = std::min(size_ + 1, options_.window);
}

void LossSpikeDetector::RecomputeLogs() {
  nonpositive_ = 0;
  for (int i = 0; i < size_; ++i) {
    const double loss = window_[static_cast<size_t>(i)];
    if (loss > 0) {
      log_window_[static_cast<size_t>(i)] = std::log(loss);
    } else {
      ++nonpositive_;
    }
  }
}

std::string LossSpikeDetector::SaveState() const {
  std::string out(kStateHeaderBytes + static_cast<size_t>(size_) * sizeof(double), '\0');
  char* p = out.data();
  std::memcpy(p, kStateMagic, sizeof(kStateMagic));
  p += sizeof(kStateMagic);
  const uint32_t version = kStateVersion;
  const uint32_t count = static_cast<uint32_t>(size_);
  std::memcpy(p, &version, sizeof(version));
  p += sizeof(version);
  std::memcpy(p, &count, sizeof(count));
  p += sizeof(count);
  // Oldest first: when the ring is full, the oldest is where the next loss goes.
  const int oldest = size_ < options_.window ? 0 : next_;
  for (int i = 0; i < size_; ++i) {
    const double loss = window_[static_cast<size_t>((oldest + i) % options_.window)];
    std::memcpy(p, &loss, sizeof(loss));
    p += sizeof(loss);
  }
  return out;
}

absl::Status LossSpikeDetector::LoadState(std::string_view state) {
  if (state.empty()) {
    size_ = 0;
    next_ = 0;
    nonpositive_ = 0;
    return absl::OkStatus();
  }
  if (state.size() < kStateHeaderBytes ||
      std::memcmp(state.data(), kStateMagic, sizeof(kStateMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "loss-spike window state: %d bytes that do not start with its header", state.size()));
  }
  uint32_t version = 0;
  uint32_t count = 0;
  std::memcpy(&version, state.data() + sizeof(kStateMagic), sizeof(version));
  std::memcpy(&count, state.data() + sizeof(kStateMagic) + sizeof(version), sizeof(count));
  if (version != kStateVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "loss-spike window state: version %d, this trainguard reads version %d", version,
        kStateVersion));
  }
  if (state.size() != kStateHeaderBytes + size_t{count} * sizeof(double)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("loss-spike window state: %d bytes, its header says %d losses (%d bytes)",
                        state.size(), count, kStateHeaderBytes + size_t{count} * sizeof(double)));
  }
  const uint32_t keep = std::min(count, static_cast<uint32_t>(options_.window));
  const char* p = state.data() + kStateHeaderBytes + (count - keep) * sizeof(double);
  for (uint32_t i = 0; i < keep; ++i) {
    std::memcpy(&window_[i], p + i * sizeof(double), sizeof(double));
  }
  size_ = static_cast<int>(keep);
  next_ = size_ % options_.window;
  RecomputeLogs();
  return absl::OkStatus();
}

}  // namespace trainguard
