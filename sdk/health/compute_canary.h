// The compute canary (silent data corruption, docs/GUIDE.md): a fixed, deterministic computation
// every rank runs at each snapshot, whose result must be bit-identical on every healthy machine of
// the job. It checks the arithmetic of the machine itself, for state no replica holds (a rank
// alone in its data-parallel group, sharded optimizer state). The Runtime hands it to the
// Checkpointer (CheckpointerOptions::canary), which carries its fingerprint in the snapshot vote;
// the ballot's judge names a rank whose fingerprint differs from the job's majority.
//
// The CPU twin: a 96 x 96 by 96 x 96 single-precision matrix product of fixed inputs (normal
// numbers in [-1, 1), no denormals), summed in a fixed order with no fused multiply-add (its file
// is compiled with -ffp-contract=off), so every IEEE-754 machine running the same binary gets the
// same bits. ComputeDeviceCanary runs the same product on a CUDA device, operation for operation
// (rounded multiplies and adds, no fused multiply-add), so a healthy GPU gets the CPU twin's bits
// too and a rank's fingerprint does not depend on where it ran.
//
// Thread safety: a pure function; any thread.
#ifndef TRAINGUARD_SDK_HEALTH_COMPUTE_CANARY_H_
#define TRAINGUARD_SDK_HEALTH_COMPUTE_CANARY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace trainguard {

inline constexpr int kCanaryDim = 96;

// The canary's fixed inputs A and B, row-major kCanaryDim x kCanaryDim.
std::vector<float> CanaryInputA();
std::vector<float> CanaryInputB();
// The product C = A x B of the canary's fixed inputs, row-major kCanaryDim x kCanaryDim.
std::vector<float> CanaryProduct();
// XXH3-64 of CanaryProduct()'s bytes: equal on every healthy machine.
uint64_t ComputeCanary();
// The same on CUDA device `device`: equal to ComputeCanary() on a healthy GPU. Unimplemented when
// trainguard is built without CUDA; the CUDA error, naming the device, otherwise.
absl::StatusOr<uint64_t> ComputeDeviceCanary(int device);
// The product on CUDA device `device` (for its test).
absl::StatusOr<std::vector<float>> DeviceCanaryProduct(int device);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_COMPUTE_CANARY_H_
