// The CUDA half of the CollectiveTracker: a pool of timing events, two per in-flight slot, created
// once. Compiled only when trainguard is built with CUDA.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "sdk/watchdog/gpu_events.h"

namespace trainguard {
namespace watchdog_internal {
namespace {

GpuEventState StateOf(cudaError_t e) {
  if (e == cudaSuccess) return GpuEventState::kDone;
  if (e == cudaErrorNotReady) {
    // cudaEventQuery leaves cudaErrorNotReady as the thread's last error; clear it so that a
    // trainer's own cudaGetLastError on this thread is not confused (this is the monitor thread,
    // but tests may poll from the training thread).
    (void)cudaGetLastError();
    return GpuEventState::kPending;
  }
  return GpuEventState::kError;
}

class CudaEvents final : public GpuEvents {
 public:
  CudaEvents(int device, std::vector<cudaEvent_t> start, std::vector<cudaEvent_t> end)
      : device_(device), start_(std::move(start)), end_(std::move(end)) {}

  ~CudaEvents() override {
    // cudaEventDestroy on an event still pending returns at once; CUDA frees it once it fires.
    if (cudaSetDevice(device_) != cudaSuccess) return;  // the context is gone: nothing to free
    for (cudaEvent_t e : start_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : end_) (void)cudaEventDestroy(e);
  }

  bool RecordStart(int slot, void* stream) override {
    return cudaEventRecord(start_[slot], static_cast<cudaStream_t>(stream)) == cudaSuccess;
  }
  bool RecordEnd(int slot, void* stream) override {
    return cudaEventRecord(end_[slot], static_cast<cudaStream_t>(stream)) == cudaSuccess;
  }
  GpuEventState QueryStart(int slot) override { return StateOf(cudaEventQuery(start_[slot])); }
  GpuEventState QueryEnd(int slot) override { return StateOf(cudaEventQuery(end_[slot])); }

  int64_t ElapsedNanos(int slot) override {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_[slot], end_[slot]) != cudaSuccess) return 0;
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

  void BindThread() override { (void)cudaSetDevice(device_); }

 private:
  const int device_;
  const std::vector<cudaEvent_t> start_;
  const std::vector<cudaEvent_t> end_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuEvents>> CreateCudaEvents(int device, int slots) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrFormat("collective tracker: cudaSetDevice(%d): %s (%s)", device,
                        cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  std::vector<cudaEvent_t> start(slots, nullptr);
  std::vector<cudaEvent_t> end(slots, nullptr);
  auto destroy = [&] {
    for (cudaEvent_t ev : start) {
      if (ev != nullptr) (void)cudaEventDestroy(ev);
    }
    for (cudaEvent_t ev : end) {
      if (ev != nullptr) (void)cudaEventDestroy(ev);
    }
  };
  for (int i = 0; i < slots; ++i) {
    // Timing events (no cudaEventDisableTiming): a finished collective's device time is what the
    // tracker learns its bound from.
    cudaError_t e = cudaEventCreate(&start[i]);
    if (e == cudaSuccess) e = cudaEventCreate(&end[i]);
    if (e != cudaSuccess) {
      destroy();
      return absl::ResourceExhaustedError(
          absl::StrFormat("collective tracker: cudaEventCreate (%d of %d pairs) on device %d: %s",
                          i, slots, device, cudaGetErrorString(e)));
    }
  }
  return std::unique_ptr<GpuEvents>(new CudaEvents(device, std::move(start), std::move(end)));
}

}  // namespace watchdog_internal
}  // namespace trainguard
