// bench_host_recovery: how long `trainguard run`, as one agent per host, takes to recover from the
// loss of a whole host, on simulated hosts (tests/support/sim_cluster.h: Linux namespaces, one
// loopback address 127.0.1.<n> per host). Needs root.
//
//   bench_host_recovery [--trials N] [--backends tcp,etcd] [--restore peer,disk]
//                       [--hosts N] [--nproc-per-node M] [--kill-host K]
//                       [--state-mib N] [--host-timeout S] [--json FILE] [--work-dir DIR]
//                       [--keep-logs] [--megatron]
//
// For each store backend, each restore source (peer: the dead host's ranks restore from the memory
// of their backup holders, the default of a multi-host job; disk: the same job with
// --backup-copies 1, so they read the newest durable checkpoint) and each trial, in one run:
// store backend (tcp: a TcpStore served by this process on 127.0.1.254; etcd: a 3-member
// cluster on 127.0.1.201-203), a fresh cluster runs the example trainer (with --state-mib N: N MiB
// of extra state per rank, the snapshot's size) on --hosts worker hosts (default 4) x
// --nproc-per-node ranks (default 2) plus 1 standby host (--role standby) with as many standbys.
// Host 1 starts first and coordinates; once "step 300 loss" appears and a step is committed both
// in memory and on disk, host K (--kill-host, default 3, or 2 with two worker hosts) is killed
// (SIGKILL to its PID namespace's init: every process of the host at once), and the logs are
// polled every 10 ms until the coordinator prints "recovered from the loss of host hostK in X s"
// (host 1, unless the coordinator lease moved to another agent: a coordinator whose store calls
// are too slow to renew the lease loses it); the standby host's ranks must say they restored from
// the source the variant names ("from peer host ..." or "from disk"), else the trial fails.
// Recorded per trial:
//   reported: X, the launcher's own figure (the dead host's last heartbeat -> every rank completed
//             its first step of the new generation);
//   seen:     the wall time from KillHost() returning to that line appearing in the log (an upper
//             bound: it includes the log polling);
//   seen - bound: seen minus the liveness bound (--host-timeout): the recovery proper;
//   and which host reported it and how many coordinator lease terms the agents took (1 when the
//   lease never moved; more means the figure includes a coordinator failover);
//   phases:   from the events the coordinator and the ranks wrote (RUN_DIR/events), each as the
//             time after the host was declared dead: the new generation published, the resume
//             step agreed (the replacement's runtime started), every rank restored, every rank's
//             communicator rebuilt (its recovery decided: the example trainer's gloo full mesh),
//             and every rank's first step done (the coordinator's "recovered" event).
// The cluster is then torn down (every host killed); the job is not run to its end. Prints the
// median and max of each figure per backend, and with --json writes every trial's figures.
//
// Single-threaded: the main thread drives every SimCluster (it must: see sim_cluster.h).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/core/proto_json.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/example_trainer_job.h"
#include "tests/support/sim_cluster.h"
#include "tools/chaos_report.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using testing::SimCluster;

// Host numbers (addresses 127.0.1.<n>) above the worker and standby hosts' are the store's: the
// etcd members' 201-203 and the TcpStore's 254.
constexpr int kMaxWorkerHosts = 199;
// Long enough that the job is still training when the recovery completes; the bench kills the
// cluster right after the measurement.
constexpr int kSteps = 100000;
constexpr char kStoreAddress[] = "127.0.1.254";
constexpr char kToken[] = "bench-host-recovery-token";
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

constexpr char kUsage[] =
    "usage: bench_host_recovery [--trials N] [--backends tcp,etcd] [--restore peer,disk]\n"
    "                           [--hosts N] [--nproc-per-node M] [--kill-host K]\n"
    "                           [--state-mib N] [--host-timeout S] [--json FILE] [--work-dir DIR]\n"
    "                           [--megatron]\n"
    "\n"
    "Time to recover from the loss of a whole host under `trainguard run` agents, on simulated\n"
    "hosts (Linux namespaces; needs root and /usr/sbin/nft; etcd needs /usr/bin/etcd).\n"
    "Each trial: N worker hosts x M ranks + 1 standby host (host N+1) with M standbys; host K is\n"
    "killed at step 300. Host 1 coordinates.\n"
    "\n"
    "  --trials N          trials per backend (default 3)\n"
    "  --hosts N           worker hosts, 2 to 199 (default 4)\n"
    "  --nproc-per-node M  ranks per worker host, and standbys on the standby host (default 2)\n"
    "  --kill-host K       the worker host killed, 2 to N (host 1 coordinates); default 3, or\n"
    "                      2 when N is 2\n"
    "  --wait-s S          the bound on each wait of a trial (the job to form and reach step 300,\n"
    "                      a commit, the recovery line), seconds (default 120)\n"
    "  --backends LIST     comma-separated, of tcp (TcpStore served on 127.0.1.254) and etcd\n"
    "                      (3-member cluster on 127.0.1.201-203); default tcp,etcd\n"
    "  --restore LIST      comma-separated, of peer (the dead host's ranks restore from their\n"
    "                      backup holders' memory) and disk (--backup-copies 1: from the newest\n"
    "                      durable checkpoint); default peer\n"
    "  --megatron          run examples/megatron_like (tensor-parallel degree = ranks per host,\n"
    "                      pipeline 2: each host one tensor-parallel group) instead\n"
    "  --state-mib N       extra state per rank, MiB (the example trainer's --extra-state-mib);\n"
    "                      default 0 (a few KiB of model)\n"
    "  --host-timeout S    the agents' liveness bound, seconds (default 2)\n"
    "  --json FILE         also write every trial's figures as JSON to FILE\n"
    "  --keep-logs         keep every trial's run directory and host logs (failed ones are kept\n"
    "                      anyway)\n"
    "  --work-dir DIR      where run directories and host logs go (default: under the build\n"
    "                      tree); not /tmp itself, which each host sees privately\n"
    "\n"
    "Figures, per backend (median and max over the trials):\n"
    "  reported       the launcher's own: the dead host's last heartbeat -> every rank completed\n"
    "                 its first step of the new generation\n"
    "  seen           KillHost() returned -> the coordinator's \"recovered\" line in its log\n"
    "                 (an upper bound: includes the 10 ms log polling)\n"
    "  seen - bound   seen minus --host-timeout: the recovery after the liveness bound\n";

struct Flags {
  int trials = 3;
  int hosts = 4;
  int per_host = 2;
  int victim = 3;  // not host 1, which coordinates
  double wait_s = 120;
  std::vector<std::string> backends = {"tcp", "etcd"};
  std::vector<std::string> restores = {"peer"};
  int state_mib = 0;
  // --megatron: examples/megatron_like with TRAINGUARD_TP=<ranks per host> and TRAINGUARD_PP=2,
  // so each host holds one tensor-parallel group.
  bool megatron = false;
  double host_timeout_s = 2;
  std::string json;
  std::string work_dir = TRAINGUARD_BENCH_WORK_DIR;
  bool keep_logs = false;
};

struct Trial {
  double reported_s = 0;
  double seen_s = 0;
  double seen_minus_bound_s = 0;
  int reported_by = 0;  // the host whose agent coordinated the recovery (1 unless the lease moved)
  int lease_terms = 0;  // the coordinator lease terms taken during the trial (1: it never moved)
  // Seconds after the host was declared dead (its "host_lost" event); -1 when the event is missing.
  struct Phases {
    double published_s = -1;  // the coordinator's "host_replaced": the new generation published
    double agreed_s = -1;     // the replacement's runtime started: the resume step agreed
    double restored_s = -1;   // the last rank's "restored" event of the new generation
    double connected_s = -1;  // the last rank's recovery decision (its communicator rebuilt)
    double recovered_s = -1;  // the coordinator's "recovered": every rank's first step done
  } phases;
};

// The phases of the recovery from the loss of host `victim`, read from the events of `run_dir`.
absl::StatusOr<Trial::Phases> ReadPhases(const std::string& run_dir, int victim) {
  absl::StatusOr<std::vector<Event>> events = tools::ReadRunEvents(run_dir);
  if (!events.ok()) return events.status();
  const std::string host = absl::StrCat("host", victim);
  auto of_host = [&](const Event& e, std::string_view what) {
    return e.Attribute("what") == what && e.Attribute("host") == host;
  };
  std::optional<absl::Time> declared;
  int64_t generation = -1;
  for (const Event& e : *events) {
    if (of_host(e, "host_lost")) declared = e.time;
    if (of_host(e, "host_replaced")) generation = e.generation;
  }
  if (!declared.has_value() || generation < 0) {
    return absl::NotFoundError(
        absl::StrCat("no host_lost or host_replaced event of ", host, " in ", run_dir, "/events"));
  }
  Trial::Phases p;
  auto latest = [&](double& phase, absl::Time t) {
    phase = std::max(phase, absl::ToDoubleSeconds(t - *declared));
  };
  for (const Event& e : *events) {
    if (of_host(e, "host_replaced")) latest(p.published_s, e.time);
    if (of_host(e, "recovered")) latest(p.recovered_s, e.time);
    if (e.generation != generation) continue;
    if (e.type == EventType::kRuntimeStarted && !e.Attribute("replaced_rank").empty()) {
      latest(p.agreed_s, e.time);
    }
    if (e.Attribute("what") == "restored") latest(p.restored_s, e.time);
    if (e.type == EventType::kRecoveryDecision) latest(p.connected_s, e.time);
  }
  return p;
}

struct BackendResult {
  std::string backend;
  std::string restore;
  std::vector<Trial> trials;
  std::vector<std::string> failures;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `lines` lines of `text`, for an error message.
std::string Tail(const std::string& text, int lines) {
  size_t pos = text.size();
  for (int i = 0; i <= lines && pos != std::string::npos && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  bool victim_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> value;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (flag == "--help" || flag == "-h") return absl::CancelledError("help");
    if (flag == "--keep-logs") {
      flags.keep_logs = true;
      continue;
    }
    if (flag == "--megatron") {
      flags.megatron = true;
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, ": needs a value"));
      value = argv[++i];
    }
    if (flag == "--trials") {
      if (!absl::SimpleAtoi(*value, &flags.trials) || flags.trials < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--trials '", *value, "': need an integer >= 1"));
      }
    } else if (flag == "--backends") {
      flags.backends = absl::StrSplit(*value, ',', absl::SkipEmpty());
      if (flags.backends.empty()) return absl::InvalidArgumentError("--backends: empty list");
      for (const std::string& b : flags.backends) {
        if (b != "tcp" && b != "etcd") {
          return absl::InvalidArgumentError(
              absl::StrCat("--backends: unknown backend '", b, "' (know tcp, etcd)"));
        }
      }
    } else if (flag == "--restore") {
      flags.restores = absl::StrSplit(*value, ',', absl::SkipEmpty());
      if (flags.restores.empty()) return absl::InvalidArgumentError("--restore: empty list");
      for (const std::string& r : flags.restores) {
        if (r != "peer" && r != "disk") {
          return absl::InvalidArgumentError(
              absl::StrCat("--restore: unknown source '", r, "' (know peer, disk)"));
        }
      }
    } else if (flag == "--hosts") {
      if (!absl::SimpleAtoi(*value, &flags.hosts) || flags.hosts < 2 ||
          flags.hosts > kMaxWorkerHosts) {
        return absl::InvalidArgumentError(
            absl::StrCat("--hosts '", *value, "': need an integer in [2, ", kMaxWorkerHosts, "]"));
      }
    } else if (flag == "--nproc-per-node") {
      if (!absl::SimpleAtoi(*value, &flags.per_host) || flags.per_host < 1 || flags.per_host > 64) {
        return absl::InvalidArgumentError(
            absl::StrCat("--nproc-per-node '", *value, "': need an integer in [1, 64]"));
      }
    } else if (flag == "--kill-host") {
      if (!absl::SimpleAtoi(*value, &flags.victim)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kill-host '", *value, "': need an integer"));
      }
      victim_given = true;
    } else if (flag == "--wait-s") {
      if (!absl::SimpleAtod(*value, &flags.wait_s) || flags.wait_s < 1 || flags.wait_s > 3600) {
        return absl::InvalidArgumentError(
            absl::StrCat("--wait-s '", *value, "': need seconds in [1, 3600]"));
      }
    } else if (flag == "--state-mib") {
      if (!absl::SimpleAtoi(*value, &flags.state_mib) || flags.state_mib < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--state-mib '", *value, "': need an integer >= 0"));
      }
    } else if (flag == "--host-timeout") {
      if (!absl::SimpleAtod(*value, &flags.host_timeout_s) || flags.host_timeout_s < 0.5 ||
          flags.host_timeout_s > 3600) {
        return absl::InvalidArgumentError(
            absl::StrCat("--host-timeout '", *value, "': need seconds in [0.5, 3600]"));
      }
    } else if (flag == "--json") {
      flags.json = *value;
    } else if (flag == "--work-dir") {
      flags.work_dir = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
  }
  if (!victim_given) flags.victim = std::min(3, flags.hosts);
  if (flags.victim < 2 || flags.victim > flags.hosts) {
    return absl::InvalidArgumentError(absl::StrCat("--kill-host ", flags.victim,
                                                   ": need a worker host in [2, ", flags.hosts,
                                                   "] (host 1 coordinates)"));
  }
  return flags;
}

// The standby host's number: the one after the worker hosts.
int StandbyHost(const Flags& flags) { return flags.hosts + 1; }

std::vector<std::string> TrainerArgs(const Flags& flags) {
  return testing::ExampleTrainerArgs(
      flags.megatron ? TRAINGUARD_MEGATRON_PATH : TRAINGUARD_TRAINER_PATH, kSteps);
}

std::vector<std::string> JobEnv(const Flags& flags, const std::string& dir) {
  std::vector<std::string> env = testing::ExampleCheckpointEnv(dir);
  if (flags.megatron) {
    env.push_back(absl::StrCat("TRAINGUARD_TP=", flags.per_host));
    env.push_back("TRAINGUARD_PP=2");
  }
  return env;
}

// One multi-host job on `cluster`: an agent per simulated host, all writing their logs to `dir`.
class HostJob {
 public:
  HostJob(SimCluster& cluster, const Flags& flags, std::string dir, std::string endpoint,
          std::string job_id, std::vector<std::string> agent_flags,
          std::vector<std::string> trainer)
      : cluster_(cluster),
        flags_(flags),
        dir_(std::move(dir)),
        endpoint_(std::move(endpoint)),
        job_id_(std::move(job_id)),
        agent_flags_(std::move(agent_flags)),
        trainer_(std::move(trainer)) {}

  absl::Status StartHost(int n, bool standby) {
    std::vector<std::string> argv = {
        TRAINGUARD_CLI_PATH, "run",
        "--nnodes",          absl::StrCat(flags_.hosts),
        "--nproc-per-node",  absl::StrCat(flags_.per_host),
        "--rdzv-endpoint",   endpoint_,
        "--token-file",      dir_ + "/token",
        "--job-id",          job_id_,
        "--run-dir",         dir_ + "/run",
        "--host-id",         absl::StrCat("host", n),
        "--local-addr",      SimCluster::Address(n),
        "--host-timeout",    absl::StrFormat("%g", flags_.host_timeout_s)};
    if (standby) {
      argv.push_back("--role");
      argv.push_back("standby");
    }
    argv.insert(argv.end(), agent_flags_.begin(), agent_flags_.end());
    argv.push_back("--");
    argv.insert(argv.end(), trainer_.begin(), trainer_.end());
    hosts_.push_back(n);
    return cluster_.StartHost(n, {.hostname = absl::StrCat("host", n),
                                  .argv = argv,
                                  .env = JobEnv(flags_, dir_ + "/run"),
                                  .log_path = Log(n)});
  }

  std::string Log(int n) const { return absl::StrCat(dir_, "/host", n, ".log"); }

  // The coordinator lease terms the agents took ("coordinating the job (lease term T"): one when
  // the lease never moved.
  int LeaseTerms() const {
    const std::regex term("coordinating the job \\(lease term ([0-9]+)");
    std::set<std::string> terms;
    for (int n : hosts_) {
      const std::string text = ReadFile(Log(n));
      for (auto it = std::sregex_iterator(text.begin(), text.end(), term);
           it != std::sregex_iterator(); ++it) {
        terms.insert((*it)[1]);
      }
    }
    return static_cast<int>(terms.size());
  }

  std::string AllOutput() const {
    std::string all;
    for (int n : hosts_) absl::StrAppend(&all, "==== host", n, "\n", ReadFile(Log(n)));
    return all;
  }

  // Polling of host n's log (n == 0: each host's) for a match of `re`, bounded by --wait-s: the
  // match, and in `*found_in` (when given) the host whose log has it.
  absl::StatusOr<std::smatch> Await(int n, const std::regex& re, const std::string& what,
                                    int* found_in = nullptr) const {
    const absl::Duration bound = absl::Seconds(flags_.wait_s);
    const std::vector<int> hosts = n > 0 ? std::vector<int>{n} : hosts_;
    for (absl::Time end = absl::Now() + bound; absl::Now() < end;) {
      for (int host : hosts) {
        // Kept alive for the match, which points into it.
        text_ = ReadFile(Log(host));
        std::smatch m;
        if (!std::regex_search(text_, m, re)) continue;
        if (found_in != nullptr) *found_in = host;
        return m;
      }
      absl::SleepFor(kPollInterval);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "no ", what, " in ", n > 0 ? absl::StrCat("host ", n, "'s log") : "any log", " within ",
        absl::FormatDuration(bound), "; the logs end:\n", Tail(AllOutput(), 40)));
  }

 private:
  SimCluster& cluster_;
  const Flags& flags_;
  const std::string dir_;
  const std::string endpoint_;
  const std::string job_id_;
  const std::vector<std::string> agent_flags_;
  const std::vector<std::string> trainer_;
  std::vector<int> hosts_;
  mutable std::string text_;
};

// Polling of the job's store, bounded by `bound`, until a step is committed in memory and one on
// disk (ckpt/commit/<S>/snapshot and ckpt/commit/<S>/durable, docs/FORMATS.md).
absl::Status AwaitCommits(const std::string& endpoint, const std::string& job_id,
                          absl::Duration bound) {
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(endpoint, job_id, kToken, absl::Seconds(30));
  if (!store.ok()) return store.status();
  for (absl::Time end = absl::Now() + bound; absl::Now() < end;) {
    absl::StatusOr<std::vector<std::string>> keys =
        (*store)->ListKeys("ckpt/commit/", absl::Seconds(10));
    bool memory = false, disk = false;
    for (const std::string& key : keys.value_or(std::vector<std::string>{})) {
      memory |= absl::EndsWith(key, "/snapshot");
      disk |= absl::EndsWith(key, "/durable");
    }
    if (memory && disk) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no step of job ", job_id, " was committed both in memory and on disk within ",
                   absl::FormatDuration(bound)));
}

// One trial on a fresh cluster: the store, the hosts, the kill, the measurement; everything is torn
// down on return (hosts first, by the SimCluster's destructor, then the store).
absl::StatusOr<Trial> RunTrial(const Flags& flags, const std::string& backend,
                               const std::string& restore, int index) {
  std::error_code ec;
  std::filesystem::create_directories(flags.work_dir, ec);
  std::string pattern = flags.work_dir + "/hr-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
  }
  const std::string dir = pattern;
  std::ofstream(dir + "/token") << kToken << "\n";

  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
  if (!cluster.ok()) return cluster.status();
  // Declared after the cluster's network namespace is entered (so they serve inside it), and
  // destroyed after it (the hosts die first, and never see their store vanish).
  std::unique_ptr<TcpStoreServer> tcp;
  std::unique_ptr<testing::EtcdCluster> etcd;
  std::string endpoint;
  if (backend == "tcp") {
    TcpStoreServerOptions options;
    options.host = kStoreAddress;
    options.job_token = kToken;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    if (!server.ok()) return server.status();
    tcp = *std::move(server);
    endpoint = absl::StrCat("tcp://", kStoreAddress, ":", tcp->port());
  } else {
    absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> started =
        testing::EtcdCluster::Start(3, {"127.0.1.201", "127.0.1.202", "127.0.1.203"});
    if (!started.ok()) return started.status();
    etcd = *std::move(started);
    endpoint = etcd->StoreUrl();
  }

  absl::StatusOr<Trial> trial = [&]() -> absl::StatusOr<Trial> {
    std::vector<std::string> trainer = TrainerArgs(flags);
    if (flags.state_mib > 0) {
      trainer.push_back(flags.megatron ? "--state-mib" : "--extra-state-mib");
      trainer.push_back(absl::StrCat(flags.state_mib));
    }
    std::vector<std::string> agent_flags;
    if (restore == "disk") agent_flags = {"--backup-copies", "1"};
    const std::string job_id = absl::StrCat("hr-", backend, "-", restore, "-", getpid(), "-", index);
    HostJob job(**cluster, flags, dir, endpoint, job_id, agent_flags, trainer);
    if (absl::Status s = job.StartHost(1, false); !s.ok()) return s;
    if (auto m = job.Await(1, std::regex("coordinating the job"), "\"coordinating the job\"");
        !m.ok()) {
      return m.status();
    }
    for (int n = 2; n <= flags.hosts; ++n) {
      if (absl::Status s = job.StartHost(n, false); !s.ok()) return s;
    }
    if (absl::Status s = job.StartHost(StandbyHost(flags), true); !s.ok()) return s;
    if (auto m = job.Await(0, std::regex("step 300 loss"), "\"step 300 loss\""); !m.ok()) {
      return m.status();
    }
    // Both variants must have something to restore: a step committed in memory (with its backups,
    // for peer) and one committed on disk. With large state a save outlasts the 25 steps between
    // checkpoints, so the first commits can come well after step 300.
    if (absl::Status s = AwaitCommits(endpoint, job_id, absl::Seconds(flags.wait_s)); !s.ok()) {
      return s;
    }
    const absl::StatusOr<absl::Time> killed = (*cluster)->KillHost(flags.victim);
    if (!killed.ok()) return killed.status();
    const absl::Time kill_returned = absl::Now();
    // From whichever agent coordinates: host 1 unless the lease moved (a coordinator whose store
    // calls are too slow to renew it in time loses it).
    Trial t;
    absl::StatusOr<std::smatch> recovered = job.Await(
        0,
        std::regex(
            absl::StrCat("recovered from the loss of host host", flags.victim, " in ([0-9.]+) s")),
        absl::StrCat("\"recovered from the loss of host host", flags.victim, "\""), &t.reported_by);
    if (!recovered.ok()) return recovered.status();
    t.seen_s = absl::ToDoubleSeconds(absl::Now() - kill_returned);
    t.reported_s = std::stod((*recovered)[1]);
    t.seen_minus_bound_s = t.seen_s - flags.host_timeout_s;
    t.lease_terms = job.LeaseTerms();
    // The measurement is what it claims only if the dead host's ranks restored from `restore`.
    absl::StatusOr<std::smatch> source =
        job.Await(StandbyHost(flags), std::regex("restored step [0-9]+ from (peer host|disk)"),
                  "a restore line of the standby host's ranks");
    if (!source.ok()) return source.status();
    if (((*source)[1] == "disk") != (restore == "disk")) {
      return absl::InternalError(absl::StrCat("the standby host's ranks restored from ",
                                              std::string((*source)[1]), ", not from ", restore));
    }
    // The figures stand without the phases: a missing event leaves them at -1.
    if (absl::StatusOr<Trial::Phases> phases = ReadPhases(dir + "/run", flags.victim);
        phases.ok()) {
      t.phases = *phases;
    }
    return t;
  }();
  cluster->reset();
  etcd.reset();
  tcp.reset();
  if (trial.ok() && !flags.keep_logs) std::filesystem::remove_all(dir, ec);  // a failed trial's stay
  if (trial.ok() && flags.keep_logs) std::printf("logs of %s/%s trial %d: %s\n", backend.c_str(),
                                                  restore.c_str(), index + 1, dir.c_str());
  if (!trial.ok()) {
    return absl::Status(trial.status().code(),
                        absl::StrCat(trial.status().message(), "\n(logs kept in ", dir, ")"));
  }
  return trial;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

std::vector<double> Figure(const std::vector<Trial>& trials, double Trial::*field) {
  std::vector<double> v;
  for (const Trial& t : trials) v.push_back(t.*field);
  return v;
}

void PrintTable(const Flags& flags, const std::vector<BackendResult>& results) {
  std::printf(
      "\nhost loss recovery: %d worker hosts x %d ranks + 1 standby host, host%d killed "
      "at step 300, --host-timeout %g s, %d MiB of extra state per rank\n",
      flags.hosts, flags.per_host, flags.victim, flags.host_timeout_s, flags.state_mib);
  std::printf("%-13s %6s  %-19s  %-19s  %-19s\n", "backend/from", "trials", "reported (s)",
              "seen (s)", "seen - bound (s)");
  std::printf("%-13s %6s  %-19s  %-19s  %-19s\n", "", "", "median   max", "median   max",
              "median   max");
  for (const BackendResult& r : results) {
    const std::string name = absl::StrCat(r.backend, "/", r.restore);
    if (r.trials.empty()) {
      std::printf("%-13s %6d  (every trial failed)\n", name.c_str(), 0);
      continue;
    }
    std::printf("%-13s %6zu", name.c_str(), r.trials.size());
    for (double Trial::*field : {&Trial::reported_s, &Trial::seen_s, &Trial::seen_minus_bound_s}) {
      const std::vector<double> v = Figure(r.trials, field);
      std::printf("  %-8.3f %-10.3f", Median(v), Max(v));
    }
    std::printf("\n");
    if (!r.failures.empty()) std::printf("         (%zu trial(s) failed)\n", r.failures.size());
  }
}

absl::Status WriteJson(const Flags& flags, const std::vector<BackendResult>& results) {
  std::string json = absl::StrFormat(
      "{\n  \"benchmark\": \"host_recovery\",\n  \"worker_hosts\": %d,\n  \"ranks_per_host\": %d,\n"
      "  \"standby_hosts\": 1,\n  \"killed_host\": \"host%d\",\n  \"host_timeout_s\": %g,\n"
      "  \"state_mib\": %d,\n  \"backends\": [",
      flags.hosts, flags.per_host, flags.victim, flags.host_timeout_s, flags.state_mib);
  for (size_t i = 0; i < results.size(); ++i) {
    const BackendResult& r = results[i];
    absl::StrAppend(&json, i > 0 ? "," : "", "\n    {\"backend\": ", JsonString(r.backend),
                    ", \"restore\": ", JsonString(r.restore), ", \"trials\": [");
    for (size_t j = 0; j < r.trials.size(); ++j) {
      const Trial& t = r.trials[j];
      absl::StrAppend(
          &json, j > 0 ? ", " : "",
          absl::StrFormat("{\"reported_s\": %.3f, \"seen_s\": %.3f, "
                          "\"seen_minus_bound_s\": %.3f, \"reported_by\": \"host%d\", "
                          "\"lease_terms\": %d, \"phases_after_declared_s\": "
                          "{\"published\": %.3f, \"agreed\": %.3f, \"restored\": "
                          "%.3f, \"connected\": %.3f, \"recovered\": %.3f}}",
                          t.reported_s, t.seen_s, t.seen_minus_bound_s, t.reported_by,
                          t.lease_terms, t.phases.published_s, t.phases.agreed_s,
                          t.phases.restored_s, t.phases.connected_s, t.phases.recovered_s));
    }
    absl::StrAppend(&json, "]");
    if (!r.trials.empty()) {
      const char* names[] = {"reported_s", "seen_s", "seen_minus_bound_s"};
      double Trial::*fields[] = {&Trial::reported_s, &Trial::seen_s, &Trial::seen_minus_bound_s};
      for (const char* stat : {"median", "max"}) {
        absl::StrAppend(&json, ", \"", stat, "\": {");
        for (int k = 0; k < 3; ++k) {
          const std::vector<double> v = Figure(r.trials, fields[k]);
          absl::StrAppend(&json, k > 0 ? ", " : "",
                          absl::StrFormat("\"%s\": %.3f", names[k],
                                          std::string(stat) == "median" ? Median(v) : Max(v)));
        }
        absl::StrAppend(&json, "}");
      }
    }
    absl::StrAppend(&json, ", \"failures\": [");
    for (size_t j = 0; j < r.failures.size(); ++j) {
      absl::StrAppend(&json, j > 0 ? ", " : "", JsonString(r.failures[j]));
    }
    absl::StrAppend(&json, "]}");
  }
  absl::StrAppend(&json, "\n  ]\n}\n");
  std::ofstream out(flags.json);
  out << json;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing --json ", flags.json));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (absl::IsCancelled(flags.status())) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!flags.ok()) {
    std::fprintf(stderr, "bench_host_recovery: %s\n\n%s",
                 std::string(flags.status().message()).c_str(), kUsage);
    return 2;
  }
  // A tree under /tmp named in the hosts' argv (the run directory) is shared with them
  // (sim_cluster.h); /tmp itself is private to each host.
  if (flags->work_dir == "/tmp" || flags->work_dir == "/tmp/") {
    std::fprintf(stderr, "bench_host_recovery: --work-dir %s: each host sees its own /tmp\n",
                 flags->work_dir.c_str());
    return 2;
  }
  std::vector<BackendResult> results;
  bool failed = false;
  for (const std::string& backend : flags->backends) {
    for (const std::string& restore : flags->restores) {
      BackendResult& result = results.emplace_back();
      result.backend = backend;
      result.restore = restore;
      for (int i = 0; i < flags->trials; ++i) {
        const absl::Time start = absl::Now();
        absl::StatusOr<Trial> trial = RunTrial(*flags, backend, restore, i);
        if (!trial.ok()) {
          std::fprintf(stderr, "%s/%s trial %d failed: %s\n", backend.c_str(), restore.c_str(),
                       i + 1, std::string(trial.status().ToString()).c_str());
          result.failures.push_back(std::string(trial.status().message()).substr(0, 2000));
          failed = true;
          continue;
        }
        const std::string lease =
            trial->lease_terms > 1
                ? absl::StrFormat("; the coordinator lease moved: %d terms, host%d reported",
                                  trial->lease_terms, trial->reported_by)
                : "";
        std::printf(
            "%s/%s trial %d: reported %.3f s, seen %.3f s, seen - bound %.3f s (trial took %.1f "
            "s%s)\n",
            backend.c_str(), restore.c_str(), i + 1, trial->reported_s, trial->seen_s,
            trial->seen_minus_bound_s, absl::ToDoubleSeconds(absl::Now() - start), lease.c_str());
        const Trial::Phases& p = trial->phases;
        std::printf(
            "  after the declaration: published %.3f, agreed %.3f, restored %.3f, connected "
            "%.3f, first step %.3f s\n",
            p.published_s, p.agreed_s, p.restored_s, p.connected_s, p.recovered_s);
        std::fflush(stdout);
        result.trials.push_back(*trial);
      }
    }
  }
  PrintTable(*flags, results);
  if (!flags->json.empty()) {
    if (absl::Status s = WriteJson(*flags, results); !s.ok()) {
      std::fprintf(stderr, "bench_host_recovery: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace trainguard

int main(int argc, char** argv) { return trainguard::Main(argc, argv); }
