// The CPU twin of the GPU metrics (sdk/health/gpu_metrics_source.h): a fake GpuMetricsSource feeds
// the host agent's sampler (sdk/host_agent/host_sampler.h), and, end to end through the
// coordinator's FailSlowMonitor, a host whose GPU loses clocks is named; which GPUs a host's ranks
// use; NVML absent is a reason, not a failure. The real NVML: tests/gpu/nvml_metrics_gpu_test.cc.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/health/fail_slow_detector.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/health/fail_slow_monitor.h"
#include "sdk/health/gpu_metrics_source.h"
#include "sdk/host_agent/host_sampler.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GPUs whose readings the test sets: by device name ("0", "1", ...).
using Readings = std::map<std::string, GpuSample>;

class FakeGpus : public GpuMetricsSource {
 public:
  FakeGpus(std::shared_ptr<Readings> readings, int count)
      : readings_(std::move(readings)), count_(count) {}
  int device_count() const override { return count_; }
  absl::StatusOr<GpuSample> Sample(const std::string& device) override {
    const auto it = readings_->find(device);
    if (it == readings_->end()) return absl::NotFoundError(absl::StrCat("no GPU ", device));
    return it->second;
  }

 private:
  std::shared_ptr<Readings> readings_;
  int count_;
};

GpuSample Healthy() { return {90.0, 400.0, 1980.0, 60.0}; }

// A rank whose work record advances 10 steps of 1 s (0.2 s in collectives) per call; pid -1: no
// CPU metric (nothing of the test process's own CPU time leaks into the comparison).
HostSampler::RankProcess Rank(int rank, int local_rank, int64_t call) {
  RankWorkRecord w;
  w.steps = 10 * call;
  w.step_ns = 1'000'000'000 * call;
  w.collective_ns = 200'000'000 * call;
  return {rank, -1, EncodeRankWorkRecord(w), local_rank};
}

double Metric(const HostMetricsRecord& r, const std::string& name) {
  for (const auto& [n, v] : r.metrics) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no " << name << " in " << EncodeHostMetricsRecord(r);
  return -1;
}

TEST(GpuDevicesOfRanks, LocalRankRIsTheRthVisibleDeviceOrIndexRWithoutCudaVisibleDevices) {
  EXPECT_THAT(GpuDevicesOfRanks({0, 1}, nullptr, 8), ElementsAre("0", "1"));
  EXPECT_THAT(GpuDevicesOfRanks({1, 0}, "6,7", 8), ElementsAre("7", "6"));
  EXPECT_THAT(GpuDevicesOfRanks({0}, "GPU-1234-abcd,3", 8), ElementsAre("GPU-1234-abcd"));
  // More ranks than visible GPUs share them; each device is sampled once.
  EXPECT_THAT(GpuDevicesOfRanks({0, 1, 2, 3}, "4,5", 8), ElementsAre("4", "5"));
  // Without the variable, a rank beyond the host's GPUs has none.
  EXPECT_THAT(GpuDevicesOfRanks({0, 3}, nullptr, 2), ElementsAre("0"));
  // An empty value hides every GPU; CUDA stops at the first entry it cannot use.
  EXPECT_TRUE(GpuDevicesOfRanks({0}, "", 8).empty());
  EXPECT_THAT(GpuDevicesOfRanks({0, 1}, "2,9,3", 8), ElementsAre("2"));
  EXPECT_TRUE(GpuDevicesOfRanks({-1}, nullptr, 8).empty());  // a rank with no local rank
}

TEST(HostSamplerGpus, TheSampleAveragesTheGpusOfTheHostsRanksOnly) {
  auto readings = std::make_shared<Readings>();
  (*readings)["0"] = {80.0, 300.0, 1900.0, 50.0};
  (*readings)["1"] = {100.0, 500.0, 1700.0, 70.0};
  (*readings)["2"] = {0.0, 60.0, 210.0, 0.0};  // idle, used by no rank of this host
  // Board 1 cannot report its power: averaged over the GPUs that can.
  (*readings)["1"].power_w.reset();
  HostSampler sampler(std::make_unique<FakeGpus>(readings, 3), std::nullopt);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(sampler.Sample(t0, {Rank(0, 0, 1), Rank(1, 1, 1)}).has_value());
  std::optional<HostMetricsRecord> r =
      sampler.Sample(t0 + absl::Seconds(1), {Rank(0, 0, 2), Rank(1, 1, 2)});
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(Metric(*r, "gpu_util"), 90.0);
  EXPECT_DOUBLE_EQ(Metric(*r, "gpu_power_w"), 300.0);
  EXPECT_DOUBLE_EQ(Metric(*r, "gpu_sm_clock_mhz"), 1800.0);
  EXPECT_DOUBLE_EQ(Metric(*r, "gpu_mem_util"), 60.0);
  EXPECT_DOUBLE_EQ(Metric(*r, "compute_ms"), 800.0);  // the CPU-side metrics are still there
}

TEST(HostSamplerGpus, WithoutASourceNoGpuMetricIsSampled) {
  HostSampler sampler;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  (void)sampler.Sample(t0, {Rank(0, 0, 1)});
  std::optional<HostMetricsRecord> r = sampler.Sample(t0 + absl::Seconds(1), {Rank(0, 0, 2)});
  ASSERT_TRUE(r.has_value());
  EXPECT_THAT(EncodeHostMetricsRecord(*r), ::testing::Not(HasSubstr("gpu_")));
}

TEST(HostSamplerGpus, AHostWhoseGpuLosesClocksIsNamedByTheCoordinatorAndNoOtherHostIs) {
  constexpr int kHosts = 4;
  std::vector<std::shared_ptr<Readings>> readings;
  std::vector<HostSampler> samplers;
  for (int h = 0; h < kHosts; ++h) {
    readings.push_back(std::make_shared<Readings>(Readings{{"0", Healthy()}, {"1", Healthy()}}));
    samplers.emplace_back(std::make_unique<FakeGpus>(readings.back(), 2), std::nullopt);
  }
  FailSlowOptions options;
  options.continuity = 5;
  absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
  ASSERT_TRUE(detector.ok()) << detector.status();
  FailSlowMonitor monitor(*std::move(detector));
  std::vector<SuspectVerdict> verdicts;
  for (int64_t second = 1; second <= 60; ++second) {
    // From second 20, host2's GPU 1 is throttled to 1200 MHz: its host averages 1590 MHz.
    if (second == 20) (*readings[2])["1"].sm_clock_mhz = 1200.0;
    std::map<std::string, std::string> records;
    for (int h = 0; h < kHosts; ++h) {
      std::optional<HostMetricsRecord> r =
          samplers[h].Sample(absl::FromUnixSeconds(1000 + second),
                             {Rank(2 * h, 0, second), Rank(2 * h + 1, 1, second)});
      if (r.has_value()) records[absl::StrCat("host", h)] = EncodeHostMetricsRecord(*r);
    }
    for (SuspectVerdict& v : monitor.Observe(second, records)) verdicts.push_back(std::move(v));
  }
  ASSERT_FALSE(verdicts.empty());
  for (const SuspectVerdict& v : verdicts) {
    EXPECT_EQ(v.host, "host2");
    EXPECT_EQ(v.metric, "gpu_sm_clock_mhz");
    EXPECT_GE(v.second, 20);
  }
  EXPECT_DOUBLE_EQ(verdicts[0].value, 1590.0);
  EXPECT_DOUBLE_EQ(verdicts[0].peers_median, 1980.0);
}

TEST(HostSamplerGpus, TheGpuMetricsAreJudgedRightAfterComputeMsAndBeforeTheCpuOnes) {
  std::vector<std::string> names;
  for (const FailSlowMetric& m : FailSlowDetector::DefaultMetrics()) names.push_back(m.name);
  EXPECT_THAT(names, ElementsAre("compute_ms", "gpu_sm_clock_mhz", "gpu_power_w", "gpu_mem_util",
                                 "gpu_util", "cpu_wait_ms", "tcp_retrans", "tcp_rtt_ms",
                                 "collective_ms", "cpu_util"));
}

TEST(NvmlGpuMetricsSource, WithoutTheDriversLibraryItIsUnavailableAndSaysWhy) {
  absl::StatusOr<std::unique_ptr<GpuMetricsSource>> source =
      NvmlGpuMetricsSource::Open("libtrainguard-no-such-nvml.so.1");
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(source.status().message(), HasSubstr("libtrainguard-no-such-nvml.so.1"));
}

}  // namespace
}  // namespace trainguard
