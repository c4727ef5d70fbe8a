// The guard against real CUDA faults: a kernel that writes through a wild pointer leaves a sticky
// cudaErrorIllegalAddress; TRAINGUARD_CUDA_CHECK turns it into a DeviceError and the guard
// classifies it as a fatal device error and rejects further steps. Runs only on a machine with a
// GPU.
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/fault_kernels.h"
#include "tests/gpu/spin_kernel.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::unique_ptr<sdk::Runtime> MakeRuntime() {
  char dir[] = "/tmp/trainguard-gpu-test-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  sdk::Options options;
  options.job_id = "gpu-test";
  options.run_dir = dir;
  auto rt = sdk::Runtime::Create(options);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return *std::move(rt);
}

TEST(CudaGuard, OutOfMemoryIsARecoverableStepFailureAndTheNextStepRuns) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto rt = MakeRuntime();
  sdk::StepResult r = sdk::guard(*rt, 0, [] {
    void* p = nullptr;
    TRAINGUARD_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 60));  // 1 EiB: always refused, not sticky
  });
  EXPECT_EQ(r.fault, sdk::FaultKind::kStepFailure);
  EXPECT_EQ(r.Evidence("sticky"), "false");
  EXPECT_EQ(r.Evidence("cuda_error"), std::to_string(static_cast<int>(cudaErrorMemoryAllocation)));
  EXPECT_FALSE(rt->fatal());
  // CUDA keeps the refused allocation in the thread's last-error slot; the guard's macro must clear
  // it, or the retried step's first launch check fails with the old out-of-memory.
  sdk::StepResult retry = sdk::guard(*rt, 0, [] {
    TRAINGUARD_CUDA_CHECK(testing::LaunchNoop(nullptr));
    TRAINGUARD_CUDA_CHECK(cudaDeviceSynchronize());
  });
  EXPECT_TRUE(retry.ok()) << retry.Evidence("what");
}

// Must run last in the process: it destroys the CUDA context for good.
TEST(CudaGuard, IllegalAddressIsAFatalDeviceErrorAndLaterStepsAreRejected) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto rt = MakeRuntime();
  sdk::StepResult r = sdk::guard(*rt, 7, [] {
    TRAINGUARD_CUDA_CHECK(testing::LaunchWildWrite(reinterpret_cast<float*>(0x10)));
    TRAINGUARD_CUDA_CHECK(cudaDeviceSynchronize());
  });
  EXPECT_EQ(r.fault, sdk::FaultKind::kFatalDeviceError);
  EXPECT_EQ(r.action, sdk::StepAction::kFatal);
  EXPECT_EQ(r.Evidence("sticky"), "true");
  EXPECT_THAT(r.Evidence("what"), HasSubstr("cudaDeviceSynchronize()"));
  EXPECT_TRUE(rt->fatal());
  bool ran = false;
  sdk::StepResult next = sdk::guard(*rt, 8, [&] { ran = true; });
  EXPECT_FALSE(ran);
  EXPECT_EQ(next.fault, sdk::FaultKind::kUsageError);
}

}  // namespace
}  // namespace trainguard
