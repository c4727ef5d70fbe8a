// A kernel that stands in for a hung collective: it spins on the GPU until the host flips a flag.
#ifndef TRAINGUARD_TESTS_GPU_SPIN_KERNEL_H_
#define TRAINGUARD_TESTS_GPU_SPIN_KERNEL_H_

#include <cuda_runtime_api.h>

namespace trainguard::testing {

// Launches, on `stream`, one thread that spins until `*device_flag` is nonzero. `device_flag` is
// the device alias of host-mapped pinned memory (cudaHostAlloc with cudaHostAllocMapped, then
// cudaHostGetDevicePointer), so the host releases the kernel by writing 1 to its own pointer.
cudaError_t LaunchSpinUntilFlag(const volatile int* device_flag, cudaStream_t stream);

// Launches a trivial kernel on `stream` (a healthy, short "collective").
cudaError_t LaunchNoop(cudaStream_t stream);

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_GPU_SPIN_KERNEL_H_
