// The real NVML (sdk/health/gpu_metrics_source.h) on a host with an NVIDIA GPU and driver: the
// source opens, sees the GPU, and its readings are plausible. Labelled gpu: run only where
// nvidia-smi sees a device (scripts/test.sh). The CPU twin: tests/unit/gpu_metrics_test.cc.
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sdk/health/gpu_metrics_source.h"

namespace trainguard {
namespace {

TEST(NvmlGpuMetricsSourceGpu, EveryGpuReportsPlausibleUtilisationPowerAndClocks) {
  absl::StatusOr<std::unique_ptr<GpuMetricsSource>> source = NvmlGpuMetricsSource::Open();
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_GE((*source)->device_count(), 1);
  for (int i = 0; i < (*source)->device_count(); ++i) {
    absl::StatusOr<GpuSample> s = (*source)->Sample(absl::StrCat(i));
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(s->util_pct.has_value()) << "GPU " << i;
    EXPECT_GE(*s->util_pct, 0) << "GPU " << i;
    EXPECT_LE(*s->util_pct, 100) << "GPU " << i;
    ASSERT_TRUE(s->mem_util_pct.has_value()) << "GPU " << i;
    EXPECT_GE(*s->mem_util_pct, 0) << "GPU " << i;
    EXPECT_LE(*s->mem_util_pct, 100) << "GPU " << i;
    ASSERT_TRUE(s->sm_clock_mhz.has_value()) << "GPU " << i;
    EXPECT_GT(*s->sm_clock_mhz, 0) << "GPU " << i;
    if (s->power_w.has_value()) {  // some boards cannot report it
      EXPECT_GT(*s->power_w, 0) << "GPU " << i;
    }
  }
}

TEST(NvmlGpuMetricsSourceGpu, AnIndexBeyondTheGpusIsNotFound) {
  absl::StatusOr<std::unique_ptr<GpuMetricsSource>> source = NvmlGpuMetricsSource::Open();
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<GpuSample> s = (*source)->Sample(absl::StrCat((*source)->device_count() + 64));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainguard
