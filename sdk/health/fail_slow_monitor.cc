// The detector fed with the hosts' records: see fail_slow_monitor.h.
#include "sdk/health/fail_slow_monitor.h"

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/health/fail_slow_metrics.h"

namespace trainguard {

std::vector<SuspectVerdict> FailSlowMonitor::Observe(
    int64_t second, const std::map<std::string, std::string>& records) {
  std::vector<FailSlowSample> samples;
  for (const auto& [host, text] : records) {
    absl::StatusOr<HostMetricsRecord> record = ParseHostMetricsRecord(text);
    if (!record.ok()) continue;
    auto [it, inserted] = last_seq_.try_emplace(host, record->seq);
    if (!inserted && it->second == record->seq) continue;  // nothing new from this host
    it->second = record->seq;
    for (const auto& [metric, value] : record->metrics) {
      samples.push_back({host, metric, value, record->work});
    }
  }
  return detector_.Observe(second, samples);
}

void FailSlowMonitor::Forget(const std::string& host) {
  detector_.Forget(host);
  last_seq_.erase(host);
}

}  // namespace trainguard
