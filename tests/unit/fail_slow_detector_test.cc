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
  // The moving median (window 9) turns with the 5th slow sample: second kOnset + 4 is the first
  // candidate second, and the 10th candidate second confirms.
  const int64_t confirmed = kOnset + 4 + kContinuity - 1;
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
  const int64_t confirmed = kOnset + 4 + kContinuity - 1;
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
  EXPECT_EQ(all[0].second, 5 + 4 + 4 - 1);
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
