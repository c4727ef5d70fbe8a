#include "sdk/runtime/rank_publisher.h"

#include <algorithm>
#include <string>
#include <utility>

#include "sdk/health/fail_slow_metrics.h"
#include "sdk/runtime/peer_progress.h"

namespace trainguard {

void RankPublisher::PublishProgress() {
  if (options_.store == nullptr || options_.watchdog == nullptr ||
      options_.collectives == nullptr || options_.progress_period <= absl::ZeroDuration()) {
    return;
  }
  const int64_t generation = options_.generation();
  if (progress_wanted_.load(std::memory_order_acquire) != generation) return;  // no one reads it
  const int64_t now_ns = options_.clock->MonotonicNanos();
  if (now_ns - published_.written_ns < absl::ToInt64Nanoseconds(options_.progress_period)) {
    return;
  }
  PublishedProgress now;
  now.written_ns = now_ns;
  now.last_progress_ns = options_.watchdog->last_progress_ns();
  for (const CommunicatorProgress& p : options_.collectives->Progress()) {
    now.begun.emplace_back(p.comm_id, p.begun);
  }
  now.generation = generation;
  // Unchanged since the last record: the peers already know, and its age grows by itself.
  if (now.last_progress_ns == 0 ||
      (now.last_progress_ns == published_.last_progress_ns && now.begun == published_.begun &&
       now.generation == published_.generation)) {
    return;
  }
  runtime_internal::ProgressRecord record;
  record.published = options_.clock->Now();
  record.progress_age = absl::Nanoseconds(std::max<int64_t>(0, now_ns - now.last_progress_ns));
  record.step = options_.heartbeat->Read().step;
  record.begun = now.begun;
  if (!options_.store
           ->Set(runtime_internal::ProgressKey(now.generation, options_.rank),
                 runtime_internal::EncodeProgressRecord(record), absl::Seconds(1))
           .ok()) {
    return;  // tried again at the next period
  }
  published_ = std::move(now);
}

void RankPublisher::PublishWork() {
  if (options_.store == nullptr || options_.collectives == nullptr ||
      !work_wanted_.load(std::memory_order_acquire)) {
    return;
  }
  const int64_t now_ns = options_.clock->MonotonicNanos();
  if (now_ns - work_published_ns_ < 1'000'000'000) return;
  work_published_ns_ = now_ns;
  const HeartbeatSnapshot beat = options_.heartbeat->Read();
  RankWorkRecord record;
  record.steps = beat.steps_completed;
  record.step_ns = beat.total_step_ns;
  record.collective_ns = absl::ToInt64Nanoseconds(options_.collectives->completed_time());
  record.collective_bytes = options_.collectives->completed_bytes();
  if (options_.watchdog != nullptr) {
    for (PhaseTotal& p : options_.watchdog->PhaseTotals()) {
      if (p.name != kStepPhase) {
        record.phase_ns.emplace_back(std::move(p.name), absl::ToInt64Nanoseconds(p.total));
      }
    }
  }
  // Short: a slow store must not delay the hang watch the same thread does; a lost second is
  // filled by the detector.
  (void)options_.store->Set(RankWorkKey(options_.rank), EncodeRankWorkRecord(record),
                            absl::Milliseconds(500));
}

}  // namespace trainguard
