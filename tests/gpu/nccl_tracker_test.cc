// The NCCL wrappers (nccl.h) on a one-rank communicator: the all-reduce runs through NCCL, and the
// tracker records its begin and end. Runs only where a GPU is.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/nccl.h"

namespace trainguard {
namespace {

constexpr uint64_t kWorld = 3;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(NcclTracker, AnAllReduceThroughTheWrapperIsRecordedBeginAndEnd) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  auto recorder = FlightRecorder::Create(absl::StrCat("nccl-test-", getpid()), 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  CollectiveTrackerOptions options;
  options.recorder = recorder->get();
  auto tracker = CollectiveTracker::Create(options);
  ASSERT_TRUE(tracker.ok());
  ASSERT_TRUE((*tracker)->EnableGpu(0).ok());
  ASSERT_TRUE(nccl::RegisterNcclComm(**tracker, kWorld, "world", comm).ok());
  (*tracker)->SetStep(4);

  constexpr size_t kCount = 1024;
  std::vector<float> host(kCount, 2.0f);
  float* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(buffer, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(
      nccl::AllReduce(**tracker, kWorld, buffer, buffer, kCount, ncclFloat, ncclSum, comm, stream),
      ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CollectivePoll poll = (*tracker)->Poll((*tracker)->clock().MonotonicNanos());
  EXPECT_EQ(poll.gpu_completed, 1);
  ASSERT_EQ(cudaMemcpy(host.data(), buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(host[0], 2.0f) << "one rank: the sum is the input";

  std::vector<FlightRecord> records = (*recorder)->Snapshot();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].type, FlightRecordType::kCommunicator);  // the registration
  records.erase(records.begin());
  EXPECT_EQ(records[0].type, FlightRecordType::kCollectiveBegin);
  EXPECT_EQ(records[1].type, FlightRecordType::kCollectiveEnd);
  for (const FlightRecord& r : records) {
    EXPECT_EQ(r.Name(), "all_reduce");
    EXPECT_EQ(r.comm_id, kWorld);
    EXPECT_EQ(r.comm_seq, 0);
    EXPECT_EQ(r.bytes, kCount * sizeof(float));
    EXPECT_EQ(r.step, 4);
  }
  EXPECT_EQ((*tracker)->Progress()[0].completed, 1);

  ASSERT_TRUE((*tracker)->UnregisterCommunicator(kWorld).ok());
  EXPECT_EQ((*tracker)->AbortCommunicators(), 0) << "unregistered: nothing to abort";
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(cudaFree(buffer), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(NcclTracker, AHangAbortsTheRegisteredCommunicator) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  auto tracker = CollectiveTracker::Create(CollectiveTrackerOptions{});
  ASSERT_TRUE(tracker.ok());
  ASSERT_TRUE(nccl::RegisterNcclComm(**tracker, kWorld, "world", comm).ok());
  EXPECT_EQ((*tracker)->AbortCommunicators(), 1) << "ncclCommAbort frees the communicator";
  EXPECT_EQ((*tracker)->AbortCommunicators(), 0) << "once per registration";
}

}  // namespace
}  // namespace trainguard
