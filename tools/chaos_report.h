// ChaosReport: what a chaos run's events say about effective training time, and `trainguard report`.
//
// A chaos run (tools/chaos_command.h) leaves, in its run dir's events/: the faults it injected
// (chaos.tgev: custom events what=chaos_inject with the ground truth kind, rank and pid, written
// before the signal; what=chaos_run_start / chaos_run_end bracketing the run), the launcher's
// observations (launcher.tgev: rank_died, rank_unresponsive, hang_suspect, recovered, restart_all)
// and the ranks' own events (step faults, hangs, and with the example trainer's --progress-events
// one what=step_done per successful step of rank 0). AnalyzeRun turns those into:
//
//   ETTR          the time spent on kept steps / the run's wall time. A step done event is kept
//                 when no later step done event has a step number <= its own (it was not rolled
//                 back and redone). A kept step's time is the interval since the step done event
//                 before it, counted only when that event is the previous step's, from the same
//                 process (pid) in the same generation: the first step after a recovery carries
//                 the recovery in its interval and counts nothing.
//   per fault     detection latency (inject -> the first event that saw it: for kill the
//                 launcher's rank_died; for stop a hang event, rank_unresponsive, hang_suspect or
//                 rank_died; for nan a step fault whose message says "non-finite values"; for drop
//                 a communication failure, generation_renewed or restart_all: no culprit; for
//                 host_kill and partition the launcher's host_lost), the culprit named (the rank
//                 of rank_died for kill, of hang_suspect or rank_unresponsive for stop, of the
//                 non-finite step fault for nan; the host of host_lost for a host fault) against
//                 the ground truth, time to recovery (inject -> the first step done beyond the last
//                 step done before the fault; for a host fault, done after the launcher's
//                 recovered event naming the host, when there is one: a step in flight may end
//                 after the host is cut off; for a stop, done after its detection: a step in flight
//                 may end after the rank stopped), and steps lost (steps done before the fault that
//                 were done again after it).
//                 Evidence is looked for up to 60 s after the injection; an event naming a process
//                 (attribute pid, with on_host on simulated hosts) that another injection hit is
//                 never credited to this fault, and an event naming a culprit is credited to one
//                 fault only (the one whose process or host it names, else the earliest), so
//                 overlapping faults are told apart. An event that names no process (a hang event)
//                 is credited to a fault only while the faulty process lives: once the launcher
//                 saw it die (rank_died naming it), restarted every rank (restart_all) or lost its
//                 host (host_lost), the fault was cleared (cleared_by) and a later such event is
//                 another fault's.
//   longest unproductive stretch   the longest part of the run in no kept step's interval.
//   suspect hosts  every suspect_host event of the fail-slow detector (docs/GUIDE.md, "Fail-slow
//                 hosts"): when, the host, the metric, z, the continuity windows, the action.
//
// With --png, each fail-slow dump of the run (<run_dir>/events/fail_slow/*.trace,
// sdk/health/fail_slow_dump.h) is also drawn: one PNG per dump, one panel per metric, one line per
// host, the suspect host highlighted and the detection second marked.
//
// Everything is a pure function of the events given: exact and deterministic, so it is unit-tested
// on hand-made streams (tests/unit/chaos_report_test.cc).
//
// Thread safety: free functions on values; RunReportCommand writes to stdout and files.
#ifndef TRAINGUARD_TOOLS_CHAOS_REPORT_H_
#define TRAINGUARD_TOOLS_CHAOS_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/health/fail_slow_dump.h"
#include "trainguard/events.h"

namespace trainguard::tools {

// One injected fault and what the events say became of it.
struct FaultOutcome {
  // "kill", "stop", "nan", "drop" (which has no culprit); on simulated hosts also "host_kill" and
  // "partition" (IsHostFault: the culprit is a host).
  std::string kind;
  int rank = -1;     // the ground truth (a host fault: the first rank the host held)
  int64_t pid = -1;  // in the PID namespace of `host` when there is one
  // The host hit (a host fault), or the host the process runs on; "" on a single host.
  std::string host;
  std::string ranks;  // a host fault: the ranks the host held ("2,3")
  absl::Duration injected_at;  // since the run's start
  std::optional<absl::Duration> detection_latency;
  std::string detected_by;  // the detecting event's what (or event type name)
  std::optional<int> culprit_named;  // the rank the system acted on; nullopt: none named
  std::optional<std::string> culprit_host_named;  // a host fault: the host declared lost
  // The event that ended the faulty process before anything detected the fault (a restart of
  // every rank for another fault, say): the fault was cleared, not detected. "" otherwise.
  std::string cleared_by;
  bool culprit_correct() const {
    if (IsHostFault(kind)) return culprit_host_named.has_value() && *culprit_host_named == host;
    return culprit_named.has_value() && *culprit_named == rank;
  }
  static bool IsHostFault(const std::string& kind) {
    return kind == "host_kill" || kind == "partition";
  }
  std::optional<absl::Duration> time_to_recovery;
  int64_t steps_lost = 0;
};

// A point of the progress curve: a step done event.
struct ProgressPoint {
  absl::Duration at;  // since the run's start
  int64_t step = 0;
};

// A suspect_host event of the fail-slow detector.
struct SuspectDetection {
  absl::Duration at;  // since the run's start
  std::string host;
  std::string metric;
  double z = 0;
  int windows = 0;
  std::string action;
};

struct RunAnalysis {
  std::string mode;  // chaos_run_start's mode attribute ("trainguard", "baseline"), or ""
  absl::Duration wall;
  absl::Duration productive;
  double ettr = 0;  // productive / wall; 0 for an empty run
  int64_t steps_kept = 0;
  int64_t last_step = -1;
  absl::Duration median_step;  // of the counted intervals
  absl::Duration longest_unproductive;
  absl::Duration longest_unproductive_from;  // since the run's start
  std::vector<FaultOutcome> faults;
  std::vector<ProgressPoint> progress;
  std::vector<SuspectDetection> suspects;
  // Hangs a rank's watchdog declared (kHang events but the peers' "remote" ones), and those of
  // them withdrawn because the wait ended by itself (a stall: no abort, no one replaced).
  int hangs_declared = 0;
  int hangs_withdrawn = 0;
  int faults_detected() const;
  int faults_recovered() const;
  int culprits_correct() const;
};

// Analyses one run's events (any order; every file's of one run dir together). Requires no
// particular event: an empty stream gives an empty analysis.
RunAnalysis AnalyzeRun(std::vector<Event> events);

// Reads every *.tgev of RUN_DIR/events. NotFound names the directory when it has none.
absl::StatusOr<std::vector<Event>> ReadRunEvents(const std::string& run_dir);

// The text report of one or two runs (a baseline second: side by side, and their ETTR ratio).
std::string FormatReport(const std::vector<RunAnalysis>& runs);
// The same as one JSON object: {"runs": [...], "ettr_ratio": x} (the ratio only with two runs).
std::string ReportJson(const std::vector<RunAnalysis>& runs);

// Writes a PNG of committed step over wall time, every fault marked, one line per run, by running
// gnuplot (Debian package gnuplot-nox). FailedPrecondition says so when gnuplot is missing.
absl::Status PlotRuns(const std::vector<RunAnalysis>& runs, const std::string& png_path);

// The gnuplot script that draws one fail-slow dump into `png_path`: a multiplot of one panel per
// metric the dump holds (in the detector's priority order; a per-step metric divided by the work
// of its second, as the detector sees it), x the seconds relative to the detection (0, marked by
// a dashed line), one line per host read from `data_dir`/host-<i>.dat (PlotFailSlowDump writes
// them; i the host's index in dump.hosts), the suspect host thick and red, the others thin.
std::string FailSlowPlotScript(const FailSlowDump& dump, const std::string& data_dir,
                               const std::string& png_path);
// Writes the data files and the script under `png_path`.data/ and runs gnuplot.
// FailedPrecondition when gnuplot is missing.
absl::Status PlotFailSlowDump(const FailSlowDump& dump, const std::string& png_path);
// The PNG of dump `dump_path` next to the report's --png FILE: FILE's stem, "-fail-slow-", the
// dump's name without .trace, ".png".
std::string FailSlowPngPath(const std::string& png_path, const std::string& dump_path);

// `trainguard report RUN_DIR [--json] [--png FILE]`; returns the exit status.
int RunReportCommand(const std::vector<std::string>& args);
std::string ReportUsage();

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_CHAOS_REPORT_H_
