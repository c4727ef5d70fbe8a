// The compute canary's product on a CUDA device: one thread per element of C, the CPU twin's
// order of operations (k ascending, a product rounded, then a sum rounded: __fmul_rn and
// __fadd_rn, which the compiler never contracts into a fused multiply-add).
#include <cuda_runtime.h>

#include <cstddef>

#include "sdk/health/canary_kernels.h"

namespace trainguard {
namespace health_internal {
namespace {

constexpr int kTile = 16;

__global__ void CanaryProductKernel(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.y * kTile + threadIdx.y;
  const int j = blockIdx.x * kTile + threadIdx.x;
  if (i >= n || j >= n) return;
  float sum = 0.0f;
  for (int k = 0; k < n; ++k) sum = __fadd_rn(sum, __fmul_rn(a[i * n + k], b[k * n + j]));
  c[i * n + j] = sum;
}

}  // namespace

cudaError_t DeviceCanaryProduct(int device, const float* a, const float* b, float* c, int n) {
  cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) return status;
  const size_t bytes = static_cast<size_t>(n) * n * sizeof(float);
  float* d_a = nullptr;
  float* d_b = nullptr;
  float* d_c = nullptr;
  auto first = [&status](cudaError_t next) {
    if (status == cudaSuccess) status = next;
  };
  first(cudaMalloc(&d_a, bytes));
  first(cudaMalloc(&d_b, bytes));
  first(cudaMalloc(&d_c, bytes));
  if (status == cudaSuccess) {
    first(cudaMemcpy(d_a, a, bytes, cudaMemcpyHostToDevice));
    first(cudaMemcpy(d_b, b, bytes, cudaMemcpyHostToDevice));
  }
  if (status == cudaSuccess) {
    const dim3 threads(kTile, kTile);
    const dim3 blocks((n + kTile - 1) / kTile, (n + kTile - 1) / kTile);
    void* args[] = {&d_a, &d_b, &d_c, &n};
    first(cudaLaunchKernel(reinterpret_cast<const void*>(&CanaryProductKernel), blocks, threads,
                           args, 0, nullptr));
    first(cudaMemcpy(c, d_c, bytes, cudaMemcpyDeviceToHost));  // synchronises
  }
  for (float* p : {d_a, d_b, d_c}) {
    if (p != nullptr) first(cudaFree(p));
  }
  return status;
}

}  // namespace health_internal
}  // namespace trainguard
