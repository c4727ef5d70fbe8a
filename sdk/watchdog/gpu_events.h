// GpuEvents: the CUDA events a CollectiveTracker brackets GPU collectives with (private to
// sdk/watchdog). Slot i of the tracker owns one start and one end event, created once by
// EnableGpu(), so recording them on the hot path allocates nothing.
//
// The CUDA implementation (collective_tracker_cuda.cc, built only with TRAINGUARD_HAVE_CUDA) uses
// timing events and only ever *queries* them from the monitor thread (cudaEventQuery): the
// watchdog must never block on a device that may be hung. Unit tests substitute a fake.
//
// Thread safety: Record*() from the threads that issue collectives, Query() and ElapsedNanos()
// from the one polling thread, each on a slot the caller owns at that moment.
#ifndef TRAINGUARD_SDK_WATCHDOG_GPU_EVENTS_H_
#define TRAINGUARD_SDK_WATCHDOG_GPU_EVENTS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace trainguard {
namespace watchdog_internal {

enum class GpuEventState { kPending, kDone, kError };

class GpuEvents {
 public:
  virtual ~GpuEvents() = default;

  // Enqueue the slot's start (end) event on `stream` (a cudaStream_t). False when CUDA refused.
  virtual bool RecordStart(int slot, void* stream) = 0;
  virtual bool RecordEnd(int slot, void* stream) = 0;

  // Non-blocking.
  virtual GpuEventState QueryStart(int slot) = 0;
  virtual GpuEventState QueryEnd(int slot) = 0;
  // Device time between the slot's start and end events. REQUIRES: both are done.
  virtual int64_t ElapsedNanos(int slot) = 0;

  // Makes the events' device current on the calling (polling) thread.
  virtual void BindThread() = 0;
};

#if defined(TRAINGUARD_HAVE_CUDA)
// Creates 2 x `slots` timing events on CUDA device `device`.
absl::StatusOr<std::unique_ptr<GpuEvents>> CreateCudaEvents(int device, int slots);
#endif

}  // namespace watchdog_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_GPU_EVENTS_H_
