// CheckFiniteHost: a fast pass that only answers "all finite?", block by block (4 KiB), then, for a
// buffer that is not, a second pass from the first dirty block that finds the first bad element and
// counts the bad ones.
//
// An element is NaN or Inf exactly when its exponent field is all ones. The fast pass tests that
// with integer operations on vector registers (no floating point: no trap, no dependence on
// -ffast-math), in one of two ways:
//   - carry: adding the lowest exponent bit to the masked exponent carries into the element's sign
//     position only when the exponent is all ones, and never into the next element, so over 64-bit
//     words  acc |= (word & kExponents) + kExponentLsbs  and the block is dirty when
//     acc & kSignBits != 0. Three instructions per vector, any element width, plain SSE2/NEON.
//   - max: the block's largest magnitude (sign cleared) is >= the all-ones exponent exactly when
//     some element is NaN or Inf. Two instructions per vector, where the CPU has an unsigned
//     maximum for the element width: AVX2 for 16 and 32 bits, AVX-512 (F+BW) for all.
// The best one for the CPU is picked once, at first use (__builtin_cpu_supports); tests run every
// one the CPU has (check_finite_host.h). The loops use GCC/Clang vector-extension types with four
// named accumulators, so they are vectorised at -O2 without relying on the auto-vectoriser (which
// leaves the SSE2 build scalar there). Loads go through memcpy, so any alignment of `data` is fine.
#include "sdk/health/check_finite_host.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "sdk/health/float_format.h"
#include "trainguard/checkpoint.h"
#include "trainguard/health.h"

namespace trainguard {
namespace {

using health_internal::BF16;
using health_internal::F16;
using health_internal::F32;
using health_internal::F64;

constexpr size_t kBlockBytes = 4096;  // small enough that a bad block is rescanned cheaply

// Vector-extension types: 16 bytes (one SSE2 or NEON register) for the baseline build, 32 for the
// AVX2 one, 64 for the AVX-512 one. (Spelling a 32-byte type for SSE2 makes GCC spill.)
using U64x2 = uint64_t __attribute__((vector_size(16)));
using U64x4 = uint64_t __attribute__((vector_size(32)));
using U32x8 = uint32_t __attribute__((vector_size(32)));
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U64x8 = uint64_t __attribute__((vector_size(64)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using U16x32 = uint16_t __attribute__((vector_size(64)));

// Loads 4 consecutive vectors at `p`, unaligned. (Through pointers: returning a 32- or 64-byte
// vector by value from a function not built for AVX is an ABI change GCC warns about.) Named
// accumulators and values, not arrays, below: GCC at -O2 keeps arrays of vectors in memory.
template <typename Vec>
[[gnu::always_inline]] inline void Load4(const unsigned char* p, Vec* w0, Vec* w1, Vec* w2,
                                         Vec* w3) {
  std::memcpy(w0, p, sizeof(Vec));
  std::memcpy(w1, p + sizeof(Vec), sizeof(Vec));
  std::memcpy(w2, p + 2 * sizeof(Vec), sizeof(Vec));
  std::memcpy(w3, p + 3 * sizeof(Vec), sizeof(Vec));
}

// Whether the kBlockBytes at `p` hold a NaN or an Inf, by the carry trick (see the file comment):
// an AND, an ADD and an OR per vector, for any element width and any vector width.
template <typename Vec, typename F>
[[gnu::always_inline]] inline bool BlockDirtyByCarry(const unsigned char* p) {
  Vec acc0 = {};
  Vec acc1 = {};
  Vec acc2 = {};
  Vec acc3 = {};
  for (size_t i = 0; i < kBlockBytes; i += 4 * sizeof(Vec)) {
    Vec w0, w1, w2, w3;
    Load4(p + i, &w0, &w1, &w2, &w3);
    acc0 |= (w0 & F::kWordExponents) + F::kWordExponentLsbs;
    acc1 |= (w1 & F::kWordExponents) + F::kWordExponentLsbs;
    acc2 |= (w2 & F::kWordExponents) + F::kWordExponentLsbs;
    acc3 |= (w3 & F::kWordExponents) + F::kWordExponentLsbs;
  }
  const Vec all = (acc0 | acc1) | (acc2 | acc3);
  uint64_t summary = 0;
  for (size_t lane = 0; lane < sizeof(Vec) / sizeof(uint64_t); ++lane) summary |= all[lane];
  return (summary & F::kWordSigns) != 0;
}

// The same question with one instruction fewer per vector, where the CPU has an unsigned maximum
// for the element width (AVX2: 16 and 32 bits; AVX-512: all): the largest magnitude (sign cleared)
// of the block is NaN or Inf exactly when some element is, i.e. when it is >= the all-ones
// exponent.
template <typename Vec, typename F>
[[gnu::always_inline]] inline bool BlockDirtyByMax(const unsigned char* p) {
  using Bits = typename F::Bits;
  constexpr Bits kMagnitude = static_cast<Bits>(~F::kSign);
  Vec acc0 = {};
  Vec acc1 = {};
  Vec acc2 = {};
  Vec acc3 = {};
  for (size_t i = 0; i < kBlockBytes; i += 4 * sizeof(Vec)) {
    Vec w0, w1, w2, w3;
    Load4(p + i, &w0, &w1, &w2, &w3);
    w0 &= kMagnitude;
    w1 &= kMagnitude;
    w2 &= kMagnitude;
    w3 &= kMagnitude;
    acc0 = acc0 > w0 ? acc0 : w0;
    acc1 = acc1 > w1 ? acc1 : w1;
    acc2 = acc2 > w2 ? acc2 : w2;
    acc3 = acc3 > w3 ? acc3 : w3;
  }
  acc0 = acc0 > acc1 ? acc0 : acc1;
  acc2 = acc2 > acc3 ? acc2 : acc3;
  acc0 = acc0 > acc2 ? acc0 : acc2;
  Bits largest = 0;
  for (size_t lane = 0; lane < sizeof(Vec) / sizeof(Bits); ++lane) {
    largest = acc0[lane] > largest ? acc0[lane] : largest;
  }
  return largest >= F::kExponent;
}

// The byte offset of the first block of `blocks` at `p` that holds a NaN or an Inf, or
// blocks * kBlockBytes when none does.
template <bool (*kBlockDirty)(const unsigned char*)>
[[gnu::always_inline]] inline size_t FirstDirtyBlock(const unsigned char* p, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b) {
    if (kBlockDirty(p + b * kBlockBytes)) return b * kBlockBytes;
  }
  return blocks * kBlockBytes;
}

using ScanFn = size_t (*)(const unsigned char*, size_t);

template <typename F>
size_t FirstDirtyBlockBaseline(const unsigned char* p, size_t blocks) {
  return FirstDirtyBlock<&BlockDirtyByCarry<U64x2, F>>(p, blocks);
}

#if defined(__x86_64__)
// The vector type whose lanes are F's elements, where AVX2 has an unsigned maximum for them.
template <typename Bits>
struct Avx2Lanes {
  using Vec = void;
};
template <>
struct Avx2Lanes<uint32_t> {
  using Vec = U32x8;
};
template <>
struct Avx2Lanes<uint16_t> {
  using Vec = U16x16;
};

template <typename F>
__attribute__((target("avx2"))) size_t FirstDirtyBlockAvx2(const unsigned char* p, size_t blocks) {
  using Lanes = typename Avx2Lanes<typename F::Bits>::Vec;
  if constexpr (std::is_void_v<Lanes>) {  // fp64: AVX2 has no 64-bit maximum
    return FirstDirtyBlock<&BlockDirtyByCarry<U64x4, F>>(p, blocks);
  } else {
    return FirstDirtyBlock<&BlockDirtyByMax<Lanes, F>>(p, blocks);
  }
}

// AVX-512 (F and BW) has an unsigned maximum for every element width, over 64 bytes.
template <typename Bits>
struct Avx512Lanes;
template <>
struct Avx512Lanes<uint64_t> {
  using Vec = U64x8;
};
template <>
struct Avx512Lanes<uint32_t> {
  using Vec = U32x16;
};
template <>
struct Avx512Lanes<uint16_t> {
  using Vec = U16x32;
};

template <typename F>
__attribute__((target("avx512f,avx512bw"))) size_t FirstDirtyBlockAvx512(const unsigned char* p,
                                                                         size_t blocks) {
  return FirstDirtyBlock<&BlockDirtyByMax<typename Avx512Lanes<typename F::Bits>::Vec, F>>(p,
                                                                                           blocks);
}
#endif

template <typename F>
ScanFn ScanFor(health_internal::FiniteScanIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case health_internal::FiniteScanIsa::kAvx512:
      return &FirstDirtyBlockAvx512<F>;
    case health_internal::FiniteScanIsa::kAvx2:
      return &FirstDirtyBlockAvx2<F>;
#endif
    default:
      return &FirstDirtyBlockBaseline<F>;
  }
}

template <typename F>
typename F::Bits Load(const unsigned char* p, size_t index) {
  typename F::Bits bits;
  std::memcpy(&bits, p + index * sizeof(bits), sizeof(bits));
  return bits;
}

// Elements [begin, count): the first bad one is located, then every bad one counted. Slow only
// for buffers that do hold a NaN or an Inf.
template <typename F>
FiniteCheckResult LocateAndCount(const unsigned char* p, size_t begin, size_t count) {
  FiniteCheckResult result;
  size_t i = begin;
  while (i < count && !F::IsNonFinite(Load<F>(p, i))) ++i;
  if (i == count) return result;
  result.first_bad_index = static_cast<int64_t>(i);
  size_t nans = 0;
  size_t infs = 0;
  for (; i < count; ++i) {
    const typename F::Bits bits = Load<F>(p, i);
    const bool nonfinite = F::IsNonFinite(bits);
    const bool mantissa = (bits & F::kMantissa) != 0;
    nans += nonfinite & mantissa;
    infs += nonfinite & !mantissa;
  }
  result.nonfinite_count = nans + infs;
  result.has_nan = nans != 0;
  result.has_inf = infs != 0;
  return result;
}

template <typename F>
FiniteCheckResult Check(ScanFn scan, const void* data, size_t count) {
  using Bits = typename F::Bits;
  constexpr size_t kPerBlock = kBlockBytes / sizeof(Bits);
  const auto* p = static_cast<const unsigned char*>(data);
  // Elements before the first 64-byte boundary one by one, so that the blocks' loads do not
  // straddle cache lines (a 64-byte load at a 16-byte offset, as malloc returns, always would).
  const size_t misaligned = (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
  const size_t head = std::min(count, (misaligned + sizeof(Bits) - 1) / sizeof(Bits));
  for (size_t i = 0; i < head; ++i) {
    if (F::IsNonFinite(Load<F>(p, i))) return LocateAndCount<F>(p, i, count);
  }
  const size_t blocks = (count - head) / kPerBlock;
  const size_t clean_end = head + blocks * kPerBlock;
  size_t begin = head + scan(p + head * sizeof(Bits), blocks) / sizeof(Bits);
  if (begin == clean_end) {
    // The tail, shorter than a block: clean unless an element there is bad.
    while (begin < count && !F::IsNonFinite(Load<F>(p, begin))) ++begin;
    if (begin == count) return {};
  }
  return LocateAndCount<F>(p, begin, count);
}

template <typename F>
FiniteCheckResult Check(const void* data, size_t count) {
  static const ScanFn best = ScanFor<F>(health_internal::SupportedFiniteScanIsas().back());
  return Check<F>(best, data, count);
}

}  // namespace

FiniteCheckResult CheckFiniteHost(const void* data, size_t count, DType dtype) {
  if (count == 0) return {};
  switch (dtype) {
    case DType::kF32:
      return Check<F32>(data, count);
    case DType::kF16:
      return Check<F16>(data, count);
    case DType::kBF16:
      return Check<BF16>(data, count);
    case DType::kF64:
      return Check<F64>(data, count);
    case DType::kU8:
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return {};
}

namespace health_internal {

std::vector<FiniteScanIsa> SupportedFiniteScanIsas() {
  std::vector<FiniteScanIsa> isas = {FiniteScanIsa::kBaseline};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) isas.push_back(FiniteScanIsa::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    isas.push_back(FiniteScanIsa::kAvx512);
  }
#endif
  return isas;
}

FiniteCheckResult CheckFiniteHostWith(FiniteScanIsa isa, const void* data, size_t count,
                                      DType dtype) {
  if (count == 0) return {};
  switch (dtype) {
    case DType::kF32:
      return Check<F32>(ScanFor<F32>(isa), data, count);
    case DType::kF16:
      return Check<F16>(ScanFor<F16>(isa), data, count);
    case DType::kBF16:
      return Check<BF16>(ScanFor<BF16>(isa), data, count);
    case DType::kF64:
      return Check<F64>(ScanFor<F64>(isa), data, count);
    default:
      return {};
  }
}

}  // namespace health_internal
}  // namespace trainguard
