// FiniteChecker on CUDA device buffers: NaN and Inf written at chosen indices of fp32, fp16, bf16
// and fp64 buffers are found by the kernel, and Collect() reports a check whose kernel is still
// running as pending instead of waiting for it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "spin_kernel.h"
#include "trainguard/checkpoint.h"
#include "trainguard/health.h"

namespace trainguard {
namespace {

struct Format {
  DType dtype;
  size_t size;
  uint64_t one, nan, pos_inf, neg_inf;
};

const Format kFormats[] = {
    {DType::kF32, 4, 0x3F800000, 0x7FC00000, 0x7F800000, 0xFF800000},
    {DType::kF16, 2, 0x3C00, 0x7E00, 0x7C00, 0xFC00},
    {DType::kBF16, 2, 0x3F80, 0x7FC0, 0x7F80, 0xFF80},
    {DType::kF64, 8, 0x3FF0000000000000, 0x7FF8000000000000, 0x7FF0000000000000,
     0xFFF0000000000000},
};

class FiniteCheckerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    auto checker = FiniteChecker::Create(16);
    ASSERT_TRUE(checker.ok()) << checker.status();
    checker_ = *std::move(checker);
    ASSERT_TRUE(checker_->has_cuda());
  }
  void TearDown() override {
    checker_.reset();
    for (void* p : allocations_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A device buffer of `count` elements equal to 1.0, `offset` bytes into an allocation.
  unsigned char* FiniteBuffer(const Format& f, size_t count, size_t offset = 0) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, count * f.size + offset + 64), cudaSuccess);
    allocations_.push_back(p);
    std::vector<unsigned char> host(count * f.size);
    for (size_t i = 0; i < count; ++i) std::memcpy(&host[i * f.size], &f.one, f.size);
    unsigned char* data = static_cast<unsigned char*>(p) + offset;
    EXPECT_EQ(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return data;
  }
  static void Put(const Format& f, unsigned char* buffer, size_t index, uint64_t bits) {
    ASSERT_EQ(cudaMemcpy(buffer + index * f.size, &bits, f.size, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // Runs one check to completion and returns its result.
  BufferCheck CheckNow(const std::string& name, const void* data, size_t count, DType dtype) {
    EXPECT_TRUE(checker_->Check(name, data, count, dtype, Device::Cuda(0), stream_).ok());
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    auto checks = checker_->Collect();
    EXPECT_TRUE(checks.ok()) << checks.status();
    EXPECT_EQ(checks->size(), 1u);
    return checks->empty() ? BufferCheck{} : checks->front();
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<FiniteChecker> checker_;
  std::vector<void*> allocations_;
};

TEST_F(FiniteCheckerGpuTest, NanAndInfAtChosenIndicesAreFoundInEveryDtype) {
  constexpr size_t kCount = (1 << 20) + 37;  // many blocks, and a ragged end
  for (const Format& f : kFormats) {
    const std::string dtype(DTypeName(f.dtype));
    unsigned char* buffer = FiniteBuffer(f, kCount);
    BufferCheck clean = CheckNow("clean." + dtype, buffer, kCount, f.dtype);
    EXPECT_FALSE(clean.pending);
    EXPECT_EQ(clean.result, FiniteCheckResult{}) << dtype;

    for (size_t index : {size_t{0}, size_t{1}, kCount / 2 + 3, kCount - 1}) {
      Put(f, buffer, index, f.nan);
      BufferCheck check = CheckNow("grad." + dtype, buffer, kCount, f.dtype);
      EXPECT_EQ(check.buffer_name, "grad." + dtype);
      EXPECT_EQ(check.count, kCount);
      EXPECT_EQ(check.device, Device::Cuda(0));
      EXPECT_EQ(check.result, (FiniteCheckResult{.nonfinite_count = 1,
                                                 .first_bad_index = static_cast<int64_t>(index),
                                                 .has_nan = true,
                                                 .has_inf = false}))
          << dtype << " NaN at " << index;
      Put(f, buffer, index, f.one);
    }

    Put(f, buffer, 777777, f.pos_inf);
    Put(f, buffer, 5, f.neg_inf);
    Put(f, buffer, kCount - 2, f.nan);
    BufferCheck check = CheckNow("mixed." + dtype, buffer, kCount, f.dtype);
    EXPECT_EQ(check.result,
              (FiniteCheckResult{
                  .nonfinite_count = 3, .first_bad_index = 5, .has_nan = true, .has_inf = true}))
        << dtype;
  }
}

TEST_F(FiniteCheckerGpuTest, UnalignedDeviceBuffersAreChecked) {
  constexpr size_t kCount = 100003;
  for (const Format& f : kFormats) {
    // One element past a 16-byte boundary (vector head), and one byte past it (not even aligned
    // to the element size).
    for (size_t offset : {f.size, size_t{1}}) {
      unsigned char* buffer = FiniteBuffer(f, kCount, offset);
      Put(f, buffer, 2, f.pos_inf);
      Put(f, buffer, kCount - 1, f.nan);
      BufferCheck check = CheckNow("unaligned", buffer, kCount, f.dtype);
      EXPECT_EQ(check.result,
                (FiniteCheckResult{
                    .nonfinite_count = 2, .first_bad_index = 2, .has_nan = true, .has_inf = true}))
          << DTypeName(f.dtype) << " offset " << offset;
    }
  }
}

TEST_F(FiniteCheckerGpuTest, ShortBuffersHaveEveryPositionChecked) {
  for (const Format& f : kFormats) {
    for (size_t count : {size_t{1}, size_t{5}, size_t{17}, size_t{64}}) {
      unsigned char* buffer = FiniteBuffer(f, count);
      for (size_t index = 0; index < count; ++index) {
        Put(f, buffer, index, f.neg_inf);
        BufferCheck check = CheckNow("short", buffer, count, f.dtype);
        EXPECT_EQ(check.result.first_bad_index, static_cast<int64_t>(index))
            << DTypeName(f.dtype) << " count " << count;
        EXPECT_EQ(check.result.nonfinite_count, 1u);
        Put(f, buffer, index, f.one);
      }
    }
  }
}

TEST_F(FiniteCheckerGpuTest, CollectReportsARunningCheckAsPendingWithoutWaiting) {
  const Format& f = kFormats[2];  // bf16
  constexpr size_t kCount = 4096;
  unsigned char* buffer = FiniteBuffer(f, kCount);
  Put(f, buffer, 100, f.nan);

  void* release_memory = nullptr;
  ASSERT_EQ(cudaHostAlloc(&release_memory, sizeof(int), cudaHostAllocMapped), cudaSuccess);
  auto* release = static_cast<volatile int*>(release_memory);
  *release = 0;
  void* release_on_device = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&release_on_device, release_memory, 0), cudaSuccess);
  // However the test ends (a failed ASSERT returns), the spinning kernel is let go before the
  // stream is destroyed.
  struct Releaser {
    volatile int* flag;
    void* memory;
    cudaStream_t stream;
    ~Releaser() {
      *flag = 1;
      cudaStreamSynchronize(stream);
      cudaFreeHost(memory);
    }
  } releaser{release, release_memory, stream_};

  // The stream is held by the spinning kernel, so the check queued behind it cannot have run.
  ASSERT_EQ(trainguard::testing::LaunchSpinUntilFlag(
                static_cast<const volatile int*>(release_on_device), stream_),
            cudaSuccess);
  ASSERT_TRUE(
      checker_->Check("layer7.grad", buffer, kCount, f.dtype, Device::Cuda(0), stream_).ok());
  const float host_value = 0;
  ASSERT_TRUE(checker_->Check("loss", &host_value, 1, DType::kF32, Device::Host(), nullptr).ok());

  auto first = checker_->Collect();  // must return while the kernel still spins
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady) << "the stream finished on its own";
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].buffer_name, "layer7.grad");
  EXPECT_TRUE((*first)[0].pending);
  EXPECT_EQ((*first)[1].buffer_name, "loss");
  EXPECT_FALSE((*first)[1].pending);
  EXPECT_EQ(checker_->outstanding(), 1);  // the pending one is carried

  *release = 1;
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  auto second = checker_->Collect();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].buffer_name, "layer7.grad");
  EXPECT_FALSE((*second)[0].pending);
  EXPECT_EQ((*second)[0].result,
            (FiniteCheckResult{
                .nonfinite_count = 1, .first_bad_index = 100, .has_nan = true, .has_inf = false}));
  EXPECT_EQ(checker_->outstanding(), 0);
}

TEST_F(FiniteCheckerGpuTest, ManyChecksInOneStepComeBackInOrderWithTheirNames) {
  const Format& f = kFormats[0];
  constexpr size_t kCount = 1000;
  std::vector<unsigned char*> buffers;
  for (int i = 0; i < 16; ++i) {
    buffers.push_back(FiniteBuffer(f, kCount));
    if (i % 5 == 0) Put(f, buffers.back(), static_cast<size_t>(i), f.pos_inf);
  }
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(checker_
                    ->Check("layer" + std::to_string(i), buffers[static_cast<size_t>(i)], kCount,
                            f.dtype, Device::Cuda(0), stream_)
                    .ok());
  }
  EXPECT_EQ(
      checker_->Check("one.too.many", buffers[0], kCount, f.dtype, Device::Cuda(0), stream_).code(),
      absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  auto checks = checker_->Collect();
  ASSERT_TRUE(checks.ok()) << checks.status();
  ASSERT_EQ(checks->size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const BufferCheck& check = (*checks)[static_cast<size_t>(i)];
    EXPECT_EQ(check.buffer_name, "layer" + std::to_string(i));
    EXPECT_FALSE(check.pending);
    EXPECT_EQ(check.result.all_finite(), i % 5 != 0) << check.buffer_name;
  }
}

TEST_F(FiniteCheckerGpuTest, ADeviceThatDoesNotExistIsRefused) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  const Format& f = kFormats[0];
  unsigned char* buffer = FiniteBuffer(f, 10);
  EXPECT_EQ(checker_->Check("x", buffer, 10, f.dtype, Device::Cuda(devices), stream_).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainguard
