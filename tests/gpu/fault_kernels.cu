#include "fault_kernels.h"

namespace trainguard::testing {
namespace {

__global__ void WriteThrough(float* p) { p[threadIdx.x] = 1.0f; }

}  // namespace

cudaError_t LaunchWildWrite(float* wild) {
  WriteThrough<<<1, 32>>>(wild);
  return cudaGetLastError();
}

}  // namespace trainguard::testing
