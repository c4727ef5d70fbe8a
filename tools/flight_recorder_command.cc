#include "tools/flight_recorder_command.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "tools/cli_output.pb.h"
#include "tools/print_json.h"
#include "tools/usage.h"

namespace trainguard::tools {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitDataError = 1;
constexpr int kExitUsageError = 2;

struct FlightRecorderArgs {
  std::string verb;
  std::string file;  // show FILE
  std::string job;
  std::optional<int> rank;
  std::string out;
  std::optional<int> last;
  std::optional<int> world_size;
  std::optional<int> generation;
  bool json = false;
};

std::optional<FlightRecorderArgs> Parse(const std::vector<std::string>& args) {
  FlightRecorderArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool has_value = i + 1 < args.size();
    if (arg == "--json") {
      a.json = true;
    } else if (arg == "--job" && has_value) {
      a.job = args[++i];
    } else if (arg == "--out" && has_value) {
      a.out = args[++i];
    } else if ((arg == "--rank" || arg == "--last" || arg == "--world-size" ||
                arg == "--generation") &&
               has_value) {
      int n;
      if (!absl::SimpleAtoi(args[++i], &n) || n < 0) return std::nullopt;
      (arg == "--rank"         ? a.rank
       : arg == "--last"       ? a.last
       : arg == "--world-size" ? a.world_size
                               : a.generation) = n;
    } else if (!arg.empty() && arg[0] == '-') {
      return std::nullopt;
    } else if (a.verb.empty()) {
      a.verb = arg;
    } else if (a.file.empty() && (a.verb == "show" || a.verb == "diagnose")) {
      a.file = arg;
    } else {
      return std::nullopt;
    }
  }
  const bool segment = !a.job.empty() && a.rank.has_value();
  if (a.verb != "diagnose" && (a.world_size || a.generation)) return std::nullopt;
  if (a.verb == "diagnose") {
    if (a.file.empty() || a.rank || !a.out.empty() || a.last) return std::nullopt;
    return a;
  }
  if (a.verb == "show") {
    // Either a segment (--job and --rank) or a file, not both.
    if (a.file.empty() ? !segment : (!a.job.empty() || a.rank)) return std::nullopt;
    return a.out.empty() ? std::optional(a) : std::nullopt;
  }
  if (a.verb == "dump") {
    if (!segment || a.out.empty() || a.json || a.last) return std::nullopt;
    return a;
  }
  if (a.verb == "remove") {
    if (a.job.empty() || !a.out.empty() || a.json || a.last) return std::nullopt;
    return a;
  }
  return std::nullopt;
}

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// What became of the process that wrote a segment: "running", "stopped", "exited", ... (from
// /proc; a recycled pid would read as running).
std::string WriterState(int pid) {
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  std::string line;
  if (pid <= 0 || !std::getline(stat, line)) return "exited";
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return "unknown";
  switch (line[paren + 2]) {
    case 'T':
    case 't':
      return "stopped";
    case 'Z':
    case 'X':
      return "exited";
    case 'D':
      return "running (uninterruptible wait)";
    default:
      return "running";
  }
}

constexpr char kRecordHeading[] =
    "     SEQ        T-LAST      STEP  TYPE              NAME                      COMM/SEQ"
    "                 BYTES   PEER  VALUE\n";

// One line; the time is relative to the newest record shown.
std::string RecordLine(const FlightRecord& r, int64_t newest_ns) {
  const std::string comm =
      r.comm_id == 0 && r.comm_seq == -1 ? "-" : absl::StrFormat("0x%x/%d", r.comm_id, r.comm_seq);
  const std::string peer = r.peer < 0 ? "-" : absl::StrFormat("%d", r.peer);
  return absl::StrFormat("%8d %+12.6fs %9d  %-16s  %-24s  %-20s %8d %6s  %d\n", r.seq,
                         static_cast<double>(r.time_ns - newest_ns) / 1e9, r.step,
                         FlightRecordTypeName(r.type), r.Name(), comm, r.bytes, peer, r.value);
}

std::vector<FlightRecord> LastRecords(const FlightRecorderArgs& a,
                                      const std::vector<FlightRecord>& records) {
  if (!a.last || static_cast<size_t>(*a.last) >= records.size()) return records;
  return std::vector<FlightRecord>(records.end() - *a.last, records.end());
}

int ShowSegment(const FlightRecorderArgs& a) {
  absl::StatusOr<FlightRecorderContents> c = ReadFlightRecorder(a.job, *a.rank);
  const int64_t now = MonotonicNanos();
  if (!c.ok()) {
    absl::FPrintF(stderr, "trainguard flight-recorder show: %s\n", c.status().ToString());
    return kExitDataError;
  }
  const std::vector<FlightRecord> records = LastRecords(a, c->records);
  const std::string state = WriterState(c->writer_pid);
  if (a.json) {
    // What `dump` would write now, read back.
    FlightRecorderDump dump;
    dump.rank = *a.rank;
    dump.contents = *c;
    dump.contents.records = records;
    dump.evidence = {{"writer_state", state}};
    dump.dumped_at = absl::Now();
    dump.dumped_monotonic_ns = now;
    return PrintJson(FlightRecorderDumpToJson(dump), "flight-recorder show") ? kExitOk
                                                                             : kExitDataError;
  }
  absl::PrintF(
      "segment %s: rank %d, writer pid %d (%s), capacity %d, next seq %d, %d records, %d dropped\n",
      c->segment, *a.rank, c->writer_pid, state, c->capacity, c->next_seq, c->records.size(),
      c->dropped);
  if (!records.empty()) {
    absl::PrintF("newest record %.3f s ago\n",
                 static_cast<double>(now - records.back().time_ns) / 1e9);
    absl::PrintF("%s", kRecordHeading);
    for (const FlightRecord& r : records) absl::PrintF("%s", RecordLine(r, records.back().time_ns));
  }
  return kExitOk;
}

int ShowFile(const FlightRecorderArgs& a) {
  absl::StatusOr<FlightRecorderDump> d = ReadFlightRecorderDump(a.file);
  if (!d.ok()) {
    absl::FPrintF(stderr, "trainguard flight-recorder show: %s\n", d.status().ToString());
    return kExitDataError;
  }
  const FlightRecorderContents& c = d->contents;
  const std::vector<FlightRecord> records = LastRecords(a, c.records);
  const std::string dumped_at =
      absl::FormatTime(absl::RFC3339_full, d->dumped_at, absl::UTCTimeZone());
  if (a.json) {
    FlightRecorderDump shown = *d;
    shown.contents.records = records;
    return PrintJson(FlightRecorderDumpToJson(shown), "flight-recorder show") ? kExitOk
                                                                              : kExitDataError;
  }
  absl::PrintF(
      "dump %s of segment %s: rank %d, writer pid %d, capacity %d, next seq %d, %d records, "
      "%d dropped, dumped at %s\n",
      a.file, c.segment, d->rank, c.writer_pid, c.capacity, c.next_seq, c.records.size(), c.dropped,
      dumped_at);
  if (!records.empty()) {
    absl::PrintF("newest record %.3f s before the dump\n",
                 static_cast<double>(d->dumped_monotonic_ns - records.back().time_ns) / 1e9);
    absl::PrintF("%s", kRecordHeading);
    for (const FlightRecord& r : records) absl::PrintF("%s", RecordLine(r, records.back().time_ns));
  }
  if (!d->evidence.empty()) absl::PrintF("evidence:\n");
  for (const auto& [key, value] : d->evidence) {
    if (value.find('\n') == std::string::npos) {
      absl::PrintF("  %s: %s\n", key, value);
      continue;
    }
    absl::PrintF("  %s:\n", key);
    for (absl::string_view line : absl::StrSplit(value, '\n', absl::SkipEmpty())) {
      absl::PrintF("    %s\n", line);
    }
  }
  return kExitOk;
}

int Dump(const FlightRecorderArgs& a) {
  absl::StatusOr<FlightRecorderContents> c = ReadFlightRecorder(a.job, *a.rank);
  if (!c.ok()) {
    absl::FPrintF(stderr, "trainguard flight-recorder dump: %s\n", c.status().ToString());
    return kExitDataError;
  }
  const std::vector<std::pair<std::string, std::string>> evidence = {
      {"reason", "trainguard flight-recorder dump"},
      {"writer_state", WriterState(c->writer_pid)},
  };
  if (absl::Status s = WriteFlightRecorderDump(*c, *a.rank, evidence, a.out); !s.ok()) {
    absl::FPrintF(stderr, "trainguard flight-recorder dump: %s\n", s.ToString());
    return kExitDataError;
  }
  absl::PrintF("wrote %s: %d records of %s\n", a.out, c->records.size(), c->segment);
  return kExitOk;
}

int Remove(const FlightRecorderArgs& a) {
  std::vector<int> ranks;
  if (a.rank) {
    ranks.push_back(*a.rank);
  } else {
    absl::StatusOr<std::vector<int>> found = ListFlightRecorderRanks(a.job);
    if (!found.ok()) {
      absl::FPrintF(stderr, "trainguard flight-recorder remove: %s\n", found.status().ToString());
      return kExitDataError;
    }
    if (found->empty()) {
      absl::FPrintF(stderr,
                    "trainguard flight-recorder remove: job %s has no flight recorder segment on "
                    "this host (/dev/shm%s, any rank)\n",
                    a.job, FlightRecorder::SegmentName(a.job, 0));
      return kExitDataError;
    }
    ranks = *std::move(found);
  }
  int rc = kExitOk;
  for (int rank : ranks) {
    if (absl::Status s = FlightRecorder::Remove(a.job, rank); !s.ok()) {
      absl::FPrintF(stderr, "trainguard flight-recorder remove: %s\n", s.ToString());
      rc = kExitDataError;
      continue;
    }
    absl::PrintF("removed %s\n", FlightRecorder::SegmentName(a.job, rank));
  }
  return rc;
}

// Reads the dumps in a run's flight_recorder directory (and, with --job, the live rings of ranks
// that wrote none) and names the suspects (hang_diagnosis.h).
int Diagnose(const FlightRecorderArgs& a) {
  // The run directory or its flight_recorder folder.
  std::string dir = a.file;
  std::error_code error;
  if (std::filesystem::is_directory(dir + "/flight_recorder", error)) dir += "/flight_recorder";
  absl::StatusOr<std::vector<FlightRecorderDump>> dumps =
      ReadHangDumps(dir, a.generation ? *a.generation : -1);
  if (!dumps.ok()) {
    absl::FPrintF(stderr, "trainguard flight-recorder diagnose: %s\n", dumps.status().ToString());
    return kExitDataError;
  }
  HangEvidence evidence;
  evidence.dumps = *std::move(dumps);
  evidence.world_size = a.world_size.value_or(0);
  if (!a.job.empty()) {
    absl::StatusOr<std::vector<int>> live = ListFlightRecorderRanks(a.job);
    for (int rank : live.ok() ? *live : std::vector<int>{}) {
      absl::StatusOr<FlightRecorderContents> ring = ReadFlightRecorder(a.job, rank);
      if (ring.ok()) evidence.live_rings[rank] = *std::move(ring);
    }
  }
  const HangDiagnosis d = DiagnoseHang(evidence);
  if (!a.json) {
    absl::PrintF("%s\n", d.ToString());
    return kExitOk;
  }
  cli::HangDiagnosisReport report;
  report.set_dir(dir);
  report.set_generation(d.generation);
  report.mutable_suspects()->Add(d.suspects.begin(), d.suspects.end());
  report.mutable_dumped()->Add(d.dumped.begin(), d.dumped.end());
  report.mutable_missing()->Add(d.missing.begin(), d.missing.end());
  for (const LaggardReport& r : d.laggards) {
    cli::HangDiagnosisReport::Laggard* laggard = report.add_laggards();
    laggard->set_comm_id(r.comm_id);
    laggard->set_comm_seq(r.comm_seq);
    laggard->set_op(r.op);
    laggard->mutable_laggards()->Add(r.laggards.begin(), r.laggards.end());
    laggard->mutable_waiting()->Add(r.waiting.begin(), r.waiting.end());
    laggard->set_text(r.ToString());
  }
  report.mutable_stack_outliers()->Add(d.stack_outliers.begin(), d.stack_outliers.end());
  for (const StackGroup& g : d.stack_groups) {
    cli::HangDiagnosisReport::StackGroup* group = report.add_stack_groups();
    group->mutable_ranks()->Add(g.ranks.begin(), g.ranks.end());
    group->mutable_modules()->Add(g.modules.begin(), g.modules.end());
    group->mutable_frames()->Add(g.frames.begin(), g.frames.end());
  }
  report.set_text(d.ToString());
  return PrintJson(report, "flight-recorder diagnose") ? kExitOk : kExitDataError;
}

}  // namespace

std::string FlightRecorderUsage() {
  return "usage: trainguard flight-recorder show --job J --rank R [--json] [--last N]\n"
         "       trainguard flight-recorder show FILE [--json] [--last N]\n"
         "       trainguard flight-recorder dump --job J --rank R --out FILE\n"
         "       trainguard flight-recorder remove --job J [--rank R]\n"
         "       trainguard flight-recorder diagnose RUN_DIR [--job J] [--world-size N]\n"
         "                                           [--generation G] [--json]\n";
}

namespace {

constexpr char kFlightRecorderExitStatus[] =
    "\nExit status: 0 success, 1 a segment or file is missing, unreadable or not a flight\n"
    "recorder's, 2 bad usage.\n";

// What --help prints: the usage of `verb`, or of the whole command when no verb was named.
std::string FlightRecorderHelp(const std::string& verb) {
  if (verb == "show") {
    return absl::StrCat(
        "usage: trainguard flight-recorder show --job J --rank R [--json] [--last N]\n"
        "       trainguard flight-recorder show FILE [--json] [--last N]\n\n"
        "Prints the live ring of rank R of job J (read from shared memory while the rank runs,\n"
        "hangs, is stopped or after it died), or a dump FILE and its evidence: one line per\n"
        "record, the last N only with --last.\n",
        kFlightRecorderExitStatus);
  }
  if (verb == "dump") {
    return absl::StrCat(
        "usage: trainguard flight-recorder dump --job J --rank R --out FILE\n\n"
        "Saves the live ring of rank R of job J to FILE (protobuf, written atomically).\n",
        kFlightRecorderExitStatus);
  }
  if (verb == "remove") {
    return absl::StrCat(
        "usage: trainguard flight-recorder remove --job J [--rank R]\n\n"
        "Removes the shared-memory segment of rank R of job J, or every rank's without --rank.\n",
        kFlightRecorderExitStatus);
  }
  if (verb == "diagnose") {
    return absl::StrCat(
        "usage: trainguard flight-recorder diagnose RUN_DIR [--job J] [--world-size N]\n"
        "                                           [--generation G] [--json]\n\n"
        "Reads the hang dumps in RUN_DIR/flight_recorder (of generation G; default: the newest\n"
        "generation a dump names) and, with --job, the live rings of ranks that wrote none, and\n"
        "names the suspects of the hang. With --world-size, ranks in [0, N) with no dump are\n"
        "reported missing.\n",
        kFlightRecorderExitStatus);
  }
  return absl::StrCat(FlightRecorderUsage(),
                      "\n"
                      "Reads the flight recorder of a rank and the dumps of a hang.\n"
                      "  show      a rank's live ring, or a dump file\n"
                      "  dump      save a rank's live ring to a file\n"
                      "  remove    remove a job's shared-memory segments\n"
                      "  diagnose  name the suspects of a hang from the ranks' dumps\n"
                      "`trainguard flight-recorder VERB --help` describes one verb.\n",
                      kFlightRecorderExitStatus);
}

}  // namespace

int RunFlightRecorderCommand(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) {
    // The verb, when one was named, is the first word; an unknown one is still bad usage.
    const std::string verb = args.empty() || args[0].starts_with("-") ? "" : args[0];
    if (!verb.empty() && verb != "show" && verb != "dump" && verb != "remove" &&
        verb != "diagnose") {
      absl::FPrintF(stderr, "trainguard flight-recorder: unknown verb %s\n%s", verb,
                    FlightRecorderUsage());
      return kExitUsageError;
    }
    absl::PrintF("%s", FlightRecorderHelp(verb));
    return kExitOk;
  }
  std::optional<FlightRecorderArgs> a = Parse(args);
  if (!a) {
    absl::FPrintF(stderr, "%s", FlightRecorderUsage());
    return kExitUsageError;
  }
  if (a->verb == "show") return a->file.empty() ? ShowSegment(*a) : ShowFile(*a);
  if (a->verb == "dump") return Dump(*a);
  if (a->verb == "diagnose") return Diagnose(*a);
  return Remove(*a);
}

}  // namespace trainguard::tools
