// FailSlowMonitor: the fail-slow detector (fail_slow_detector.h) fed with the hosts' records as the
// job's store holds them (agents/metrics/<host>, fail_slow_metrics.h): once a second the
// coordinator passes every host's latest record; only a record whose seq changed since the last
// call is a new sample (a silent host is filled, then dropped, by the detector), and the verdicts
// of that second come back.
//
// Pure computation over the records it is given: no clock, no I/O, deterministic.
// Thread safety: not thread-safe; one thread (the coordinator's loop, a test) uses an instance.
#ifndef TRAINGUARD_SDK_HEALTH_FAIL_SLOW_MONITOR_H_
#define TRAINGUARD_SDK_HEALTH_FAIL_SLOW_MONITOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sdk/health/fail_slow_detector.h"

namespace trainguard {

class FailSlowMonitor {
 public:
  explicit FailSlowMonitor(FailSlowDetector detector) : detector_(std::move(detector)) {}
  // `records`: host -> its agents/metrics/<host> value; a record that does not parse is skipped.
  // `second` increases from call to call (FailSlowDetector::Observe).
  std::vector<SuspectVerdict> Observe(int64_t second,
                                      const std::map<std::string, std::string>& records);
  // Drops `host` (evicted, dead): it is no longer compared.
  void Forget(const std::string& host);

 private:
  FailSlowDetector detector_;
  std::map<std::string, int64_t> last_seq_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_FAIL_SLOW_MONITOR_H_
