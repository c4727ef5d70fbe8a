#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/errors.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

TEST(DeviceErrors, ContextCorruptingCudaErrorsAreSticky) {
  for (int code : {700, 702, 709, 710, 714, 715, 716, 717, 718, 719, 214, 999}) {
    EXPECT_TRUE(IsStickyCudaError(code)) << code;
  }
}

TEST(DeviceErrors, UsageAndResourceCudaErrorsAreNotSticky) {
  // cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInitializationError,
  // cudaErrorNoDevice, cudaErrorLaunchOutOfResources, cudaErrorNotReady.
  for (int code : {1, 2, 3, 100, 701, 600}) EXPECT_FALSE(IsStickyCudaError(code)) << code;
}

TEST(DeviceErrors, ThrowCudaErrorNamesTheCallTheLocationAndTheError) {
  try {
    ThrowCudaError(700, "cudaErrorIllegalAddress", "an illegal memory access",
                   "cudaMemcpy(a, b, n)", "trainer.cc", 88);
    FAIL() << "did not throw";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.code(), 700);
    EXPECT_TRUE(e.sticky());
    EXPECT_STREQ(e.what(),
                 "cudaMemcpy(a, b, n) failed at trainer.cc:88: cudaErrorIllegalAddress (700): an "
                 "illegal memory access");
  }
}

TEST(DeviceErrors, NcclErrorsAreCommunicationErrorsAndKnowDeviceFaults) {
  try {
    ThrowNcclError(2, "unhandled system error", "ncclAllReduce(...)", "t.cc", 5);
    FAIL() << "did not throw";
  } catch (const CommunicationError& e) {
    const auto* nccl = dynamic_cast<const NcclError*>(&e);
    ASSERT_NE(nccl, nullptr);
    EXPECT_EQ(nccl->code(), 2);
    EXPECT_FALSE(nccl->is_device_fault());
    EXPECT_THAT(e.what(), HasSubstr("NCCL error 2"));
  }
  EXPECT_TRUE(NcclError("x", 1).is_device_fault());
}

}  // namespace
}  // namespace trainguard
