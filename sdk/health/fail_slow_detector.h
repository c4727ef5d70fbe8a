// FailSlowDetector: finds the host that is degraded (slow, throttled) but not dead, without labels,
// from per-second metrics of every host of a job (Minder, NSDI'25; shared research notes, detection
// section 4). Under balanced parallelism healthy hosts look alike second by second, so for each
// metric the detector:
//   1. denoises each host's series with a moving median over the last `denoise_window` seconds (an
//      odd number, so a rise and a fall move it alike), so a spike shorter than half the window
//      never moves it;
//   2. normalises across hosts: each host's denoised value divided by the hosts' median of it, or
//      by the metric's min_difference where that is larger (a count that is zero on most hosts,
//      retransmissions), so distances are relative deviations whatever the metric's unit;
//   3. sums each host's distances to all the others, and z-scores the sums across hosts;
//   4. names the host with the largest z a candidate when z >= z_threshold x sqrt(n - 1) (the
//      largest z any host can reach among n; see FailSlowOptions) and its mean distance to the
//      others is at least `min_deviation` (z alone is scale-free: pure noise has an outlier too),
//      and at least the metric's min_difference in its own unit, and it is on the metric's bad
//      side of the hosts' median (FailSlowMetric::worse);
//   5. and only when it is sustained: in `sustained` of its window's seconds (7 of 9 by default)
//      its own value is worse than the hosts' median by the metric's min_difference and by
//      min_deviation of the scale, not only in its median. A whole machine's CPU contention makes
//      a healthy host's loopback round trips and run-queue waits alternate between bad and good
//      seconds, and its median can stay apart from its peers' for ten seconds and more, while its
//      good seconds are as good as theirs; a degraded host is worse in nearly every second;
//   6. declares it suspect when the same host has been the candidate for `continuity` consecutive
//      seconds, and again after every further `continuity` seconds (SuspectVerdict::windows).
// Metrics are checked in the priority order given; in one second only the first metric that
// confirms a host reports it. Work normalisation: a metric marked per_work is divided by the work
// done in that second (steps, tokens), so an RL job whose step length follows its generation
// length, the same on every host, looks flat. Fewer than 3 hosts give no verdict: with two, the
// distance is symmetric and neither is the odd one out.
//
// MahalanobisDetector is the baseline of the evaluation (bench/bench_fail_slow): per second, each
// host's vector of metrics (normalised by the hosts' medians, not denoised) and its Mahalanobis
// distance from the hosts' mean under their covariance (ridge-regularised); the farthest host is
// flagged at once when its distance exceeds the threshold, with no continuity.
//
// Pure computation over the samples it is given: no clock, no I/O, deterministic.
// Thread safety: not thread-safe; one thread (the coordinator's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DETECTOR_H_
#define TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainguard {

// The median of an odd count (element size/2 of the sorted values); for an even count the upper
// median, which the hosts' median across an even number of hosts is. REQUIRES: values not empty.
double UpperMedian(std::vector<double> values);

// One host's value of one metric in one second.
struct FailSlowSample {
  std::string host;
  std::string metric;
  double value = 0;
  // Work done by the host in that second (steps, tokens); used by metrics marked per_work. A
  // per_work sample with work <= 0 (the host did no step that second) is ignored.
  double work = 1;
};

struct FailSlowMetric {
  // Which side of its peers a degraded host is on. A host faster than the others (less compute
  // per step, less run-queue wait) is not fail-slow, and on a noisy machine it is often the odd
  // one out: such a metric only names hosts on its bad side.
  enum class Worse { kHigher, kLower, kEither };
  std::string name;
  bool per_work = false;  // divide each sample by its work
  // The candidate's mean distance to the others, in the metric's own unit (after per_work), must
  // be at least this: a relative deviation of a tiny value (0.01 vs 0.02 CPU, one clock tick) is
  // measurement noise, not a slow host.
  double min_difference = 0;
  Worse worse = Worse::kEither;
};

struct FailSlowOptions {
  // In priority order. Default: the metrics `trainguard run` collects (FailSlowDetector::
  // DefaultMetrics()).
  std::vector<FailSlowMetric> metrics;
  // Seconds of a host's series the moving median covers; odd. Minder's window is 8; 9 is the odd
  // window next to it: a change must last 5 s before it moves the median, which a spike of 4 s
  // or less never does (and, with `sustained`, 7 s before its host is a candidate).
  int denoise_window = 9;
  // The candidate's z must reach this fraction of sqrt(n - 1), the largest z-score one host of n
  // can have (reached when the other n - 1 agree exactly). A fixed z of 3 (Minder, thousands of
  // hosts) can never be reached by fewer than 11 hosts; 0.8 keeps "one host clearly apart" at any
  // n and is capped at an absolute z of 3 for large jobs.
  double z_threshold = 0.8;
  // The candidate's mean relative distance to the others must be at least this: 0.1 = 10% off
  // its peers. Below it a host is within what healthy hosts of a loaded machine differ by.
  double min_deviation = 0.1;
  // The share of the denoise window's seconds in which the candidate's own value must be worse
  // than the hosts' median by the metric's min_difference (and by min_deviation of the scale): a
  // candidate whose median is apart from its peers' while its good seconds are like theirs is a
  // host of a noisy machine, not a degraded one. In (0, 1]; 0.75 with the window of 9: 7 seconds
  // of 9, so a change must last 7 s before its host is a candidate.
  double sustained = 0.75;
  // Consecutive candidate seconds that confirm a suspect. Minder uses 4 min on real clusters; the
  // default here is 30 s, and `trainguard run --fail-slow-continuity` sets it.
  int continuity = 30;
  // A host absent for this many seconds is dropped from the comparison (and its state reset); a
  // shorter gap is filled with its last sample (Minder: nearest sample).
  int max_fill = 8;
};

// A host the detector suspects: the evidence of one confirmation.
struct SuspectVerdict {
  std::string host;
  std::string metric;
  double z = 0;             // its z-score this second
  double deviation = 0;     // its mean distance to the other hosts over max(median, floor)
  double value = 0;         // its denoised (and work-normalised) value
  double peers_median = 0;  // the hosts' median of that value
  int windows = 0;          // continuity windows met in a row: 1 at the first confirmation
  int64_t second = 0;       // when it was confirmed
  int hosts = 0;            // hosts compared
};

class FailSlowDetector {
 public:
  // InvalidArgument naming the option out of range (no metric, window < 1, continuity < 1, ...).
  static absl::StatusOr<FailSlowDetector> Create(FailSlowOptions options);

  // The metrics `trainguard run` collects (sdk/host_agent/host_sampler.h), in priority order:
  // compute_ms per step (step time outside collectives); where NVML is, gpu_sm_clock_mhz,
  // gpu_power_w, gpu_mem_util (lower is worse) and gpu_util (either side); cpu_wait_ms per second
  // (run-queue delay), tcp_retrans per second (TCP segments the host's ranks retransmitted),
  // tcp_rtt_ms (the median RTT of their active connections), collective_ms per step, cpu_util
  // (CPU seconds per second).
  static std::vector<FailSlowMetric> DefaultMetrics();

  // One second's samples (any order; hosts or metrics missing are filled, see max_fill). Seconds
  // must increase; a second not after the last one is ignored. Returns the suspects confirmed in
  // this second: at most one per host, the first metric in priority order that confirms it.
  std::vector<SuspectVerdict> Observe(int64_t second, const std::vector<FailSlowSample>& samples);

  // The seconds a degradation must last before its host is a candidate (its first candidate
  // second is the last of them): the sustained share of the denoise window, rounded up.
  static int SecondsToCandidate(const FailSlowOptions& options);

  // Drops a host (replaced, dead): it is no longer compared.
  void Forget(const std::string& host);

  const FailSlowOptions& options() const { return options_; }

 private:
  struct Series {
    std::deque<double> values;  // the last denoise_window accepted values
    int64_t last_second = 0;    // of the last real (not filled) sample
  };
  struct MetricState {
    std::map<std::string, Series> series;  // by host
    std::string candidate;                 // this metric's candidate in the last second ("" none)
    int streak = 0;                        // consecutive seconds it was
  };

  explicit FailSlowDetector(FailSlowOptions options);
  // Whether a candidate's window `values` (denoise_window of them) stay apart from the hosts'
  // median in SecondsToCandidate of its seconds, on the side it deviates to (`higher`).
  bool Sustained(const std::deque<double>& values, bool higher, double peers_median, double scale,
                 const FailSlowMetric& metric) const;
  // This metric's verdict for the second, or nullopt; updates its streak.
  std::optional<SuspectVerdict> Judge(MetricState& state, const FailSlowMetric& metric,
                                      int64_t second);

  FailSlowOptions options_;
  std::vector<MetricState> states_;  // per options_.metrics
  int64_t last_second_ = INT64_MIN;
};

struct MahalanobisOptions {
  std::vector<std::string> metrics;
  double threshold = 1.6;  // Mahalanobis distance that flags the farthest host
  double ridge = 1e-3;     // added to the covariance's diagonal (few hosts: it is singular)
  bool per_work = true;    // divide samples by their work, as FailSlowDetector's per_work metrics
};

// The baseline: see the file comment. Stateless across seconds.
class MahalanobisDetector {
 public:
  explicit MahalanobisDetector(MahalanobisOptions options) : options_(std::move(options)) {}
  // The flagged host of this second and its distance (fewer than 3 hosts: none).
  std::optional<SuspectVerdict> Observe(int64_t second, const std::vector<FailSlowSample>& samples);

 private:
  MahalanobisOptions options_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DETECTOR_H_
