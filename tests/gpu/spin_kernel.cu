#include "spin_kernel.h"

namespace trainguard::testing {
namespace {

__global__ void SpinUntilFlag(const volatile int* flag) {
  while (*flag == 0) {
    __nanosleep(1000);
  }
}

__global__ void Noop() {}

}  // namespace

cudaError_t LaunchSpinUntilFlag(const volatile int* device_flag, cudaStream_t stream) {
  SpinUntilFlag<<<1, 1, 0, stream>>>(device_flag);
  return cudaGetLastError();
}

cudaError_t LaunchNoop(cudaStream_t stream) {
  Noop<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace trainguard::testing
