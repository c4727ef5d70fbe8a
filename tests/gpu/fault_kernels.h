// Kernels that produce real device faults for the gpu-labelled tests.
#ifndef TRAINGUARD_TESTS_GPU_FAULT_KERNELS_H_
#define TRAINGUARD_TESTS_GPU_FAULT_KERNELS_H_

#include <cuda_runtime_api.h>

namespace trainguard::testing {

// Launches a kernel that writes through `wild` (an address no allocation covers) and returns the
// launch status; the fault itself surfaces at the next synchronisation as cudaErrorIllegalAddress.
cudaError_t LaunchWildWrite(float* wild);

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_GPU_FAULT_KERNELS_H_
