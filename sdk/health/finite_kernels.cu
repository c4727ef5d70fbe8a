// Finite-check kernels: a grid-stride loop over 16-byte vectors, each tested for an all-ones
// exponent with integer operations on two 64-bit words (the carry trick of float_format.h, which
// check_finite_host.cc uses too); only a vector that fails is split into elements. Each thread
// keeps its own count, first bad index and kinds; a block merges them in shared memory and one
// thread writes them into the host-mapped slot, so a clean buffer causes no write to host memory.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sdk/health/finite_kernels.h"
#include "sdk/health/float_format.h"

namespace trainguard {
namespace health_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // vectors loaded before any is tested: more loads in flight per thread

struct Findings {
  unsigned long long nonfinite = 0;
  unsigned long long first_bad = kNoBadIndex;
  unsigned int kinds = 0;
};

template <typename F>
__device__ __forceinline__ void Classify(typename F::Bits bits, unsigned long long index,
                                         Findings* found) {
  if (!F::IsNonFinite(bits)) return;
  ++found->nonfinite;
  found->first_bad = min(found->first_bad, index);
  found->kinds |= F::IsNan(bits) ? kSlotNan : kSlotInf;
}

template <typename F>
__device__ __forceinline__ bool Dirty(const ulonglong2& v) {
  const unsigned long long acc = ((v.x & F::kWordExponents) + F::kWordExponentLsbs) |
                                 ((v.y & F::kWordExponents) + F::kWordExponentLsbs);
  return (acc & F::kWordSigns) != 0;
}

template <typename F>
__device__ __noinline__ void ClassifyVector(const ulonglong2& v, unsigned long long first_index,
                                            Findings* found) {
  typename F::Bits lanes[F::kPer16Bytes];
  memcpy(lanes, &v, sizeof(v));
#pragma unroll
  for (int i = 0; i < F::kPer16Bytes; ++i) Classify<F>(lanes[i], first_index + i, found);
}

// Merges every thread's findings into `slot`, one write per block that found something.
__device__ void Publish(const Findings& found, FiniteSlot* slot) {
  __shared__ unsigned long long block_nonfinite;
  __shared__ unsigned long long block_first_bad;
  __shared__ unsigned int block_kinds;
  if (threadIdx.x == 0) {
    block_nonfinite = 0;
    block_first_bad = kNoBadIndex;
    block_kinds = 0;
  }
  __syncthreads();
  if (found.nonfinite != 0) {
    atomicAdd(&block_nonfinite, found.nonfinite);
    atomicMin(&block_first_bad, found.first_bad);
    atomicOr(&block_kinds, found.kinds);
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_nonfinite != 0) {
    atomicAdd(&slot->nonfinite, block_nonfinite);
    atomicMin(&slot->first_bad, block_first_bad);
    atomicOr(&slot->kinds, block_kinds);
  }
}

// `data` is aligned to its element size: elements before the first 16-byte boundary (`head`) and
// after the last whole vector are tested one by one, the rest as vectors.
template <typename F>
__global__ void __launch_bounds__(kThreads)
    CheckAligned(const typename F::Bits* data, size_t count, size_t head, FiniteSlot* slot) {
  using Bits = typename F::Bits;
  Findings found;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t vectors = (count - head) / F::kPer16Bytes;
  const size_t tail = head + vectors * F::kPer16Bytes;
  if (thread < head) Classify<F>(data[thread], thread, &found);
  if (tail + thread < count) Classify<F>(data[tail + thread], tail + thread, &found);

  const auto* __restrict__ v = reinterpret_cast<const ulonglong2*>(data + head);
  size_t i = thread;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    ulonglong2 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = v[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (Dirty<F>(r[u])) ClassifyVector<F>(r[u], head + (i + u * stride) * F::kPer16Bytes, &found);
    }
  }
  for (; i < vectors; i += stride) {
    const ulonglong2 r = v[i];
    if (Dirty<F>(r)) ClassifyVector<F>(r, head + i * F::kPer16Bytes, &found);
  }
  Publish(found, slot);
}

// `data` is not even aligned to its element size (a pointer into a packed structure): every
// element is assembled from bytes. Correct, not fast.
template <typename F>
__global__ void __launch_bounds__(kThreads)
    CheckUnaligned(const unsigned char* data, size_t count, FiniteSlot* slot) {
  using Bits = typename F::Bits;
  Findings found;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    Bits bits = 0;
    for (size_t b = 0; b < sizeof(Bits); ++b) {
      bits |= static_cast<Bits>(static_cast<Bits>(data[i * sizeof(Bits) + b]) << (8 * b));
    }
    Classify<F>(bits, i, &found);
  }
  Publish(found, slot);
}

template <typename F>
cudaError_t Launch(const void* data, size_t count, FiniteSlot* slot, int max_blocks,
                   cudaStream_t stream) {
  using Bits = typename F::Bits;
  const auto address = reinterpret_cast<uintptr_t>(data);
  const size_t per_thread = address % sizeof(Bits) == 0 ? F::kPer16Bytes * kUnroll : 1;
  const size_t wanted = (count + per_thread * kThreads - 1) / (per_thread * kThreads);
  const int blocks =
      static_cast<int>(wanted < static_cast<size_t>(max_blocks) ? wanted : max_blocks);
  // cudaLaunchKernel returns this launch's status, where <<<>>> would leave it to
  // cudaGetLastError(), which also reports (and clears) errors of the caller's own earlier calls.
  if (address % sizeof(Bits) != 0) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    void* args[] = {&bytes, &count, &slot};
    return cudaLaunchKernel(&CheckUnaligned<F>, dim3(blocks), dim3(kThreads), args, 0, stream);
  }
  const size_t head_bytes = (16 - address % 16) % 16;
  size_t head = head_bytes / sizeof(Bits);
  if (head > count) head = count;
  const auto* elements = static_cast<const Bits*>(data);
  void* args[] = {&elements, &count, &head, &slot};
  return cudaLaunchKernel(&CheckAligned<F>, dim3(blocks), dim3(kThreads), args, 0, stream);
}

}  // namespace

cudaError_t LaunchFiniteCheck(const void* data, size_t count, FiniteFormat format, FiniteSlot* slot,
                              int max_blocks, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (max_blocks < 1) max_blocks = 1;
  switch (format) {
    case FiniteFormat::kF32:
      return Launch<F32>(data, count, slot, max_blocks, stream);
    case FiniteFormat::kF16:
      return Launch<F16>(data, count, slot, max_blocks, stream);
    case FiniteFormat::kBF16:
      return Launch<BF16>(data, count, slot, max_blocks, stream);
    case FiniteFormat::kF64:
      return Launch<F64>(data, count, slot, max_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace health_internal
}  // namespace trainguard
