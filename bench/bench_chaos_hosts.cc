// bench_chaos_hosts: `trainguard chaos` on simulated hosts (tests/support/sim_cluster.h): a job of
// `trainguard run` agents, one per host, under a seeded Poisson stream of host faults and rank
// faults, then `trainguard report`'s figures (ETTR, per fault detection, culprit, recovery), for
// trainguard and for the baseline, side by side with their ETTR ratio. Needs root, like
// multihost_test.
//
//   bench_chaos_hosts [--training-hosts 2] [--nproc-per-node 2] [--standby-hosts 1]
//                     [--duration 10m] [--mean-interval 20s] [--seed 1]
//                     [--mix host_kill=1,partition=1,kill=1,stop=1,nan=1]
//                     [--faults 10s:host_kill:0,30s:partition:2] [--run-dir DIR] [--png FILE]
//                     [--heartbeat-timeout 5] [--host-timeout 3] [--checkpoint-every-steps 50]
//                     [--snapshot-every-steps N] [--mode trainguard|baseline|both] [-- COMMAND...]
//
// --mode both (the default) runs the job twice on the same schedule, one after the other, like
// `trainguard chaos`: trainguard (DIR/trainguard) as described below, then the baseline
// (DIR/baseline): the same hosts and standby hosts, every agent with --restart-all 100000 and no
// spare processes (torchrun's elastic agent: any fault stops every rank on every host and starts
// them again from the newest checkpoint on disk; a dead host's group rank goes to a standby host
// in the restart; see LaunchConfig::restart_all in sdk/launch/launch_config.h). In the baseline a
// host fault waits for an idle standby host instead of parked standbys, a kill or stop waits for
// nothing, and a standby host is added when none is idle.
//
// The job (trainguard): hosts 1..T train (T = --training-hosts, N ranks each, and one warm spare
// process each,
// --standby 1), hosts T+1..T+S are standby hosts (--role standby, N standbys each); every agent has
// --standby-nodes S (the job forms once every host joined), --spread-standbys (a dead host's ranks
// may go to spares of several hosts when no standby host is whole), --max-replacements 100000
// --restart-backoff 0 (faults come at random: no crash loop). The trainer is the example trainer
// with the flags `trainguard chaos` gives it (--step-time-ms 50 --progress-events 1
// --nan-on-sigusr1 1 --drop-on-sigurg 1), or the COMMAND after `--` (absolute or relative to the
// working directory, as `trainguard chaos -- COMMAND` takes it: the PyTorch example under
// .venv/bin/python, whose restart costs what torch's import costs; it must do what the mix asks of
// it: --nan-on-sigusr1 for nan, --drop-on-sigurg for drop), snapshots in memory every
// --snapshot-every-steps (default --checkpoint-every-steps / 10, at least 1), on disk every
// --checkpoint-every-steps. The store is a
// TcpStore this program serves on 127.0.1.254.
//
// The schedule: PlanFaults (tools/chaos_command.h) over the world's ranks, or --faults (fixed
// AT:KIND:RANK items, for a test). A fault's rank picks its target when it comes: the process that
// holds the rank now, or for host_kill and partition the host that holds it now. The kinds:
//   host_kill  SimCluster::KillHost: SIGKILL to the host's init, every process of the host at once;
//   partition  SimCluster::Isolate: every packet between the host and any other address dropped,
//              until the job declared the host lost (then healed: the host's agent finds itself
//              fenced out and stops; it is killed if it has not within 20 s);
//   kill, stop, nan, drop  as `trainguard chaos`: SIGKILL, SIGSTOP, SIGUSR1, SIGURG to the rank's
//              process, found from the launcher's pid file (<mode>/pids/<host>/rank-R, a pid of
//              that host's PID namespace), mapped to this machine's pid through /proc/<pid>/status
//              NSpid among the host's processes, and signalled through a pidfd only if it is a
//              running descendant of this program.
// A host fault waits (up to 30 s, then it is skipped) until no other host fault is being handled
// and the job has a parked standby outside the target host for every rank the host holds (its
// spares may have taken more ranks than it started with), so the job can always replace it;
// a host that was lost is started again, once its loss was declared, as a new standby host under
// a new host id (host<n>r<k>: the old id stays fenced), so a long run keeps its standby hosts; and
// when no more than N standbys are parked (rank faults use them up: a standby host starts no new
// ones once they took ranks), one more standby host is started, at most one per 15 s, as a
// scheduler adds a node. A kill or stop waits (up to 10 s, then it is skipped) for a parked
// standby, without which the job fails by design.
// Every injection is appended to <mode>/events/chaos.tgev before it is done (what=chaos_inject:
// kind, rank, pid, host, ranks), a skip as what=chaos_skip.
//
// At --duration (or once the job failed: exit status 1) every host is killed; after the last run
// the report of both is printed (and written to DIR/report.txt, DIR/report.json; --png FILE plots
// both lines, every fault marked).
//
// Exit status: 0 the run ran; 1 it could not be set up, or the job failed; 2 bad usage.
//
// Single-threaded: the main thread drives the SimCluster (it must: see sim_cluster.h).
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
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
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/event_log.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/own_process.h"
#include "tests/support/sim_cluster.h"
#include "tools/chaos_command.h"
#include "tools/chaos_report.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using testing::SimCluster;

constexpr char kStoreAddress[] = "127.0.1.254";
constexpr char kToken[] = "bench-chaos-hosts-token";
constexpr absl::Duration kFormationPatience = absl::Minutes(3);
// How long a rank fault waits for its rank to have a process (a replacement taking over), and a
// host fault for the job to be able to replace a host.
constexpr absl::Duration kRankPatience = absl::Seconds(10);
constexpr absl::Duration kHostPatience = absl::Seconds(30);
// How long a lost host's loss may take to be declared, and a healed partitioned host to stop.
constexpr absl::Duration kLossPatience = absl::Seconds(60);
constexpr absl::Duration kFencePatience = absl::Seconds(20);
constexpr absl::Duration kPoll = absl::Milliseconds(100);
constexpr absl::Duration kRefillSpacing = absl::Seconds(15);

constexpr char kUsage[] =
    "usage: bench_chaos_hosts [--training-hosts 2] [--nproc-per-node 2] [--standby-hosts 1]\n"
    "                         [--duration 10m] [--mean-interval 20s] [--seed 1]\n"
    "                         [--mix host_kill=1,partition=1,kill=1,stop=1,nan=1]\n"
    "                         [--faults AT:KIND:RANK,...] [--run-dir DIR] [--png FILE]\n"
    "                         [--heartbeat-timeout 5] [--host-timeout 3]\n"
    "                         [--checkpoint-every-steps 50] [--snapshot-every-steps N]\n"
    "                         [--mode trainguard|baseline|both]\n"
    "                         [-- COMMAND...]\n";

struct Config {
  int training_hosts = 2;
  int per_node = 2;
  int standby_hosts = 1;
  absl::Duration duration = absl::Minutes(10);
  absl::Duration mean_interval = absl::Seconds(20);
  uint64_t seed = 1;
  std::vector<std::pair<std::string, int>> mix = {
      {"host_kill", 1}, {"partition", 1}, {"kill", 1}, {"stop", 1}, {"nan", 1}};
  std::vector<tools::PlannedFault> fixed;  // --faults
  std::string run_dir;
  std::string png;
  int heartbeat_timeout_s = 5;
  double host_timeout_s = 3;
  int checkpoint_every_steps = 50;
  int snapshot_every_steps = 0;  // 0: checkpoint_every_steps / 10 (at least 1)
  std::vector<std::string> modes = {"trainguard", "baseline"};
  // The trainer each rank runs (after `--`); empty: the example trainer with chaos's flags.
  std::vector<std::string> command;
  int world() const { return training_hosts * per_node; }
  int hosts() const { return training_hosts + standby_hosts; }
};

absl::StatusOr<absl::Duration> ParseDuration(const std::string& flag, const std::string& value) {
  absl::Duration d;
  if (absl::ParseDuration(value, &d) && d > absl::ZeroDuration()) return d;
  double seconds = 0;
  if (absl::SimpleAtod(value, &seconds) && seconds > 0) return absl::Seconds(seconds);
  return absl::InvalidArgumentError(
      absl::StrFormat("%s '%s': need a positive duration (20s, 10m)", flag, value));
}

absl::StatusOr<std::vector<tools::PlannedFault>> ParseFixedFaults(const std::string& text,
                                                                  int world) {
  std::vector<tools::PlannedFault> faults;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(item, ':');
    tools::PlannedFault fault;
    if (f.size() != 3 || !absl::SimpleAtoi(f[2], &fault.rank) || fault.rank < 0 ||
        fault.rank >= world) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--faults '%s': need AT:KIND:RANK with RANK in [0, %d)", std::string(item), world));
    }
    absl::StatusOr<absl::Duration> at = ParseDuration("--faults", f[0]);
    if (!at.ok()) return at.status();
    absl::StatusOr<std::vector<std::pair<std::string, int>>> kind =
        tools::ParseMix(f[1] + "=1", /*host_kinds=*/true);
    if (!kind.ok()) return kind.status();
    fault.at = *at;
    fault.kind = f[1];
    faults.push_back(fault);
  }
  // Faults at the same time are injected in the order given.
  std::stable_sort(
      faults.begin(), faults.end(),
      [](const tools::PlannedFault& a, const tools::PlannedFault& b) { return a.at < b.at; });
  return faults;
}

absl::StatusOr<Config> ParseArguments(int argc, char** argv) {
  Config config;
  std::string fixed;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--") {
      if (i + 1 >= argc) return absl::InvalidArgumentError("-- needs a command after it");
      // A host's working directory is this one, but its argv[0] must be absolute.
      config.command.push_back(std::filesystem::absolute(argv[i + 1]).string());
      config.command.insert(config.command.end(), argv + i + 2, argv + argc);
      break;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    int n = 0;
    const bool count = absl::SimpleAtoi(value, &n) && n >= 1;
    auto need_count = [&](int* field) -> absl::Status {
      if (!count) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s '%s': need an integer >= 1", flag, value));
      }
      *field = n;
      return absl::OkStatus();
    };
    absl::Status status;
    if (flag == "--training-hosts") {
      status = need_count(&config.training_hosts);
    } else if (flag == "--nproc-per-node") {
      status = need_count(&config.per_node);
    } else if (flag == "--standby-hosts") {
      status = need_count(&config.standby_hosts);
    } else if (flag == "--heartbeat-timeout") {
      status = need_count(&config.heartbeat_timeout_s);
    } else if (flag == "--host-timeout") {
      if (!absl::SimpleAtod(value, &config.host_timeout_s) || config.host_timeout_s < 0.5 ||
          config.host_timeout_s > 3600) {
        status = absl::InvalidArgumentError(
            absl::StrFormat("--host-timeout '%s': need seconds in [0.5, 3600]", value));
      }
    } else if (flag == "--checkpoint-every-steps") {
      status = need_count(&config.checkpoint_every_steps);
    } else if (flag == "--snapshot-every-steps") {
      status = need_count(&config.snapshot_every_steps);
    } else if (flag == "--duration" || flag == "--mean-interval") {
      absl::StatusOr<absl::Duration> d = ParseDuration(flag, value);
      if (!d.ok()) return d.status();
      (flag == "--duration" ? config.duration : config.mean_interval) = *d;
    } else if (flag == "--seed") {
      if (!absl::SimpleAtoi(value, &config.seed)) {
        return absl::InvalidArgumentError(absl::StrFormat("--seed '%s': need an integer", value));
      }
    } else if (flag == "--mix") {
      absl::StatusOr<std::vector<std::pair<std::string, int>>> mix =
          tools::ParseMix(value, /*host_kinds=*/true);
      if (!mix.ok()) return mix.status();
      config.mix = *std::move(mix);
    } else if (flag == "--faults") {
      fixed = value;
    } else if (flag == "--run-dir") {
      config.run_dir = std::filesystem::absolute(value).string();
    } else if (flag == "--png") {
      config.png = std::filesystem::absolute(value).string();
    } else if (flag == "--mode") {
      absl::StatusOr<std::vector<std::string>> modes = tools::ParseModes(value);
      if (!modes.ok()) return modes.status();
      config.modes = *std::move(modes);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
    if (!status.ok()) return status;
  }
  if (config.training_hosts < 2) {
    return absl::InvalidArgumentError("--training-hosts: need at least 2 (a job of several hosts)");
  }
  if (!fixed.empty()) {
    absl::StatusOr<std::vector<tools::PlannedFault>> faults =
        ParseFixedFaults(fixed, config.world());
    if (!faults.ok()) return faults.status();
    config.fixed = *std::move(faults);
  }
  if (config.run_dir.empty()) {
    // Every simulated host has a private /tmp: the default is under the build tree.
    config.run_dir = absl::StrCat(TRAINGUARD_BENCH_WORK_DIR, "/run-", getpid());
  }
  return config;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The last NSpid field of /proc/<pid>/status: the pid as its own (innermost) PID namespace knows
// it; -1 when the process is gone.
pid_t InnermostPid(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "NSpid:")) continue;
    std::vector<absl::string_view> ids =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t id = -1;
    if (ids.empty() || !absl::SimpleAtoi(ids.back(), &id)) return -1;
    return static_cast<pid_t>(id);
  }
  return -1;
}

// A rank's process as found now.
struct Holder {
  int slot = -1;      // the simulated host (SimCluster's n)
  std::string host;   // its host id
  pid_t pid = -1;     // in the host's PID namespace (what its launcher records)
  pid_t global = -1;  // in this program's
};

class ChaosOnHosts {
 public:
  // `mode`: "trainguard" or "baseline"; the run's files go to <run dir>/<mode>.
  ChaosOnHosts(const Config& config, std::string mode)
      : config_(config),
        baseline_(mode == "baseline"),
        mode_(std::move(mode)),
        dir_(absl::StrCat(config.run_dir, "/", mode_)) {}
  ChaosOnHosts(const ChaosOnHosts&) = delete;
  ChaosOnHosts& operator=(const ChaosOnHosts&) = delete;
  ~ChaosOnHosts() {
    // The hosts go before the store they use; the cluster's destructor kills any left.
    if (cluster_ != nullptr) {
      for (const auto& [slot, k] : incarnation_) {
        if (cluster_->Running(slot)) (void)cluster_->KillHost(slot);
      }
    }
  }

  // Runs the job under the schedule; 0 when it ran, 1 when it could not be set up or failed.
  int Run();

 private:
  struct HostFault {
    int slot;
    std::string host;
    std::string kind;
    absl::Time injected;
    bool lost_seen = false;
    absl::Time healed = absl::InfiniteFuture();
  };

  absl::Status SetUp();
  absl::Status StartHost(int slot, bool standby);
  std::string HostId(int slot) const {
    const int k = incarnation_.at(slot);
    return k == 0 ? absl::StrCat("host", slot) : absl::StrCat("host", slot, "r", k);
  }
  std::string Log(int slot) const { return absl::StrCat(dir_, "/", HostId(slot), ".log"); }
  std::string AllLogs() const {
    std::string all;
    for (const auto& [slot, k] : incarnation_) absl::StrAppend(&all, ReadFile(Log(slot)));
    return all;
  }
  // Whether the job failed, or a rank stopped it (the launchers say so in their logs).
  bool JobEnded() const {
    const std::string logs = AllLogs();
    return absl::StrContains(logs, "job failed: ") || absl::StrContains(logs, "job stopped: ");
  }
  std::optional<Holder> FindHolder(int rank);
  int ParkedOutside(const std::string& host);
  // Baseline: the standby hosts (in the job, holding no group rank, not dead) other than `host`.
  int IdleHostsOutside(const std::string& host);
  void Record(int rank, EventKind what, const std::string& message,
              std::vector<std::pair<std::string, std::string>> attributes);
  void Say(const std::string& line) {
    std::printf("bench_chaos_hosts [%s]: %s\n", mode_.c_str(), line.c_str());
    std::fflush(stdout);
  }
  // Waits until `when`, tending the host fault in progress meanwhile.
  void WaitUntil(absl::Time when);
  void Tend();
  // Starts one more standby host when the job's parked standbys run low (as a scheduler adds a
  // node): standby hosts do not start new standbys once theirs took ranks.
  void Refill();
  void Inject(const tools::PlannedFault& fault);
  bool InjectHostFault(const tools::PlannedFault& fault, std::string* why);
  bool InjectRankFault(const tools::PlannedFault& fault, std::string* why);

  const Config config_;
  const bool baseline_;
  const std::string mode_;
  const std::string dir_;  // this run's: config_.run_dir/<mode>
  std::unique_ptr<SimCluster> cluster_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RendezvousCoordinator> rendezvous_;  // read-only: the parked standbys
  std::unique_ptr<EventLog> events_;
  std::string endpoint_;
  const std::string job_id_ = absl::StrCat("chaos-hosts-", mode_, "-", getpid());
  std::map<int, int> incarnation_;  // slot -> how often it was started again
  std::optional<HostFault> pending_;
  absl::Time start_;
  absl::Time next_refill_check_ = absl::InfinitePast();
  absl::Time last_refill_ = absl::InfinitePast();
};

absl::Status ChaosOnHosts::SetUp() {
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_ + "/events");
  std::ofstream(dir_ + "/token") << kToken << "\n";
  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
  if (!cluster.ok()) return cluster.status();
  cluster_ = *std::move(cluster);
  TcpStoreServerOptions options;
  options.host = kStoreAddress;
  options.job_token = kToken;
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  endpoint_ = absl::StrCat("tcp://", kStoreAddress, ":", server_->port());
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(endpoint_, job_id_, kToken, absl::Seconds(10));
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  rendezvous_ = std::make_unique<RendezvousCoordinator>(store_.get());
  absl::StatusOr<std::unique_ptr<EventLog>> events =
      EventLog::Open(Env::Default(), dir_ + "/events/chaos.tgev");
  if (!events.ok()) return events.status();
  events_ = *std::move(events);
  return absl::OkStatus();
}

absl::Status ChaosOnHosts::StartHost(int slot, bool standby) {
  const int every = config_.checkpoint_every_steps;
  const int snapshot_every =
      config_.snapshot_every_steps > 0 ? config_.snapshot_every_steps : std::max(1, every / 10);
  const std::string& run = dir_;  // the job's run dir, beside the host logs
  std::vector<std::string> argv = {TRAINGUARD_CLI_PATH,
                                   "run",
                                   "--nnodes",
                                   absl::StrCat(config_.training_hosts),
                                   "--nproc-per-node",
                                   absl::StrCat(config_.per_node),
                                   "--standby-nodes",
                                   absl::StrCat(config_.standby_hosts),
                                   "--rdzv-endpoint",
                                   endpoint_,
                                   "--token-file",
                                   dir_ + "/token",
                                   "--job-id",
                                   job_id_,
                                   "--run-dir",
                                   run,
                                   "--host-id",
                                   HostId(slot),
                                   "--local-addr",
                                   SimCluster::Address(slot),
                                   "--host-timeout",
                                   absl::StrFormat("%g", config_.host_timeout_s),
                                   "--heartbeat-timeout",
                                   absl::StrCat(config_.heartbeat_timeout_s),
                                   "--max-replacements",
                                   "100000",
                                   "--restart-backoff",
                                   "0",
                                   "--spread-standbys"};
  if (standby) {
    argv.insert(argv.end(), {"--role", "standby"});
  } else if (!baseline_) {
    argv.insert(argv.end(), {"--standby", "1"});
  }
  if (baseline_) argv.insert(argv.end(), {"--restart-all", "100000"});
  argv.push_back("--");
  if (config_.command.empty()) {
    argv.insert(argv.end(),
                {TRAINGUARD_TRAINER_PATH, "--steps", "1000000000", "--step-time-ms", "50",
                 "--print-every", "100", "--comm-timeout-s", "10", "--progress-events", "1",
                 "--nan-on-sigusr1", "1", "--drop-on-sigurg", "1"});
  } else {
    argv.insert(argv.end(), config_.command.begin(), config_.command.end());
  }
  const std::vector<std::string> env = {
      absl::StrCat("TRAINGUARD_CHECKPOINT_EVERY_STEPS=", snapshot_every),
      absl::StrCat("TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "=", std::max(1, every / snapshot_every)),
      absl::StrCat("TRAINGUARD_CHECKPOINT_DIR=", run, "/checkpoints")};
  return cluster_->StartHost(
      slot, {.hostname = HostId(slot), .argv = argv, .env = env, .log_path = Log(slot)});
}

void ChaosOnHosts::Record(int rank, EventKind what, const std::string& message,
                          std::vector<std::pair<std::string, std::string>> attributes) {
  if (absl::Status s =
          tools::AppendChaosEvent(events_.get(), rank, what, message, std::move(attributes));
      !s.ok()) {
    Say(s.ToString());
  }
}

std::optional<Holder> ChaosOnHosts::FindHolder(int rank) {
  std::optional<Holder> best;
  absl::Time best_written = absl::InfinitePast();
  for (const auto& [slot, k] : incarnation_) {
    if (!cluster_->Running(slot)) continue;
    const std::string host = HostId(slot);
    const std::string file = absl::StrCat(dir_, "/pids/", host, "/rank-", rank);
    int64_t pid = 0;
    struct stat st {};
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(file)), &pid) || pid <= 1 ||
        stat(file.c_str(), &st) != 0) {
      continue;
    }
    // A rank that moved to another host leaves its old pid file behind: the newest file whose
    // process still runs names the holder.
    const absl::Time written = absl::TimeFromTimespec(st.st_mtim);
    for (pid_t global : cluster_->Processes(slot)) {
      if (InnermostPid(global) != pid || written <= best_written) continue;
      best = Holder{slot, host, static_cast<pid_t>(pid), global};
      best_written = written;
    }
  }
  return best;
}

// "": every parked standby.
int ChaosOnHosts::ParkedOutside(const std::string& host) {
  absl::StatusOr<std::vector<std::string>> parked = rendezvous_->ParkedStandbys(absl::Seconds(2));
  if (!parked.ok()) return 0;
  return static_cast<int>(std::count_if(parked->begin(), parked->end(), [&](const std::string& m) {
    return !absl::StartsWith(m, host + ":");
  }));
}

int ChaosOnHosts::IdleHostsOutside(const std::string& host) {
  const absl::Duration timeout = absl::Seconds(2);
  absl::StatusOr<std::string> plan = store_->Get("agents/plan", timeout);
  absl::StatusOr<std::vector<std::string>> joined = store_->ListKeys("agents/join/", timeout);
  absl::StatusOr<std::vector<std::string>> dead = store_->ListKeys("agents/dead/", timeout);
  if (!plan.ok() || !joined.ok() || !dead.ok()) return 0;
  std::set<std::string> training;
  for (absl::string_view line : absl::StrSplit(*plan, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int group = -1;
    if (f.size() == 2 && absl::SimpleAtoi(f[1], &group) && group >= 0) training.insert(f[0]);
  }
  int idle = 0;
  for (const auto& [slot, k] : incarnation_) {
    const std::string id = HostId(slot);
    if (id == host || !cluster_->Running(slot) || training.count(id) != 0) continue;
    const auto has = [&](const std::vector<std::string>& keys, const std::string& key) {
      return std::find(keys.begin(), keys.end(), key) != keys.end();
    };
    if (has(*joined, "agents/join/" + id) && !has(*dead, "agents/dead/" + id)) ++idle;
  }
  return idle;
}

void ChaosOnHosts::Refill() {
  const absl::Time now = absl::Now();
  // A host takes a few seconds to join and park its standbys: one at a time.
  if (now < next_refill_check_ || now - last_refill_ < kRefillSpacing) return;
  next_refill_check_ = now + absl::Seconds(1);
  // The baseline has no standby processes: only a host fault uses a standby host up.
  if (baseline_ ? IdleHostsOutside("") >= 1 : ParkedOutside("") > config_.per_node) return;
  const int slot = incarnation_.rbegin()->first + 1;
  incarnation_[slot] = 0;
  last_refill_ = now;
  if (absl::Status s = StartHost(slot, /*standby=*/true); !s.ok()) {
    Say(absl::StrCat("cannot start standby host ", HostId(slot), ": ", s.ToString()));
    return;
  }
  Say(absl::StrFormat("few standbys parked: standby host %s started at %.1f s", HostId(slot),
                      absl::ToDoubleSeconds(now - start_)));
}

void ChaosOnHosts::Tend() {
  if (!pending_.has_value()) return Refill();
  HostFault& p = *pending_;
  const absl::Time now = absl::Now();
  if (!p.lost_seen) {
    p.lost_seen = absl::StrContains(AllLogs(), absl::StrCat("host ", p.host, " is dead"));
    if (!p.lost_seen && now - p.injected < kLossPatience) return;
    if (!p.lost_seen) Say(absl::StrCat("host ", p.host, "'s loss was not declared within 60 s"));
    p.lost_seen = true;
    if (p.kind == "partition") {
      if (absl::Status s = cluster_->HealAll(); !s.ok()) Say(s.ToString());
      p.healed = now;
    }
  }
  if (cluster_->Running(p.slot)) {
    // A healed host's agent finds itself fenced out and stops its processes.
    if (now - p.healed < kFencePatience) return;
    Say(absl::StrCat("host ", p.host, " did not stop within 20 s of the heal: killing it"));
    (void)cluster_->KillHost(p.slot);
  }
  ++incarnation_[p.slot];
  if (absl::Status s = StartHost(p.slot, /*standby=*/true); !s.ok()) {
    Say(absl::StrCat("cannot start host ", HostId(p.slot), " again: ", s.ToString()));
  } else {
    Say(absl::StrFormat("host %s started again as standby host %s at %.1f s", p.host,
                        HostId(p.slot), absl::ToDoubleSeconds(now - start_)));
  }
  pending_.reset();
}

void ChaosOnHosts::WaitUntil(absl::Time when) {
  while (absl::Now() < when) {
    Tend();
    absl::SleepFor(std::min(kPoll, when - absl::Now()));  // bounded: `when` is finite
  }
}

bool ChaosOnHosts::InjectHostFault(const tools::PlannedFault& fault, std::string* why) {
  if (pending_.has_value()) {
    *why = absl::StrCat("host ", pending_->host, "'s fault is still being handled");
    return false;
  }
  const std::optional<Holder> holder = FindHolder(fault.rank);
  if (!holder.has_value()) {
    *why = absl::StrCat("no host holds rank ", fault.rank, " now");
    return false;
  }
  std::vector<int> ranks;
  for (int r = 0; r < config_.world(); ++r) {
    const std::optional<Holder> h = r == fault.rank ? holder : FindHolder(r);
    if (h.has_value() && h->slot == holder->slot) ranks.push_back(r);
  }
  // A host's spare processes take its ranks' single faults, so it may hold more ranks than it
  // started with: every one of them needs a parked standby elsewhere, or the job fails by design.
  if (baseline_) {
    if (IdleHostsOutside(holder->host) < 1) {
      *why = absl::StrFormat("no idle standby host to take host %s's group rank", holder->host);
      return false;
    }
  } else if (const int parked = ParkedOutside(holder->host);
             parked < static_cast<int>(ranks.size())) {
    *why = absl::StrFormat("%d standbys parked outside host %s, %d needed to replace its ranks %s",
                           parked, holder->host, ranks.size(), absl::StrJoin(ranks, ","));
    return false;
  }
  // The ground truth first: a report must never miss a fault that was done.
  Record(
      fault.rank, EventKind::kChaosInject,
      absl::StrFormat("%s host %s (ranks %s)", fault.kind, holder->host, absl::StrJoin(ranks, ",")),
      {{"kind", fault.kind},
       {"host", holder->host},
       {"ranks", absl::StrJoin(ranks, ",")},
       {"planned_at_ms", absl::StrCat(absl::ToInt64Milliseconds(fault.at))}});
  absl::Status done = fault.kind == "host_kill" ? cluster_->KillHost(holder->slot).status()
                                                : cluster_->Isolate(holder->slot);
  if (!done.ok()) Say(absl::StrCat(fault.kind, " of host ", holder->host, ": ", done.ToString()));
  pending_ = HostFault{holder->slot, holder->host, fault.kind, absl::Now()};
  Say(absl::StrFormat("%s: host %s (ranks %s) at %.1f s", fault.kind, holder->host,
                      absl::StrJoin(ranks, ","), absl::ToDoubleSeconds(absl::Now() - start_)));
  return true;
}

int SignalFor(const std::string& kind) {
  if (kind == "kill") return SIGKILL;
  if (kind == "stop") return SIGSTOP;
  if (kind == "drop") return SIGURG;
  return SIGUSR1;  // nan
}

bool ChaosOnHosts::InjectRankFault(const tools::PlannedFault& fault, std::string* why) {
  if (!baseline_ && (fault.kind == "kill" || fault.kind == "stop") && ParkedOutside("") < 1) {
    *why = "no standby is parked to replace the rank";  // the job would fail by design
    return false;
  }
  const std::optional<Holder> holder = FindHolder(fault.rank);
  if (!holder.has_value()) {
    *why = absl::StrCat("no process holds rank ", fault.rank, " now");
    return false;
  }
  // Opened first: the process checked below is the one the signal reaches, or the signal fails.
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, holder->global, 0));
  if (fd < 0) {
    *why = absl::StrCat("rank ", fault.rank, "'s pid ", holder->global, " is gone");
    return false;
  }
  char state = 0;
  pid_t parent = 0;
  absl::Status own = testing::CheckOwnProcess(holder->global);
  if (!own.ok() || InnermostPid(holder->global) != holder->pid ||
      !testing::own_process_internal::ReadStat(holder->global, &state, &parent) || state == 'T' ||
      state == 't' || state == 'Z' || state == 'X') {
    close(fd);
    *why = absl::StrFormat(
        "rank %d's process (pid %d on host %s) is not a running process of "
        "this bench (%s, state %c)",
        fault.rank, holder->pid, holder->host, own.ToString(), state);
    return false;
  }
  Record(fault.rank, EventKind::kChaosInject,
         absl::StrFormat("%s rank %d (pid %d on host %s)", fault.kind, fault.rank, holder->pid,
                         holder->host),
         {{"kind", fault.kind},
          {"pid", absl::StrCat(holder->pid)},
          {"host", holder->host},
          {"planned_at_ms", absl::StrCat(absl::ToInt64Milliseconds(fault.at))}});
  const int sig = SignalFor(fault.kind);
  if (syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) != 0) {
    Say(absl::StrFormat("signal %d to rank %d (pid %d on host %s): %s", sig, fault.rank,
                        holder->pid, holder->host, strerror(errno)));
  } else {
    Say(absl::StrFormat("%s: rank %d (pid %d on host %s) at %.1f s", fault.kind, fault.rank,
                        holder->pid, holder->host, absl::ToDoubleSeconds(absl::Now() - start_)));
  }
  close(fd);
  return true;
}

void ChaosOnHosts::Inject(const tools::PlannedFault& fault) {
  const bool host_fault = tools::FaultOutcome::IsHostFault(fault.kind);
  const absl::Time give_up = absl::Now() + (host_fault ? kHostPatience : kRankPatience);
  std::string why;
  while (true) {
    if (host_fault ? InjectHostFault(fault, &why) : InjectRankFault(fault, &why)) return;
    if (absl::Now() >= give_up) break;
    WaitUntil(absl::Now() + absl::Milliseconds(200));
  }
  Say(absl::StrFormat("%s rank %d skipped: %s", fault.kind, fault.rank, why));
  Record(fault.rank, EventKind::kChaosSkip, why, {{"kind", fault.kind}});
}

int ChaosOnHosts::Run() {
  if (absl::Status s = SetUp(); !s.ok()) {
    Say(s.ToString());
    return 1;
  }
  for (int slot = 1; slot <= config_.hosts(); ++slot) incarnation_[slot] = 0;
  // Host 1 first, so that it coordinates; then the others in order, each once the one before it
  // joined, so that host n holds group n - 1.
  for (int slot = 1; slot <= config_.hosts(); ++slot) {
    if (absl::Status s = StartHost(slot, slot > config_.training_hosts); !s.ok()) {
      Say(s.ToString());
      return 1;
    }
    const absl::Time give_up = absl::Now() + kFormationPatience;
    while (!absl::StrContains(ReadFile(Log(slot)), " joined as ")) {
      if (absl::Now() >= give_up) {
        Say(absl::StrCat("host ", slot, " did not join within 3 minutes:\n", AllLogs()));
        return 1;
      }
      absl::SleepFor(kPoll);  // bounded polling of a log
    }
  }
  const absl::Time give_up = absl::Now() + kFormationPatience;
  while (!absl::StrContains(AllLogs(), "generation 0 formed")) {
    if (absl::Now() >= give_up) {
      Say(absl::StrCat("generation 0 did not form within 3 minutes:\n", AllLogs()));
      return 1;
    }
    absl::SleepFor(kPoll);  // bounded polling of the logs
  }
  const std::vector<tools::PlannedFault> plan =
      !config_.fixed.empty() ? config_.fixed
                             : tools::PlanFaults(config_.seed, config_.mean_interval,
                                                 config_.duration, config_.mix, config_.world());
  std::vector<std::string> planned;
  for (const tools::PlannedFault& f : plan) {
    planned.push_back(
        absl::StrFormat("%.1fs %s rank %d", absl::ToDoubleSeconds(f.at), f.kind, f.rank));
  }
  Say(absl::StrFormat("%d faults planned over %s (seed %d): %s", plan.size(),
                      absl::FormatDuration(config_.duration), config_.seed,
                      absl::StrJoin(planned, ", ")));
  start_ = absl::Now();
  Record(-1, EventKind::kChaosRunStart, absl::StrCat(mode_, " run on simulated hosts"),
         {{"mode", mode_},
          {"seed", absl::StrCat(config_.seed)},
          {"duration_s", absl::StrCat(absl::ToDoubleSeconds(config_.duration))},
          {"mean_interval_s", absl::StrCat(absl::ToDoubleSeconds(config_.mean_interval))},
          {"nproc", absl::StrCat(config_.world())},
          {"hosts", absl::StrCat(config_.training_hosts, "+", config_.standby_hosts)}});
  bool failed = false;
  for (const tools::PlannedFault& fault : plan) {
    if (fault.at >= config_.duration) break;
    WaitUntil(start_ + fault.at);
    // A job that failed cannot be measured further: say so, and report what there is.
    failed = JobEnded();
    if (failed) break;
    Inject(fault);
  }
  if (!failed) {
    WaitUntil(start_ + config_.duration);
    failed = JobEnded();
  }
  if (failed) Say("the job failed (see the host logs): the run ends here");
  Record(-1, EventKind::kChaosRunEnd,
         failed ? "the job failed" : "the run's duration is over: stopping the job", {});
  if (absl::Status s = cluster_->HealAll(); !s.ok()) Say(s.ToString());
  for (const auto& [slot, k] : incarnation_) {
    if (cluster_->Running(slot)) (void)cluster_->KillHost(slot);
  }
  Say(absl::StrCat("the run and its host logs are in ", dir_));
  return failed ? 1 : 0;
}

// The report of every run of `config` (a baseline second: side by side, with the ETTR ratio).
int Report(const Config& config) {
  std::vector<tools::RunAnalysis> runs;
  for (const std::string& mode : config.modes) {
    absl::StatusOr<std::vector<Event>> events =
        tools::ReadRunEvents(absl::StrCat(config.run_dir, "/", mode));
    if (!events.ok()) {
      std::printf("bench_chaos_hosts: %s\n", events.status().ToString().c_str());
      return 1;
    }
    runs.push_back(tools::AnalyzeRun(*std::move(events)));
  }
  const std::string text = tools::FormatReport(runs);
  std::printf("%s", text.c_str());
  std::ofstream(config.run_dir + "/report.txt") << text;
  std::ofstream(config.run_dir + "/report.json") << tools::ReportJson(runs);
  if (!config.png.empty()) {
    if (absl::Status s = tools::PlotRuns(runs, config.png); !s.ok()) {
      std::printf("bench_chaos_hosts: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("bench_chaos_hosts: plot written to %s\n", config.png.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) {
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", trainguard::kUsage);
      return 0;
    }
  }
  absl::StatusOr<trainguard::Config> config = trainguard::ParseArguments(argc, argv);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_chaos_hosts: %s\n%s",
                 std::string(config.status().message()).c_str(), trainguard::kUsage);
    return 2;
  }
  int rc = 0;
  for (const std::string& mode : config->modes) {
    // One run at a time: each has its own simulated cluster and store, gone before the next.
    trainguard::ChaosOnHosts chaos(*config, mode);
    if (chaos.Run() != 0) rc = 1;
  }
  std::fflush(stdout);
  if (trainguard::Report(*config) != 0) rc = 1;
  return rc;
}
