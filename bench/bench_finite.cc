// Finite checks against the cost of reading the same bytes.
//
// BM_CheckFinite{F32,BF16,F16}: CheckFiniteHost over an all-finite buffer (the common case: the
// fast pass only). BM_PlainReadSum: a sum of the same buffer's uint64 words, the floor any check
// must pay; the target is a check at >= 0.8x its bytes/s. Sizes: 1 MiB (cache-resident) and 64 MiB
// (memory-bound). With CUDA: BM_CheckFiniteDevice{F32,BF16} time Check() + stream sync + Collect()
// on a device buffer, against BM_DeviceMemcpyD2D (counted as read + write bytes, so its rate is
// the device's memory bandwidth); both are skipped where no device exists.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "benchmark/benchmark.h"
#include "trainguard/checkpoint.h"
#include "trainguard/health.h"

#if defined(TRAINGUARD_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace trainguard {
namespace {

// Finite values of every magnitude (no NaN/Inf bit pattern in any element of any of the dtypes):
// each 16-bit half of a word has an exponent field below all-ones for fp16, bf16 and fp32.
void FillFinite(uint64_t* words, size_t count) {
  uint64_t x = 0x9E3779B97F4A7C15u;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x & 0x3BFF3BFF3BFF3BFFu;  // every 16-bit lane <= 0x3BFF: finite as fp16 and bf16
  }
}

// `bytes` of finite words at a 64-byte boundary, as tensors are allocated (both the check and the
// plain read see the same alignment).
struct HostBuffer {
  explicit HostBuffer(size_t bytes) : words(static_cast<uint64_t*>(std::aligned_alloc(64, bytes))) {
    FillFinite(words.get(), bytes / sizeof(uint64_t));
  }
  struct Free {
    void operator()(uint64_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint64_t, Free> words;
};

void CheckFinite(benchmark::State& state, DType dtype) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const HostBuffer buffer(bytes);
  const size_t count = bytes / DTypeSize(dtype);
  for (auto _ : state) {
    FiniteCheckResult result = CheckFiniteHost(buffer.words.get(), count, dtype);
    benchmark::DoNotOptimize(result);
    if (!result.all_finite()) state.SkipWithError("the buffer was meant to be all finite");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_CheckFiniteF32(benchmark::State& state) { CheckFinite(state, DType::kF32); }
void BM_CheckFiniteBF16(benchmark::State& state) { CheckFinite(state, DType::kBF16); }
void BM_CheckFiniteF16(benchmark::State& state) { CheckFinite(state, DType::kF16); }

// The sum of `bytes` of uint64 words at `p`, in the same shape as the finite check's fast pass
// (four vector accumulators, unaligned loads) minus its AND and ADD: a plain loop over uint64_t
// stays scalar at -O2 and would flatter the check.
template <typename Vec>
[[gnu::always_inline]] inline uint64_t SumWords(const unsigned char* p, size_t bytes) {
  Vec acc0 = {};
  Vec acc1 = {};
  Vec acc2 = {};
  Vec acc3 = {};
  for (size_t i = 0; i + 4 * sizeof(Vec) <= bytes; i += 4 * sizeof(Vec)) {
    Vec w0, w1, w2, w3;
    std::memcpy(&w0, p + i, sizeof(Vec));
    std::memcpy(&w1, p + i + sizeof(Vec), sizeof(Vec));
    std::memcpy(&w2, p + i + 2 * sizeof(Vec), sizeof(Vec));
    std::memcpy(&w3, p + i + 3 * sizeof(Vec), sizeof(Vec));
    acc0 += w0;
    acc1 += w1;
    acc2 += w2;
    acc3 += w3;
  }
  const Vec all = (acc0 + acc1) + (acc2 + acc3);
  uint64_t sum = 0;
  for (size_t lane = 0; lane < sizeof(Vec) / sizeof(uint64_t); ++lane) sum += all[lane];
  return sum;
}

using Vec16 = uint64_t __attribute__((vector_size(16)));
using Vec32 = uint64_t __attribute__((vector_size(32)));

uint64_t SumWordsBaseline(const unsigned char* p, size_t bytes) {
  return SumWords<Vec16>(p, bytes);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t SumWordsAvx2(const unsigned char* p, size_t bytes) {
  return SumWords<Vec32>(p, bytes);
}
#endif

void BM_PlainReadSum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const HostBuffer buffer(bytes);
  uint64_t (*sum_words)(const unsigned char*, size_t) = &SumWordsBaseline;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) sum_words = &SumWordsAvx2;  // as the check does
#endif
  for (auto _ : state) {
    const auto* p = reinterpret_cast<const unsigned char*>(buffer.words.get());
    benchmark::DoNotOptimize(p);  // the sum is recomputed every iteration
    uint64_t sum = sum_words(p, bytes);
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

BENCHMARK(BM_CheckFiniteF32)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_CheckFiniteBF16)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_CheckFiniteF16)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_PlainReadSum)->Arg(1 << 20)->Arg(64 << 20);

#if defined(TRAINGUARD_HAVE_CUDA)

bool HaveDevice(benchmark::State& state) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// A device buffer of `bytes` finite values, freed at scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&data, bytes) != cudaSuccess) return;
    const HostBuffer host(bytes);
    cudaMemcpy(data, host.words.get(), bytes, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(data); }
  void* data = nullptr;
};

void CheckFiniteDevice(benchmark::State& state, DType dtype) {
  if (!HaveDevice(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  DeviceBuffer buffer(bytes);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  auto checker = FiniteChecker::Create(1);
  if (buffer.data == nullptr || !checker.ok()) {
    state.SkipWithError("cudaMalloc or FiniteChecker::Create failed");
    return;
  }
  const size_t count = bytes / DTypeSize(dtype);
  for (auto _ : state) {
    if (!(*checker)->Check("bench", buffer.data, count, dtype, Device::Cuda(0), stream).ok()) {
      state.SkipWithError("Check failed");
      break;
    }
    cudaStreamSynchronize(stream);
    auto checks = (*checker)->Collect();
    if (!checks.ok() || checks->size() != 1 || (*checks)[0].pending ||
        !(*checks)[0].result.all_finite()) {
      state.SkipWithError("Collect did not report one finished, all-finite check");
      break;
    }
  }
  cudaStreamDestroy(stream);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_CheckFiniteDeviceF32(benchmark::State& state) { CheckFiniteDevice(state, DType::kF32); }
void BM_CheckFiniteDeviceBF16(benchmark::State& state) { CheckFiniteDevice(state, DType::kBF16); }

void BM_DeviceMemcpyD2D(benchmark::State& state) {
  if (!HaveDevice(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  DeviceBuffer from(bytes);
  DeviceBuffer to(bytes);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (auto _ : state) {
    cudaMemcpyAsync(to.data, from.data, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaStreamSynchronize(stream);
  }
  cudaStreamDestroy(stream);
  // Read and written: the device's memory traffic, comparable with a check's reads.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 *
                          static_cast<int64_t>(bytes));
}

BENCHMARK(BM_CheckFiniteDeviceF32)->Arg(64 << 20)->Arg(1 << 30)->UseRealTime();
BENCHMARK(BM_CheckFiniteDeviceBF16)->Arg(64 << 20)->Arg(1 << 30)->UseRealTime();
BENCHMARK(BM_DeviceMemcpyD2D)->Arg(64 << 20)->Arg(1 << 30)->UseRealTime();

#endif  // TRAINGUARD_HAVE_CUDA

}  // namespace
}  // namespace trainguard
