// FailSlowDetector and MahalanobisDetector: see fail_slow_detector.h. Per second and metric the
// work is O(hosts^2) for the distance sums and O(hosts x window log window) for the medians: a
// thousand hosts cost a few milliseconds per metric, on one thread.
#include "sdk/health/fail_slow_detector.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace trainguard {

double UpperMedian(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(mid), values.end());
  return values[mid];
}

namespace {

// Across-host normalisation: each value over max(the hosts' median, `floor`), the scale. Empty
// when the scale is not positive (a metric that is zero everywhere and has no floor carries no
// signal). With a floor, a count whose healthy value is zero (retransmissions: most hosts send
// none in most seconds) is measured in units of its floor instead of vanishing with its median.
std::vector<double> RelativeToScale(const std::vector<double>& values, double floor, double* median,
                                    double* scale) {
  *median = UpperMedian(values);
  *scale = std::max(*median, floor);
  if (!(*scale > 0) || !std::isfinite(*scale)) return {};
  std::vector<double> out;
  out.reserve(values.size());
  for (double v : values) out.push_back(v / *scale);
  return out;
}

// Each value's summed distance to all the others, sum_j |x_i - x_j|, in O(n log n): over the
// values in ascending order with prefix sums, the value at position k has k smaller ones (their
// distance is v - x_j) and n - 1 - k larger ones (x_j - v). A job of thousands of hosts has
// millions of pairs a metric, every second.
std::vector<double> DistanceSums(const std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&x](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> prefix(n + 1, 0.0);  // prefix[k]: the k smallest values summed
  for (size_t k = 0; k < n; ++k) prefix[k + 1] = prefix[k] + x[order[k]];
  std::vector<double> sums(n, 0.0);
  for (size_t k = 0; k < n; ++k) {
    const double v = x[order[k]];
    const double below = v * static_cast<double>(k) - prefix[k];
    const double above = (prefix[n] - prefix[k + 1]) - v * static_cast<double>(n - 1 - k);
    sums[order[k]] = below + above;
  }
  return sums;
}

}  // namespace

std::vector<FailSlowMetric> FailSlowDetector::DefaultMetrics() {
  // The floors: 1 ms of compute per step, 20 ms of run-queue wait per second, 15 retransmitted
  // segments per second, 2 ms of round trip, 5 ms of collective per step, 5% of a CPU: below them,
  // hosts of a loaded machine differ by scheduling noise alone. Retransmissions: healthy simulated
  // hosts retransmit 0-3 segments a second on loopback, and up to 10 in a job with a CPU-throttled
  // host (slow, not lossy; bench_fail_slow's 8-host runs), a host losing 5% of its packets 25-50.
  // Round trips of active connections: 0.03-0.8 ms on healthy hosts, 3-7.5 ms behind a 2 Mbit/s
  // link (1 ms and 2 ms name no healthy host in the recorded runs, 0.5 ms one; 4 ms misses the
  // 8-host slow links). The slow host computes longer and waits longer for a CPU; a lossy link
  // retransmits more and a slow one answers later, while every host of the ring waits alike in
  // the collective; the slow host waits least in collectives (the others wait for it).
  // The GPU metrics (collected only where NVML is; absent, they never judge) come right after
  // compute_ms, which any slow host shows: they name the cause when the GPU is it. A throttled
  // (thermal, power) GPU runs at a lower SM clock, draws less power and moves fewer bytes per
  // second; its duty cycle is either side (NCCL's kernels keep every GPU of a synchronous job
  // busy while it waits). Floors: 50 MHz (clock steps are 15 MHz), 10 W, 5 points of %.
  using Worse = FailSlowMetric::Worse;
  return {{"compute_ms", true, 1.0, Worse::kHigher},
          {"gpu_sm_clock_mhz", false, 50.0, Worse::kLower},
          {"gpu_power_w", false, 10.0, Worse::kLower},
          {"gpu_mem_util", false, 5.0, Worse::kLower},
          {"gpu_util", false, 5.0, Worse::kEither},
          {"cpu_wait_ms", false, 20.0, Worse::kHigher},
          {"tcp_retrans", false, 15.0, Worse::kHigher},
          {"tcp_rtt_ms", false, 2.0, Worse::kHigher},
          {"collective_ms", true, 5.0, Worse::kLower},
          {"cpu_util", false, 0.05, Worse::kEither}};
}

absl::StatusOr<FailSlowDetector> FailSlowDetector::Create(FailSlowOptions options) {
  if (options.metrics.empty()) options.metrics = DefaultMetrics();
  std::set<std::string> names;
  for (const FailSlowMetric& m : options.metrics) {
    if (!(m.min_difference >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("FailSlowOptions.metrics: %s's min_difference must be >= 0, got %g",
                          m.name, m.min_difference));
    }
    if (m.name.empty() || !names.insert(m.name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("FailSlowOptions.metrics: empty or repeated metric name \"%s\"", m.name));
    }
  }
  if (options.denoise_window < 1 || options.denoise_window % 2 == 0 || options.continuity < 1 ||
      options.max_fill < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FailSlowOptions: need an odd denoise_window >= 1, continuity >= 1, max_fill >= 0; got %d, "
        "%d, %d",
        options.denoise_window, options.continuity, options.max_fill));
  }
  if (!(options.sustained > 0 && options.sustained <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FailSlowOptions: need 0 < sustained <= 1 (a share of the denoise window's "
                        "seconds); got %g",
                        options.sustained));
  }
  if (!(options.z_threshold > 0 && options.z_threshold <= 1) ||
      !(options.min_deviation >= 0 && std::isfinite(options.min_deviation))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FailSlowOptions: need 0 < z_threshold <= 1 (a fraction of sqrt(hosts - 1)) and a finite "
        "min_deviation >= 0; got %g and %g",
        options.z_threshold, options.min_deviation));
  }
  return FailSlowDetector(std::move(options));
}

int FailSlowDetector::SecondsToCandidate(const FailSlowOptions& options) {
  const int seconds =
      static_cast<int>(std::ceil(options.sustained * options.denoise_window - 1e-9));
  return std::clamp(seconds, 1, options.denoise_window);
}

FailSlowDetector::FailSlowDetector(FailSlowOptions options)
    : options_(std::move(options)), states_(options_.metrics.size()) {}

void FailSlowDetector::Forget(const std::string& host) {
  for (MetricState& state : states_) {
    state.series.erase(host);
    if (state.candidate == host) {
      state.candidate.clear();
      state.streak = 0;
    }
  }
}

std::vector<SuspectVerdict> FailSlowDetector::Observe(int64_t second,
                                                      const std::vector<FailSlowSample>& samples) {
  if (second <= last_second_) return {};
  last_second_ = second;
  const size_t window = static_cast<size_t>(options_.denoise_window);
  // Each metric's samples, in their order: one pass over the samples (thousands of hosts times
  // their metrics), not one a metric.
  std::vector<std::vector<const FailSlowSample*>> by_metric(options_.metrics.size());
  {
    std::map<std::string_view, size_t> index;
    for (size_t m = 0; m < options_.metrics.size(); ++m) index.emplace(options_.metrics[m].name, m);
    for (const FailSlowSample& s : samples) {
      auto it = index.find(s.metric);
      if (it != index.end()) by_metric[it->second].push_back(&s);
    }
  }
  for (size_t m = 0; m < options_.metrics.size(); ++m) {
    const FailSlowMetric& metric = options_.metrics[m];
    MetricState& state = states_[m];
    for (const FailSlowSample* s : by_metric[m]) {
      if (!std::isfinite(s->value)) continue;
      auto found = state.series.find(s->host);
      // A host's first sample of the second counts; a series that took one is fresh this second.
      if (found != state.series.end() && found->second.last_second == second) continue;
      double value = s->value;
      if (metric.per_work) {
        if (!(s->work > 0)) continue;
        value /= s->work;
      }
      Series& series = found != state.series.end() ? found->second : state.series[s->host];
      series.values.push_back(value);
      if (series.values.size() > window) series.values.pop_front();
      series.last_second = second;
    }
    // Gaps: the last sample stands in for a short one; a long one drops the host.
    for (auto it = state.series.begin(); it != state.series.end();) {
      Series& series = it->second;
      if (series.last_second == second) {
        ++it;
      } else if (second - series.last_second > options_.max_fill) {
        it = state.series.erase(it);
      } else {
        series.values.push_back(series.values.back());
        if (series.values.size() > window) series.values.pop_front();
        ++it;
      }
    }
  }
  std::vector<SuspectVerdict> verdicts;
  std::set<std::string> named;
  for (size_t m = 0; m < options_.metrics.size(); ++m) {
    std::optional<SuspectVerdict> v = Judge(states_[m], options_.metrics[m], second);
    if (v.has_value() && named.insert(v->host).second) verdicts.push_back(*std::move(v));
  }
  return verdicts;
}

std::optional<SuspectVerdict> FailSlowDetector::Judge(MetricState& state,
                                                      const FailSlowMetric& metric,
                                                      int64_t second) {
  const size_t window = static_cast<size_t>(options_.denoise_window);
  std::vector<std::string> hosts;
  std::vector<double> denoised;
  std::vector<const Series*> judged;
  for (const auto& [host, series] : state.series) {
    if (series.values.size() < window) continue;  // warming up: not judged yet
    hosts.push_back(host);
    denoised.push_back(UpperMedian({series.values.begin(), series.values.end()}));
    judged.push_back(&series);
  }
  auto no_candidate = [&state]() -> std::optional<SuspectVerdict> {
    state.candidate.clear();
    state.streak = 0;
    return std::nullopt;
  };
  const size_t n = hosts.size();
  if (n < 3) return no_candidate();
  double peers_median = 0, scale = 0;
  const std::vector<double> x =
      RelativeToScale(denoised, metric.min_difference, &peers_median, &scale);
  if (x.empty()) return no_candidate();
  const std::vector<double> sums = DistanceSums(x);
  double mean = 0;
  for (double s : sums) mean += s;
  mean /= static_cast<double>(n);
  double variance = 0;
  for (double s : sums) variance += (s - mean) * (s - mean);
  const double sd = std::sqrt(variance / static_cast<double>(n));
  if (!(sd > 0)) return no_candidate();  // every host alike
  const size_t top = static_cast<size_t>(std::max_element(sums.begin(), sums.end()) - sums.begin());
  const double z = (sums[top] - mean) / sd;
  const double deviation = sums[top] / static_cast<double>(n - 1);
  const double needed = std::min(3.0, options_.z_threshold * std::sqrt(static_cast<double>(n - 1)));
  const bool bad_side =
      metric.worse == FailSlowMetric::Worse::kEither ||
      (metric.worse == FailSlowMetric::Worse::kHigher ? denoised[top] > peers_median
                                                      : denoised[top] < peers_median);
  if (z < needed || deviation < options_.min_deviation ||
      deviation * scale < metric.min_difference || !bad_side ||
      !Sustained(judged[top]->values, denoised[top] > peers_median, peers_median, scale, metric)) {
    return no_candidate();
  }
  if (state.candidate == hosts[top]) {
    ++state.streak;
  } else {
    state.candidate = hosts[top];
    state.streak = 1;
  }
  if (state.streak % options_.continuity != 0) return std::nullopt;
  SuspectVerdict verdict;
  verdict.host = hosts[top];
  verdict.metric = metric.name;
  verdict.z = z;
  verdict.deviation = deviation;
  verdict.value = denoised[top];
  verdict.peers_median = peers_median;
  verdict.windows = state.streak / options_.continuity;
  verdict.second = second;
  verdict.hosts = static_cast<int>(n);
  return verdict;
}

bool FailSlowDetector::Sustained(const std::deque<double>& values, bool higher, double peers_median,
                                 double scale, const FailSlowMetric& metric) const {
  // The value that SecondsToCandidate of the window's seconds are at or beyond, on the side the
  // candidate deviates to: the best of its worst seconds.
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t needed = static_cast<size_t>(SecondsToCandidate(options_));
  const double edge = higher ? sorted[sorted.size() - needed] : sorted[needed - 1];
  const double margin = higher ? edge - peers_median : peers_median - edge;
  return margin >= metric.min_difference && margin >= options_.min_deviation * scale;
}

std::optional<SuspectVerdict> MahalanobisDetector::Observe(
    int64_t second, const std::vector<FailSlowSample>& samples) {
  // host -> metric index -> value (work-normalised)
  std::map<std::string, std::vector<std::optional<double>>> by_host;
  const size_t k = options_.metrics.size();
  for (const FailSlowSample& s : samples) {
    const auto it = std::find(options_.metrics.begin(), options_.metrics.end(), s.metric);
    if (it == options_.metrics.end() || !std::isfinite(s.value)) continue;
    if (options_.per_work && s.metric != "cpu_util" && !(s.work > 0)) continue;
    const double value = options_.per_work && s.metric != "cpu_util" ? s.value / s.work : s.value;
    auto& row = by_host[s.host];
    row.resize(k);
    row[static_cast<size_t>(it - options_.metrics.begin())] = value;
  }
  std::vector<std::string> hosts;
  std::vector<std::vector<double>> rows;
  for (const auto& [host, row] : by_host) {
    if (std::any_of(row.begin(), row.end(), [](const auto& v) { return !v.has_value(); })) continue;
    hosts.push_back(host);
    std::vector<double> r;
    for (const auto& v : row) r.push_back(*v);
    rows.push_back(std::move(r));
  }
  const size_t n = hosts.size();
  if (n < 3 || k == 0) return std::nullopt;
  // Normalise each metric by the hosts' median; a metric zero everywhere is left out (all zeros).
  for (size_t j = 0; j < k; ++j) {
    std::vector<double> column;
    for (const auto& r : rows) column.push_back(r[j]);
    double median = 0, scale = 0;
    const std::vector<double> relative = RelativeToScale(column, 0, &median, &scale);
    for (size_t i = 0; i < n; ++i) rows[i][j] = relative.empty() ? 0.0 : relative[i];
  }
  std::vector<double> mu(k, 0.0);
  for (const auto& r : rows) {
    for (size_t j = 0; j < k; ++j) mu[j] += r[j] / static_cast<double>(n);
  }
  // Covariance plus ridge, inverted by Gauss-Jordan (k is a handful).
  std::vector<std::vector<double>> a(k, std::vector<double>(2 * k, 0.0));
  for (size_t p = 0; p < k; ++p) {
    for (size_t q = 0; q < k; ++q) {
      double c = 0;
      for (const auto& r : rows) c += (r[p] - mu[p]) * (r[q] - mu[q]);
      a[p][q] = c / static_cast<double>(n) + (p == q ? options_.ridge : 0.0);
    }
    a[p][k + p] = 1.0;
  }
  for (size_t col = 0; col < k; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < k; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    std::swap(a[col], a[pivot]);
    const double d = a[col][col];
    if (std::fabs(d) < 1e-15) return std::nullopt;
    for (double& v : a[col]) v /= d;
    for (size_t r = 0; r < k; ++r) {
      if (r == col) continue;
      const double f = a[r][col];
      for (size_t c = 0; c < 2 * k; ++c) a[r][c] -= f * a[col][c];
    }
  }
  size_t top = 0;
  double best = -1;
  for (size_t i = 0; i < n; ++i) {
    double d2 = 0;
    for (size_t p = 0; p < k; ++p) {
      for (size_t q = 0; q < k; ++q) {
        d2 += (rows[i][p] - mu[p]) * a[p][k + q] * (rows[i][q] - mu[q]);
      }
    }
    const double d = std::sqrt(std::max(0.0, d2));
    if (d > best) {
      best = d;
      top = i;
    }
  }
  if (best < options_.threshold) return std::nullopt;
  SuspectVerdict verdict;
  verdict.host = hosts[top];
  verdict.metric = "mahalanobis";
  verdict.z = best;
  verdict.windows = 1;
  verdict.second = second;
  verdict.hosts = static_cast<int>(n);
  return verdict;
}

}  // namespace trainguard
