// Snapshotter with a CUDA device buffer: the device bytes are copied to the pinned arena chunk by
// chunk on the snapshot stream, checksummed there, and copied back on restore.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

constexpr size_t kBytes = (9 << 20) + 4096 + 40;  // several chunks, the last one partial

std::vector<char> Pattern(int step) {
  std::vector<char> bytes(kBytes);
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<char>(i * 17 + step * 5 + (i >> 11));
  return bytes;
}

class SnapshotterGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    options_.job_id = absl::StrFormat("gpu-test-%d", getpid());
    options_.chunk_bytes = 1 << 20;
    ASSERT_EQ(cudaMalloc(&device_, kBytes), cudaSuccess);
  }
  void TearDown() override {
    if (device_ != nullptr) cudaFree(device_);
    absl::Status removed = Snapshotter::RemoveArena(options_.job_id, options_.rank);
    EXPECT_TRUE(removed.ok() || absl::IsNotFound(removed)) << removed;
  }

  SnapshotterOptions options_;
  void* device_ = nullptr;
};

TEST_F(SnapshotterGpuTest, ADeviceBufferIsSnapshottedAndRestoredByteExact) {
  std::vector<char> step5 = Pattern(5);
  ASSERT_EQ(cudaMemcpy(device_, step5.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> host(1024, 2.5f);

  StateRegistry registry;
  ASSERT_TRUE(registry
                  .Register(StateBuffer{"layer0.weight",
                                        "model",
                                        device_,
                                        kBytes,
                                        DType::kU8,
                                        {static_cast<int64_t>(kBytes)},
                                        Device::Cuda(0)})
                  .ok());
  ASSERT_TRUE(registry
                  .Register(StateBuffer{"optimizer.scale",
                                        "optimizer",
                                        host.data(),
                                        host.size() * sizeof(float),
                                        DType::kF32,
                                        {1024},
                                        Device::Host()})
                  .ok());
  absl::StatusOr<std::unique_ptr<Snapshotter>> snapshotter =
      Snapshotter::Create(&registry, options_);
  ASSERT_TRUE(snapshotter.ok()) << snapshotter.status();
  ASSERT_TRUE((*snapshotter)->Begin(5).ok());
  ASSERT_TRUE((*snapshotter)->FenceBuffer("layer0.weight", absl::Seconds(30)).ok());
  // The trainer overwrites the device buffer as soon as its copy is fenced.
  std::vector<char> step6 = Pattern(6);
  ASSERT_EQ(cudaMemcpy(device_, step6.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE((*snapshotter)->Fence(absl::Seconds(30)).ok());

  absl::StatusOr<Snapshotter::View> view = (*snapshotter)->LatestView();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->payload.substr(0, kBytes), std::string_view(step5.data(), kBytes));

  std::fill(host.begin(), host.end(), 0.0f);
  absl::StatusOr<SnapshotInfo> restored = (*snapshotter)->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 5);
  std::vector<char> back(kBytes);
  ASSERT_EQ(cudaMemcpy(back.data(), device_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(back == step5);
  EXPECT_EQ(host, std::vector<float>(1024, 2.5f));
}

}  // namespace
}  // namespace trainguard
