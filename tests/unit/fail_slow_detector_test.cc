// FailSlowDetector (sdk/health/fail_slow_detector.h) on synthetic per-second samples: exact
// seconds, deterministic noise, no clock.
#include "sdk/health/fail_slow_detector.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

// Deterministic noise in [-1, 1] for (host, second, salt).
double Noise(int host, int64_t second, uint64_t salt = 0) {
  uint64_t x = (static_cast<uint64_t>(host) << 40) ^ static_cast<uint64_t>(second) ^ (salt << 20);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

std::string Host(int h) { return absl::StrCat("host", h); }

FailSlowOptions ComputeOnly(int continuity) {
  FailSlowOptions options;
  options.metrics = {{"compute_ms", true}};
  options.continuity = continuity;
  return options;
}

// `hosts` hosts of 100 ms of compute per step (+-3% noise) and one step a second; `factor(h, t)`
// multiplies host h's value at second t.
template <typename Factor>
std::vector<FailSlowSample> Second(int hosts, int64_t t, Factor factor) {
  std::vector<FailSlowSample> samples;
  for (int h = 0; h < hosts; ++h) {
    samples.push_back({Host(h), "compute_ms", 100.0 * (1 + 0.03 * Noise(h, t)) * factor(h, t), 1});
  }
  return samples;
}

TEST(FailSlowDetector, AHostThirtyPercentSlowerIsNamedExactlyWhenTheContinuityWindowIsMet) {
  constexpr int kContinuity = 10;
  constexpr int64_t kOnset = 20;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(kContinuity));
  ASSERT_TRUE(detector.ok()) << detector.status();
  auto slow = [](int h, int64_t t) { return h == 2 && t >= kOnset ? 1.3 : 1.0; };
  // The moving median (window 9) turns with the 5th slow sample, and the host is worse than its
  // peers in 7 seconds of its window (FailSlowOptions::sustained) with the 7th: second kOnset + 6
  // is the first candidate second, and the 10th candidate second confirms.
  ASSERT_EQ(FailSlowDetector::SecondsToCandidate(detector->options()), 7);
  const int64_t confirmed = kOnset + 6 + kContinuity - 1;
  std::vector<SuspectVerdict> all;
  for (int64_t t = 0; t <= confirmed + kContinuity; ++t) {
    for (SuspectVerdict& v : detector->Observe(t, Second(4, t, slow))) all.push_back(v);
  }
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].host, "host2");
  EXPECT_EQ(all[0].metric, "compute_ms");
  EXPECT_EQ(all[0].second, confirmed);
  EXPECT_EQ(all[0].windows, 1);
  EXPECT_EQ(all[0].hosts, 4);
  EXPECT_GE(all[0].z, 0.8 * std::sqrt(3.0));
  EXPECT_NEAR(all[0].deviation, 0.3, 0.06);
  // Still the outlier one continuity window later: a second window, as evict-repeated counts.
  EXPECT_EQ(all[1].host, "host2");
  EXPECT_EQ(all[1].second, confirmed + kContinuity);
  EXPECT_EQ(all[1].windows, 2);
}

// At 2,048 hosts (16,384 ranks), as at 4: the slow host is named when the continuity window is
// met, with the z and the deviation each host's summed distances to the others give (summed over
// the sorted values, not pair by pair: four million pairs a metric every second).
TEST(FailSlowDetector, AmongTwoThousandHostsTheSlowOneIsNamedWhenTheContinuityWindowIsMet) {
  constexpr int kHosts = 2048;
  constexpr int kContinuity = 10;
  constexpr int64_t kOnset = 20;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(kContinuity));
  ASSERT_TRUE(detector.ok()) << detector.status();
  auto slow = [](int h, int64_t t) { return h == 1000 && t >= kOnset ? 1.3 : 1.0; };
  const int64_t confirmed = kOnset + 6 + kContinuity - 1;
  std::vector<SuspectVerdict> all;
  for (int64_t t = 0; t <= confirmed; ++t) {
    for (SuspectVerdict& v : detector->Observe(t, Second(kHosts, t, slow))) all.push_back(v);
  }
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].host, "host1000");
  EXPECT_EQ(all[0].second, confirmed);
  EXPECT_EQ(all[0].hosts, kHosts);
  EXPECT_GE(all[0].z, 3.0) << "the cap of the z needed among many hosts";
  EXPECT_NEAR(all[0].deviation, 0.3, 0.06);
}

TEST(FailSlowDetector, ASpikeShorterThanHalfTheDenoiseWindowIsNeverReported) {
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(3));
  ASSERT_TRUE(detector.ok());
  // One second at 5x, and later four seconds at 2x on another host (window 9: 5 are needed).
  auto spikes = [](int h, int64_t t) {
    if (h == 1 && t == 30) return 5.0;
    if (h == 3 && t >= 60 && t < 64) return 2.0;
    return 1.0;
  };
  for (int64_t t = 0; t < 120; ++t) {
    EXPECT_TRUE(detector->Observe(t, Second(5, t, spikes)).empty()) << "second " << t;
  }
}

// An RL job: each step's length follows its generation length, the same on every host, and one
// host does twice the work (tokens) of the others for a minute, taking twice the time for it.
std::vector<FailSlowSample> RlSecond(int64_t t) {
  const double ms_per_token = 2.0 * std::exp(1.2 * Noise(99, t / 3));  // a 3 s step, varied
  std::vector<FailSlowSample> samples;
  for (int h = 0; h < 4; ++h) {
    const double tokens =
        (h == 1 && t >= 30 && t < 90 ? 200.0 : 100.0) * (1 + 0.2 * Noise(h, t, 7));
    samples.push_back(
        {Host(h), "compute_ms", tokens * ms_per_token * (1 + 0.02 * Noise(h, t)), tokens});
  }
  return samples;
}

TEST(FailSlowDetector, UnevenWorkIsNotReportedOnceNormalisedPerUnitOfWork) {
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(5));
  ASSERT_TRUE(detector.ok());
  for (int64_t t = 0; t < 150; ++t) {
    EXPECT_TRUE(detector->Observe(t, RlSecond(t)).empty()) << "second " << t;
  }
  // The control: the same samples taken per second, not per unit of work, name host1.
  FailSlowOptions raw = ComputeOnly(5);
  raw.metrics[0].per_work = false;
  absl::StatusOr<FailSlowDetector> per_second = FailSlowDetector::Create(raw);
  ASSERT_TRUE(per_second.ok());
  std::vector<std::string> named;
  for (int64_t t = 0; t < 150; ++t) {
    for (const SuspectVerdict& v : per_second->Observe(t, RlSecond(t))) named.push_back(v.host);
  }
  EXPECT_THAT(named, ::testing::Contains("host1"));
}

TEST(FailSlowDetector, FewerThanThreeHostsGiveNoVerdictBecauseNeitherOfTwoIsTheOddOneOut) {
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(3));
  ASSERT_TRUE(detector.ok());
  auto slow = [](int h, int64_t) { return h == 1 ? 2.0 : 1.0; };
  for (int64_t t = 0; t < 60; ++t) EXPECT_TRUE(detector->Observe(t, Second(2, t, slow)).empty());
}

TEST(FailSlowDetector, MetricsAreCheckedInPriorityOrderAndAHostIsReportedOncePerSecond) {
  FailSlowOptions options;
  options.metrics = {{"cpu_util", false}, {"compute_ms", true}};
  options.continuity = 4;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  ASSERT_TRUE(detector.ok());
  std::vector<SuspectVerdict> all;
  for (int64_t t = 0; t < 20; ++t) {
    std::vector<FailSlowSample> samples;
    for (int h = 0; h < 4; ++h) {
      const double f = h == 0 && t >= 5 ? 1.5 : 1.0;
      samples.push_back({Host(h), "compute_ms", 100 * f, 1});
      samples.push_back({Host(h), "cpu_util", 0.5 / f, 1});
    }
    for (SuspectVerdict& v : detector->Observe(t, samples)) all.push_back(v);
  }
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0].host, "host0");
  EXPECT_EQ(all[0].metric, "cpu_util");  // both confirm in the same second; cpu_util comes first
  EXPECT_EQ(all[0].second, 5 + 6 + 4 - 1);  // the 7th slow second is the first candidate one
  for (size_t i = 1; i < all.size(); ++i) EXPECT_NE(all[i].second, all[i - 1].second);
}

TEST(FailSlowDetector, AForgottenHostIsNoLongerComparedAndAShortGapIsFilled) {
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(ComputeOnly(3));
  ASSERT_TRUE(detector.ok());
  auto slow = [](int h, int64_t) { return h == 3 ? 1.5 : 1.0; };
  int64_t first = -1;
  for (int64_t t = 0; t < 30 && first < 0; ++t) {
    std::vector<FailSlowSample> samples = Second(4, t, slow);
    if (t == 12) samples.pop_back();  // host3 misses one second: filled with its last sample
    if (!detector->Observe(t, samples).empty()) first = t;
  }
  EXPECT_EQ(first, 8 + 3 - 1);  // judged from the 9th second (a full window), confirmed 3 later
  detector->Forget("host3");
  for (int64_t t = 30; t < 60; ++t) {
    std::vector<FailSlowSample> samples = Second(3, t, slow);
    EXPECT_TRUE(detector->Observe(t, samples).empty()) << "second " << t;
  }
}

TEST(FailSlowDetector, AHostFasterThanItsPeersIsNotAFailSlowSuspect) {
  FailSlowOptions options;
  options.metrics = {{"compute_ms", true, 0, FailSlowMetric::Worse::kHigher}};
  options.continuity = 3;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  ASSERT_TRUE(detector.ok());
  auto fast = [](int h, int64_t) { return h == 0 ? 0.5 : 1.0; };
  for (int64_t t = 0; t < 40; ++t) EXPECT_TRUE(detector->Observe(t, Second(4, t, fast)).empty());
  // The same host slower instead is named.
  auto slow = [](int h, int64_t) { return h == 0 ? 1.5 : 1.0; };
  bool named = false;
  for (int64_t t = 40; t < 80; ++t)
    named = named || !detector->Observe(t, Second(4, t, slow)).empty();
  EXPECT_TRUE(named);
}

TEST(FailSlowDetector, ADeviationBelowTheMetricsAbsoluteFloorIsNotReported) {
  FailSlowOptions options;
  options.metrics = {{"cpu_util", false, 0.05}};
  options.continuity = 3;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  ASSERT_TRUE(detector.ok());
  // host0 uses twice the CPU of the others, but 0.02 of a CPU against 0.01: one clock tick.
  for (int64_t t = 0; t < 40; ++t) {
    std::vector<FailSlowSample> samples;
    for (int h = 0; h < 4; ++h) samples.push_back({Host(h), "cpu_util", h == 0 ? 0.02 : 0.01, 1});
    EXPECT_TRUE(detector->Observe(t, samples).empty()) << "second " << t;
  }
}

// The default metrics of `trainguard run` for one second of `hosts` hosts that train alike (a
// ring: every host waits as long in the collective), host `lossy` retransmitting `retrans` TCP
// segments a second and the others 1 to 3, host `slow` (-1: none) with a round trip of `rtt_ms`
// on its active connections and the others 0.1 to 0.3 ms.
std::vector<FailSlowSample> RingSecond(int hosts, int64_t t, int lossy, double retrans,
                                       int slow = -1, double rtt_ms = 0) {
  std::vector<FailSlowSample> samples;
  for (int h = 0; h < hosts; ++h) {
    const double n = 1 + 0.03 * Noise(h, t);
    samples.push_back({Host(h), "compute_ms", 4.0 * n, 20});
    samples.push_back({Host(h), "cpu_wait_ms", 150.0 * n, 20});
    samples.push_back({Host(h), "collective_ms", 1000.0 * n, 20});
    samples.push_back({Host(h), "cpu_util", 0.15 * n, 20});
    samples.push_back(
        {Host(h), "tcp_retrans", h == lossy ? retrans * n : 2.0 + Noise(h, t, 7), 20});
    samples.push_back(
        {Host(h), "tcp_rtt_ms", h == slow ? rtt_ms * n : 0.2 + 0.1 * Noise(h, t, 9), 20});
  }
  return samples;
}

// Every verdict of the default metrics at `continuity` over seconds [0, seconds) of 4 hosts'
// RingSecond(.., lossy, retrans, slow, rtt_ms).
std::vector<SuspectVerdict> RingVerdicts(int continuity, int64_t seconds, int lossy, double retrans,
                                         int slow = -1, double rtt_ms = 0) {
  FailSlowOptions options;
  options.continuity = continuity;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  EXPECT_TRUE(detector.ok()) << detector.status();
  std::vector<SuspectVerdict> all;
  for (int64_t t = 0; detector.ok() && t < seconds; ++t) {
    for (SuspectVerdict& v : detector->Observe(t, RingSecond(4, t, lossy, retrans, slow, rtt_ms))) {
      all.push_back(v);
    }
  }
  return all;
}

TEST(FailSlowDetector,
     ALossyHostIsNamedByItsRetransmissionsThoughEveryHostWaitsAlikeInCollectives) {
  const std::vector<SuspectVerdict> all = RingVerdicts(10, 25, 2, 40);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].host, "host2");
  EXPECT_EQ(all[0].metric, "tcp_retrans");
  // Judged from second 8 (the 9th sample fills the window): the 10th candidate second confirms.
  EXPECT_EQ(all[0].second, 8 + 10 - 1);
}

TEST(FailSlowDetector, RetransmissionsBelowTheFloorAreNotALossyLinkEvenFarAboveThePeers) {
  // host1 retransmits 6x its peers, as a healthy host did beside a CPU-throttled one (12 segments
  // a second against 2): under the 15/s floor.
  EXPECT_TRUE(RingVerdicts(3, 60, 1, 12).empty());
}

TEST(FailSlowDetector, ALossyHostIsNamedThoughItsPeersMedianOfRetransmissionsIsZero) {
  FailSlowOptions options;
  options.metrics = {{"tcp_retrans", false, 15.0, FailSlowMetric::Worse::kHigher}};
  options.continuity = 10;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  ASSERT_TRUE(detector.ok());
  // As on bench_fail_slow's 8-host lossy runs: host3 retransmits about 50 segments a second, the
  // healthy hosts none in most seconds and one or two in some, so most of their 9-second medians,
  // and the hosts' median of those, are zero. A scale of zero would hide host3; the floor is the
  // scale then.
  std::vector<SuspectVerdict> all;
  for (int64_t t = 0; t < 25; ++t) {
    std::vector<FailSlowSample> samples;
    for (int h = 0; h < 8; ++h) {
      const double healthy = Noise(h, t, 3) > 0.6 ? 0.83 * (1 + (h + t) % 3) : 0.0;
      samples.push_back(
          {Host(h), "tcp_retrans", h == 3 ? 50.0 * (1 + 0.3 * Noise(h, t)) : healthy});
    }
    for (SuspectVerdict& v : detector->Observe(t, samples)) all.push_back(v);
  }
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].host, "host3");
  EXPECT_EQ(all[0].peers_median, 0.0);
  EXPECT_EQ(all[0].second, 8 + 10 - 1);
}

TEST(FailSlowDetector, ASlowLinksHostIsNamedByTheRoundTripOfItsActiveConnections) {
  // As on bench_fail_slow's slow-link runs: host3's packets shaped, its connections' RTT 6-10 ms
  // against 0.03-0.6 ms on its peers; compute, waits and collectives alike on every host.
  const std::vector<SuspectVerdict> all = RingVerdicts(10, 25, -1, 0, 3, 7.0);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].host, "host3");
  EXPECT_EQ(all[0].metric, "tcp_rtt_ms");
  EXPECT_EQ(all[0].second, 8 + 10 - 1);
}

TEST(FailSlowDetector, ARoundTripBelowTheFloorIsNotASlowLinkEvenFiveTimesThePeers) {
  // host1's connections answer in 1 ms against 0.2 ms: a loaded loopback, not a slow link (the
  // floor is 2 ms of mean distance to the peers).
  EXPECT_TRUE(RingVerdicts(3, 60, -1, 0, 1, 1.0).empty());
}

// tcp_rtt_ms (ms) of host1..host4, second by second from second 4, as the coordinator read them
// in a run of `trainguard run --fail-slow` (bench_fail_slow record --scenario throttle: 4 hosts x
// 2 ranks, host3's ranks in a CPU cgroup capped at 2% of a CPU) with both cores of the 2-core VM
// busy with two `yes` loops; -1: no sample. On loopback a connection's round trip is the time its
// receiver takes to be scheduled and read, so every host's alternates between good seconds and
// bad ones of several ms. Over seconds 15-27 host4's bad seconds came in a run: its 9-s median
// stayed about 2.2 ms above the others' (over the 2 ms floor, z 1.73 among 4), and with a
// continuity of 5 the detector named it, healthy, beside the throttled host3 (as
// MultiHost.AThrottledHostIsNamedThenEvictedOnItsSecondWindowAndNoHealthyHostEverIs once saw).
constexpr double kContendedRtt[][4] = {
    {5.43, 5.91, -1, 6.17},   {4.91, 8.90, 7.86, 7.39}, {2.70, 4.40, 2.90, 3.12},
    {1.09, 0.02, 0.02, 1.83}, {0.01, 0.02, 0.04, 0.01}, {0.61, 0.82, 1.28, 5.02},
    {4.29, 1.60, 1.89, 2.26}, {1.38, 0.76, 1.16, 1.21}, {1.07, 0.52, 0.55, 3.65},
    {1.07, 0.67, 0.89, 0.91}, {3.34, 1.27, 3.45, 1.19}, {3.86, 1.31, 2.15, 5.02},
    {0.49, 0.29, 0.62, 0.52}, {0.37, 0.57, 0.85, 2.02}, {0.30, 0.46, 2.73, 1.13},
    {0.80, 0.74, 3.33, 3.09}, {3.99, 1.03, 2.92, 3.59}, {0.58, 0.08, 0.43, 3.00},
    {0.26, 0.08, 1.43, 3.14}, {0.14, 0.13, 0.48, 0.23}, {4.83, 1.41, 1.33, 5.40},
    {3.46, 0.71, 1.62, 2.20}, {0.43, 0.40, 0.54, 1.46}, {0.36, 0.46, 1.84, 1.43},
    {0.38, 4.58, 1.19, 1.06}, {3.93, 3.00, 1.82, 0.98}, {4.87, 0.55, 4.04, 2.44},
    {0.11, 0.26, 1.75, 0.42}, {0.20, 0.08, 0.92, 0.12}, {4.27, 1.29, 0.41, 2.87},
    {2.71, 2.42, 2.07, 1.35}, {0.27, 0.07, 1.58, 0.89}, {0.40, 0.39, 1.35, 0.21},
    {0.20, 0.19, 0.68, 0.40}, {3.74, 0.34, 1.15, 2.67}, {0.98, 2.42, 1.51, 1.17},
    {0.09, 0.22, 0.91, 2.20}, {0.42, 0.19, 2.52, 0.81}, {0.53, 0.35, 0.74, 0.69},
    {1.66, 2.28, 1.07, 2.39}, {3.28, 1.77, 2.25, 0.88}, {0.07, 0.14, 2.05, 0.74},
    {0.14, 0.26, 0.28, 0.70}, {0.49, 0.16, 0.91, 3.13}, {1.48, 1.96, 0.99, 2.38},
    {2.63, 0.49, 1.34, 0.60},
};

// The same of a slow-link run on a quiet machine (bench_fail_slow record --scenario slowlink:
// host3's packets shaped to 2 Mbit/s): host3's round trips are 5-14 ms in every second, while
// its peers' jump to 2-6 ms for two seconds with every snapshot their replicators send.
constexpr double kSlowLinkRtt[][4] = {
    {0.02, 0.02, 0.03, 0.01},  {0.01, 0.12, 0.03, 0.01},  {0.23, 0.10, 5.27, 0.25},
    {0.08, 0.08, 12.61, 0.50}, {2.60, 6.38, 7.74, 0.66},  {2.62, 6.33, 8.82, 2.23},
    {0.07, 0.05, 6.88, 0.50},  {0.06, 0.06, 8.14, 0.44},  {0.06, 0.06, 7.90, 0.52},
    {2.44, 5.42, 9.10, 3.11},  {2.31, 5.65, 9.68, 2.71},  {0.04, 0.05, 7.94, 0.46},
    {0.04, 0.05, 8.05, 0.38},  {0.04, 0.06, 7.60, 0.45},  {2.19, 5.16, 8.25, 2.89},
    {2.07, 5.08, 8.25, 3.20},  {0.07, 0.06, 5.96, 0.47},  {0.07, 0.05, 5.91, 0.52},
    {0.07, 0.07, 6.23, 0.53},  {2.29, 5.00, 7.80, 2.62},  {2.28, 5.01, 7.80, 2.26},
    {0.07, 0.05, 7.99, 0.70},  {0.05, 0.09, 7.98, 0.52},  {0.05, 0.06, 7.82, 0.92},
    {1.81, 4.41, 7.94, 2.86},  {1.93, 4.17, 7.44, 2.84},  {0.04, 0.05, 6.48, 0.35},
    {0.05, 0.06, 6.04, 0.37},  {0.06, 0.06, 5.97, 0.31},  {2.01, 4.22, 7.24, 2.63},
    {1.82, 4.16, 6.54, 2.57},  {0.07, 0.15, 5.78, 0.51},  {0.17, 0.07, 6.53, 0.17},
    {0.11, 0.08, 6.91, 0.33},  {1.38, 3.70, 6.91, 2.42},  {1.26, 3.70, 6.91, 2.41},
    {0.06, 0.06, 9.15, 0.52},  {0.06, 0.07, 6.82, 0.25},  {0.07, 0.07, 6.62, 2.32},
    {1.19, 3.23, 6.70, 2.80},  {1.28, 3.23, 6.70, 0.19},  {0.05, 0.05, 6.15, 0.47},
    {0.05, 0.06, 6.09, 0.27},  {0.04, 2.83, 13.69, 2.24}, {1.18, 2.83, 6.62, 2.35},
    {1.09, 0.22, 6.62, 0.57},  {0.07, 0.19, 5.38, 0.42},  {0.05, 0.07, 6.47, 0.21},
};

// Every verdict of the default tcp_rtt_ms metric (its 2 ms floor) alone at continuity 5 (the
// multi-host test's) over `rows`, with `sustained` (FailSlowOptions).
template <size_t N>
std::vector<SuspectVerdict> RttVerdicts(const double (&rows)[N][4], double sustained) {
  FailSlowOptions options;
  for (const FailSlowMetric& m : FailSlowDetector::DefaultMetrics()) {
    if (m.name == "tcp_rtt_ms") options.metrics = {m};
  }
  options.continuity = 5;
  options.sustained = sustained;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  EXPECT_TRUE(detector.ok()) << detector.status();
  std::vector<SuspectVerdict> all;
  for (size_t i = 0; detector.ok() && i < N; ++i) {
    std::vector<FailSlowSample> samples;
    for (int h = 0; h < 4; ++h) {
      if (rows[i][h] >= 0) samples.push_back({Host(h + 1), "tcp_rtt_ms", rows[i][h], 1});
    }
    for (SuspectVerdict& v : detector->Observe(static_cast<int64_t>(i) + 4, samples)) {
      all.push_back(v);
    }
  }
  return all;
}

TEST(FailSlowDetector, AHealthyHostWhoseRoundTripsAreBadInRunsOfSecondsOnABusyMachineIsNotNamed) {
  // Judged on its median alone (sustained by its window's single worst second: the detector as
  // it was), host4 is named at second 27.
  const std::vector<SuspectVerdict> on_median = RttVerdicts(kContendedRtt, 1.0 / 9);
  ASSERT_FALSE(on_median.empty());
  EXPECT_EQ(on_median[0].host, "host4");
  EXPECT_EQ(on_median[0].second, 27);
  EXPECT_GT(on_median[0].value - on_median[0].peers_median, 1.5);
  // With the default, host4 must be 2 ms worse than the hosts' median in 7 of the 9 seconds of
  // its window, and its good seconds are as good as its peers': no host is ever named.
  for (const SuspectVerdict& v : RttVerdicts(kContendedRtt, FailSlowOptions{}.sustained)) {
    ADD_FAILURE() << v.host << " named at second " << v.second << ": " << v.value << " ms vs "
                  << v.peers_median;
  }
}

TEST(FailSlowDetector, AHostBehindASlowLinkIsNamedThoughItsPeersRoundTripsJumpWithEverySnapshot) {
  const std::vector<SuspectVerdict> all = RttVerdicts(kSlowLinkRtt, FailSlowOptions{}.sustained);
  ASSERT_FALSE(all.empty());
  for (const SuspectVerdict& v : all) EXPECT_EQ(v.host, "host3") << "second " << v.second;
  // Slow from second 6: the 7th slow second (12) is its first candidate second, the 5th confirms.
  EXPECT_EQ(all[0].second, 16);
}

TEST(FailSlowDetector, OptionsOutOfRangeAreRejectedNamingTheOption) {
  FailSlowOptions options;
  options.continuity = 0;
  EXPECT_EQ(FailSlowDetector::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.z_threshold = 2;  // a fraction of sqrt(n - 1), at most 1
  EXPECT_EQ(FailSlowDetector::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.metrics = {{"cpu_util", false}, {"cpu_util", false}};
  EXPECT_EQ(FailSlowDetector::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.denoise_window = 8;  // even: a rise would move the median one second before a fall
  EXPECT_EQ(FailSlowDetector::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  for (double sustained : {0.0, 1.5}) {  // a share of the window's seconds
    options = {};
    options.sustained = sustained;
    EXPECT_EQ(FailSlowDetector::Create(options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // The defaults: 5 CPU-side metrics and 4 GPU ones.
  EXPECT_EQ(FailSlowDetector::Create(FailSlowOptions{})->options().metrics.size(), 10u);
}

TEST(MahalanobisDetector, FlagsAThirtyPercentOutlierAtOnceAndAOneSecondSpikeToo) {
  MahalanobisDetector baseline({.metrics = {"compute_ms"}});
  auto slow = [](int h, int64_t t) { return h == 2 && t >= 10 ? 1.3 : 1.0; };
  std::optional<SuspectVerdict> v = baseline.Observe(10, Second(4, 10, slow));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->host, "host2");
  // No denoising and no continuity: one second at 1.5x is flagged as well (its false alarm).
  auto spike = [](int h, int64_t t) { return h == 1 && t == 3 ? 1.5 : 1.0; };
  v = baseline.Observe(3, Second(4, 3, spike));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->host, "host1");
}

}  // namespace
}  // namespace trainguard
