#include "sdk/checkpoint/snapshotter_cuda.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace trainguard {
namespace checkpoint_internal {

struct DeviceCopier::Stream {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
};

namespace {

absl::Status CudaError(cudaError_t error, const char* operation, int ordinal) {
  return absl::InternalError(absl::StrFormat("snapshot copy: %s on CUDA device %d: %s (%s)",
                                             operation, ordinal, cudaGetErrorName(error),
                                             cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::Create(
    void* host, size_t bytes, const std::vector<int>& ordinals) {
  std::unique_ptr<DeviceCopier> copier(new DeviceCopier());
  for (int ordinal : ordinals) {
    if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
      return CudaError(e, "cudaSetDevice", ordinal);
    }
    auto stream = std::make_unique<Stream>();
    stream->ordinal = ordinal;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream->stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "cudaStreamCreateWithFlags", ordinal);
    }
    copier->streams_.push_back(std::move(stream));
  }
  // Once, at creation: pinning is slow (about 1 s per 8 GiB) and must never happen per snapshot.
  if (cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterDefault); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("snapshot arena: cudaHostRegister of %d bytes: %s (%s)", bytes,
                        cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  copier->host_ = host;
  copier->registered_ = true;
  return copier;
}

DeviceCopier::~DeviceCopier() {
  for (const auto& stream : streams_) {
    cudaSetDevice(stream->ordinal);
    cudaStreamSynchronize(stream->stream);  // no DMA may land in memory about to be unmapped
    cudaStreamDestroy(stream->stream);
  }
  if (registered_) cudaHostUnregister(host_);
}

absl::Status DeviceCopier::CopyToHost(int ordinal, void* host, const void* device, size_t bytes,
                                      absl::Duration timeout) {
  return Copy(ordinal, host, device, bytes, /*to_host=*/true, timeout);
}

absl::Status DeviceCopier::CopyToDevice(int ordinal, void* device, const void* host, size_t bytes,
                                        absl::Duration timeout) {
  return Copy(ordinal, device, host, bytes, /*to_host=*/false, timeout);
}

absl::Status DeviceCopier::Copy(int ordinal, void* dst, const void* src, size_t bytes, bool to_host,
                                absl::Duration timeout) {
  Stream* stream = nullptr;
  for (const auto& s : streams_) {
    if (s->ordinal == ordinal) stream = s.get();
  }
  if (stream == nullptr) {
    return absl::InternalError(
        absl::StrFormat("snapshot copy: no stream for CUDA device %d", ordinal));
  }
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice", ordinal);
  }
  cudaEvent_t landed;
  if (cudaError_t e = cudaEventCreateWithFlags(&landed, cudaEventDisableTiming); e != cudaSuccess) {
    return CudaError(e, "cudaEventCreateWithFlags", ordinal);
  }
  absl::Status status;
  cudaError_t e = cudaMemcpyAsync(
      dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream->stream);
  if (e != cudaSuccess) {
    status = CudaError(e, "cudaMemcpyAsync", ordinal);
  } else if (e = cudaEventRecord(landed, stream->stream); e != cudaSuccess) {
    status = CudaError(e, "cudaEventRecord", ordinal);
  } else {
    // Polled rather than cudaEventSynchronize'd, so the wait has a deadline.
    const absl::Time deadline = absl::Now() + timeout;
    while ((e = cudaEventQuery(landed)) == cudaErrorNotReady) {
      if (absl::Now() > deadline) {
        // The copy may still land later: harmless, the arena stays mapped until the destructor has
        // synchronised the stream, and the slot is never marked complete.
        status = absl::DeadlineExceededError(
            absl::StrFormat("snapshot copy: %d bytes %s CUDA device %d not done after %s", bytes,
                            to_host ? "from" : "to", ordinal, absl::FormatDuration(timeout)));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (status.ok() && e != cudaSuccess) status = CudaError(e, "cudaEventQuery", ordinal);
  }
  cudaEventDestroy(landed);
  return status;
}

}  // namespace checkpoint_internal
}  // namespace trainguard
