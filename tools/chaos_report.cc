// `trainguard report`: see chaos_report.h.
#include "tools/chaos_report.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "sdk/core/proto_json.h"
#include "sdk/health/fail_slow_detector.h"
#include "tools/usage.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

extern char** environ;

namespace trainguard::tools {
namespace {

bool Is(const Event& e, EventKind kind) { return KindOf(e) == kind; }

bool IsLauncher(const Event& e, EventKind kind) {
  return Is(e, kind) && e.Attribute("source") == "launcher";
}

// The name of the event that detected or cleared a fault: its kind, else its type.
std::string DetectorName(const Event& e) {
  const std::optional<EventKind> kind = KindOf(e);
  return std::string(kind.has_value() ? EventKindName(*kind) : EventTypeName(e.type));
}

int64_t AttributeInt(const Event& e, std::string_view key, int64_t fallback) {
  int64_t v = 0;
  return absl::SimpleAtoi(std::string(e.Attribute(key)), &v) ? v : fallback;
}

struct StepDone {
  absl::Time time;
  int64_t step;
  int64_t generation;
  std::string pid;
};

// The event that detected a fault of `kind`, and the rank it names as the culprit (nullopt: it
// names none, e.g. a hang declared by a waiting rank).
struct Detection {
  bool detects = false;
  std::optional<int> culprit;
};

Detection Detects(const std::string& kind, const Event& e) {
  if (kind == "kill") {
    if (IsLauncher(e, EventKind::kRankDied)) return {true, e.rank};
    return {};
  }
  if (kind == "stop") {
    if (IsLauncher(e, EventKind::kHangSuspect) || IsLauncher(e, EventKind::kRankUnresponsive))
      return {true, e.rank};
    if (IsLauncher(e, EventKind::kRankDied)) return {true, std::nullopt};
    if (e.type == EventType::kHang) return {true, std::nullopt};
    return {};
  }
  if (kind == "drop") {  // nobody is at fault: the job renews its generation (or restarts)
    if (IsLauncher(e, EventKind::kGenerationRenewed) || IsLauncher(e, EventKind::kRestartAll))
      return {true, {}};
    if (e.type == EventType::kStepFault && e.Attribute("fault") == "communication_failure") {
      return {true, std::nullopt};
    }
    return {};
  }
  if (FaultOutcome::IsHostFault(kind)) {
    if (IsLauncher(e, EventKind::kHostLost))
      return {true, std::nullopt};  // named by host: HostNamed
    return {};
  }
  if (kind == "nan") {
    if (e.type == EventType::kStepFault && absl::StrContains(e.message, "non-finite values")) {
      return {true, e.rank};
    }
    return {};
  }
  return {};
}

// When an event detected what it reports: its time, but for a hang the declaration, `dump_ms`
// before the event (a rank writes its hang event once it has dumped every thread's stack).
absl::Time DetectedAt(const Event& e) {
  if (e.type != EventType::kHang) return e.time;
  return e.time - absl::Milliseconds(std::max<int64_t>(0, AttributeInt(e, "dump_ms", 0)));
}

// How long after its injection a fault's evidence is looked for.
constexpr absl::Duration kEvidenceWindow = absl::Seconds(60);

// The pid an event names (attribute pid), or -1.
int64_t EventPid(const Event& e) { return AttributeInt(e, "pid", -1); }

// The process an event names: "<host>:<pid>" (pids are per host on simulated hosts: the launcher's
// on_host, the injection's host), or "" when it names none.
std::string ProcessKey(const Event& e) {
  const int64_t pid = EventPid(e);
  if (pid < 0) return "";
  const bool inject = Is(e, EventKind::kChaosInject);
  return absl::StrCat(std::string(e.Attribute(inject ? "host" : "on_host")), ":", pid);
}

// The host a launcher event names as lost (host_lost), or nullopt.
std::optional<std::string> HostNamed(const Event& e) {
  if (!IsLauncher(e, EventKind::kHostLost)) return std::nullopt;
  return std::string(e.Attribute("host"));
}

// Whether `e` ends the faulty process of rank fault `f` (key `process`): the launcher saw it die,
// restarted every rank, or lost its host.
bool EndsProcess(const FaultOutcome& f, const std::string& process, const Event& e) {
  if (IsLauncher(e, EventKind::kRankDied)) return !process.empty() && ProcessKey(e) == process;
  if (IsLauncher(e, EventKind::kRestartAll)) return true;
  if (IsLauncher(e, EventKind::kHostLost)) return !f.host.empty() && e.Attribute("host") == f.host;
  return false;
}

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.3f", absl::ToDoubleSeconds(d)); }
std::string OptSeconds(const std::optional<absl::Duration>& d) {
  return d.has_value() ? Seconds(*d) : "-";
}
std::string JsonOptSeconds(const std::optional<absl::Duration>& d) {
  return d.has_value() ? Seconds(*d) : "null";
}

}  // namespace

int RunAnalysis::faults_detected() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) {
    return f.detection_latency.has_value();
  }));
}
int RunAnalysis::faults_recovered() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) {
    return f.time_to_recovery.has_value();
  }));
}
int RunAnalysis::culprits_correct() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(),
                                        [](const FaultOutcome& f) { return f.culprit_correct(); }));
}

RunAnalysis AnalyzeRun(std::vector<Event> events) {
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.time < b.time; });
  RunAnalysis run;
  if (events.empty()) return run;
  absl::Time start = events.front().time;
  absl::Time end = events.back().time;
  std::vector<StepDone> done;
  std::vector<const Event*> injections;
  for (const Event& e : events) {
    const std::optional<EventKind> kind = KindOf(e);
    if (kind == EventKind::kChaosRunStart) {
      start = e.time;
      run.mode = std::string(e.Attribute("mode"));
    } else if (kind == EventKind::kChaosRunEnd) {
      end = e.time;
    } else if (kind == EventKind::kChaosInject) {
      injections.push_back(&e);
    } else if (kind == EventKind::kStepDone) {
      done.push_back({e.time, e.step, e.generation, std::string(e.Attribute("pid"))});
    }
  }
  // Only what happened inside the run counts.
  std::erase_if(done, [&](const StepDone& d) { return d.time < start || d.time > end; });
  run.wall = std::max(absl::ZeroDuration(), end - start);
  for (const Event& e : events) {
    if (e.time < start || e.time > end) continue;
    if (e.type == EventType::kHang && e.Attribute("remote") != "true") ++run.hangs_declared;
    if (Is(e, EventKind::kHangWithdrawn)) ++run.hangs_withdrawn;
  }
  for (const Event& e : events) {
    if (e.type != EventType::kSuspectHost) continue;
    SuspectDetection d;
    d.at = e.time - start;
    d.host = std::string(e.Attribute("host"));
    d.metric = std::string(e.Attribute("metric"));
    (void)absl::SimpleAtod(std::string(e.Attribute("z")), &d.z);
    d.windows = static_cast<int>(AttributeInt(e, "windows", 0));
    d.action = std::string(e.Attribute("action"));
    run.suspects.push_back(std::move(d));
  }

  // Kept: no later step done event at or below its step. Counted: the previous event is the
  // previous step's, from the same process and generation.
  std::vector<bool> kept(done.size(), false);
  int64_t min_later = INT64_MAX;
  for (size_t i = done.size(); i-- > 0;) {
    kept[i] = done[i].step < min_later;
    min_later = std::min(min_later, done[i].step);
  }
  std::vector<std::pair<absl::Time, absl::Time>> productive;
  std::vector<absl::Duration> intervals;
  for (size_t i = 0; i < done.size(); ++i) {
    run.progress.push_back({done[i].time - start, done[i].step});
    run.last_step = std::max(run.last_step, done[i].step);
    if (!kept[i]) continue;
    ++run.steps_kept;
    if (i == 0) continue;
    const StepDone& prev = done[i - 1];
    if (prev.step != done[i].step - 1 || prev.pid != done[i].pid ||
        prev.generation != done[i].generation) {
      continue;
    }
    productive.emplace_back(prev.time, done[i].time);
    intervals.push_back(done[i].time - prev.time);
    run.productive += done[i].time - prev.time;
  }
  run.ettr = run.wall > absl::ZeroDuration() ? absl::FDivDuration(run.productive, run.wall) : 0;
  if (!intervals.empty()) {
    std::vector<absl::Duration> sorted = intervals;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    run.median_step = sorted[sorted.size() / 2];
  }
  // The gaps between productive intervals (which are disjoint and in order), and at both ends.
  absl::Time cursor = start;
  auto gap = [&](absl::Time until) {
    if (until - cursor > run.longest_unproductive) {
      run.longest_unproductive = until - cursor;
      run.longest_unproductive_from = cursor - start;
    }
  };
  for (const auto& [from, to] : productive) {
    gap(from);
    cursor = std::max(cursor, to);
  }
  gap(end);

  std::set<std::string> injected;  // the processes faults hit
  for (const Event* inject : injections) {
    if (std::string key = ProcessKey(*inject); !key.empty()) injected.insert(key);
  }
  std::set<size_t> claimed;  // events that named a culprit, each credited to one fault
  for (size_t k = 0; k < injections.size(); ++k) {
    const Event& inject = *injections[k];
    FaultOutcome f;
    f.kind = std::string(inject.Attribute("kind"));
    f.rank = inject.rank;
    f.pid = AttributeInt(inject, "pid", -1);
    f.host = std::string(inject.Attribute("host"));
    f.ranks = std::string(inject.Attribute("ranks"));
    f.injected_at = inject.time - start;
    const bool host_fault = FaultOutcome::IsHostFault(f.kind);
    const std::string process = host_fault ? "" : ProcessKey(inject);
    // Evidence: events up to kEvidenceWindow after the injection. An event that names a process
    // another injection hit is that fault's, never this one's; an event that names a culprit is
    // credited to one fault only, the one whose process (or host) it names first, else the
    // earliest. An event naming no process counts only if it detected while the faulty process
    // lived.
    absl::Time until = std::min(end, inject.time + kEvidenceWindow);
    std::optional<absl::Time> cleared;
    std::string cleared_by;
    if (!host_fault) {
      for (const Event& e : events) {
        if (e.time < inject.time || e.time > until || !EndsProcess(f, process, e)) continue;
        cleared = e.time;
        cleared_by = DetectorName(e);
        break;
      }
    }
    auto ours = [&](const Event& e) {
      const std::string key = ProcessKey(e);
      if (key.empty()) return !cleared.has_value() || DetectedAt(e) <= *cleared;
      return key == process || injected.count(key) == 0;
    };
    auto names_target = [&](const Event& e) {
      if (host_fault) return HostNamed(e) == f.host;
      return !process.empty() && ProcessKey(e) == process;
    };
    auto names_culprit = [&](const Event& e) {
      return host_fault ? HostNamed(e).has_value() : Detects(f.kind, e).culprit.has_value();
    };
    std::optional<size_t> naming;
    for (int pass = 0; pass < 2 && !naming.has_value(); ++pass) {
      for (size_t i = 0; i < events.size(); ++i) {
        const Event& e = events[i];
        if (e.time < inject.time || e.time > until || claimed.count(i) != 0 || !ours(e)) continue;
        if (pass == 0 && !names_target(e)) continue;
        if (names_culprit(e)) {
          naming = i;
          break;
        }
      }
    }
    if (naming.has_value()) {
      claimed.insert(*naming);
      if (host_fault) {
        f.culprit_host_named = HostNamed(events[*naming]);
      } else {
        f.culprit_named = Detects(f.kind, events[*naming]).culprit;
      }
    }
    // The earliest detection, by when it detected: a rank writes its hang event once its dump is
    // written, which can be after the launcher acted on the hang (it publishes the hang first).
    for (size_t i = 0; i < events.size(); ++i) {
      const Event& e = events[i];
      // A hang declared before the injection is not its detection, whenever its event was written.
      if (DetectedAt(e) < inject.time || e.time > until || !ours(e)) continue;
      if (f.detection_latency.has_value() && DetectedAt(e) - inject.time >= *f.detection_latency) {
        continue;
      }
      const Detection d = Detects(f.kind, e);
      if (!d.detects || ((d.culprit.has_value() || host_fault) && naming != i)) continue;
      f.detection_latency = DetectedAt(e) - inject.time;
      f.detected_by = DetectorName(e);
    }
    if (!f.detection_latency.has_value()) f.cleared_by = cleared_by;
    int64_t before = -1;
    for (const StepDone& d : done) {
      if (d.time <= inject.time) before = std::max(before, d.step);
    }
    // A host fault need not stop the step in flight (a partition is felt at the next collective):
    // it is recovered by the first step beyond `before` once the launcher recovered from the loss
    // of that host, when it says so.
    absl::Time recovered_from = inject.time;
    // Nor need a stop: a rank stopped after its last collective of a step lets the others finish
    // that step, and the job stalls only at the next. It is recovered by the first step beyond
    // `before` done once the hang was detected.
    if (f.kind == "stop" && f.detection_latency.has_value()) {
      recovered_from = inject.time + *f.detection_latency;
    }
    if (host_fault) {
      for (const Event& e : events) {
        if (e.time >= inject.time && e.time <= until && IsLauncher(e, EventKind::kRecovered) &&
            e.Attribute("host") == f.host) {
          recovered_from = e.time;
          break;
        }
      }
    }
    int64_t lowest_after = INT64_MAX;
    for (const StepDone& d : done) {
      if (d.time <= inject.time) continue;
      lowest_after = std::min(lowest_after, d.step);
      if (d.step > before && d.time >= recovered_from) {
        f.time_to_recovery = d.time - inject.time;
        break;
      }
    }
    if (lowest_after != INT64_MAX) f.steps_lost = std::max<int64_t>(0, before - lowest_after + 1);
    run.faults.push_back(std::move(f));
  }
  return run;
}

absl::StatusOr<std::vector<Event>> ReadRunEvents(const std::string& run_dir) {
  Env* env = Env::Default();
  const std::string dir = run_dir + "/events";
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (!names.ok()) {
    return absl::NotFoundError(
        absl::StrCat("no events in ", run_dir, ": ", names.status().message()));
  }
  std::sort(names->begin(), names->end());
  std::vector<Event> events;
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".tgev")) continue;
    absl::StatusOr<EventLogContents> contents = ReadEventLog(env, dir + "/" + name);
    if (!contents.ok()) return contents.status();
    // A torn final record (a rank killed mid-write) loses one event, not the report.
    events.insert(events.end(), contents->events.begin(), contents->events.end());
  }
  return events;
}

namespace {

std::string FaultsTable(const RunAnalysis& run) {
  bool hosts = false;
  for (const FaultOutcome& f : run.faults) hosts |= !f.host.empty();
  std::string out =
      absl::StrFormat("  %-4s %-9s %4s %9s %10s %-18s %8s %10s %6s\n", "#", "kind", "rank", "at_s",
                      "detect_s", "detected_by", "culprit", "recover_s", "lost");
  if (hosts) out.insert(out.size() - 1, "  host");
  for (size_t i = 0; i < run.faults.size(); ++i) {
    const FaultOutcome& f = run.faults[i];
    std::string culprit = "-";
    if (f.culprit_host_named.has_value()) culprit = *f.culprit_host_named;
    if (f.culprit_named.has_value()) culprit = absl::StrCat(*f.culprit_named);
    if (culprit != "-") absl::StrAppend(&culprit, f.culprit_correct() ? " ok" : " WRONG");
    std::string detected_by = f.detected_by.empty() ? "-" : f.detected_by;
    if (!f.cleared_by.empty()) detected_by = "cleared:" + f.cleared_by;
    out += absl::StrFormat("  %-4d %-9s %4d %9s %10s %-18s %8s %10s %6d", i + 1, f.kind, f.rank,
                           Seconds(f.injected_at), OptSeconds(f.detection_latency), detected_by,
                           culprit, OptSeconds(f.time_to_recovery), f.steps_lost);
    if (hosts) {
      absl::StrAppend(&out, "  ", f.host.empty() ? "-" : f.host,
                      f.ranks.empty() ? "" : absl::StrCat(" (ranks ", f.ranks, ")"));
    }
    out += "\n";
  }
  return out;
}

struct KindSummary {
  int n = 0, detected = 0, recovered = 0, named = 0;
  absl::Duration detect_sum, recover_sum, detect_max, recover_max;
  int64_t lost = 0;
};

std::map<std::string, KindSummary> ByKind(const RunAnalysis& run) {
  std::map<std::string, KindSummary> kinds;
  for (const FaultOutcome& f : run.faults) {
    KindSummary& k = kinds[f.kind];
    ++k.n;
    k.lost += f.steps_lost;
    if (f.culprit_correct()) ++k.named;
    if (f.detection_latency) {
      ++k.detected;
      k.detect_sum += *f.detection_latency;
      k.detect_max = std::max(k.detect_max, *f.detection_latency);
    }
    if (f.time_to_recovery) {
      ++k.recovered;
      k.recover_sum += *f.time_to_recovery;
      k.recover_max = std::max(k.recover_max, *f.time_to_recovery);
    }
  }
  return kinds;
}

// The fail-slow detections, one line each; nothing when there were none.
std::string SuspectsTable(const RunAnalysis& run) {
  if (run.suspects.empty()) return "";
  std::string out =
      absl::StrFormat("  suspect hosts %d:\n  %9s %-12s %-14s %6s %7s %s\n", run.suspects.size(),
                      "at_s", "host", "metric", "z", "windows", "action");
  for (const SuspectDetection& d : run.suspects) {
    out += absl::StrFormat("  %9s %-12s %-14s %6.2f %7d %s\n", Seconds(d.at), d.host, d.metric, d.z,
                           d.windows, d.action);
  }
  return out;
}

}  // namespace

std::string FormatReport(const std::vector<RunAnalysis>& runs) {
  std::string out;
  for (const RunAnalysis& run : runs) {
    out += absl::StrFormat(
        "run %s: ETTR %.1f%% (%s s of kept steps in %s s), %d steps kept, last step %d, median "
        "step %s s\n",
        run.mode.empty() ? "(unnamed)" : run.mode, 100 * run.ettr, Seconds(run.productive),
        Seconds(run.wall), run.steps_kept, run.last_step, Seconds(run.median_step));
    out += absl::StrFormat(
        "  faults %d: detected %d, culprit named correctly %d of %d, recovered %d; longest "
        "unproductive stretch %s s (from %s s)\n",
        run.faults.size(), run.faults_detected(), run.culprits_correct(),
        std::count_if(run.faults.begin(), run.faults.end(),
                      [](const FaultOutcome& f) { return f.kind != "drop"; }),
        run.faults_recovered(), Seconds(run.longest_unproductive),
        Seconds(run.longest_unproductive_from));
    out += absl::StrFormat(
        "  hangs declared by a rank %d, withdrawn %d (the wait ended by itself: nothing aborted)\n",
        run.hangs_declared, run.hangs_withdrawn);
    for (const auto& [kind, k] : ByKind(run)) {
      out += absl::StrFormat(
          "  %-9s x%-3d detected %d (mean %s s, max %s s), culprit %s, recovered %d (mean %s "
          "s, max %s s), steps lost %d\n",
          kind, k.n, k.detected, k.detected ? Seconds(k.detect_sum / k.detected) : "-",
          Seconds(k.detect_max), kind == "drop" ? "n/a" : absl::StrCat(k.named, "/", k.n),
          k.recovered, k.recovered ? Seconds(k.recover_sum / k.recovered) : "-",
          Seconds(k.recover_max), k.lost);
    }
    out += FaultsTable(run);
    out += SuspectsTable(run);
  }
  if (runs.size() == 2) {
    out += absl::StrFormat("ETTR %s %.1f%% vs %s %.1f%%: ratio %.3f\n", runs[0].mode,
                           100 * runs[0].ettr, runs[1].mode, 100 * runs[1].ettr,
                           runs[1].ettr > 0 ? runs[0].ettr / runs[1].ettr : 0.0);
  }
  return out;
}

std::string ReportJson(const std::vector<RunAnalysis>& runs) {
  std::vector<std::string> items;
  for (const RunAnalysis& run : runs) {
    std::vector<std::string> faults;
    for (const FaultOutcome& f : run.faults) {
      faults.push_back(absl::StrFormat(
          "{\"kind\":%s,\"rank\":%d,\"pid\":%d,\"injected_at_s\":%s,\"detection_latency_s\":%s,"
          "\"detected_by\":%s,\"culprit_named\":%s,\"culprit_correct\":%s,"
          "\"time_to_recovery_s\":%s,\"steps_lost\":%d,\"host\":%s,\"ranks\":%s,"
          "\"culprit_host_named\":%s,\"cleared_by\":%s}",
          JsonString(f.kind), f.rank, f.pid, Seconds(f.injected_at),
          JsonOptSeconds(f.detection_latency), JsonString(f.detected_by),
          f.culprit_named ? absl::StrCat(*f.culprit_named) : "null",
          f.culprit_correct() ? "true" : "false", JsonOptSeconds(f.time_to_recovery), f.steps_lost,
          JsonString(f.host), JsonString(f.ranks),
          f.culprit_host_named ? JsonString(*f.culprit_host_named) : "null",
          JsonString(f.cleared_by)));
    }
    std::vector<std::string> suspects;
    for (const SuspectDetection& d : run.suspects) {
      suspects.push_back(absl::StrFormat(
          "{\"at_s\":%s,\"host\":%s,\"metric\":%s,\"z\":%.3f,\"windows\":%d,\"action\":%s}",
          Seconds(d.at), JsonString(d.host), JsonString(d.metric), d.z, d.windows,
          JsonString(d.action)));
    }
    items.push_back(absl::StrFormat(
        "{\"mode\":%s,\"ettr\":%.6f,\"wall_s\":%s,\"productive_s\":%s,\"steps_kept\":%d,"
        "\"last_step\":%d,\"median_step_s\":%s,\"longest_unproductive_s\":%s,"
        "\"longest_unproductive_from_s\":%s,\"faults_detected\":%d,\"faults_recovered\":%d,"
        "\"culprits_correct\":%d,\"hangs_declared\":%d,\"hangs_withdrawn\":%d,"
        "\"faults\":[%s],\"suspects\":[%s]}",
        JsonString(run.mode), run.ettr, Seconds(run.wall), Seconds(run.productive), run.steps_kept,
        run.last_step, Seconds(run.median_step), Seconds(run.longest_unproductive),
        Seconds(run.longest_unproductive_from), run.faults_detected(), run.faults_recovered(),
        run.culprits_correct(), run.hangs_declared, run.hangs_withdrawn, absl::StrJoin(faults, ","),
        absl::StrJoin(suspects, ",")));
  }
  std::string out = absl::StrCat("{\"runs\":[", absl::StrJoin(items, ","), "]");
  if (runs.size() == 2 && runs[1].ettr > 0) {
    out += absl::StrFormat(",\"ettr_ratio\":%.6f", runs[0].ettr / runs[1].ettr);
  }
  return out + "}\n";
}

namespace {

absl::Status WriteText(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// gnuplot's path, or "" when it is not on PATH.
std::string FindGnuplot() {
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): nothing sets it
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(std::string(dir), "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::Status RunGnuplot(const std::string& gnuplot, const std::string& script_path) {
  std::vector<std::string> args = {gnuplot, script_path};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (int err = posix_spawn(&pid, gnuplot.c_str(), nullptr, nullptr, argv.data(), environ);
      err != 0) {
    return absl::InternalError(absl::StrCat("cannot run ", gnuplot, ": ", strerror(err)));
  }
  int status = 0;
  // gnuplot renders a few thousand points in well under a second; it has no reason to block.
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("gnuplot failed on ", script_path, " (wait status ", status, ")"));
  }
  return absl::OkStatus();
}

absl::Status GnuplotMissing() {
  return absl::FailedPreconditionError(
      "gnuplot is not installed (or not on PATH): --png needs it (Debian: apt-get install "
      "gnuplot-nox)");
}

// A dump's metrics in the detector's priority order, then any others it holds, by name; each
// with whether the detector divides it by the work of its second.
std::vector<std::pair<std::string, bool>> DumpMetrics(const FailSlowDump& dump) {
  std::set<std::string> present;
  for (const auto& [host, points] : dump.hosts) {
    for (const FailSlowDumpPoint& p : points) {
      for (const auto& [name, value] : p.metrics) present.insert(name);
    }
  }
  std::vector<std::pair<std::string, bool>> metrics;
  for (const FailSlowMetric& m : FailSlowDetector::DefaultMetrics()) {
    if (present.erase(m.name) > 0) metrics.emplace_back(m.name, m.per_work);
  }
  for (const std::string& name : present) metrics.emplace_back(name, false);
  return metrics;
}

}  // namespace

std::string FailSlowPlotScript(const FailSlowDump& dump, const std::string& data_dir,
                               const std::string& png_path) {
  const std::vector<std::pair<std::string, bool>> metrics = DumpMetrics(dump);
  const int columns = metrics.size() > 1 ? 2 : 1;
  const int rows = std::max<int>(1, static_cast<int>((metrics.size() + 1) / 2));
  const FailSlowDumpHeader& h = dump.header;
  std::string script = absl::StrFormat(
      "set terminal pngcairo noenhanced size %d,%d\nset output %s\nset datafile missing '-'\n"
      "set key below horizontal font ',9'\n"
      // A margin after the detection, so that its line is not the plot's border.
      "set autoscale xfix\nset offsets 0, 3, 0, 0\n"
      "set arrow 1 from 0, graph 0 to 0, graph 1 nohead dt 2 lw 1.5 lc rgb 'black'\n"
      "set multiplot layout %d,%d title %s\n",
      600 * columns, 400 * rows + 40, JsonString(png_path), rows, columns,
      JsonString(absl::StrFormat("suspect host %s: %s, z %.2f, %d window(s), action: %s  |  x: "
                                 "seconds from the detection (dashed line)",
                                 h.host, h.metric, h.z, h.windows, h.action)));
  const char* others[] = {"#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                          "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e"};
  for (size_t m = 0; m < metrics.size(); ++m) {
    const auto& [name, per_work] = metrics[m];
    script += absl::StrFormat("set title %s\n",
                              JsonString(absl::StrCat(name, per_work ? " per step" : "",
                                                      name == h.metric ? " (detected)" : "")));
    std::vector<std::string> plots;
    size_t i = 0, other = 0;
    for (const auto& [host, points] : dump.hosts) {
      const bool suspect = host == h.host;
      plots.push_back(absl::StrFormat(
          "%s using 1:%d with lines lw %s lc rgb '%s' title %s",
          JsonString(absl::StrCat(data_dir, "/host-", i, ".dat")), m + 2, suspect ? "3" : "1",
          suspect ? "#d62728" : others[other++ % (sizeof(others) / sizeof(others[0]))],
          JsonString(suspect ? host + " (suspect)" : host)));
      ++i;
    }
    script += "plot " + absl::StrJoin(plots, ", \\\n     ") + "\n";
  }
  return script + "unset multiplot\n";
}

absl::Status PlotFailSlowDump(const FailSlowDump& dump, const std::string& png_path) {
  const std::string gnuplot = FindGnuplot();
  if (gnuplot.empty()) return GnuplotMissing();
  const std::string dir = png_path + ".data";
  if (absl::Status s = Env::Default()->CreateDirs(dir); !s.ok()) return s;
  const std::vector<std::pair<std::string, bool>> metrics = DumpMetrics(dump);
  size_t i = 0;
  for (const auto& [host, points] : dump.hosts) {
    // "<s from the detection> <metric>...": '-' where the host had no value (gnuplot skips it).
    std::string data;
    for (const FailSlowDumpPoint& p : points) {
      data += absl::StrCat(p.second - dump.header.second);
      for (const auto& [name, per_work] : metrics) {
        const auto v = p.metrics.find(name);
        if (v == p.metrics.end() || (per_work && p.work <= 0)) {
          data += " -";
        } else {
          data += absl::StrFormat(" %.6g", per_work ? v->second / p.work : v->second);
        }
      }
      data += "\n";
    }
    if (absl::Status s = WriteText(absl::StrCat(dir, "/host-", i++, ".dat"), data); !s.ok()) {
      return s;
    }
  }
  const std::string script_path = dir + "/plot.gp";
  if (absl::Status s = WriteText(script_path, FailSlowPlotScript(dump, dir, png_path)); !s.ok()) {
    return s;
  }
  return RunGnuplot(gnuplot, script_path);
}

std::string FailSlowPngPath(const std::string& png_path, const std::string& dump_path) {
  std::string stem = png_path;
  if (absl::EndsWith(stem, ".png")) stem.resize(stem.size() - 4);
  std::string name = dump_path.substr(dump_path.rfind('/') + 1);  // npos + 1 == 0: all of it
  if (absl::EndsWith(name, ".trace")) name.resize(name.size() - 6);
  return absl::StrCat(stem, "-fail-slow-", name, ".png");
}

absl::Status PlotRuns(const std::vector<RunAnalysis>& runs, const std::string& png_path) {
  const std::string gnuplot = FindGnuplot();
  if (gnuplot.empty()) return GnuplotMissing();
  const std::string dir = png_path + ".data";
  if (absl::Status s = Env::Default()->CreateDirs(dir); !s.ok()) return s;
  std::string script = absl::StrFormat(
      "set terminal pngcairo size 1200,600\nset output %s\n"
      "set xlabel 'wall time (s)'\nset ylabel 'step done'\nset key top left\n"
      "set title 'Training progress under injected faults'\n",
      JsonString(png_path));
  std::vector<std::string> plots;
  const char* colors[] = {"#1f77b4", "#d62728"};
  for (size_t r = 0; r < runs.size(); ++r) {
    std::string progress;
    for (const ProgressPoint& p : runs[r].progress) {
      progress += absl::StrFormat("%.3f %d\n", absl::ToDoubleSeconds(p.at), p.step);
    }
    std::string faults;
    for (const FaultOutcome& f : runs[r].faults) {
      // Marked at the height of the progress when injected.
      int64_t step = 0;
      for (const ProgressPoint& p : runs[r].progress) {
        if (p.at <= f.injected_at) step = p.step;
      }
      faults += absl::StrFormat("%.3f %d %s\n", absl::ToDoubleSeconds(f.injected_at), step, f.kind);
    }
    const std::string progress_file = absl::StrCat(dir, "/progress-", r, ".dat");
    const std::string faults_file = absl::StrCat(dir, "/faults-", r, ".dat");
    if (absl::Status s = WriteText(progress_file, progress); !s.ok()) return s;
    if (absl::Status s = WriteText(faults_file, faults); !s.ok()) return s;
    const std::string name = runs[r].mode.empty() ? absl::StrCat("run ", r) : runs[r].mode;
    plots.push_back(absl::StrFormat(
        "%s using 1:2 with lines lw 2 lc rgb '%s' title %s", JsonString(progress_file),
        colors[r % 2], JsonString(absl::StrFormat("%s (ETTR %.1f%%)", name, 100 * runs[r].ettr))));
    if (!faults.empty()) {
      plots.push_back(absl::StrFormat(
          "%s using 1:2 with points pt 7 ps 1.2 lc rgb '%s' title %s, "
          "%s using 1:2:3 with labels offset 0,1 font ',8' tc rgb '%s' noenhanced notitle",
          JsonString(faults_file), colors[r % 2], JsonString(name + " faults"),
          JsonString(faults_file), colors[r % 2]));
    }
  }
  script += "plot " + absl::StrJoin(plots, ", \\\n     ") + "\n";
  const std::string script_path = dir + "/plot.gp";
  if (absl::Status s = WriteText(script_path, script); !s.ok()) return s;
  return RunGnuplot(gnuplot, script_path);
}

std::string ReportUsage() { return "usage: trainguard report RUN_DIR [--json] [--png FILE]\n"; }

namespace {

constexpr char kReportHelp[] =
    "\n"
    "Reports a chaos run (trainguard chaos) from its events: ETTR (time on kept steps / wall\n"
    "time); for every injected fault its detection latency, whether the culprit rank was named\n"
    "correctly, its time to recovery and the steps lost; the longest unproductive stretch.\n"
    "RUN_DIR is one run's dir (it has events/), or a chaos dir holding trainguard/ and\n"
    "baseline/: then both are shown side by side with their ETTR ratio. --json prints one JSON\n"
    "object; --png FILE plots the step done over wall time with every fault marked (needs\n"
    "gnuplot: Debian package gnuplot-nox), and every fail-slow dump of the run\n"
    "(events/fail_slow/*.trace) into <FILE less .png>-fail-slow-<unix>-<host>.png: per-host\n"
    "metric curves around the detection. The fail-slow detector's suspect_host events are\n"
    "listed.\n"
    "Definitions: tools/chaos_report.h, docs/GUIDE.md.\n"
    "\n"
    "Exit status: 0 success, 1 no events could be read or the plot failed, 2 bad usage.\n";

}  // namespace

int RunReportCommand(const std::vector<std::string>& args) {
  if (AsksForHelp(args)) {
    std::printf("%s%s", ReportUsage().c_str(), kReportHelp);
    return 0;
  }
  bool json = false;
  std::string png;
  std::string run_dir;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--png" && i + 1 < args.size()) {
      png = args[++i];
    } else if (!args[i].empty() && args[i][0] == '-') {
      std::fprintf(stderr, "trainguard report: unknown flag or missing value %s\n%s",
                   args[i].c_str(), ReportUsage().c_str());
      return 2;
    } else if (run_dir.empty()) {
      run_dir = args[i];
    } else {
      std::fprintf(stderr, "trainguard report: one RUN_DIR only\n%s", ReportUsage().c_str());
      return 2;
    }
  }
  if (run_dir.empty()) {
    std::fprintf(stderr, "trainguard report: no RUN_DIR\n%s", ReportUsage().c_str());
    return 2;
  }
  std::vector<std::string> dirs;
  for (const char* sub : {"/trainguard", "/baseline"}) {
    if (Env::Default()->FileExists(run_dir + sub + "/events")) dirs.push_back(run_dir + sub);
  }
  if (dirs.empty()) dirs.push_back(run_dir);
  std::vector<RunAnalysis> runs;
  for (const std::string& dir : dirs) {
    absl::StatusOr<std::vector<Event>> events = ReadRunEvents(dir);
    if (!events.ok()) {
      std::fprintf(stderr, "trainguard report: %s\n", events.status().ToString().c_str());
      return 1;
    }
    runs.push_back(AnalyzeRun(*std::move(events)));
  }
  std::printf("%s", json ? ReportJson(runs).c_str() : FormatReport(runs).c_str());
  if (png.empty()) return 0;
  std::vector<std::string> dumps;
  for (const std::string& dir : dirs) {
    for (std::string& d : ListFailSlowDumps(Env::Default(), FailSlowDumpDir(dir))) {
      dumps.push_back(std::move(d));
    }
  }
  // A fail-slow run without step done events has no progress to draw: only its dumps.
  const bool progress = std::any_of(runs.begin(), runs.end(),
                                    [](const RunAnalysis& r) { return !r.progress.empty(); });
  if (progress || dumps.empty()) {
    if (absl::Status s = PlotRuns(runs, png); !s.ok()) {
      std::fprintf(stderr, "trainguard report: %s\n", s.ToString().c_str());
      return 1;
    }
    if (!json) std::printf("plot written to %s\n", png.c_str());
  }
  for (const std::string& dump_path : dumps) {
    absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(dump_path);
    absl::StatusOr<FailSlowDump> dump =
        text.ok() ? ParseFailSlowDump(*text) : absl::StatusOr<FailSlowDump>(text.status());
    const std::string out = FailSlowPngPath(png, dump_path);
    absl::Status s = dump.ok() ? PlotFailSlowDump(*dump, out) : dump.status();
    if (!s.ok()) {
      std::fprintf(stderr, "trainguard report: %s: %s\n", dump_path.c_str(), s.ToString().c_str());
      return 1;
    }
    if (!json) std::printf("fail-slow plot written to %s\n", out.c_str());
  }
  return 0;
}

}  // namespace trainguard::tools
