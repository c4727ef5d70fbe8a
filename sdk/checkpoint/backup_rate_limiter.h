// BackupRateLimiter: the token bucket that paces the pushes of one process (PeerBackups shares one
// among a rank's pushes), so that backups leave bandwidth to training. Thread-safe.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_RATE_LIMITER_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_RATE_LIMITER_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace trainguard {

class Clock;

// Sends at most `bytes_per_second` (0: unlimited), in chunks. Each Acquire reserves the link for
// bytes / rate after the previous reservation ends (or now, if that is later) and waits until its
// reservation starts, so a first chunk goes at once and N bytes in chunks take at least (N - the
// last chunk) / rate. Time is `clock`'s (nullptr: Clock::Real()): on a ManualClock the waits
// advance the clock and return at once.
class BackupRateLimiter {
 public:
  explicit BackupRateLimiter(uint64_t bytes_per_second, Clock* clock = nullptr);
  BackupRateLimiter(const BackupRateLimiter&) = delete;
  BackupRateLimiter& operator=(const BackupRateLimiter&) = delete;

  // Blocks until `bytes` may be sent, or `deadline`, or `cancel`; false when it gave up. Gives up
  // at once, reserving nothing, when the bytes would be free only after `deadline` (a deadline
  // is wall time, compared with the clock's Now()). A reservation whose wait is cancelled is
  // still spent.
  bool Acquire(uint64_t bytes, absl::Time deadline, const std::atomic<bool>* cancel);
  uint64_t bytes_per_second() const { return rate_; }

 private:
  const uint64_t rate_;
  Clock* const clock_;
  std::atomic<int64_t> next_free_ns_{0};  // on clock_'s monotonic time
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_RATE_LIMITER_H_
