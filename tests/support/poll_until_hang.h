// PollUntilHang: drives a Watchdog whose monitor thread is off (poll_period zero) on a ManualClock,
// the way the watchdog tests make time exact and independent of the machine's speed.
//
// Thread safety: call from the test's thread only.
#ifndef TRAINGUARD_TESTS_SUPPORT_POLL_UNTIL_HANG_H_
#define TRAINGUARD_TESTS_SUPPORT_POLL_UNTIL_HANG_H_

#include <optional>

#include "absl/time/time.h"
#include "trainguard/clock.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace testing {

// Advances `clock` by `step` and polls `watchdog`, again and again, until it declares a hang
// (returns the time advanced by then) or `limit` has been advanced (returns nullopt).
inline std::optional<absl::Duration> PollUntilHang(ManualClock& clock, Watchdog& watchdog,
                                                   absl::Duration step, absl::Duration limit) {
  for (absl::Duration t; t < limit;) {
    clock.Advance(step);
    t += step;
    if (watchdog.PollOnce() > 0) return t;
  }
  return std::nullopt;
}

}  // namespace testing
}  // namespace trainguard

#endif  // TRAINGUARD_TESTS_SUPPORT_POLL_UNTIL_HANG_H_
