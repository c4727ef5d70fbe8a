// CollectiveTracker::Impl: the tracker's state (include/trainguard/collectives.h documents the
// behaviour). Private to trainguard; the thread contract is the tracker's.
#ifndef TRAINGUARD_SDK_WATCHDOG_COLLECTIVE_TRACKER_IMPL_H_
#define TRAINGUARD_SDK_WATCHDOG_COLLECTIVE_TRACKER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/watchdog/gpu_events.h"
#include "sdk/watchdog/learned_bound.h"
#include "sdk/watchdog/name_table.h"
#include "trainguard/collectives.h"

namespace trainguard {

class CollectiveTracker::Impl {
 public:
  explicit Impl(const CollectiveTrackerOptions& options);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  absl::Status RegisterCommunicator(uint64_t comm_id, std::string name,
                                    std::function<void()> abort);
  absl::Status UnregisterCommunicator(uint64_t comm_id);
  absl::Status EnableGpu(int device);
  void SetStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  CollectiveHandle Begin(std::string_view op, uint64_t comm_id, uint64_t bytes, int peer = -1);
  void End(CollectiveHandle handle, bool failed);
  CollectiveHandle BeginOnStream(std::string_view op, uint64_t comm_id, uint64_t bytes, int peer,
                                 void* stream);
  void EndOnStream(CollectiveHandle handle, void* stream);
  CollectivePoll Poll(int64_t now_ns);
  // nullptr: every communicator.
  int AbortCommunicators(const std::vector<uint64_t>* comm_ids);
  void ExcuseOverdue(uint64_t instance);
  bool InFlight(uint64_t instance) const;
  absl::Duration BoundFor(std::string_view op) const;
  std::vector<CommunicatorProgress> Progress() const;
  int64_t usage_errors() const { return usage_errors_.load(std::memory_order_relaxed); }
  int64_t completed_ns() const { return completed_ns_.load(std::memory_order_relaxed); }
  int64_t completed_bytes() const { return completed_bytes_.load(std::memory_order_relaxed); }
  absl::Status usage_status() const;
  Clock& clock() const { return *clock_; }
  // Installs the GPU event pool (EnableGpu, or a test's fake through CollectiveTrackerTestPeer).
  absl::Status UseGpuEvents(std::unique_ptr<watchdog_internal::GpuEvents> events);

 private:
  struct Slot;
  struct Communicator;

  int FindCommunicator(uint64_t comm_id) const;
  int OpIndex(std::string_view op);
  // Claims a free slot and fills it; the handle of it, or an invalid one (a usage error recorded).
  CollectiveHandle Claim(int op, int comm, uint64_t bytes, int peer, bool on_gpu, int64_t now_ns);
  // The slot of a live handle in state `expected`, or nullptr (a usage error recorded).
  Slot* Resolve(CollectiveHandle handle, uint32_t expected, std::string_view what);
  // Learns the duration, counts the completion, writes kCollectiveEnd, frees the slot.
  void Complete(Slot& slot, int64_t now_ns, int64_t duration_ns, bool failed);
  // Writes kCollectiveBegin (end false) or kCollectiveEnd with `duration_ns` as its value.
  void Record(const Slot& slot, int op, int comm, bool end, int64_t now_ns, uint16_t flags,
              int64_t duration_ns);
  void UsageError(std::string message);
  InFlightCollective Describe(const Slot& slot, int64_t now_ns, int64_t start_ns, int op, int comm,
                              int64_t bound_ns) const;

  const CollectiveTrackerOptions options_;
  Clock* const clock_;
  FlightRecorder* const recorder_;
  const int slot_count_;
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<Communicator[]> comms_;
  std::atomic<int> comm_count_{0};  // comms_[0, comm_count_) have been used
  std::unique_ptr<watchdog_internal::NameTable> ops_;
  std::vector<std::unique_ptr<watchdog_internal::SampleWindow>> op_durations_;
  std::atomic<int> next_slot_{0};  // where Begin looks for a free slot first
  std::atomic<int64_t> step_{-1};
  std::atomic<int64_t> usage_errors_{0};
  std::atomic<int64_t> completed_ns_{0};     // completed collectives' durations, summed
  std::atomic<int64_t> completed_bytes_{0};  // and their bytes
  std::unique_ptr<const watchdog_internal::BoundRule> rule_;
  std::atomic<bool> gpu_enabled_{false};
  std::unique_ptr<watchdog_internal::GpuEvents> gpu_;  // set once, before gpu_enabled_

  mutable Mutex comms_mu_;  // registration and the abort functions
  Mutex poll_mu_;           // one poller at a time
  mutable Mutex usage_mu_;
  absl::Status first_usage_error_ ABSL_GUARDED_BY(usage_mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_COLLECTIVE_TRACKER_IMPL_H_
