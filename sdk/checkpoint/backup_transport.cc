#include "sdk/checkpoint/backup_transport.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace trainguard {

absl::StatusOr<absl::Duration> NextStreamWait(const char* doing, const std::string& peer,
                                              absl::Time now, absl::Time deadline,
                                              absl::Time last_progress,
                                              absl::Duration idle_timeout,
                                              const std::atomic<bool>* cancel) {
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);
  if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
    return absl::CancelledError(absl::StrFormat("%s %s: cancelled", doing, peer));
  }
  if (now >= deadline) {
    return absl::DeadlineExceededError(absl::StrFormat("%s %s: the deadline passed", doing, peer));
  }
  if (now - last_progress >= idle_timeout) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s %s: the peer was silent for %s", doing, peer, absl::FormatDuration(idle_timeout)));
  }
  absl::Duration wait = std::min(deadline - now, last_progress + idle_timeout - now);
  if (cancel != nullptr) wait = std::min(wait, kCancelPoll);
  return wait;
}

}  // namespace trainguard
