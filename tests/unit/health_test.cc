// Finite checks on host buffers (every dtype, every position, odd alignments), FiniteChecker's host
// path, and LossSpikeDetector.
#include "trainguard/health.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "sdk/health/check_finite_host.h"
#include "tests/support/allocation_counter.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

// The bit patterns of one floating-point dtype, written out by hand (no conversion routine whose
// own bugs a test could share).
struct Patterns {
  DType dtype;
  size_t size;
  uint64_t one;      // 1.0
  uint64_t nan;      // a quiet NaN
  uint64_t neg_nan;  // a quiet NaN with the sign bit set
  uint64_t snan;     // a signalling NaN (exponent all ones, lowest mantissa bit only)
  uint64_t pos_inf;
  uint64_t neg_inf;
  std::vector<uint64_t> finite_edges;  // subnormals, +/-max finite, -0.0, smallest normal
};

std::vector<Patterns> AllPatterns() {
  return {
      {DType::kF32,
       4,
       0x3F800000,
       0x7FC00000,
       0xFFC00000,
       0x7F800001,
       0x7F800000,
       0xFF800000,
       {0x00000001, 0x807FFFFF, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000}},
      {DType::kF16,
       2,
       0x3C00,
       0x7E00,
       0xFE00,
       0x7C01,
       0x7C00,
       0xFC00,
       {0x0001, 0x83FF, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x8000}},
      {DType::kBF16,
       2,
       0x3F80,
       0x7FC0,
       0xFFC0,
       0x7F81,
       0x7F80,
       0xFF80,
       {0x0001, 0x807F, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x8000}},
      {DType::kF64,
       8,
       0x3FF0000000000000,
       0x7FF8000000000000,
       0xFFF8000000000000,
       0x7FF0000000000001,
       0x7FF0000000000000,
       0xFFF0000000000000,
       {0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
        0xFFEFFFFFFFFFFFFF, 0x8000000000000000}},
  };
}

// `count` elements of p.dtype, all finite (varied: 1.0 and the finite edge cases in turn), at
// `offset` bytes into the returned storage.
class Buffer {
 public:
  Buffer(const Patterns& p, size_t count, size_t offset = 0)
      : patterns_(p), offset_(offset), bytes_(offset + count * p.size + 8) {
    for (size_t i = 0; i < count; ++i) {
      const size_t edge = i % (p.finite_edges.size() + 1);
      Set(i, edge == 0 ? p.one : p.finite_edges[edge - 1]);
    }
  }
  void Set(size_t index, uint64_t bits) {
    std::memcpy(bytes_.data() + offset_ + index * patterns_.size, &bits, patterns_.size);
  }
  const void* data() const { return bytes_.data() + offset_; }

 private:
  const Patterns& patterns_;
  size_t offset_;
  std::vector<unsigned char> bytes_;
};

// CheckFiniteHost(), after checking that every instruction-set variant this CPU can run (not only
// the one CheckFiniteHost picks) gives the same answer.
FiniteCheckResult CheckAllVariants(const void* data, size_t count, DType dtype) {
  const FiniteCheckResult result = CheckFiniteHost(data, count, dtype);
  for (health_internal::FiniteScanIsa isa : health_internal::SupportedFiniteScanIsas()) {
    EXPECT_EQ(health_internal::CheckFiniteHostWith(isa, data, count, dtype), result)
        << "variant " << static_cast<int>(isa) << ", " << DTypeName(dtype) << " x " << count;
  }
  return result;
}

FiniteCheckResult One(int64_t index, bool nan) {
  return {.nonfinite_count = 1, .first_bad_index = index, .has_nan = nan, .has_inf = !nan};
}

TEST(CheckFiniteHostTest, FiniteBuffersOfEveryDtypeAreAllFinite) {
  for (const Patterns& p : AllPatterns()) {
    for (size_t count : {1u, 7u, 100u, 4096u, 10001u}) {
      Buffer buffer(p, count);
      EXPECT_EQ(CheckAllVariants(buffer.data(), count, p.dtype), FiniteCheckResult{})
          << DTypeName(p.dtype) << " x " << count;
    }
  }
}

TEST(CheckFiniteHostTest, SubnormalsMaxFiniteAndNegativeZeroAreFinite) {
  for (const Patterns& p : AllPatterns()) {
    for (uint64_t bits : p.finite_edges) {
      Buffer buffer(p, 1);
      buffer.Set(0, bits);
      EXPECT_TRUE(CheckAllVariants(buffer.data(), 1, p.dtype).all_finite())
          << DTypeName(p.dtype) << " bits 0x" << std::hex << bits;
    }
  }
}

TEST(CheckFiniteHostTest, NanAndInfAtFirstMiddleAndLastIndexAreFoundInEveryDtype) {
  constexpr size_t kCount = 5003;  // several 4 KiB blocks for every dtype, then a ragged tail
  for (const Patterns& p : AllPatterns()) {
    for (size_t index : {size_t{0}, kCount / 2, kCount - 1}) {
      for (uint64_t bad : {p.nan, p.neg_nan, p.snan, p.pos_inf, p.neg_inf}) {
        Buffer buffer(p, kCount);
        buffer.Set(index, bad);
        const bool nan = bad != p.pos_inf && bad != p.neg_inf;
        EXPECT_EQ(CheckAllVariants(buffer.data(), kCount, p.dtype),
                  One(static_cast<int64_t>(index), nan))
            << DTypeName(p.dtype) << " bits 0x" << std::hex << bad << " at " << std::dec << index;
      }
    }
  }
}

TEST(CheckFiniteHostTest, ANanAtEveryPositionOfShortBuffersIsFound) {
  // Every length up to a few vectors: the scalar tail and every lane of the vector loop.
  for (const Patterns& p : AllPatterns()) {
    for (size_t count = 1; count <= 70; ++count) {
      for (size_t index = 0; index < count; ++index) {
        Buffer buffer(p, count);
        buffer.Set(index, p.nan);
        EXPECT_EQ(CheckAllVariants(buffer.data(), count, p.dtype),
                  One(static_cast<int64_t>(index), true))
            << DTypeName(p.dtype) << " count " << count << " index " << index;
      }
    }
  }
}

TEST(CheckFiniteHostTest, AnInfAtEveryPositionAcrossBlockBoundariesIsFound) {
  for (const Patterns& p : AllPatterns()) {
    const size_t count = 2 * 4096 / p.size + 13;  // two whole fast-pass blocks and a tail
    Buffer buffer(p, count);
    for (size_t index = 0; index < count; ++index) {
      buffer.Set(index, p.neg_inf);
      ASSERT_EQ(CheckAllVariants(buffer.data(), count, p.dtype),
                One(static_cast<int64_t>(index), false))
          << DTypeName(p.dtype) << " index " << index;
      buffer.Set(index, p.one);
    }
  }
}

TEST(CheckFiniteHostTest, CountsEveryBadElementAndReportsBothKinds) {
  for (const Patterns& p : AllPatterns()) {
    constexpr size_t kCount = 20000;
    Buffer buffer(p, kCount);
    buffer.Set(9000, p.pos_inf);
    buffer.Set(12345, p.nan);
    buffer.Set(19999, p.neg_inf);
    buffer.Set(15000, p.neg_nan);
    EXPECT_EQ(CheckAllVariants(buffer.data(), kCount, p.dtype),
              (FiniteCheckResult{
                  .nonfinite_count = 4, .first_bad_index = 9000, .has_nan = true, .has_inf = true}))
        << DTypeName(p.dtype);
  }
}

TEST(CheckFiniteHostTest, TheSameBitsAreJudgedByTheirDtype) {
  // 0x7F80 is +Inf in bf16 but a NaN in fp16 (all-ones exponent, non-zero mantissa); 0x7C00 is
  // +Inf in fp16 but a finite bf16 (about 2.6e36).
  const uint16_t bf16_inf = 0x7F80;
  const uint16_t fp16_inf = 0x7C00;
  EXPECT_EQ(CheckAllVariants(&bf16_inf, 1, DType::kBF16), One(0, false));
  EXPECT_EQ(CheckAllVariants(&bf16_inf, 1, DType::kF16), One(0, true));
  EXPECT_EQ(CheckAllVariants(&fp16_inf, 1, DType::kF16), One(0, false));
  EXPECT_TRUE(CheckAllVariants(&fp16_inf, 1, DType::kBF16).all_finite());
  // A float's own NaN and Inf, not hand-built, agree with the patterns.
  const float floats[] = {1.0f, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(CheckAllVariants(floats, 3, DType::kF32),
            (FiniteCheckResult{
                .nonfinite_count = 2, .first_bad_index = 1, .has_nan = true, .has_inf = true}));
}

TEST(CheckFiniteHostTest, UnalignedBuffersAreCheckedElementByElement) {
  for (const Patterns& p : AllPatterns()) {
    for (size_t offset = 1; offset < 8; ++offset) {
      constexpr size_t kCount = 3001;
      Buffer buffer(p, kCount, offset);
      EXPECT_TRUE(CheckAllVariants(buffer.data(), kCount, p.dtype).all_finite())
          << DTypeName(p.dtype) << " offset " << offset;
      buffer.Set(2999, p.pos_inf);
      EXPECT_EQ(CheckAllVariants(buffer.data(), kCount, p.dtype), One(2999, false))
          << DTypeName(p.dtype) << " offset " << offset;
    }
  }
}

TEST(CheckFiniteHostTest, ZeroElementsAreAllFiniteWithoutReadingData) {
  EXPECT_EQ(CheckAllVariants(nullptr, 0, DType::kF32), FiniteCheckResult{});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CheckAllVariants(&nan, 0, DType::kF32), FiniteCheckResult{});
}

TEST(CheckFiniteHostTest, IntegerDtypesAreAlwaysFinite) {
  const uint64_t ones[4] = {~0ull, ~0ull, ~0ull, ~0ull};
  EXPECT_TRUE(CheckAllVariants(ones, 32, DType::kU8).all_finite());
  EXPECT_TRUE(CheckAllVariants(ones, 8, DType::kI32).all_finite());
  EXPECT_TRUE(CheckAllVariants(ones, 4, DType::kI64).all_finite());
}

// --- FiniteChecker, host buffers.

TEST(FiniteCheckerTest, RefusesZeroSlots) {
  EXPECT_EQ(FiniteChecker::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FiniteCheckerTest, AHostCheckRunsInCheckAndNamesItsBuffer) {
  auto checker = FiniteChecker::Create(4);
  ASSERT_TRUE(checker.ok()) << checker.status();
  std::vector<float> grad(1000, 0.5f);
  grad[7] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> weight(10, 1.0f);
  ASSERT_TRUE(
      (*checker)
          ->Check("layer3.mlp.grad", grad.data(), grad.size(), DType::kF32, Device::Host(), nullptr)
          .ok());
  grad[7] = 0;  // the result was taken inside CheckAllVariants(): later writes do not change it
  ASSERT_TRUE((*checker)
                  ->Check("layer3.mlp.weight", weight.data(), weight.size(), DType::kF32,
                          Device::Host(), nullptr)
                  .ok());
  EXPECT_EQ((*checker)->outstanding(), 2);

  auto checks = (*checker)->Collect();
  ASSERT_TRUE(checks.ok()) << checks.status();
  ASSERT_EQ(checks->size(), 2u);
  const BufferCheck& bad = (*checks)[0];
  EXPECT_EQ(bad.buffer_name, "layer3.mlp.grad");
  EXPECT_EQ(bad.dtype, DType::kF32);
  EXPECT_EQ(bad.device, Device::Host());
  EXPECT_EQ(bad.count, 1000u);
  EXPECT_FALSE(bad.pending);
  EXPECT_EQ(bad.result, One(7, true));
  EXPECT_EQ((*checks)[1].buffer_name, "layer3.mlp.weight");
  EXPECT_TRUE((*checks)[1].result.all_finite());

  // Collected checks are gone: their slots serve the next step.
  EXPECT_EQ((*checker)->outstanding(), 0);
  auto next = (*checker)->Collect();
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->empty());
}

TEST(FiniteCheckerTest, MoreChecksThanSlotsBeforeCollectAreRefused) {
  auto checker = FiniteChecker::Create(2);
  ASSERT_TRUE(checker.ok());
  const float x = 1;
  ASSERT_TRUE((*checker)->Check("a", &x, 1, DType::kF32, Device::Host(), nullptr).ok());
  ASSERT_TRUE((*checker)->Check("b", &x, 1, DType::kF32, Device::Host(), nullptr).ok());
  absl::Status third = (*checker)->Check("c", &x, 1, DType::kF32, Device::Host(), nullptr);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("'c'"), std::string::npos) << third;
  ASSERT_TRUE((*checker)->Collect().ok());
  EXPECT_TRUE((*checker)->Check("c", &x, 1, DType::kF32, Device::Host(), nullptr).ok());
}

TEST(FiniteCheckerTest, ResetDropsUncollectedChecks) {
  auto checker = FiniteChecker::Create(1);
  ASSERT_TRUE(checker.ok());
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_TRUE((*checker)->Check("a", &inf, 1, DType::kF32, Device::Host(), nullptr).ok());
  (*checker)->Reset();
  EXPECT_EQ((*checker)->outstanding(), 0);
  auto checks = (*checker)->Collect();
  ASSERT_TRUE(checks.ok());
  EXPECT_TRUE(checks->empty());
  EXPECT_TRUE((*checker)->Check("b", &inf, 1, DType::kF32, Device::Host(), nullptr).ok());
}

TEST(FiniteCheckerTest, NullDataWithElementsIsRefused) {
  auto checker = FiniteChecker::Create(1);
  ASSERT_TRUE(checker.ok());
  EXPECT_EQ((*checker)->Check("a", nullptr, 3, DType::kF32, Device::Host(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*checker)->Check("empty", nullptr, 0, DType::kF32, Device::Host(), nullptr).ok());
}

TEST(FiniteCheckerTest, ACudaBufferWithoutADeviceIsAFailedPrecondition) {
  auto checker = FiniteChecker::Create(1);
  ASSERT_TRUE(checker.ok());
  if ((*checker)->has_cuda()) GTEST_SKIP() << "a CUDA device is present (tests/gpu covers it)";
  const float x = 1;
  absl::Status status =
      (*checker)->Check("layer0.grad", &x, 1, DType::kF32, Device::Cuda(0), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("layer0.grad"), std::string::npos) << status;
  EXPECT_EQ((*checker)->outstanding(), 0);
}

// --- LossSpikeDetector.

// The trend of NoisyLoss: 2.0, slowly falling.
double Trend(int64_t step) { return 2.0 * std::exp(-static_cast<double>(step) / 5000.0); }

// A noisy, slowly falling loss: Trend(step) plus deterministic noise of +/-3%.
double NoisyLoss(int64_t step) {
  uint64_t x = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15u;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9u;
  x ^= x >> 32;
  const double noise = static_cast<double>(x % 2001) / 1000.0 - 1.0;  // [-1, 1]
  return Trend(step) * (1.0 + 0.03 * noise);
}

LossSpikeDetector MakeDetector(const LossSpikeOptions& options = {}) {
  auto detector = LossSpikeDetector::Create(options);
  EXPECT_TRUE(detector.ok()) << detector.status();
  return *std::move(detector);
}

TEST(LossSpikeDetectorTest, RefusesBadOptions) {
  EXPECT_FALSE(LossSpikeDetector::Create({.window = 100, .threshold = 6, .warmup = 5}).ok());
  EXPECT_FALSE(LossSpikeDetector::Create({.window = 30, .threshold = 6, .warmup = 40}).ok());
  EXPECT_FALSE(LossSpikeDetector::Create({.window = 100, .threshold = 0, .warmup = 20}).ok());
  EXPECT_FALSE(LossSpikeDetector::Create(
                   {.window = 100, .threshold = std::numeric_limits<double>::quiet_NaN()})
                   .ok());
  EXPECT_TRUE(LossSpikeDetector::Create({.window = 20, .threshold = 3, .warmup = 20}).ok());
}

TEST(LossSpikeDetectorTest, ASteadyNoisySeriesHasNoSpike) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 3000; ++step) {
    std::optional<LossSpike> spike = detector.Observe(step, NoisyLoss(step));
    ASSERT_FALSE(spike.has_value())
        << "step " << step << " loss " << spike->loss << " score " << spike->score;
  }
  EXPECT_EQ(detector.window_size(), 100);
}

TEST(LossSpikeDetectorTest, ATenfoldJumpIsASpikeWithItsScore) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 200; ++step) ASSERT_FALSE(detector.Observe(step, NoisyLoss(step)));
  const double jump = 10 * NoisyLoss(200);
  std::optional<LossSpike> spike = detector.Observe(200, jump);
  ASSERT_TRUE(spike.has_value());
  EXPECT_EQ(spike->kind, LossSpike::Kind::kSpike);
  EXPECT_EQ(spike->step, 200);
  EXPECT_EQ(spike->loss, jump);
  EXPECT_TRUE(spike->log_scale);                 // a positive loss, a positive window
  EXPECT_NEAR(spike->median, Trend(150), 0.05);  // the window: steps 100 to 199
  EXPECT_GT(spike->mad, 0);
  EXPECT_LT(spike->mad, 0.05);  // of log(loss): noise of +/-3%
  EXPECT_DOUBLE_EQ(spike->score, (std::log(jump) - std::log(spike->median)) / spike->mad);
  EXPECT_GT(spike->score, 8);
}

// Per-batch losses are skewed: a batch with a few hard examples has twice the median loss, and one
// with half is rare. Judged on the loss itself such a healthy series raised false alarms (2 % of
// the example's converged steps at 6 scaled MADs); on the log scale it raises none.
TEST(LossSpikeDetectorTest, ASkewedHealthySeriesOfPerBatchLossesHasNoSpike) {
  LossSpikeDetector detector = MakeDetector();
  uint64_t x = 42;
  auto uniform = [&x] {  // splitmix64: the same series on every platform
    x += 0x9E3779B97F4A7C15u;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return static_cast<double>((z ^ (z >> 31)) >> 11) / 9007199254740992.0;  // [0, 1)
  };
  for (int64_t step = 0; step < 20000; ++step) {
    // A batch of 32 squared errors, each exponential (a heavy right tail), on a falling trend.
    double sum = 0;
    for (int i = 0; i < 32; ++i) {
      const double e = -std::log(1.0 - uniform());
      sum += e * e;
    }
    const double loss = Trend(step) * sum / 32;
    std::optional<LossSpike> spike = detector.Observe(step, loss);
    ASSERT_FALSE(spike.has_value())
        << "step " << step << " loss " << loss << " median " << spike->median << " score "
        << spike->score;
  }
}

TEST(LossSpikeDetectorTest, ANegativeLossInTheWindowIsJudgedOnTheLossItself) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 100; ++step) {
    ASSERT_FALSE(detector.Observe(step, NoisyLoss(step) - 2.1));  // an objective below zero
  }
  std::optional<LossSpike> spike = detector.Observe(100, 3.0);
  ASSERT_TRUE(spike.has_value());
  EXPECT_FALSE(spike->log_scale);
  EXPECT_DOUBLE_EQ(spike->score, (3.0 - spike->median) / spike->mad);
}

TEST(LossSpikeDetectorTest, ASpikeIsKeptOutOfTheWindowSoTheNextIsSeenToo) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 100; ++step) ASSERT_FALSE(detector.Observe(step, NoisyLoss(step)));
  ASSERT_EQ(detector.window_size(), 100);
  for (int64_t step = 100; step < 160; ++step) {
    std::optional<LossSpike> spike = detector.Observe(step, 5 * NoisyLoss(step));
    ASSERT_TRUE(spike.has_value()) << "step " << step;
    EXPECT_EQ(spike->step, step);
  }
  EXPECT_FALSE(detector.Observe(160, NoisyLoss(160)));
}

TEST(LossSpikeDetectorTest, ALowerLossIsNotASpike) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 100; ++step) ASSERT_FALSE(detector.Observe(step, NoisyLoss(step)));
  EXPECT_FALSE(detector.Observe(100, NoisyLoss(100) / 10));
}

TEST(LossSpikeDetectorTest, ANonFiniteLossIsAlwaysReportedAndNeverScored) {
  LossSpikeDetector detector = MakeDetector();
  // During the warm-up too.
  std::optional<LossSpike> nan = detector.Observe(3, std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(nan.has_value());
  EXPECT_EQ(nan->kind, LossSpike::Kind::kNonFinite);
  EXPECT_EQ(nan->step, 3);
  EXPECT_TRUE(std::isnan(nan->loss));
  EXPECT_EQ(nan->score, 0);
  EXPECT_EQ(detector.window_size(), 0);

  for (int64_t step = 0; step < 50; ++step) ASSERT_FALSE(detector.Observe(step, NoisyLoss(step)));
  for (double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    std::optional<LossSpike> inf = detector.Observe(50, bad);
    ASSERT_TRUE(inf.has_value());
    EXPECT_EQ(inf->kind, LossSpike::Kind::kNonFinite);
    EXPECT_EQ(inf->loss, bad);
    EXPECT_NEAR(inf->median, Trend(25), 0.05);
    EXPECT_EQ(inf->score, 0);
  }
  EXPECT_EQ(detector.window_size(), 50);
}

TEST(LossSpikeDetectorTest, NoSpikeIsReportedDuringTheWarmUp) {
  LossSpikeDetector detector = MakeDetector();  // warm-up 20
  for (int64_t step = 0; step < 10; ++step) ASSERT_FALSE(detector.Observe(step, 2.0 + 0.01 * step));
  // The window holds 10 losses: a jump is not judged, and joins the window.
  EXPECT_FALSE(detector.Observe(10, 100.0));
  for (int64_t step = 11; step < 20; ++step)
    ASSERT_FALSE(detector.Observe(step, 2.0 + 0.01 * step));
  ASSERT_EQ(detector.window_size(), 20);
  // Now it is: one earlier outlier in the window does not move the median or the MAD much.
  std::optional<LossSpike> spike = detector.Observe(20, 100.0);
  ASSERT_TRUE(spike.has_value());
  EXPECT_EQ(spike->kind, LossSpike::Kind::kSpike);
}

TEST(LossSpikeDetectorTest, AJumpFromAFlatSeriesGetsAFiniteScore) {
  LossSpikeDetector detector = MakeDetector({.window = 30, .threshold = 6, .warmup = 20});
  for (int64_t step = 0; step < 30; ++step) ASSERT_FALSE(detector.Observe(step, 1.5));
  EXPECT_FALSE(detector.Observe(30, 1.5));
  std::optional<LossSpike> spike = detector.Observe(31, 1.6);
  ASSERT_TRUE(spike.has_value());
  EXPECT_EQ(spike->mad, 0);
  EXPECT_TRUE(std::isfinite(spike->score));
  EXPECT_GT(spike->score, 6);
}

// A checkpoint holds the window (the Runtime saves it with every snapshot): a detector loaded from
// it judges every later loss exactly as the one that saved it.
TEST(LossSpikeDetectorTest, ADetectorLoadedFromASavedWindowJudgesEveryLossAsTheOriginal) {
  for (int saved_at : {10, 60, 150}) {  // inside the warm-up, a part-filled ring, a wrapped one
    LossSpikeDetector original = MakeDetector();
    for (int64_t step = 0; step < saved_at; ++step) original.Observe(step, NoisyLoss(step));
    LossSpikeDetector loaded = MakeDetector();
    ASSERT_TRUE(loaded.LoadState(original.SaveState()).ok());
    ASSERT_EQ(loaded.window_size(), original.window_size());
    EXPECT_EQ(loaded.SaveState(), original.SaveState());
    int spikes = 0;
    for (int64_t step = saved_at; step < saved_at + 300; ++step) {
      const double loss = step % 40 == 0 ? 8 * NoisyLoss(step) : NoisyLoss(step);
      std::optional<LossSpike> a = original.Observe(step, loss);
      std::optional<LossSpike> b = loaded.Observe(step, loss);
      ASSERT_EQ(a.has_value(), b.has_value()) << "saved at " << saved_at << ", step " << step;
      if (!a.has_value()) continue;
      ++spikes;
      EXPECT_EQ(a->median, b->median);
      EXPECT_EQ(a->mad, b->mad);
      EXPECT_EQ(a->score, b->score);
    }
    EXPECT_GE(spikes, 6) << "saved at " << saved_at;  // the jumps after the warm-up
  }
}

TEST(LossSpikeDetectorTest, AnEmptyStateEmptiesTheWindowAndALongerWindowKeepsItsNewestLosses) {
  LossSpikeDetector big = MakeDetector({.window = 200, .threshold = 6, .warmup = 20});
  for (int64_t step = 0; step < 200; ++step) big.Observe(step, NoisyLoss(step));
  LossSpikeDetector small = MakeDetector({.window = 50, .threshold = 6, .warmup = 20});
  ASSERT_TRUE(small.LoadState(big.SaveState()).ok());
  EXPECT_EQ(small.window_size(), 50);
  LossSpikeDetector reference = MakeDetector({.window = 50, .threshold = 6, .warmup = 20});
  for (int64_t step = 150; step < 200; ++step) reference.Observe(step, NoisyLoss(step));
  EXPECT_EQ(small.SaveState(), reference.SaveState());
  ASSERT_TRUE(small.LoadState("").ok());
  EXPECT_EQ(small.window_size(), 0);
}

TEST(LossSpikeDetectorTest, BytesItDidNotWriteAreRefusedNamingWhyAndTheWindowIsKept) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 30; ++step) detector.Observe(step, NoisyLoss(step));
  const std::string saved = detector.SaveState();
  std::string wrong_version = saved;
  wrong_version[4] = 9;
  for (const auto& [bytes, why] : std::vector<std::pair<std::string, std::string>>{
           {"not a window", "do not start with its header"},
           {wrong_version, "version 9"},
           {saved.substr(0, saved.size() - 3), "its header says 30 losses"}}) {
    absl::Status s = detector.LoadState(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
    EXPECT_EQ(detector.SaveState(), saved);
  }
}

TEST(LossSpikeDetectorTest, JudgeAddsNothingAndAcceptAddsALossItDidNotReport) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 30; ++step) {
    ASSERT_FALSE(detector.Judge(step, NoisyLoss(step)));
    EXPECT_EQ(detector.window_size(), static_cast<int>(step));
    detector.Accept(NoisyLoss(step));
  }
  EXPECT_TRUE(detector.Judge(30, 10 * NoisyLoss(30)).has_value());
  EXPECT_EQ(detector.window_size(), 30);
  detector.Accept(std::numeric_limits<double>::quiet_NaN());  // never part of the window
  EXPECT_EQ(detector.window_size(), 30);
}

TEST(LossSpikeDetectorTest, ObserveDoesNotAllocate) {
  LossSpikeDetector detector = MakeDetector();
  for (int64_t step = 0; step < 150; ++step) detector.Observe(step, NoisyLoss(step));
  const int64_t before = testing::AllocationCount();
  for (int64_t step = 150; step < 400; ++step) {
    detector.Observe(step, step % 50 == 0 ? 100.0 : NoisyLoss(step));
  }
  detector.Observe(400, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(testing::AllocationCount(), before);
}

}  // namespace
}  // namespace trainguard
