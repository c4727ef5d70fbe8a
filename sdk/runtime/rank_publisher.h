// RankPublisher: what a rank tells the others about itself through the store, from its watcher
// thread (private to sdk/runtime):
//
//   - its progress record (sdk/runtime/peer_progress.h), for the peers' watchdogs: at most every
//     progress_period and only when it changed (a new phase or tick, a collective entered, a new
//     generation), so that a rank blocked for long writes nothing while the record's age grows;
//     only in a generation whose records a peer asked for (WantProgress);
//   - its work record (sdk/health/fail_slow_metrics.h: steps, their time, the time in collectives
//     and in the trainer's own phases), once a second, for its host agent's fail-slow sample; only
//     once WantWorkRecords() was called (the agent asked, health/work_wanted): nothing else reads
//     it.
//
// Not a thread: its owner calls PublishProgress() and PublishWork() every period or so. Whether a
// record is due is measured on the clock's monotonic time, so a test drives it with a ManualClock.
// A write that fails is tried again at the next due call.
//
// Thread safety: one thread at a time (the owner's duty thread), but WantWorkRecords() from any.
// The sources it reads (the heartbeat, the watchdog, the tracker) may be written by other threads
// meanwhile.
#ifndef TRAINGUARD_SDK_RUNTIME_RANK_PUBLISHER_H_
#define TRAINGUARD_SDK_RUNTIME_RANK_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/runtime.h"
#include "trainguard/store.h"
#include "trainguard/watchdog.h"

namespace trainguard {

// The watchdog phase every guarded step is (StepScope opens it; the work record leaves it out of
// the trainer's own phases, since its step_ns is that time already).
inline constexpr char kStepPhase[] = "step";

struct RankPublisherOptions {
  Store* store = nullptr;  // the job's store; nullptr: nothing is published
  int rank = 0;
  Clock* clock = Clock::Real();
  // Options::watchdog_peer_progress_ms; zero: no progress records.
  absl::Duration progress_period = absl::ZeroDuration();
  // The sources. The watchdog may be nullptr (no progress records, no phase times); the tracker
  // nullptr (nothing at all).
  const Heartbeat* heartbeat = nullptr;
  const Watchdog* watchdog = nullptr;
  const CollectiveTracker* collectives = nullptr;
  // The rank's current generation (the progress record's key names it).
  std::function<int64_t()> generation;
};

class RankPublisher {
 public:
  // REQUIRES: the store, the clock and the sources outlive the publisher; heartbeat and
  // generation are set.
  explicit RankPublisher(RankPublisherOptions options) : options_(std::move(options)) {}
  RankPublisher(const RankPublisher&) = delete;
  RankPublisher& operator=(const RankPublisher&) = delete;

  // Writes this rank's progress record when progress_period has passed since the last one and it
  // changed, in a generation whose records were asked for.
  void PublishProgress();
  // From now on PublishProgress writes in `generation` (a peer asked). Any thread.
  void WantProgress(int64_t generation) {
    progress_wanted_.store(generation, std::memory_order_release);
  }
  // Writes this rank's work record when a second has passed since the last one, once asked to.
  void PublishWork();
  // From now on PublishWork writes. Any thread.
  void WantWorkRecords() { work_wanted_.store(true, std::memory_order_release); }

 private:
  // What the last progress record said, and when it was written.
  struct PublishedProgress {
    int64_t written_ns = 0;        // clock->MonotonicNanos() when written
    int64_t last_progress_ns = 0;  // the watchdog's last_progress_ns() it reported
    std::vector<std::pair<uint64_t, int64_t>> begun;
    int64_t generation = -1;
  };

  const RankPublisherOptions options_;
  PublishedProgress published_;
  int64_t work_published_ns_ = 0;  // when PublishWork last wrote
  std::atomic<bool> work_wanted_{false};
  std::atomic<int64_t> progress_wanted_{-1};  // the generation whose records were asked for
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_RANK_PUBLISHER_H_
