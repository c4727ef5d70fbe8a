// Snapshotter with a CUDA device buffer: the device bytes are copied to the pinned arena chunk by
// chunk on the snapshot stream, checksummed there, and copied back on restore.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

  // Registers device_ (kBytes) as "layer0.weight" on device 0.
  void RegisterDeviceBuffer(StateRegistry& registry) {
    ASSERT_TRUE(registry
                    .Register(StateBuffer{"layer0.weight",
                                          "model",
                                          device_,
                                          kBytes,
                                          DType::kU8,
                                          {static_cast<int64_t>(kBytes)},
                                          Device::Cuda(0)})
                    .ok());
  }

  SnapshotterOptions options_;
  void* device_ = nullptr;
};

TEST_F(SnapshotterGpuTest, ADeviceBufferIsSnapshottedAndRestoredByteExact) {
  std::vector<char> step5 = Pattern(5);
  ASSERT_EQ(cudaMemcpy(device_, step5.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> host(1024, 2.5f);

  StateRegistry registry;
  ASSERT_NO_FATAL_FAILURE(RegisterDeviceBuffer(registry));
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

// The restore of a fetched backup (Snapshotter::InstallAndRestoreWith): a device buffer is copied
// from the pinned slot once its last chunk landed, while the fill is still running (the rest of
// the payload still arriving), in one copy; not before.
TEST_F(SnapshotterGpuTest, ADeviceBufferIsRestoredOnceItsLastChunkLandsDuringTheInstall) {
  std::vector<char> step5 = Pattern(5);
  ASSERT_EQ(cudaMemcpy(device_, step5.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  StateRegistry registry;
  ASSERT_NO_FATAL_FAILURE(RegisterDeviceBuffer(registry));
  absl::StatusOr<std::unique_ptr<Snapshotter>> snapshotter =
      Snapshotter::Create(&registry, options_);
  ASSERT_TRUE(snapshotter.ok()) << snapshotter.status();
  ASSERT_TRUE((*snapshotter)->Begin(5).ok());
  ASSERT_TRUE((*snapshotter)->Fence(absl::Seconds(30)).ok());
  absl::StatusOr<Snapshotter::View> view = (*snapshotter)->LatestView();
  ASSERT_TRUE(view.ok()) << view.status();
  const std::string payload(view->payload);
  const std::vector<uint64_t> checksums = view->chunk_checksums;
  const uint64_t chunk = options_.chunk_bytes;
  ASSERT_GT(checksums.size(), 1u);
  std::vector<char> step6 = Pattern(6);
  ASSERT_EQ(cudaMemcpy(device_, step6.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  auto device_holds = [&](const std::vector<char>& expected) {
    std::vector<char> back(kBytes);
    EXPECT_EQ(cudaMemcpy(back.data(), device_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return back == expected;
  };
  const uint64_t fingerprint = SnapshotFingerprint(9, (*snapshotter)->LatestComplete()->layout_hash,
                                                   payload.size(), checksums);
  // The chunks land last first (the blob area with the buffer's last bytes, then the others one by
  // one): the buffer is copied when chunk 0, its last one in, lands; not before.
  absl::StatusOr<SnapshotInfo> restored =
      (*snapshotter)
          ->InstallAndRestoreWith(
              &registry, 9, 0, payload.size(), checksums, fingerprint,
              [&](char* dst, Snapshotter::ChunkSink* sink) -> absl::Status {
                for (uint64_t k = checksums.size(); k-- > 0;) {
                  const uint64_t begin = k * chunk;
                  std::memcpy(dst + begin, payload.data() + begin,
                              std::min<uint64_t>(chunk, payload.size() - begin));
                  if (k == 0) {
                    EXPECT_TRUE(device_holds(step6));  // every other chunk told: not yet
                  }
                  sink->Landed(k);
                }
                EXPECT_TRUE(device_holds(step5));  // before the fill returned
                return absl::OkStatus();
              });
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 9);
  EXPECT_TRUE(device_holds(step5));
}

}  // namespace
}  // namespace trainguard
