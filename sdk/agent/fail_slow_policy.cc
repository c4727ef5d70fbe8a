// What the coordinator does with a confirmed fail-slow suspect: see fail_slow_policy.h.
#include "sdk/agent/fail_slow_policy.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace trainguard {

bool MayEvict(FailSlowPolicy policy) {
  return policy == FailSlowPolicy::kEvict || policy == FailSlowPolicy::kEvictRepeated;
}

FailSlowDecision DecideFailSlowAction(FailSlowPolicy policy, int windows, int evicted,
                                      int training_hosts, double max_share, int spare_standbys,
                                      int needed) {
  FailSlowDecision d;
  d.action = "alert";
  const bool wants = policy == FailSlowPolicy::kEvict ||
                     (policy == FailSlowPolicy::kEvictRepeated && windows >= 2);
  if (!wants) {
    if (policy == FailSlowPolicy::kEvictRepeated) {
      d.action = "alert (evict-repeated: evicted if it is still the outlier one window later)";
    }
    return d;
  }
  const int may_evict =
      max_share <= 0 ? 0 : std::max(1, static_cast<int>(max_share * training_hosts));
  if (evicted >= may_evict) {
    d.action = absl::StrFormat(
        "alert (not evicted: %d of at most %d host(s) evicted on metrics alone, "
        "--fail-slow-max-evict-share %g)",
        evicted, may_evict, max_share);
  } else if (spare_standbys < needed) {
    d.action = absl::StrFormat("alert (not evicted: %d parked standby(s) elsewhere, %d needed)",
                               spare_standbys, needed);
  } else {
    d.evict = true;
    d.action = "evict";
  }
  return d;
}

}  // namespace trainguard
