// The compute canary on a real GPU (sdk/health/compute_canary.h): the device's product equals the
// CPU twin's bit for bit, so a healthy GPU and a healthy CPU give every rank the same fingerprint.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "sdk/health/compute_canary.h"

namespace trainguard {
namespace {

TEST(CanaryGpuTest, TheDevicesProductIsTheCpuTwinsBitForBit) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> cpu = CanaryProduct();
  absl::StatusOr<std::vector<float>> gpu = DeviceCanaryProduct(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_EQ(gpu->size(), cpu.size());
  size_t differing = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    differing += std::memcmp(&(*gpu)[i], &cpu[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differing, 0u) << "of " << cpu.size() << " elements";
  absl::StatusOr<uint64_t> fingerprint = ComputeDeviceCanary(0);
  ASSERT_TRUE(fingerprint.ok()) << fingerprint.status();
  EXPECT_EQ(*fingerprint, ComputeCanary());
}

TEST(CanaryGpuTest, ADeviceThatDoesNotExistIsAnErrorNamingIt) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<uint64_t> fingerprint = ComputeDeviceCanary(devices);
  ASSERT_FALSE(fingerprint.ok());
  EXPECT_NE(fingerprint.status().message().find("CUDA device"), std::string::npos)
      << fingerprint.status();
}

}  // namespace
}  // namespace trainguard
