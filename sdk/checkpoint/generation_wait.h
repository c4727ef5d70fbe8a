// WaitUnlessSuperseded: Store::Wait that gives up once the rank's generation is superseded. A rank
// that died, or failed at start-up, never writes its keys; the ranks waiting for them must meet
// its replacement in the newer generation instead of waiting out their timeout.
//
// Thread safety: as the store's Wait; `superseded` may be called from this thread.
#ifndef TRAINGUARD_SDK_CHECKPOINT_GENERATION_WAIT_H_
#define TRAINGUARD_SDK_CHECKPOINT_GENERATION_WAIT_H_

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainguard/store.h"

namespace trainguard {

// How often a wait checks whether its generation was superseded.
inline constexpr absl::Duration kSupersededPoll = absl::Milliseconds(250);

// store.Wait(keys, timeout), in slices of kSupersededPoll between which it asks `superseded`
// (empty: one plain Wait). Aborted "a newer generation was published meanwhile" once it says yes;
// else the Wait's own result (DeadlineExceeded at `timeout`).
inline absl::Status WaitUnlessSuperseded(Store& store, const std::vector<std::string>& keys,
                                         absl::Duration timeout,
                                         const std::function<bool()>& superseded) {
  if (!superseded) return store.Wait(keys, timeout);
  const absl::Time deadline = absl::Now() + timeout;  // a bound on a wait: real time
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    absl::Status s = store.Wait(keys, std::min(left, kSupersededPoll));
    if (!absl::IsDeadlineExceeded(s) || left <= kSupersededPoll) return s;
    if (superseded()) return absl::AbortedError("a newer generation was published meanwhile");
  }
}

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_GENERATION_WAIT_H_
