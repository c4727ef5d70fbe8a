// DecideFailSlowAction: what the coordinator of `trainguard run --fail-slow` does with a host the
// fail-slow detector confirmed (sdk/health/fail_slow_detector.h): report it, or evict it (its
// ranks replaced as a dead host's are), as --fail-slow says, within the share of the job that may
// be evicted on metrics alone (--fail-slow-max-evict-share) and only when parked standbys elsewhere
// can take its ranks: evicting into nothing would fail a job that was only slow.
//
// Pure: the counts in, the decision out; no store, no clock (FailSlowCoordinator,
// sdk/coordinator, reads them and acts).
// Thread safety: a plain function.
#ifndef TRAINGUARD_SDK_AGENT_FAIL_SLOW_POLICY_H_
#define TRAINGUARD_SDK_AGENT_FAIL_SLOW_POLICY_H_

#include <string>

namespace trainguard {

// --fail-slow off|alert|evict|evict-repeated.
enum class FailSlowPolicy { kOff, kAlert, kEvict, kEvictRepeated };

// Whether the policy ever evicts (so the coordinator reads the parked standbys for it).
bool MayEvict(FailSlowPolicy policy);

struct FailSlowDecision {
  bool evict = false;
  std::string action;  // "alert", "evict", or "alert (not evicted: why)"
};

// `windows`: the verdict's continuity windows in a row; `evicted`: hosts evicted on metrics so far
// in this job; `training_hosts`: hosts holding ranks; `spare_standbys`: parked standbys on other
// hosts; `needed`: ranks per host. Evicts when the policy says so (evict-repeated: from the second
// window), at most max(1, floor(max_share x training_hosts)) hosts over the job (max_share 0:
// none), and only when the spares can take the host's ranks.
FailSlowDecision DecideFailSlowAction(FailSlowPolicy policy, int windows, int evicted,
                                      int training_hosts, double max_share, int spare_standbys,
                                      int needed);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_AGENT_FAIL_SLOW_POLICY_H_
