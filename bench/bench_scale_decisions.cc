// bench_scale_decisions: what the coordinator's decisions cost at scale (issue 37): a hang
// diagnosed from every rank's dump, the fail-slow detector, and the backup placement and its proof.
//
//   bench_scale_decisions [--parts=hang,fail_slow,placement] [--ranks=8,64,512,4096,16384]
//       [--hosts=1,8,64,512,2048] [--runs=3] [--records=4096] [--steady_s=2]
//       [--dump_wait_ms=1000] [--digests=1] [--read_threads=4] [--work_dir=DIR] [--json=FILE]
//       [--timeout_s=120]
//
// hang, for each R of --ranks (8 ranks per host): R ranks' dumps of one hang, written by the real
//   writer (WriteHangDump, with the evidence FlightRecorderEvidence::Write gives it, each dump with
//   its digest beside it; --digests=0: without, as ranks of an older version wrote them) from real
//   rings (a FlightRecorder of --records records filled by a training loop of bucketed
//   all_reduces) and real stacks (this process's threads, captured and symbolised as a rank's
//   are): R - 1 ranks wait in all_reduce #N, one (rank R/2 + 3) never entered it. The dumps are in
//   place when the hang is declared (the ranks' own writing time is theirs, not the
//   coordinator's). Generation 0 of R members is formed on a TcpStore server of this process
//   (its threads are not the coordinator's). Rank 0 declares the hang as the Runtime does (the
//   hang key) and aborts --dump_wait_ms later (hang_dump_wait_ms); the real HangCoordinator,
//   polled every 10 ms on a thread of its own (its poll_interval of 50 ms gates it), runs until it
//   names the suspects, reading the dumps on --read_threads threads (its own among them; the
//   option's default unless given). Measured: declaration -> suspects named, the coordinator
//   thread's CPU (with one read thread, all of its work), the whole process's CPU meanwhile (the
//   other read threads' too, and the store server's), its longest Poll (how long the coordinator's
//   loop stalled), the store requests the server served meanwhile, the dump files read (count,
//   bytes) and the peak resident memory of this process (VmHWM, reset before each run). --runs runs
//   on the same dumps, each with a fresh coordinator. Then the steady state: a fresh coordinator
//   polled for --steady_s with no hang, its CPU and store requests per second. The coordinator's
//   host sees its 8 ranks' processes (local_holder), the others' only through the store; the agents
//   are not simulated (no host heartbeats: no hold-off), and silent_heartbeat is 600 s (no rank
//   beats).
// fail_slow, for each H of --hosts: H hosts of 8 ranks in generation 0 on the same kind of server;
//   every simulated second each host's agent publishes its sample (agents/metrics/<host>, the
//   HostSampler's metrics through EncodeHostMetricsRecord), one host 30 % slower from second 10,
//   and the real FailSlowCoordinator (--fail-slow alert) polls on a ManualClock advanced by 1 s.
//   Measured: its CPU per poll (per second of the job), the store requests per poll, and the
//   seconds from the onset to the slow host named.
// placement, for each H of --hosts: 8H ranks, TP 8, PP 4 (PP 1 below 4 hosts), DP the rest, 2
//   copies, --backup-evict host,tp,pp,dp: the CPU time of BackupPlacement::Place, of
//   ProvePlacement, and of DescribePlacement (what `trainguard run` prints: placement, proof,
//   survival probabilities), and the sizes of the encoded placement and of the description.
//
// A table on stdout; --json FILE writes every figure (one object per part, size and run).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/hang_dumps.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/coordinator/fail_slow_coordinator.h"
#include "sdk/coordinator/hang_coordinator.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"

namespace trainguard {
namespace {

constexpr char kToken[] = "bench-decisions-token";
constexpr char kJob[] = "decisions";
constexpr int kRanksPerHost = 8;
constexpr absl::Duration kCall = absl::Seconds(30);

struct Flags {
  std::set<std::string> parts = {"hang", "fail_slow", "placement"};
  std::vector<int> ranks = {8, 64, 512, 4096, 16384};
  std::vector<int> hosts = {1, 8, 64, 512, 2048};
  int runs = 3;
  int records = 4096;
  absl::Duration steady = absl::Seconds(2);
  absl::Duration dump_wait = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(120);
  bool digests = true;
  int read_threads = HangCoordinatorOptions{}.read_threads;
  std::string work_dir = "/tmp/bench_scale_decisions";
  std::string json;
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// CPU time of the calling thread.
absl::Duration ThreadCpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}
// CPU time of this process, every thread's.
absl::Duration ProcessCpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

// This process's peak resident memory since the last ResetPeakMemory, in MiB.
void ResetPeakMemory() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}
double PeakMemoryMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmHWM:")) {
      int64_t kib = 0;
      v = absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(v), "kB"));
      if (absl::SimpleAtoi(v, &kib)) return kib / 1024.0;
    }
  }
  return 0;
}

// One figure of one run, for --json.
struct Row {
  std::string part;
  int size = 0;  // ranks (hang) or hosts (fail_slow, placement)
  int run = 0;
  std::vector<std::pair<std::string, double>> figures;
};

class Report {
 public:
  void Add(Row row) { rows_.push_back(std::move(row)); }
  absl::Status WriteJson(const std::string& path, const std::string& load) const {
    std::string out = absl::StrFormat("{\"load\": \"%s\", \"rows\": [\n", load);
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      absl::StrAppendFormat(&out, "  {\"part\": \"%s\", \"size\": %d, \"run\": %d", r.part, r.size,
                            r.run);
      for (const auto& [name, value] : r.figures) {
        absl::StrAppendFormat(&out, ", \"%s\": %.9g", name, value);
      }
      absl::StrAppend(&out, i + 1 < rows_.size() ? "},\n" : "}\n");
    }
    absl::StrAppend(&out, "]}\n");
    std::ofstream file(path);
    file << out;
    return file ? absl::OkStatus() : absl::InternalError(absl::StrCat("writing ", path));
  }

 private:
  std::vector<Row> rows_;
};

// An Env that counts the files read through it (the coordinator's dumps).
class CountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    absl::StatusOr<std::string> bytes = target()->ReadFileToString(path);
    if (bytes.ok()) {
      files_.fetch_add(1, std::memory_order_relaxed);
      bytes_.fetch_add(static_cast<int64_t>(bytes->size()), std::memory_order_relaxed);
    }
    return bytes;
  }
  int64_t files() const { return files_.load(); }
  int64_t bytes() const { return bytes_.load(); }

 private:
  std::atomic<int64_t> files_{0};
  std::atomic<int64_t> bytes_{0};
};

absl::StatusOr<std::unique_ptr<Store>> Connect(int port) {
  TcpStoreOptions options;
  options.port = port;
  options.job_id = kJob;
  options.job_token = kToken;
  options.connect_timeout = kCall;
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<Store>(*std::move(client));
}

std::string Host(int h) { return absl::StrCat("host", h); }
std::string MemberOf(int rank) {
  return store_keys::EncodeMemberId({Host(rank / kRanksPerHost), 1000 + rank / kRanksPerHost, 0,
                                     store_keys::MemberId::Role::kRank, rank});
}

// A TcpStore server of this process, a store client on it, and generation 0 of `ranks` members
// (8 per host) formed by a RendezvousCoordinator on that client, with a JobCoordinator over it
// (never ticked: no host is watched).
struct Job {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<Store> store;
  std::unique_ptr<RendezvousCoordinator> rendezvous;
  ReplacementPolicy policy{ReplacementPolicyOptions{}};
  RenewalPolicy renewal{RenewalPolicyOptions{}};
  FailureHistory failures;
  std::unique_ptr<JobCoordinator> coordinator;
  std::vector<std::string> said;

  int64_t requests() const { return server->stats().requests_served; }

  static absl::StatusOr<std::unique_ptr<Job>> Form(int ranks, Clock* clock) {
    auto job = std::make_unique<Job>();
    TcpStoreServerOptions options;
    options.job_token = kToken;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    if (!server.ok()) return server.status();
    job->server = *std::move(server);
    absl::StatusOr<std::unique_ptr<Store>> store = Connect(job->server->port());
    if (!store.ok()) return store.status();
    job->store = *std::move(store);
    for (int r = 0; r < ranks; ++r) {
      absl::Status set = job->store->Set(store_keys::RdzvJoin(r), MemberOf(r), kCall);
      if (!set.ok()) return set;
    }
    job->rendezvous = std::make_unique<RendezvousCoordinator>(job->store.get(), clock, Host(0));
    if (absl::StatusOr<Membership> formed = job->rendezvous->FormInitialGeneration(ranks, kCall);
        !formed.ok()) {
      return formed.status();
    }
    JobCoordinatorOptions job_options;
    job_options.host_id = Host(0);
    job_options.call_timeout = kCall;
    job_options.replace_timeout = kCall;
    JobCoordinator::Hooks hooks;
    std::vector<std::string>* said = &job->said;
    hooks.coordinating = [] { return true; };
    hooks.say = [said](const std::string& line) { said->push_back(line); };
    hooks.record = [](int, EventKind, const std::string&, JobCoordinator::Attributes) {};
    hooks.fail = [said](const std::string& why) { said->push_back(why); };
    hooks.preferred_standbys = [](const std::string&, const std::vector<int>&) {
      return std::vector<std::string>{};
    };
    hooks.standby_starting = [] { return false; };
    hooks.rank_taken = [](int, const std::string&, int64_t) {};
    job->coordinator = std::make_unique<JobCoordinator>(
        job->store.get(), clock, job->rendezvous.get(), &job->policy, &job->renewal, &job->failures,
        job_options, std::move(hooks));
    job->coordinator->set_world_size(ranks);
    return job;
  }
};

// ---- hang ----------------------------------------------------------------------------------

constexpr int kDeclarer = 0;
int Culprit(int ranks) { return std::min(ranks - 1, ranks / 2 + 3); }
std::string Declaration() {
  return store_keys::EncodeHangDeclaration(
      {kDeclarer, "hang (collective) at step 587: all_reduce #2348 (comm 1) ran 60s, bound 60s"});
}

// Writes the R ranks' dumps of generation 0's hang into `dir` as the Runtime does (with their
// digests when `digests`). Returns the dumps' bytes.
absl::StatusOr<int64_t> WriteDumps(const std::string& dir, int ranks, int records, bool digests) {
  absl::StatusOr<FlightRecorderContents> waiting_ring =
      bench::RealRing(kJob, 0, records, /*enters=*/true);
  if (!waiting_ring.ok()) return waiting_ring.status();
  absl::StatusOr<FlightRecorderContents> culprit_ring =
      bench::RealRing(kJob, 1, records, /*enters=*/false);
  if (!culprit_ring.ok()) return culprit_ring.status();
  absl::StatusOr<bench::Stacks> stacks = bench::RealStacks();
  if (!stacks.ok()) return stacks.status();
  if (absl::Status made = Env::Default()->CreateDirs(dir); !made.ok()) return made;
  const std::string declaration = Declaration();
  int64_t bytes = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const bool culprit = rank == Culprit(ranks);
    // What FlightRecorderEvidence::Write gives the writer (sdk/runtime/hang_evidence.cc).
    const std::string reason =
        rank == kDeclarer
            ? absl::StrCat("hang: ", store_keys::DecodeHangDeclaration(declaration)->report)
            : absl::StrCat("a peer declared a hang: ", declaration);
    absl::StatusOr<std::string> path =
        bench::WriteRankHangDump(culprit ? *culprit_ring : *waiting_ring, kJob, *stacks, rank,
                                 culprit, reason, /*generation=*/0, dir, digests);
    if (!path.ok()) return path.status();
    absl::StatusOr<uint64_t> size = Env::Default()->GetFileSize(*path);
    if (size.ok()) bytes += static_cast<int64_t>(*size);
  }
  return bytes;
}

struct HangRun {
  bool named = false;
  std::string suspects;  // the "suspects: ..." line
  absl::Duration to_suspects;
  absl::Duration cpu;
  absl::Duration process_cpu;   // the whole process's, from the declaration to the suspects
  absl::Duration longest_poll;  // the longest Poll call: how long the coordinator's loop stalled
  int64_t requests = 0;
  int64_t files_read = 0;
  int64_t bytes_read = 0;
  double peak_mib = 0;
};

std::unique_ptr<HangCoordinator> MakeHangCoordinator(Job& job, Env* env, const std::string& dir,
                                                     int ranks, int read_threads,
                                                     std::function<void(const std::string&)> say) {
  HangCoordinatorOptions options;
  options.dump_dir = dir;
  options.read_threads = read_threads;
  options.silent_heartbeat = absl::Seconds(600);
  options.heartbeat_timeout = absl::Seconds(600);
  options.store_timeout = kCall;
  HangCoordinator::Hooks hooks;
  hooks.coordinating = [] { return true; };
  hooks.say = std::move(say);
  hooks.ranks_store = [&job] { return job.store.get(); };
  hooks.rendezvous = [&job] { return job.rendezvous.get(); };
  hooks.restarted_at = [] { return absl::InfinitePast(); };
  hooks.live_rings = [] { return std::map<int, FlightRecorderContents>(); };
  // The coordinator's host (host0) runs ranks 0..7; every other rank is another host's.
  hooks.local_holder = [](int rank) {
    LocalHolder holder;
    if (rank >= kRanksPerHost) return holder;
    holder.here = true;
    holder.running = true;
    holder.label = absl::StrCat("rank ", rank);
    holder.pid = 100000 + rank;
    return holder;
  };
  hooks.kill_local = [](int, int64_t) {};
  hooks.kill_member = [](const std::string&, EventKind, const std::string&) {};
  hooks.kill_and_replace_stopped = [](int, const std::string&, EventKind, const std::string&) {};
  auto coordinator = std::make_unique<HangCoordinator>(
      job.store.get(), Clock::Real(), env, job.coordinator.get(), options, std::move(hooks));
  coordinator->set_world_size(ranks);
  return coordinator;
}

HangRun RunHang(Job& job, const std::string& dir, int ranks, const Flags& flags) {
  HangRun run;
  CountingEnv env(Env::Default());
  absl::Mutex mu;
  std::optional<absl::Time> named;
  std::string suspects;
  auto coordinator =
      MakeHangCoordinator(job, &env, dir, ranks, flags.read_threads, [&](const std::string& line) {
        if (absl::StartsWith(line, "hang diagnosis: suspects: ")) {
          absl::MutexLock lock(&mu);
          if (!named.has_value()) {
            named = absl::Now();
            suspects = line.substr(16);
          }
        }
      });
  (void)job.store->Delete(store_keys::Hang(0), kCall);
  (void)job.store->Delete(store_keys::HangAborted(0, kDeclarer), kCall);
  ResetPeakMemory();
  std::atomic<bool> stop{false};
  absl::Duration cpu;
  absl::Duration longest_poll;
  std::thread polling([&] {
    const absl::Duration begin = ThreadCpu();
    while (!stop.load()) {
      const absl::Time poll_begin = absl::Now();
      coordinator->Poll();
      longest_poll = std::max(longest_poll, absl::Now() - poll_begin);
      absl::SleepFor(absl::Milliseconds(10));
    }
    cpu = ThreadCpu() - begin;
  });
  absl::SleepFor(absl::Milliseconds(200));  // polls with no hang yet
  const int64_t requests_before = job.requests();
  const absl::Duration process_cpu_before = ProcessCpu();
  const absl::Time declared = absl::Now();
  (void)job.store->Set(store_keys::Hang(0), Declaration(), kCall);
  bool aborted = false;
  const absl::Time deadline = declared + flags.timeout;
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu);
      if (named.has_value()) break;
    }
    if (!aborted && absl::Now() >= declared + flags.dump_wait) {
      (void)job.store->Set(store_keys::HangAborted(0, kDeclarer), "rank 0", kCall);
      aborted = true;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  run.process_cpu = ProcessCpu() - process_cpu_before;
  stop = true;
  polling.join();
  run.requests = job.requests() - requests_before;
  run.cpu = cpu;
  run.longest_poll = longest_poll;
  run.files_read = env.files();
  run.bytes_read = env.bytes();
  run.peak_mib = PeakMemoryMiB();
  absl::MutexLock lock(&mu);
  if (named.has_value()) {
    run.named = true;
    run.to_suspects = *named - declared;
    run.suspects = suspects;
  }
  return run;
}

// The coordinator with no hang for `d`: its CPU and the store requests.
std::pair<absl::Duration, int64_t> RunSteady(Job& job, const std::string& dir, int ranks,
                                             absl::Duration d) {
  (void)job.store->Delete(store_keys::Hang(0), kCall);
  (void)job.store->Delete(store_keys::HangAborted(0, kDeclarer), kCall);
  auto coordinator =
      MakeHangCoordinator(job, Env::Default(), dir, ranks, 1, [](const std::string&) {});
  const int64_t before = job.requests();
  const absl::Duration cpu_begin = ThreadCpu();
  const absl::Time end = absl::Now() + d;
  while (absl::Now() < end) {
    coordinator->Poll();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return {ThreadCpu() - cpu_begin, job.requests() - before};
}

void MeasureHang(const Flags& flags, Report& report) {
  std::printf(
      "hang diagnosis (dumps of %d records, %s, read on %d threads; declaration -> suspects "
      "named, rank 0 aborts after %s)\n",
      flags.records, flags.digests ? "each with its digest" : "no digests", flags.read_threads,
      absl::FormatDuration(flags.dump_wait).c_str());
  std::printf("%7s %4s %10s %10s %9s %9s %9s %10s %8s %10s %9s  %s\n", "ranks", "run", "dumps_MiB",
              "named_s", "cpu_s", "proc_cpu", "poll_max", "requests", "files", "read_MiB",
              "peak_MiB", "suspects");
  for (int ranks : flags.ranks) {
    const std::string dir = absl::StrCat(flags.work_dir, "/ranks-", ranks, "/flight_recorder");
    std::error_code ignored;
    const absl::Time write_begin = absl::Now();
    absl::StatusOr<int64_t> written = WriteDumps(dir, ranks, flags.records, flags.digests);
    if (!written.ok()) {
      std::printf("ranks=%d: writing the dumps: %s\n", ranks, written.status().ToString().c_str());
      continue;
    }
    const absl::Duration write_time = absl::Now() - write_begin;
    absl::StatusOr<std::unique_ptr<Job>> job = Job::Form(ranks, Clock::Real());
    if (!job.ok()) {
      std::printf("ranks=%d: forming generation 0: %s\n", ranks, job.status().ToString().c_str());
      continue;
    }
    for (int run = 1; run <= flags.runs; ++run) {
      const HangRun r = RunHang(**job, dir, ranks, flags);
      std::printf("%7d %4d %10.1f %10s %9.3f %9.3f %9.3f %10ld %8ld %10.1f %9.0f  %s\n", ranks, run,
                  *written / 1048576.0,
                  r.named ? absl::StrFormat("%.3f", Seconds(r.to_suspects)).c_str() : "not named",
                  Seconds(r.cpu), Seconds(r.process_cpu), Seconds(r.longest_poll), r.requests,
                  r.files_read, r.bytes_read / 1048576.0, r.peak_mib, r.suspects.c_str());
      report.Add({"hang",
                  ranks,
                  run,
                  {{"named", r.named ? 1.0 : 0.0},
                   {"digests", flags.digests ? 1.0 : 0.0},
                   {"declared_to_suspects_s", Seconds(r.to_suspects)},
                   {"read_threads", static_cast<double>(flags.read_threads)},
                   {"coordinator_cpu_s", Seconds(r.cpu)},
                   {"process_cpu_s", Seconds(r.process_cpu)},
                   {"longest_poll_s", Seconds(r.longest_poll)},
                   {"store_requests", static_cast<double>(r.requests)},
                   {"dump_files_read", static_cast<double>(r.files_read)},
                   {"dump_bytes_read", static_cast<double>(r.bytes_read)},
                   {"dump_bytes_total", static_cast<double>(*written)},
                   {"dumps_write_s", Seconds(write_time)},
                   {"peak_rss_mib", r.peak_mib}}});
      std::fflush(stdout);
    }
    for (int run = 1; run <= flags.runs; ++run) {
      const auto [cpu, requests] = RunSteady(**job, dir, ranks, flags.steady);
      const double per_s = 1 / Seconds(flags.steady);
      std::printf("%7d %4d steady state: %.4f cpu_s/s, %.1f store requests/s\n", ranks, run,
                  Seconds(cpu) * per_s, requests * per_s);
      report.Add({"hang_steady",
                  ranks,
                  run,
                  {{"coordinator_cpu_s_per_s", Seconds(cpu) * per_s},
                   {"store_requests_per_s", requests * per_s}}});
    }
    std::filesystem::remove_all(absl::StrCat(flags.work_dir, "/ranks-", ranks), ignored);
  }
}

// ---- fail-slow -----------------------------------------------------------------------------

// Deterministic noise in [-1, 1] for (host, second).
double Noise(int host, int64_t second, int salt) {
  uint64_t x = (static_cast<uint64_t>(host) << 40) ^ (static_cast<uint64_t>(salt) << 32) ^
               static_cast<uint64_t>(second);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

// Host `h`'s sample of second `second`, with the HostSampler's metrics (host_sampler.cc).
std::string HostSample(int h, int64_t second, bool slow) {
  const double factor = slow ? 1.3 : 1.0;
  HostMetricsRecord record;
  record.seq = second;
  record.work = 1.0 / factor;
  auto v = [&](double base, int salt) { return base * (1 + 0.03 * Noise(h, second, salt)); };
  record.metrics = {{"compute_ms", v(420, 1) * factor},
                    {"collective_ms", v(180, 2)},
                    {"collective_mb_s", v(9500, 3)},
                    {"phase_forward_ms", v(140, 4) * factor},
                    {"phase_backward_ms", v(280, 5) * factor},
                    {"cpu_wait_ms", v(3, 6)},
                    {"cpu_util", v(0.35, 7)},
                    {"tcp_retrans", 0},
                    {"tcp_rtt_ms", v(0.08, 8)}};
  return EncodeHostMetricsRecord(record);
}

void MeasureFailSlow(const Flags& flags, Report& report) {
  std::printf("\nfail-slow detector (one host 30%% slower from second 10; --fail-slow alert)\n");
  std::printf("%6s %4s %12s %14s %12s %10s\n", "hosts", "run", "cpu_ms/poll", "requests/poll",
              "named_after", "record_B");
  constexpr int64_t kOnset = 10;
  constexpr int64_t kSeconds = 60;  // the default continuity (30 s) and window (9 s) fit
  for (int hosts : flags.hosts) {
    if (hosts < 3) {
      std::printf("%6d: the detector compares at least 3 hosts; not measured\n", hosts);
      continue;
    }
    for (int run = 1; run <= flags.runs; ++run) {
      ManualClock clock(absl::Now());
      absl::StatusOr<std::unique_ptr<Job>> job = Job::Form(hosts * kRanksPerHost, &clock);
      if (!job.ok()) {
        std::printf("hosts=%d: %s\n", hosts, job.status().ToString().c_str());
        break;
      }
      const int slow_host = hosts / 2;
      std::optional<int64_t> named_at;
      FailSlowCoordinatorOptions options;
      options.policy = FailSlowPolicy::kAlert;
      options.ranks_per_host = kRanksPerHost;
      options.dump_dir = absl::StrCat(flags.work_dir, "/fail_slow-", hosts);
      options.call_timeout = kCall;
      FailSlowCoordinator::Hooks hooks;
      int64_t second = 0;
      hooks.coordinating = [] { return true; };
      hooks.say = [&](const std::string& line) {
        if (!named_at.has_value() &&
            absl::StrContains(line, absl::StrCat(" ", Host(slow_host), ":"))) {
          named_at = second;
        }
      };
      hooks.record = [](Event) {};
      absl::StatusOr<std::unique_ptr<FailSlowCoordinator>> detector =
          FailSlowCoordinator::Create((*job)->store.get(), &clock, Env::Default(),
                                      (*job)->coordinator.get(), options, std::move(hooks));
      if (!detector.ok()) {
        std::printf("hosts=%d: %s\n", hosts, detector.status().ToString().c_str());
        break;
      }
      absl::Duration cpu;
      int64_t requests = 0;
      size_t record_bytes = 0;
      for (second = 1; second <= kSeconds; ++second) {
        for (int h = 0; h < hosts; ++h) {
          const std::string sample = HostSample(h, second, h == slow_host && second >= kOnset);
          record_bytes = std::max(record_bytes, sample.size());
          (void)(*job)->store->Set(HostMetricsKey(Host(h)), sample, kCall);
        }
        clock.Advance(absl::Seconds(1));
        const int64_t before = (*job)->requests();
        const absl::Duration begin = ThreadCpu();
        (*detector)->Poll(hosts * kRanksPerHost);
        cpu += ThreadCpu() - begin;
        requests += (*job)->requests() - before;
      }
      const double cpu_ms = absl::ToDoubleMilliseconds(cpu) / kSeconds;
      const double per_poll = static_cast<double>(requests) / kSeconds;
      std::printf(
          "%6d %4d %12.3f %14.1f %12s %10zu\n", hosts, run, cpu_ms, per_poll,
          named_at.has_value() ? absl::StrCat(*named_at - kOnset, " s").c_str() : "not named",
          record_bytes);
      report.Add({"fail_slow",
                  hosts,
                  run,
                  {{"cpu_ms_per_poll", cpu_ms},
                   {"store_requests_per_poll", per_poll},
                   {"named", named_at.has_value() ? 1.0 : 0.0},
                   {"named_after_s", named_at.has_value() ? double(*named_at - kOnset) : -1.0},
                   {"record_bytes", static_cast<double>(record_bytes)}}});
      std::fflush(stdout);
      std::error_code ignored;
      std::filesystem::remove_all(options.dump_dir, ignored);
    }
  }
}

// ---- backup placement ----------------------------------------------------------------------

void MeasurePlacement(const Flags& flags, Report& report) {
  std::printf(
      "\nbackup placement (8 ranks a host, TP 8, PP 4, 2 copies, --backup-evict "
      "host,tp,pp,dp)\n");
  std::printf("%6s %4s %10s %10s %12s %10s %12s  %s\n", "hosts", "run", "place_ms", "prove_ms",
              "describe_ms", "encoded_B", "described_B", "proof (times: CPU of one thread)");
  for (int hosts : flags.hosts) {
    if (hosts < 2) {
      std::printf("%6d: a placement needs 2 hosts; not measured\n", hosts);
      continue;
    }
    const int pp = hosts >= 4 ? 4 : 1;
    absl::StatusOr<Topology> topology = Topology::Create(
        {.world_size = hosts * kRanksPerHost, .tp = 8, .pp = pp, .ranks_per_host = kRanksPerHost});
    if (!topology.ok()) {
      std::printf("hosts=%d: %s\n", hosts, topology.status().ToString().c_str());
      continue;
    }
    absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses("host,tp,pp,dp");
    BackupPlacementSpec spec{.topology = *topology, .copies = 2, .classes = *classes};
    for (int run = 1; run <= flags.runs; ++run) {
      // CPU time of this thread: the calls are single-threaded, and the machine is shared.
      absl::Duration t = ThreadCpu();
      absl::StatusOr<BackupPlacement> placement = BackupPlacement::Place(spec);
      const absl::Duration place = ThreadCpu() - t;
      if (!placement.ok()) {
        std::printf("hosts=%d: %s\n", hosts, placement.status().ToString().c_str());
        break;
      }
      t = ThreadCpu();
      const PlacementProof proof = ProvePlacement(spec, *placement);
      const absl::Duration prove = ThreadCpu() - t;
      t = ThreadCpu();
      const std::string described = DescribePlacement(spec, *placement);
      const absl::Duration describe = ThreadCpu() - t;
      const std::string encoded = placement->Encode();
      std::printf("%6d %4d %10.3f %10.3f %12.3f %10zu %12zu  %s (%zu lines; dropped %s)\n", hosts,
                  run, absl::ToDoubleMilliseconds(place), absl::ToDoubleMilliseconds(prove),
                  absl::ToDoubleMilliseconds(describe), encoded.size(), described.size(),
                  proof.holds ? "holds" : "DOES NOT HOLD", proof.lines.size(),
                  placement->dropped().empty()
                      ? "none"
                      : std::string(EvictionClassName(placement->dropped().front())).c_str());
      report.Add({"placement",
                  hosts,
                  run,
                  {{"place_ms", absl::ToDoubleMilliseconds(place)},
                   {"prove_ms", absl::ToDoubleMilliseconds(prove)},
                   {"describe_ms", absl::ToDoubleMilliseconds(describe)},
                   {"encoded_bytes", static_cast<double>(encoded.size())},
                   {"described_bytes", static_cast<double>(described.size())},
                   {"proof_lines", static_cast<double>(proof.lines.size())},
                   {"proof_holds", proof.holds ? 1.0 : 0.0}}});
      std::fflush(stdout);
    }
  }
}

// ---- flags ---------------------------------------------------------------------------------

std::optional<std::vector<int>> ParseList(absl::string_view csv) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(csv, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return std::nullopt;
    out.push_back(v);
  }
  return out;
}

std::optional<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    int64_t n = 0;
    if (absl::ConsumePrefix(&arg, "--parts=")) {
      flags.parts.clear();
      for (absl::string_view p : absl::StrSplit(arg, ',')) flags.parts.insert(std::string(p));
    } else if (absl::ConsumePrefix(&arg, "--ranks=")) {
      std::optional<std::vector<int>> v = ParseList(arg);
      if (!v.has_value()) return std::nullopt;
      flags.ranks = *v;
    } else if (absl::ConsumePrefix(&arg, "--hosts=")) {
      std::optional<std::vector<int>> v = ParseList(arg);
      if (!v.has_value()) return std::nullopt;
      flags.hosts = *v;
    } else if (absl::ConsumePrefix(&arg, "--runs=") && absl::SimpleAtoi(arg, &n) && n > 0) {
      flags.runs = static_cast<int>(n);
    } else if (absl::ConsumePrefix(&arg, "--records=") && absl::SimpleAtoi(arg, &n) && n >= 16) {
      flags.records = static_cast<int>(n);
    } else if (absl::ConsumePrefix(&arg, "--steady_s=") && absl::SimpleAtoi(arg, &n) && n > 0) {
      flags.steady = absl::Seconds(n);
    } else if (absl::ConsumePrefix(&arg, "--dump_wait_ms=") && absl::SimpleAtoi(arg, &n) &&
               n >= 0) {
      flags.dump_wait = absl::Milliseconds(n);
    } else if (absl::ConsumePrefix(&arg, "--digests=") && absl::SimpleAtoi(arg, &n) && n >= 0 &&
               n <= 1) {
      flags.digests = n == 1;
    } else if (absl::ConsumePrefix(&arg, "--read_threads=") && absl::SimpleAtoi(arg, &n) && n > 0 &&
               n <= 64) {
      flags.read_threads = static_cast<int>(n);
    } else if (absl::ConsumePrefix(&arg, "--timeout_s=") && absl::SimpleAtoi(arg, &n) && n > 0) {
      flags.timeout = absl::Seconds(n);
    } else if (absl::ConsumePrefix(&arg, "--work_dir=") && !arg.empty()) {
      flags.work_dir = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--json=") && !arg.empty()) {
      flags.json = std::string(arg);
    } else {
      return std::nullopt;
    }
  }
  return flags;
}

std::string Load() {
  std::ifstream in("/proc/loadavg");
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) {
  using namespace trainguard;  // NOLINT(google-build-using-namespace)
  std::optional<Flags> flags = ParseFlags(argc, argv);
  if (!flags.has_value()) {
    std::fprintf(stderr,
                 "usage: bench_scale_decisions [--parts=hang,fail_slow,placement] "
                 "[--ranks=8,64,...] [--hosts=1,8,...] [--runs=3] [--records=4096] [--steady_s=2] "
                 "[--dump_wait_ms=1000] [--digests=1] [--read_threads=4] [--timeout_s=120] "
                 "[--work_dir=DIR] "
                 "[--json=FILE]\n");
    return 2;
  }
  std::printf("load before: %s\n", Load().c_str());
  Report report;
  if (flags->parts.count("hang") != 0) MeasureHang(*flags, report);
  if (flags->parts.count("fail_slow") != 0) MeasureFailSlow(*flags, report);
  if (flags->parts.count("placement") != 0) MeasurePlacement(*flags, report);
  const std::string load = Load();
  std::printf("load after: %s\n", load.c_str());
  if (!flags->json.empty()) {
    if (absl::Status written = report.WriteJson(flags->json, load); !written.ok()) {
      std::fprintf(stderr, "%s\n", written.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
