// The records behind the fail-slow detector (fail_slow_detector.h), as they travel through the
// job's store (docs/FORMATS.md), out of band of the training traffic:
//
//   health/work_wanted      written by a host agent that samples its host (`trainguard run
//                           --fail-slow`): until it exists, ranks write no work record (nothing
//                           else reads them), and a rank's store traffic is a second's request
//                           less.
//   health/rank/<rank>      written by each rank's Runtime (its duty thread) once a second, once
//                           health/work_wanted exists:
//                           "v1 <steps_completed> <step_ns_total> <collective_ns_total>
//                           <collective_bytes_total>": guarded steps finished, their durations
//                           summed, and the durations and the bytes of its completed collectives
//                           summed (monotonic counters of this process), then "<phase>=<ns>" per
//                           watchdog phase name other than the guard's "step": its completed
//                           phases' durations summed (Watchdog::PhaseTotals). A record of four
//                           fields (written before the bytes existed) reads with 0 bytes.
//   agents/metrics/<host>   written by each host's agent (`trainguard run`) once a second, read by
//                           the coordinator: "v1 <seq> <work> <metric>=<value> ...": the host's
//                           sample of the last second; <work> steps per rank in that second.
//
// One key per rank and per host, overwritten: the store holds O(hosts + ranks) short lines whatever
// the job's length. A counter that went backwards (a replacement process took the rank) restarts
// the deltas.
//
// Thread safety: plain functions and values.
#ifndef TRAINGUARD_SDK_HEALTH_FAIL_SLOW_METRICS_H_
#define TRAINGUARD_SDK_HEALTH_FAIL_SLOW_METRICS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/core/agent_keys.h"

namespace trainguard {

struct RankWorkRecord {
  int64_t steps = 0;
  int64_t step_ns = 0;
  int64_t collective_ns = 0;
  int64_t collective_bytes = 0;
  // Phase name (characters other than letters, digits and "_.-/" written as "_") -> its time.
  std::vector<std::pair<std::string, int64_t>> phase_ns;
};

std::string RankWorkKey(int rank);
inline constexpr char kRankWorkWantedKey[] = "health/work_wanted";
std::string EncodeRankWorkRecord(const RankWorkRecord& record);
// InvalidArgument naming the field that does not parse.
absl::StatusOr<RankWorkRecord> ParseRankWorkRecord(std::string_view text);

struct HostMetricsRecord {
  int64_t seq = 0;  // advances with every sample: an unchanged seq is no new sample
  double work = 0;  // steps per rank in the sampled second
  std::vector<std::pair<std::string, double>> metrics;  // name (no spaces or '='), value
};

std::string HostMetricsKey(std::string_view host);
inline constexpr const char* kHostMetricsPrefix = store_keys::kAgentMetrics.prefix();
std::string EncodeHostMetricsRecord(const HostMetricsRecord& record);
absl::StatusOr<HostMetricsRecord> ParseHostMetricsRecord(std::string_view text);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_FAIL_SLOW_METRICS_H_
