// The compute canary's CPU twin: a fixed matrix product. Compiled with -ffp-contract=off
// (sdk/health/CMakeLists.txt): a fused multiply-add would round differently on the machines whose
// compiler chose it.
#include "sdk/health/compute_canary.h"

#include <xxhash.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

#if defined(TRAINGUARD_HAVE_CUDA)
#include "sdk/health/canary_kernels.h"
#endif

namespace trainguard {
namespace {

// SplitMix64: the inputs are a function of their index only.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A normal float in [-1, 1) from 24 random bits, never zero or denormal.
float Input(uint64_t index) {
  const uint32_t bits = static_cast<uint32_t>(Mix(index) >> 40);  // 24 bits
  const float unit = static_cast<float>(bits) / 16777216.0f;      // [0, 1), exact
  const float value = 2.0f * unit - 1.0f;
  return value == 0.0f ? 0.5f : value;
}

}  // namespace

std::vector<float> CanaryInputA() {
  std::vector<float> a(kCanaryDim * kCanaryDim);
  for (size_t i = 0; i < a.size(); ++i) a[i] = Input(i);
  return a;
}

std::vector<float> CanaryInputB() {
  std::vector<float> b(kCanaryDim * kCanaryDim);
  for (size_t i = 0; i < b.size(); ++i) b[i] = Input(b.size() + i);
  return b;
}

std::vector<float> CanaryProduct() {
  constexpr int n = kCanaryDim;
  const std::vector<float> a = CanaryInputA();
  const std::vector<float> b = CanaryInputB();
  std::vector<float> c(n * n, 0.0f);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      const float aik = a[i * n + k];
      for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
  }
  return c;
}

uint64_t ComputeCanary() {
  const std::vector<float> c = CanaryProduct();
  return XXH3_64bits(c.data(), c.size() * sizeof(float));
}

absl::StatusOr<std::vector<float>> DeviceCanaryProduct(int device) {
#if defined(TRAINGUARD_HAVE_CUDA)
  const std::vector<float> a = CanaryInputA();
  const std::vector<float> b = CanaryInputB();
  std::vector<float> c(a.size());
  const cudaError_t status =
      health_internal::DeviceCanaryProduct(device, a.data(), b.data(), c.data(), kCanaryDim);
  if (status != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("the compute canary on CUDA device %d: %s (%d)",
                                               device, cudaGetErrorString(status),
                                               static_cast<int>(status)));
  }
  return c;
#else
  return absl::UnimplementedError(absl::StrFormat(
      "the compute canary on CUDA device %d: trainguard is built without CUDA", device));
#endif
}

absl::StatusOr<uint64_t> ComputeDeviceCanary(int device) {
  absl::StatusOr<std::vector<float>> c = DeviceCanaryProduct(device);
  if (!c.ok()) return c.status();
  return XXH3_64bits(c->data(), c->size() * sizeof(float));
}

}  // namespace trainguard
