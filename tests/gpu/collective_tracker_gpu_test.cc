// The CollectiveTracker's GPU path on a real device: CUDA events bracket a "collective" on the
// user's stream and the watchdog thread only queries them. A kernel spinning on a host-mapped flag
// stands in for a collective stuck on this GPU (a peer that never joined). Runs only where a GPU
// is.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "tests/gpu/spin_kernel.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

constexpr uint64_t kDp = 1;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::unique_ptr<CollectiveTracker> MakeGpuTracker(absl::Duration warmup_bound) {
  CollectiveTrackerOptions options;
  options.bound.warmup_bound = warmup_bound;
  auto tracker = CollectiveTracker::Create(options);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  absl::Status enabled = (*tracker)->EnableGpu(0);
  EXPECT_TRUE(enabled.ok()) << enabled;
  EXPECT_TRUE((*tracker)->RegisterCommunicator(kDp, "dp", nullptr).ok());
  return *std::move(tracker);
}

TEST(CollectiveTrackerGpu, AKernelStuckOnTheStreamIsAHangAndCompletesOnceReleased) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* host_flag = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int), cudaHostAllocMapped),
            cudaSuccess);
  *reinterpret_cast<volatile int*>(host_flag) = 0;
  int* device_flag = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), host_flag, 0),
            cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  std::unique_ptr<CollectiveTracker> tracker = MakeGpuTracker(absl::Milliseconds(300));
  Notification hung;  // outlives the watchdog's monitor thread
  WatchdogOptions options;
  options.poll_period = absl::Milliseconds(10);
  options.tracker = tracker.get();
  auto wd = Watchdog::Create(options);
  ASSERT_TRUE(wd.ok()) << wd.status();
  (*wd)->AddHangHandler([&](const HangReport&) { hung.Notify(); });

  const int64_t begun_ns = Clock::Real()->MonotonicNanos();
  CollectiveHandle h = tracker->BeginOnStream("all_reduce", kDp, 1 << 20, -1, stream);
  ASSERT_TRUE(h.valid()) << tracker->usage_status();
  ASSERT_EQ(testing::LaunchSpinUntilFlag(device_flag, stream), cudaSuccess);
  tracker->EndOnStream(h, stream);

  ASSERT_TRUE(hung.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::printf(
      "GPU collective hang detected after %s (bound 300ms, poll 10ms)\n",
      absl::FormatDuration(absl::Nanoseconds(Clock::Real()->MonotonicNanos() - begun_ns)).c_str());
  std::optional<HangReport> hang = (*wd)->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->cause, HangReport::Cause::kCollective);
  ASSERT_TRUE(hang->collective.has_value());
  EXPECT_TRUE(hang->collective->on_gpu);
  EXPECT_EQ(hang->collective->op, "all_reduce");
  EXPECT_EQ(hang->collective->comm_seq, 0);
  EXPECT_GT(hang->collective->age, absl::Milliseconds(300));
  EXPECT_EQ(tracker->Progress()[0].completed, 0) << "still spinning";

  // Release the kernel: the watchdog thread sees the end event and completes the collective.
  reinterpret_cast<std::atomic<int>*>(host_flag)->store(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (tracker->Progress()[0].completed == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(tracker->Progress()[0].completed, 1);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  wd->reset();
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(host_flag), cudaSuccess);
}

TEST(CollectiveTrackerGpu, HealthyGpuCollectivesCompleteAndTeachTheirBound) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::unique_ptr<CollectiveTracker> tracker = MakeGpuTracker(absl::Minutes(10));
  for (int i = 0; i < 5; ++i) {
    CollectiveHandle h = tracker->BeginOnStream("all_gather", kDp, 4096, -1, stream);
    ASSERT_EQ(testing::LaunchNoop(stream), cudaSuccess);
    tracker->EndOnStream(h, stream);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CollectivePoll poll = tracker->Poll(tracker->clock().MonotonicNanos());
  EXPECT_EQ(poll.gpu_completed, 5);
  EXPECT_EQ(poll.in_flight, 0);
  EXPECT_EQ(tracker->BoundFor("all_gather"), absl::Seconds(2)) << "microseconds x 3: the floor";
  EXPECT_EQ(tracker->usage_errors(), 0);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace trainguard
