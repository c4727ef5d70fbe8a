// The CUDA half of FiniteChecker (private to sdk/health; compiled only when trainguard is built
// with CUDA). A plain C++17 interface, so that nvcc (which CMake 3.25 cannot ask for C++20)
// compiles the kernels in an object library of their own and the C++20 library calls them.
//
// Thread safety: the launch may be called from any thread; each launch writes only its own slot.
#ifndef TRAINGUARD_SDK_HEALTH_FINITE_KERNELS_H_
#define TRAINGUARD_SDK_HEALTH_FINITE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trainguard {
namespace health_internal {

// One check's verdict, in pinned host memory mapped into the device's address space. The host
// initialises it before the launch; the kernel only ever changes it where it found a NaN or an Inf
// (so a clean buffer costs no write over PCIe).
struct FiniteSlot {
  unsigned int kinds;  // kSlotNan | kSlotInf
  unsigned int reserved;
  unsigned long long nonfinite;  // count of bad elements
  unsigned long long first_bad;  // lowest bad index; kNoBadIndex when none
};
constexpr unsigned int kSlotNan = 1;
constexpr unsigned int kSlotInf = 2;
constexpr unsigned long long kNoBadIndex = ~0ull;

// The formats the kernels know; the numbers are private (trainguard::DType is C++20-only).
enum class FiniteFormat : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };

// Enqueues the check of `count` elements at device address `data` on `stream` for the current
// device, writing into `slot` (the device-side address of a FiniteSlot). `max_blocks` bounds the
// grid (a few per multiprocessor). Returns the launch status; never synchronises.
cudaError_t LaunchFiniteCheck(const void* data, size_t count, FiniteFormat format, FiniteSlot* slot,
                              int max_blocks, cudaStream_t stream);

}  // namespace health_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_FINITE_KERNELS_H_
