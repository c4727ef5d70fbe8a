// SplitMix64: the example trainer's deterministic random numbers.
//
// The trainer's parameters and data must be reproducible bit for bit from a seed on every rank, so
// that replicas start identical and a replayed step sees the same shard. The standard <random>
// distributions are implementation-defined; this generator and its transforms are not (Normal()
// depends only on libm's log, sqrt and cos in double precision).
//
// Thread safety: a plain value type; one instance per thread.
#ifndef TRAINGUARD_EXAMPLES_CPP_TRAINER_SPLIT_MIX64_H_
#define TRAINGUARD_EXAMPLES_CPP_TRAINER_SPLIT_MIX64_H_

#include <cmath>
#include <cstdint>
#include <numbers>

namespace cpp_trainer {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  // Derives a seed from several values (e.g. seed, rank, step) so that nearby inputs give unrelated
  // streams.
  static uint64_t Mix(uint64_t a, uint64_t b) { return SplitMix64(a ^ Finalize(b)).Next(); }

  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return Finalize(state_);
  }

  // Uniform in [0, 1), 24 random bits: exactly representable as a float.
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }

  // Uniform in [-limit, limit).
  float Symmetric(float limit) { return (2.0f * Uniform() - 1.0f) * limit; }

  // Standard normal by Box-Muller, computed in double so libm rounding differences stay far below
  // float precision.
  float Normal() {
    const double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(Next() >> 11) * 0x1.0p-53;          // [0, 1)
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                              std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  static uint64_t Finalize(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  uint64_t state_;
};

}  // namespace cpp_trainer

#endif  // TRAINGUARD_EXAMPLES_CPP_TRAINER_SPLIT_MIX64_H_
