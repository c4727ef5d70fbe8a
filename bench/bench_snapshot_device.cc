// The Snapshotter with device state (CUDA): a whole snapshot of GPU buffers (Begin + Fence: the
// device-to-host copies into the pinned arena, chunk by chunk on the snapshot stream, and the
// checksums) against the baseline of one cudaMemcpyAsync per buffer into a pinned host buffer of
// the same size, in the same process; and a restore (verify every chunk, copy back to the GPU)
// against the host-to-device copy; and a peer restore's install into the arena with the device
// copies after it or as each buffer's chunks land. All count the state's bytes once. The snapshot
// runs with the default copy_threads and chunk_bytes, then with more threads and larger chunks.
//
//   build/default/bench/bench_checkpoint --benchmark_filter='Device|ChunkChecksum'
//
// Without a CUDA device each benchmark reports "no CUDA device".
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/checkpoint.h"
#include "xxh_x86dispatch.h"
#include "xxhash.h"

namespace {

using trainguard::Device;
using trainguard::DType;
using trainguard::Snapshotter;
using trainguard::SnapshotterOptions;
using trainguard::StateBuffer;
using trainguard::StateRegistry;

constexpr int kDeviceBuffers = 16;

// `bytes` of device state in kDeviceBuffers buffers, filled with a pattern; empty on failure.
class DeviceState {
 public:
  explicit DeviceState(size_t bytes) : bytes_per_buffer_(bytes / kDeviceBuffers) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      (void)cudaGetLastError();
      error_ = "no CUDA device";
      return;
    }
    for (int b = 0; b < kDeviceBuffers; ++b) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes_per_buffer_) != cudaSuccess ||
          cudaMemset(p, b + 1, bytes_per_buffer_) != cudaSuccess) {
        (void)cudaGetLastError();
        error_ = "cudaMalloc or cudaMemset failed";
        return;
      }
      buffers_.push_back(p);
      (void)registry_.Register(StateBuffer{absl::StrFormat("layer%d.weight", b),
                                           "model",
                                           p,
                                           bytes_per_buffer_,
                                           DType::kU8,
                                           {static_cast<int64_t>(bytes_per_buffer_)},
                                           Device::Cuda(0)});
    }
    if (cudaDeviceSynchronize() != cudaSuccess) error_ = "cudaDeviceSynchronize failed";
  }
  ~DeviceState() {
    for (void* p : buffers_) cudaFree(p);
  }
  const char* error() const { return error_; }
  StateRegistry* registry() { return &registry_; }
  void* buffer(int b) { return buffers_[b]; }
  size_t bytes_per_buffer() const { return bytes_per_buffer_; }

 private:
  const size_t bytes_per_buffer_;
  std::vector<void*> buffers_;
  StateRegistry registry_;
  const char* error_ = nullptr;
};

// Device state of `state.range(0)` bytes and a Snapshotter over it, from the arguments {bytes,
// rank (a distinct arena per shape), copy_threads, chunk MiB}; or the benchmark skipped.
struct DeviceSetup {
  explicit DeviceSetup(benchmark::State& state) : bytes(state.range(0)), device(bytes) {
    if (device.error() != nullptr) {
      state.SkipWithError(device.error());
      return;
    }
    options.job_id = absl::StrFormat("bench-device-%d", getpid());
    options.rank = static_cast<int>(state.range(1));
    options.copy_threads = static_cast<int>(state.range(2));
    options.chunk_bytes = static_cast<size_t>(state.range(3)) << 20;
    absl::StatusOr<std::unique_ptr<Snapshotter>> created =
        Snapshotter::Create(device.registry(), options);
    if (!created.ok()) {
      state.SkipWithError(created.status().ToString().c_str());
      return;
    }
    snapshotter = *std::move(created);
  }
  ~DeviceSetup() {
    if (snapshotter == nullptr) return;
    snapshotter.reset();
    (void)Snapshotter::RemoveArena(options.job_id, options.rank);
  }
  bool ok() const { return snapshotter != nullptr; }

  const size_t bytes;
  DeviceState device;
  SnapshotterOptions options;
  std::unique_ptr<Snapshotter> snapshotter;
};

// A whole snapshot of device state: Begin + Fence.
void BM_SnapshotDeviceBeginToFence(benchmark::State& state) {
  DeviceSetup setup(state);
  if (!setup.ok()) return;
  int64_t step = 0;
  for (auto _ : state) {
    if (!setup.snapshotter->Begin(++step).ok() ||
        !setup.snapshotter->Fence(absl::Minutes(2)).ok()) {
      state.SkipWithError("snapshot failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(setup.bytes));
}

// A restore into device state: every chunk verified, then copied back to the GPU.
void BM_SnapshotDeviceRestore(benchmark::State& state) {
  DeviceSetup setup(state);
  if (!setup.ok()) return;
  if (!setup.snapshotter->Begin(1).ok() || !setup.snapshotter->Fence(absl::Minutes(2)).ok()) {
    state.SkipWithError("snapshot failed");
    return;
  }
  for (auto _ : state) {
    if (!setup.snapshotter->RestoreLatest(setup.device.registry()).ok()) {
      state.SkipWithError("restore failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(setup.bytes));
}

// A peer restore of device state, with a memcpy from host memory standing in for the network: each
// chunk copied into the arena's free slot and hashed (what a fetch does as chunks land), then the
// device buffers restored from the slot. With a third argument of 0: `Install`, then `RestoreStep`
// (every host-to-device copy after the whole payload is in); 1: `InstallAndRestoreWith` (each
// buffer's host-to-device copy as soon as its last chunk is in, beside the rest of the fill).
void BM_DeviceInstallAndRestore(benchmark::State& state) {
  DeviceSetup setup(state);
  if (!setup.ok()) return;
  if (!setup.snapshotter->Begin(1).ok() || !setup.snapshotter->Fence(absl::Minutes(2)).ok()) {
    state.SkipWithError("snapshot failed");
    return;
  }
  absl::StatusOr<Snapshotter::View> view = setup.snapshotter->ViewOf(1);
  if (!view.ok()) {
    state.SkipWithError(view.status().ToString().c_str());
    return;
  }
  const std::string received(view->payload);  // the bytes the network would bring
  const std::vector<uint64_t> checksums = view->chunk_checksums;
  const uint64_t layout_hash = view->info.layout_hash;
  const uint64_t chunk = setup.options.chunk_bytes;
  const bool as_it_lands = state.range(4) != 0;
  int64_t step = 1;
  for (auto _ : state) {
    ++step;
    absl::StatusOr<trainguard::SnapshotInfo> restored;
    if (as_it_lands) {
      restored = setup.snapshotter->InstallAndRestoreWith(
          setup.device.registry(), step, 0, received.size(), checksums,
          trainguard::SnapshotFingerprint(step, layout_hash, received.size(), checksums),
          [&](char* dst, Snapshotter::ChunkSink* sink) -> absl::Status {
            for (uint64_t k = 0, at = 0; at < received.size(); ++k, at += chunk) {
              const uint64_t n = std::min<uint64_t>(chunk, received.size() - at);
              std::memcpy(dst + at, received.data() + at, n);
              if (XXH3_64bits(dst + at, n) != checksums[k]) {
                return absl::DataLossError("chunk checksum");
              }
              sink->Landed(k);
            }
            return absl::OkStatus();
          });
    } else {
      restored = setup.snapshotter->Install(step, 0, received, checksums);
      if (restored.ok()) restored = setup.snapshotter->RestoreStep(setup.device.registry(), step);
    }
    if (!restored.ok()) {
      state.SkipWithError(restored.status().ToString().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(setup.bytes));
}

// The baseline: the same buffers copied device-to-host into one pinned buffer, one stream (and,
// with a second argument of 1, host-to-device: the restore's baseline).
void BM_DeviceToPinnedMemcpy(benchmark::State& state) {
  const size_t bytes = state.range(0);
  DeviceState device(bytes);
  if (device.error() != nullptr) {
    state.SkipWithError(device.error());
    return;
  }
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    state.SkipWithError("cudaHostAlloc or cudaStreamCreate failed");
    return;
  }
  for (auto _ : state) {
    char* out = static_cast<char*>(pinned);
    for (int b = 0; b < kDeviceBuffers; ++b) {
      if (state.range(1) == 0) {
        cudaMemcpyAsync(out, device.buffer(b), device.bytes_per_buffer(), cudaMemcpyDeviceToHost,
                        stream);
      } else {
        cudaMemcpyAsync(device.buffer(b), out, device.bytes_per_buffer(), cudaMemcpyHostToDevice,
                        stream);
      }
      out += device.bytes_per_buffer();
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      state.SkipWithError("cudaMemcpyAsync failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  cudaStreamDestroy(stream);
  cudaFreeHost(pinned);
}

// What bounds a snapshot besides the copy: the XXH3-64 checksum of every chunk, on one thread, over
// host memory (the snapshot runs copy_threads of them); XXH3_64bits, then libxxhash's runtime
// dispatch to the widest vector unit (the same hash).
void BM_ChunkChecksumOneThread(benchmark::State& state) {
  const size_t bytes = state.range(0);
  const size_t chunk = size_t{4} << 20;
  std::unique_ptr<char[]> host(new char[bytes]);
  std::memset(host.get(), 7, bytes);
  uint64_t sum = 0;
  for (auto _ : state) {
    for (size_t at = 0; at < bytes; at += chunk) {
      sum += state.range(1) == 0 ? XXH3_64bits(host.get() + at, chunk)
                                 : XXH3_64bits_dispatch(host.get() + at, chunk);
    }
  }
  benchmark::DoNotOptimize(sum);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_ChunkChecksumOneThread)
    ->ArgNames({"bytes", "dispatch"})
    ->Args({int64_t{1} << 30, 0})
    ->Args({int64_t{1} << 30, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

// The defaults (4 threads, 4 MiB chunks) at each size, then more threads and larger chunks at 1 GiB.
BENCHMARK(BM_SnapshotDeviceBeginToFence)
    ->ArgNames({"bytes", "rank", "copy_threads", "chunk_mib"})
    ->Args({64 << 20, 10, 4, 4})
    ->Args({int64_t{1} << 30, 11, 4, 4})
    ->Args({int64_t{4} << 30, 12, 4, 4})
    ->Args({int64_t{1} << 30, 13, 8, 4})
    ->Args({int64_t{1} << 30, 14, 16, 4})
    ->Args({int64_t{1} << 30, 15, 4, 16})
    ->Args({int64_t{1} << 30, 16, 16, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
BENCHMARK(BM_SnapshotDeviceRestore)
    ->ArgNames({"bytes", "rank", "copy_threads", "chunk_mib"})
    ->Args({int64_t{1} << 30, 17, 4, 4})
    ->Args({int64_t{1} << 30, 18, 16, 4})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
BENCHMARK(BM_DeviceInstallAndRestore)
    ->ArgNames({"bytes", "rank", "copy_threads", "chunk_mib", "as_it_lands"})
    ->Args({int64_t{1} << 30, 19, 4, 4, 0})
    ->Args({int64_t{1} << 30, 20, 4, 4, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
// {bytes, to_device}.
BENCHMARK(BM_DeviceToPinnedMemcpy)
    ->ArgNames({"bytes", "to_device"})
    ->Args({64 << 20, 0})
    ->Args({int64_t{1} << 30, 0})
    ->Args({int64_t{4} << 30, 0})
    ->Args({int64_t{1} << 30, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

}  // namespace
