// The floating-point formats the finite checks know, described by their bit fields (private to
// sdk/health). One table for both checks: check_finite_host.cc (C++20) and finite_kernels.cu
// (nvcc at C++17, so this header is plain C++17, and its functions are __host__ __device__ there).
//
// An element is NaN or Inf exactly when its exponent field is all ones: NaN when its mantissa is
// non-zero, Inf when it is zero. Both checks first test whole 64-bit words at once with the carry
// trick: adding the lowest exponent bit to the masked exponent carries into the element's sign
// position only when the exponent is all ones, and never into the next element, so a word holds a
// non-finite element exactly when ((word & kWordExponents) + kWordExponentLsbs) & kWordSigns != 0.
#ifndef TRAINGUARD_SDK_HEALTH_FLOAT_FORMAT_H_
#define TRAINGUARD_SDK_HEALTH_FLOAT_FORMAT_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TRAINGUARD_HOST_DEVICE __host__ __device__
#else
#define TRAINGUARD_HOST_DEVICE
#endif

namespace trainguard {
namespace health_internal {

// Bits of an element of `Bits` width, repeated over a 64-bit word.
template <typename Bits>
TRAINGUARD_HOST_DEVICE constexpr uint64_t Repeat(Bits lane) {
  uint64_t word = 0;
  for (size_t i = 0; i < sizeof(uint64_t) / sizeof(Bits); ++i) {
    word |= static_cast<uint64_t>(lane) << (8 * sizeof(Bits) * i);
  }
  return word;
}

template <typename BitsT, BitsT kExponentT, BitsT kMantissaT>
struct FloatFormat {
  using Bits = BitsT;
  static constexpr Bits kExponent = kExponentT;
  static constexpr Bits kMantissa = kMantissaT;
  static constexpr Bits kExponentLsb = kExponent & (~kExponent + 1);  // lowest set bit
  static constexpr Bits kSign = static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1));
  static constexpr uint64_t kWordExponents = Repeat<Bits>(kExponent);
  static constexpr uint64_t kWordExponentLsbs = Repeat<Bits>(kExponentLsb);
  static constexpr uint64_t kWordSigns = Repeat<Bits>(kSign);
  static constexpr int kPer16Bytes = 16 / sizeof(Bits);  // elements in one 16-byte vector
  static_assert(kExponent + kExponentLsb == kSign, "the exponent field ends below the sign bit");

  TRAINGUARD_HOST_DEVICE static constexpr bool IsNonFinite(Bits bits) {
    return (bits & kExponent) == kExponent;
  }
  // REQUIRES: IsNonFinite(bits). NaN, else Inf.
  TRAINGUARD_HOST_DEVICE static constexpr bool IsNan(Bits bits) { return (bits & kMantissa) != 0; }
};

using F32 = FloatFormat<uint32_t, 0x7F800000u, 0x007FFFFFu>;
using F16 = FloatFormat<uint16_t, 0x7C00u, 0x03FFu>;
using BF16 = FloatFormat<uint16_t, 0x7F80u, 0x007Fu>;
using F64 = FloatFormat<uint64_t, 0x7FF0000000000000u, 0x000FFFFFFFFFFFFFu>;

}  // namespace health_internal
}  // namespace trainguard

#undef TRAINGUARD_HOST_DEVICE

#endif  // TRAINGUARD_SDK_HEALTH_FLOAT_FORMAT_H_
