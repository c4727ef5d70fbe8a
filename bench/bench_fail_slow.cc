// bench_fail_slow: evaluates the fail-slow detector (sdk/health/fail_slow_detector.h) on per-second
// traces that `trainguard run --fail-slow-trace FILE` recorded on simulated hosts
// (bench/bench_fail_slow.sh records them), side by side with the Mahalanobis baseline and a
// watchdog-only baseline (a host is named only if the run's watchdog declared a hang: the runs'
// event files, counted by the script and passed as --watchdog-named).
//
//   bench_fail_slow record --scenario throttle|delay|slowlink|lossy|membw|healthy|rl --seconds N
//                          --out TRACE [--hosts H] [--ranks-per-host R] [--fail-slow alert|evict]
//   bench_fail_slow hog [--seconds N] [--mib M]     (the membw scenario's hog; see the record file)
//   bench_fail_slow [--continuity S] [--window S] [--sustained F] [--metrics a,b,..]
//                   [--floor METRIC=VALUE]...
//                   [--verbose] [--watchdog-named LABEL=HOST] LABEL:FAULTY_HOST_OR_none:TRACE ...
//
// Per trace: the detector replays every second; a verdict naming FAULTY_HOST is a true positive
// (the first one gives the detection latency, from the trace's first second, since the degradation
// is present from the start), one naming another host a false positive. Host-level precision,
// recall and F1 over all traces, detection latency p50/p90, false alarms per hour of fault-free
// traces. Deterministic: the same traces give the same numbers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "sdk/health/fail_slow_detector.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/host_agent/host_sampler.h"

namespace trainguard {

int RecordFailSlowTrace(int argc, char** argv);    // bench_fail_slow_record.cc
int RunMemoryBandwidthHog(int argc, char** argv);  // bench_fail_slow_record.cc

namespace {

struct Trace {
  std::string label;
  std::string faulty;                                             // "" for a fault-free run
  std::map<int64_t, std::map<std::string, std::string>> seconds;  // second -> host -> record
  std::set<std::string> metrics;                                  // the metrics it holds
};

bool LoadTrace(const std::string& spec, Trace* trace) {
  const std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits(':', 2));
  if (parts.size() != 3) return false;
  trace->label = parts[0];
  trace->faulty = parts[1] == "none" ? "" : parts[1];
  std::ifstream in(parts[2]);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    int64_t second = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &second)) continue;
    trace->seconds[second][f[1]] = f[2];
    if (absl::StatusOr<HostMetricsRecord> r = ParseHostMetricsRecord(f[2]); r.ok()) {
      for (const auto& [metric, value] : r->metrics) trace->metrics.insert(metric);
    }
  }
  return !trace->seconds.empty();
}

std::vector<FailSlowSample> Samples(const std::map<std::string, std::string>& records,
                                    std::map<std::string, int64_t>& last_seq) {
  std::vector<FailSlowSample> samples;
  for (const auto& [host, text] : records) {
    absl::StatusOr<HostMetricsRecord> r = ParseHostMetricsRecord(text);
    if (!r.ok()) continue;
    auto [it, inserted] = last_seq.try_emplace(host, r->seq);
    if (!inserted && it->second == r->seq) continue;
    it->second = r->seq;
    for (const auto& [metric, value] : r->metrics)
      samples.push_back({host, metric, value, r->work});
  }
  return samples;
}

struct Outcome {
  bool detected = false;
  double latency_s = -1;
  int false_alarms = 0;  // verdicts naming a healthy host (distinct seconds)
  std::set<std::string> wrongly_named;
  double seconds = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

struct Totals {
  int tp = 0, fp = 0, fn = 0;
  std::vector<double> latencies;
  int healthy_alarms = 0;
  double healthy_seconds = 0;
};

void Report(const std::string& name, const Totals& t) {
  const double precision = t.tp + t.fp > 0 ? static_cast<double>(t.tp) / (t.tp + t.fp) : 0;
  const double recall = t.tp + t.fn > 0 ? static_cast<double>(t.tp) / (t.tp + t.fn) : 0;
  const double f1 = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
  std::printf(
      "%-22s precision %.3f recall %.3f F1 %.3f | latency p50 %.0f s p90 %.0f s | "
      "false alarms/hour (fault-free runs) %.0f\n",
      name.c_str(), precision, recall, f1, Percentile(t.latencies, 0.5),
      Percentile(t.latencies, 0.9),
      t.healthy_seconds > 0 ? t.healthy_alarms * 3600.0 / t.healthy_seconds : 0.0);
}

// Host-level scoring of one trace: the faulty host named = TP (else FN); each healthy host named
// at least once = FP.
void Score(const Trace& trace, const Outcome& o, Totals* t) {
  if (!trace.faulty.empty()) {
    if (o.detected) {
      ++t->tp;
      t->latencies.push_back(o.latency_s);
    } else {
      ++t->fn;
    }
  } else {
    t->healthy_alarms += o.false_alarms;
    t->healthy_seconds += o.seconds;
  }
  t->fp += static_cast<int>(o.wrongly_named.size());
}

// Opens `pairs` connected TCP pairs over 127.0.0.1 (both ends stay open in this process until it
// exits): the sockets a rank holds (its collective peers, the store).
void OpenLoopbackPairs(int pairs) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
      listen(listener, pairs) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    return;
  }
  for (int i = 0; i < pairs; ++i) {
    const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&addr), length) != 0) return;
    (void)accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  }
}

// The agent's per-second work for a host of 2 ranks, without the store round trips: the /proc
// reads, the TCP_INFO reads of 16 sockets per rank and the record's encoding (this process stands
// in for both ranks); and the coordinator's detector for `hosts` hosts of 5 metrics.
int MeasureCost() {
  constexpr int kRounds = 2000;
  const pid_t self = getpid();
  OpenLoopbackPairs(8);
  RankWorkRecord record;
  record.steps = 1000;
  record.step_ns = 5'000'000'000;
  record.collective_ns = 3'000'000'000;
  const std::string work = EncodeRankWorkRecord(record);
  HostSampler sampler;
  absl::Time now = absl::Now();
  const absl::Time start = absl::Now();
  size_t bytes = 0;
  for (int i = 0; i < kRounds; ++i) {
    now += absl::Seconds(1);
    std::optional<HostMetricsRecord> r = sampler.Sample(now, {{0, self, work}, {1, self, work}});
    if (r.has_value()) bytes += EncodeHostMetricsRecord(*r).size();
  }
  const double agent_us = absl::ToDoubleMicroseconds(absl::Now() - start) / kRounds;
  std::printf(
      "agent sample (2 ranks of 16 TCP sockets each, /proc and TCP_INFO reads + encoding): %.1f "
      "us per second of training, "
      "record %.0f bytes\n",
      agent_us, static_cast<double>(bytes) / (kRounds - 1));
  for (int hosts : {4, 64, 1024}) {
    absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create({});
    if (!detector.ok()) return 1;
    const int seconds = hosts >= 1024 ? 20 : 200;
    const absl::Time t0 = absl::Now();
    for (int s = 0; s < seconds; ++s) {
      std::vector<FailSlowSample> samples;
      for (int h = 0; h < hosts; ++h) {
        const std::string host = absl::StrCat("host", h);
        const double f = 1 + 0.01 * ((h * 7 + s * 13) % 5);
        samples.push_back({host, "compute_ms", 10 * f, 2});
        samples.push_back({host, "cpu_wait_ms", 30 * f, 1});
        samples.push_back({host, "collective_ms", 40 * f, 2});
        samples.push_back({host, "cpu_util", 0.9 * f, 1});
        samples.push_back({host, "tcp_retrans", 2 * f, 1});
      }
      (void)detector->Observe(s, samples);
    }
    std::printf("coordinator detector, %d hosts x 5 metrics: %.3f ms per second of training\n",
                hosts, absl::ToDoubleMilliseconds(absl::Now() - t0) / seconds);
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "record") return RecordFailSlowTrace(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "cost") return MeasureCost();
  if (argc > 1 && std::string(argv[1]) == "hog") return RunMemoryBandwidthHog(argc, argv);
  FailSlowOptions options;
  std::vector<std::string> specs;
  bool verbose = false;
  double mahalanobis_threshold = 1.6;
  std::map<std::string, std::string> watchdog_named;  // label -> host the watchdog named
  std::map<std::string, double> floors;               // metric -> min_difference override
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--continuity") {
      options.continuity = std::stoi(next());
    } else if (a == "--window") {
      options.denoise_window = std::stoi(next());
    } else if (a == "--sustained") {  // FailSlowOptions::sustained (1/window: the median alone)
      options.sustained = std::stod(next());
    } else if (a == "--metrics") {
      for (absl::string_view m : absl::StrSplit(next(), ',')) {
        for (const FailSlowMetric& known : FailSlowDetector::DefaultMetrics()) {
          if (known.name == m) options.metrics.push_back(known);
        }
      }
    } else if (a == "--floor") {  // METRIC=VALUE: that metric's min_difference
      const std::vector<std::string> kv = absl::StrSplit(next(), '=');
      double floor = 0;
      if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &floor)) {
        std::fprintf(stderr, "bench_fail_slow: --floor takes METRIC=VALUE\n");
        return 2;
      }
      floors[kv[0]] = floor;
    } else if (a == "--mahalanobis-threshold") {
      mahalanobis_threshold = std::stod(next());
    } else if (a == "--watchdog-named") {  // LABEL=HOST
      const std::vector<std::string> kv = absl::StrSplit(next(), '=');
      if (kv.size() == 2) watchdog_named[kv[0]] = kv[1];
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      specs.push_back(a);
    }
  }
  options.max_fill = options.denoise_window;
  if (options.metrics.empty()) options.metrics = FailSlowDetector::DefaultMetrics();
  for (FailSlowMetric& m : options.metrics) {
    if (auto it = floors.find(m.name); it != floors.end()) m.min_difference = it->second;
  }
  Totals minder, mahalanobis, watchdog;
  for (const std::string& spec : specs) {
    Trace trace;
    if (!LoadTrace(spec, &trace)) {
      std::fprintf(stderr, "bench_fail_slow: cannot read %s (LABEL:HOST|none:FILE)\n",
                   spec.c_str());
      return 2;
    }
    absl::StatusOr<FailSlowDetector> detector = FailSlowDetector::Create(options);
    if (!detector.ok()) {
      std::fprintf(stderr, "bench_fail_slow: %s\n", detector.status().ToString().c_str());
      return 2;
    }
    // The baseline gets the detector's metrics that this trace holds (a host lacking one is left
    // out of its comparison, so a metric an older agent did not publish would blind it).
    std::vector<std::string> metric_names;
    for (const FailSlowMetric& m : detector->options().metrics) {
      if (trace.metrics.count(m.name) != 0) metric_names.push_back(m.name);
    }
    MahalanobisDetector baseline({.metrics = metric_names, .threshold = mahalanobis_threshold});
    Outcome a, b, w;
    std::map<std::string, int64_t> seq_a, seq_b;
    const int64_t first = trace.seconds.begin()->first;
    for (const auto& [second, records] : trace.seconds) {
      for (const SuspectVerdict& v : detector->Observe(second, Samples(records, seq_a))) {
        if (verbose) {
          std::printf("  %s s%lld: %s %s z %.2f dev %.2f windows %d\n", trace.label.c_str(),
                      static_cast<long long>(second), v.host.c_str(), v.metric.c_str(), v.z,
                      v.deviation, v.windows);
        }
        if (v.host == trace.faulty) {
          if (!a.detected) a.latency_s = static_cast<double>(second - first);
          a.detected = true;
        } else {
          ++a.false_alarms;
          a.wrongly_named.insert(v.host);
        }
      }
      if (std::optional<SuspectVerdict> v = baseline.Observe(second, Samples(records, seq_b))) {
        if (v->host == trace.faulty) {
          if (!b.detected) b.latency_s = static_cast<double>(second - first);
          b.detected = true;
        } else {
          ++b.false_alarms;
          b.wrongly_named.insert(v->host);
        }
      }
    }
    a.seconds = b.seconds = w.seconds =
        static_cast<double>(trace.seconds.rbegin()->first - first + 1);
    if (auto it = watchdog_named.find(trace.label); it != watchdog_named.end()) {
      if (it->second == trace.faulty) {
        w.detected = true;
        w.latency_s = 0;
      } else {
        w.false_alarms = 1;
        w.wrongly_named.insert(it->second);
      }
    }
    std::printf(
        "%-12s faulty %-6s %4.0f s | minder: %s%s, %d false | mahalanobis: %s%s, %d false "
        "| watchdog: %s\n",
        trace.label.c_str(), trace.faulty.empty() ? "none" : trace.faulty.c_str(), a.seconds,
        a.detected ? "named after " : (trace.faulty.empty() ? "-" : "missed"),
        a.detected ? absl::StrCat(a.latency_s, " s").c_str() : "", a.false_alarms,
        b.detected ? "named after " : (trace.faulty.empty() ? "-" : "missed"),
        b.detected ? absl::StrCat(b.latency_s, " s").c_str() : "", b.false_alarms,
        w.detected ? "named" : (w.false_alarms > 0 ? "named a healthy host" : "nothing"));
    Score(trace, a, &minder);
    Score(trace, b, &mahalanobis);
    Score(trace, w, &watchdog);
  }
  std::printf("\n");
  Report("minder (this detector)", minder);
  Report("mahalanobis", mahalanobis);
  Report("watchdog-only", watchdog);
  return 0;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) { return trainguard::Main(argc, argv); }
