// The compute canary on a CUDA device (private to sdk/health; compiled only when trainguard is
// built with CUDA; see compute_canary.h). A plain C++17 interface, as finite_kernels.h.
//
// Thread safety: any thread; each call uses its own device memory and the default stream of the
// device it selects.
#ifndef TRAINGUARD_SDK_HEALTH_CANARY_KERNELS_H_
#define TRAINGUARD_SDK_HEALTH_CANARY_KERNELS_H_

#include <cuda_runtime_api.h>

namespace trainguard {
namespace health_internal {

// C = A x B of n x n row-major single-precision matrices on device `device`: one thread per
// element of C, summing over k in ascending order with round-to-nearest multiplies and adds and no
// fused multiply-add, as the CPU twin does (so the two agree bit for bit). `a`, `b` and `c` are
// host memory; the call copies in, computes, copies out and synchronises. The first CUDA error.
cudaError_t DeviceCanaryProduct(int device, const float* a, const float* b, float* c, int n);

}  // namespace health_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_CANARY_KERNELS_H_
