#include "sdk/rendezvous/busy_poll.h"

#include <algorithm>

namespace trainguard {

absl::Duration BusyPoll::NextWait() {
  if (budget_ <= absl::ZeroDuration()) return absl::ZeroDuration();
  if (skip_ > 0) {
    --skip_;
    return absl::ZeroDuration();
  }
  return budget_;
}

void BusyPoll::Record(bool answered) {
  if (answered) {
    skip_after_miss_ = 0;
    return;
  }
  // 1, 3, 7, ... waits block at once: the longer polling keeps missing, the rarer it is tried.
  skip_after_miss_ = std::min(2 * skip_after_miss_ + 1, kMaxSkippedWaits);
  skip_ = skip_after_miss_;
}

bool PollingSlots::TryAcquire() {
  int free = free_.load(std::memory_order_relaxed);
  while (free > 0) {
    if (free_.compare_exchange_weak(free, free - 1, std::memory_order_acquire)) return true;
  }
  return false;
}

void PollingSlots::Release() { free_.fetch_add(1, std::memory_order_release); }

}  // namespace trainguard
