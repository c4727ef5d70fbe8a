// What the coordinator keeps and writes so that a fail-slow detection can be looked at afterwards
// (docs/GUIDE.md, "Fail-slow hosts"; the file format: docs/FORMATS.md).
//
// HostMetricsHistory: a bounded ring of the last `seconds` seconds of every host's per-second
// record (agents/metrics/<host>) as the coordinator read them. When it confirms a suspect, the
// coordinator (FailSlowCoordinator, sdk/coordinator) writes the ring to
// <run_dir>/events/fail_slow/<unix-second>-<host>.trace (WriteFailSlowDump): a header line starting
// with '#' (the verdict), then one "<second> <host> <record>" line per host per second, the
// --fail-slow-trace format, so a dump replays in bench/bench_fail_slow (which skips the header).
// The dump holds what the ring has at the detection: the seconds up to and including the
// detecting one. Not the seconds after it: an evicted host stops reporting at once and a
// coordinator that dies later would lose a dump held back for them; and the detection needed
// `continuity` seconds of the degradation already, which the 120 s ring covers at the default
// continuity of 30 s.
//
// ParseFailSlowDump / ListFailSlowDumps: the reading side, for `trainguard report`.
//
// Thread safety: HostMetricsHistory is not thread-safe (the coordinator's loop thread uses it);
// the functions are safe to call from any thread on distinct directories.
#ifndef TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DUMP_H_
#define TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DUMP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainguard/env.h"

namespace trainguard {

class HostMetricsHistory {
 public:
  // REQUIRES: seconds >= 1.
  explicit HostMetricsHistory(int seconds = 120) : seconds_(seconds) {}

  // One second's records (host -> its agents/metrics value). Seconds increase; the ring keeps the
  // seconds in (last - seconds, last].
  void Record(int64_t second, const std::map<std::string, std::string>& records);

  // FailSlowTraceLines of every held second, oldest first.
  std::string Lines() const;
  size_t seconds_held() const { return ring_.size(); }

 private:
  int seconds_;
  std::deque<std::pair<int64_t, std::map<std::string, std::string>>> ring_;
};

// "<second> <host> <record>\n" for each host of one second's records (host -> its agents/metrics
// value): the lines of a dump and of the --fail-slow-trace file.
std::string FailSlowTraceLines(int64_t second, const std::map<std::string, std::string>& records);

// The verdict a dump was written for: its header line.
struct FailSlowDumpHeader {
  std::string host;
  std::string metric;
  double z = 0;
  double deviation = 0;
  int windows = 0;
  int64_t second = 0;       // the coordinator's fail-slow second of the detection
  int64_t unix_second = 0;  // wall clock of the detection
  std::string action;       // as in the suspect_host event (may hold spaces)
};

// "# suspect_host host=H metric=M z=Z deviation=D windows=W second=S unix=U action=A...".
std::string FormatFailSlowDumpHeader(const FailSlowDumpHeader& header);

// The directory of a run's dumps: <run_dir>/events/fail_slow.
std::string FailSlowDumpDir(const std::string& run_dir);

// Writes <dir>/<unix_second>-<host>.trace holding the header and `lines`, through a temporary
// file renamed into place (a reader never sees a partial dump; not fsync'ed: a dump is
// diagnostics, and the coordinator's loop must not wait on a slow disk), then removes the oldest
// dumps of `dir` beyond `max_dumps` (by unix second, then name). Returns the dump's path; an error
// names the file it could not write.
absl::StatusOr<std::string> WriteFailSlowDump(Env* env, const std::string& dir,
                                              const FailSlowDumpHeader& header,
                                              const std::string& lines, int max_dumps = 16);

// One host's value of every metric in one second of a dump.
struct FailSlowDumpPoint {
  int64_t second = 0;
  double work = 0;
  std::map<std::string, double> metrics;
};

struct FailSlowDump {
  FailSlowDumpHeader header;
  std::map<std::string, std::vector<FailSlowDumpPoint>> hosts;  // by host, seconds increasing
};

// InvalidArgument naming the line that does not parse (a record line that is not
// "<second> <host> v1 ..." or a header that is not the one above).
absl::StatusOr<FailSlowDump> ParseFailSlowDump(const std::string& text);

// The paths of <dir>'s dumps (*.trace), oldest first; none when the directory does not exist.
std::vector<std::string> ListFailSlowDumps(Env* env, const std::string& dir);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_FAIL_SLOW_DUMP_H_
