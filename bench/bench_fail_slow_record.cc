// `bench_fail_slow record`: one labelled run on simulated hosts (tests/support/sim_cluster.h) whose
// coordinator writes the per-second fail-slow trace that `bench_fail_slow` then replays:
//
//   bench_fail_slow record --scenario S --seconds N --out TRACE [--hosts H] [--ranks-per-host R]
//                          [--fail-slow alert|evict] [--link-rate RATE] [--loss P]
//
// H hosts (4..8, default 4) of R ranks (1 or 2, default 2) train the example trainer with
// --fail-slow alert (or evict: then host H+1 joins as a standby host that can take an evicted
// host's ranks) and --fail-slow-continuity 10; host 3 is the degraded one:
//   throttle: its ranks in a CPU cgroup capped at 2% of one CPU (a rank here needs about 4%);
//   delay:    its ranks sleep 20 ms in every step (--step-time-ms);
//   slowlink: every packet its processes send shaped to RATE (default 2mbit): an htb class on the
//             cluster's `lo`, chosen by iptables CLASSIFY for the sockets of the host's cgroup (tc
//             netem, which would add delay, is not in this kernel);
//   lossy:    a share P (default 0.05) of the packets its processes send dropped at random
//             (marked by cgroup on output, dropped on input with the statistic match);
//   membw:    a memory-bandwidth hog in the host (`bench_fail_slow hog`: memcpy between two
//             512 MiB buffers, far above the LLC) beside its ranks;
//   healthy:  no fault; rl: no fault, an RL-shaped step (--generate 20:4, generation lengths that
//             vary by rank and step).
// tc and iptables run in the SimCluster's private network namespace only, which vanishes with it.
// After N seconds every host is killed. Printed, from the run's event files and the coordinator's
// log: "watchdog hang events: K" (the watchdog-only baseline), "suspect verdicts: V" and
// "fail-slow evictions: E".
//
//   bench_fail_slow hog [--seconds N] [--mib M]
//
// The memory-bandwidth hog itself: copies one M MiB buffer (default 512) into another and back
// until N seconds (default 600) have passed, then exits.
//
// Needs root, like multihost_test. Single-threaded (the SimCluster's rule).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/cpu_throttle.h"
#include "tests/support/example_trainer_job.h"
#include "tests/support/sim_cluster.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

constexpr int kDegradedHost = 3;

int CountLines(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) count += line.find(needle) != std::string::npos ? 1 : 0;
  return count;
}

// A cgroup v2 group that host kDegradedHost's processes join (`echo $$ > Procs() && exec ...`), so
// iptables can match every packet its sockets send (`-m cgroup --path Path()`), whatever source
// address the kernel gave a connection (a socket that connects without binding leaves from
// 127.0.0.1, which no per-address rule sees). Removed, bounded, once its processes are gone.
class SocketCgroup {
 public:
  static absl::StatusOr<std::unique_ptr<SocketCgroup>> Create(const std::string& name) {
    // cgroup v2 is /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one.
    const std::string root = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")
                                 ? "/sys/fs/cgroup"
                                 : "/sys/fs/cgroup/unified";
    const std::string dir = root + "/" + name;
    if (mkdir(dir.c_str(), 0755) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("mkdir ", dir, ": ", std::strerror(errno), " (no cgroup v2 hierarchy)"));
    }
    return std::unique_ptr<SocketCgroup>(new SocketCgroup(dir, "/" + name));
  }
  ~SocketCgroup() {
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (rmdir(dir_.c_str()) == 0 || errno == ENOENT) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::fprintf(stderr, "bench_fail_slow record: %s not removed: %s\n", dir_.c_str(),
                 std::strerror(errno));
  }
  SocketCgroup(const SocketCgroup&) = delete;
  SocketCgroup& operator=(const SocketCgroup&) = delete;
  std::string Procs() const { return dir_ + "/cgroup.procs"; }
  const std::string& Path() const { return path_; }

 private:
  SocketCgroup(std::string dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}
  std::string dir_, path_;
};

// Degrades the traffic of the processes in `group` (host kDegradedHost's) in the cluster's
// network namespace; "" on success.
std::string DegradeLink(testing::SimCluster& cluster, const SocketCgroup& group,
                        const std::string& scenario, const std::string& rate,
                        const std::string& loss) {
  const std::string tc = "/usr/sbin/tc", iptables = "/usr/sbin/iptables";
  std::vector<std::vector<std::string>> commands;
  if (scenario == "slowlink") {
    // htb puts a packet whose priority names one of its classes in that class: CLASSIFY sets it.
    commands = {
        {tc, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10"},
        {tc, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate",
         "10gbit"},
        {tc, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", rate},
        {iptables, "-t", "mangle", "-A", "OUTPUT", "-m", "cgroup", "--path", group.Path(), "-j",
         "CLASSIFY", "--set-class", "1:20"}};
  } else if (scenario == "lossy") {
    // Marked on output, dropped on input: a packet dropped on output fails the sender's call at
    // once (EPERM), which a lossy link never does; on input it is lost in silence.
    commands = {{iptables, "-t", "mangle", "-A", "OUTPUT", "-m", "cgroup", "--path", group.Path(),
                 "-j", "MARK", "--set-mark", "0x3"},
                {iptables, "-A", "INPUT", "-m", "mark", "--mark", "0x3", "-m", "statistic",
                 "--mode", "random", "--probability", loss, "-j", "DROP"}};
  }
  for (const std::vector<std::string>& command : commands) {
    absl::StatusOr<std::string> ran = cluster.RunInNetwork(command, absl::Seconds(10));
    if (!ran.ok()) return ran.status().ToString();
  }
  return "";
}

}  // namespace

int RunMemoryBandwidthHog(int argc, char** argv) {
  int seconds = 600;
  size_t mib = 512;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seconds") seconds = std::stoi(value);
    if (flag == "--mib") mib = std::stoul(value);
  }
  const size_t bytes = mib << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
  uint64_t copies = 0;
  while (absl::Now() < deadline) {
    std::memcpy(b.data(), a.data(), bytes);
    std::memcpy(a.data(), b.data(), bytes);
    copies += 2;
  }
  std::printf("hog: %llu copies of %zu MiB\n", static_cast<unsigned long long>(copies), mib);
  return a[bytes / 2] == 1 ? 0 : 1;
}

int RecordFailSlowTrace(int argc, char** argv) {
#ifndef TRAINGUARD_TRAINER_PATH
  (void)argc;
  (void)argv;
  std::fprintf(stderr,
               "bench_fail_slow record needs the example trainer (TRAINGUARD_BUILD_EXAMPLES)\n");
  return 2;
#else
  using testing::SimCluster;
  std::string scenario, out, policy = "alert", rate = "2mbit", loss = "0.05";
  int seconds = 60, hosts = 4, per_host = 2;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--scenario") scenario = value;
    if (flag == "--seconds") seconds = std::stoi(value);
    if (flag == "--out") out = value;
    if (flag == "--hosts") hosts = std::stoi(value);
    if (flag == "--ranks-per-host") per_host = std::stoi(value);
    if (flag == "--fail-slow") policy = value;
    if (flag == "--link-rate") rate = value;
    if (flag == "--loss") loss = value;
  }
  const std::vector<std::string> scenarios = {"throttle", "delay",   "slowlink", "lossy",
                                              "membw",    "healthy", "rl"};
  if (out.empty() || std::find(scenarios.begin(), scenarios.end(), scenario) == scenarios.end() ||
      hosts < 4 || hosts > 8 || per_host < 1 || per_host > 2 ||
      (policy != "alert" && policy != "evict")) {
    std::fprintf(stderr,
                 "usage: bench_fail_slow record --scenario "
                 "throttle|delay|slowlink|lossy|membw|healthy|rl --seconds N --out TRACE "
                 "[--hosts 4..8] [--ranks-per-host 1|2] [--fail-slow alert|evict] "
                 "[--link-rate RATE] [--loss P]\n");
    return 2;
  }
  const std::string dir = std::filesystem::absolute(out).string() + ".run";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::remove(out);
  std::ofstream(dir + "/token") << "bench-fail-slow\n";
  absl::StatusOr<std::unique_ptr<SimCluster> > cluster = SimCluster::Create();
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<SocketCgroup> socket_group;
  if (scenario == "slowlink" || scenario == "lossy") {
    absl::StatusOr<std::unique_ptr<SocketCgroup>> made =
        SocketCgroup::Create(absl::StrCat("trainguard-bench-fail-slow-net-", getpid()));
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    socket_group = *std::move(made);
    if (std::string failed = DegradeLink(**cluster, *socket_group, scenario, rate, loss);
        !failed.empty()) {
      std::fprintf(stderr, "bench_fail_slow record: degrading host%d's link: %s\n", kDegradedHost,
                   failed.c_str());
      return 1;
    }
  }
  TcpStoreServerOptions store_options;
  store_options.host = "127.0.1.254";
  store_options.job_token = "bench-fail-slow";
  absl::StatusOr<std::unique_ptr<TcpStoreServer> > store = TcpStoreServer::Start(store_options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const std::string endpoint = absl::StrCat("tcp://127.0.1.254:", (*store)->port());
  std::unique_ptr<testing::CpuThrottle> throttle;
  if (scenario == "throttle") {
    absl::StatusOr<std::unique_ptr<testing::CpuThrottle> > made =
        testing::CpuThrottle::Create(absl::StrCat("trainguard-bench-fail-slow-", getpid()), 0.02);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    throttle = *std::move(made);
  }
  std::vector<std::string> trainer =
      testing::ExampleTrainerArgs(TRAINGUARD_TRAINER_PATH, 10'000'000);
  if (scenario == "rl") {
    trainer.push_back("--generate");
    trainer.push_back("20:4");
  }
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  const int started_hosts = policy == "evict" ? hosts + 1 : hosts;
  for (int n = 1; n <= started_hosts; ++n) {
    std::vector<std::string> argv_host = {TRAINGUARD_CLI_PATH,
                                          "run",
                                          "--nnodes",
                                          absl::StrCat(hosts),
                                          "--nproc-per-node",
                                          absl::StrCat(per_host),
                                          "--rdzv-endpoint",
                                          endpoint,
                                          "--token-file",
                                          dir + "/token",
                                          "--job-id",
                                          absl::StrCat("fs-", getpid()),
                                          "--run-dir",
                                          dir + "/run",
                                          "--host-id",
                                          absl::StrCat("host", n),
                                          "--local-addr",
                                          SimCluster::Address(n),
                                          "--host-timeout",
                                          "3",
                                          "--fail-slow",
                                          policy,
                                          "--fail-slow-continuity",
                                          "10",
                                          "--fail-slow-trace",
                                          std::filesystem::absolute(out).string()};
    if (n > hosts) argv_host.insert(argv_host.end(), {"--role", "standby"});
    argv_host.push_back("--");
    std::vector<std::string> command = trainer;
    if (n == kDegradedHost && scenario == "delay") {
      command.push_back("--step-time-ms");
      command.push_back("20");
    }
    if (n == kDegradedHost && scenario == "throttle") {
      command.insert(command.begin(),
                     {"/bin/sh", "-c",
                      absl::StrCat("echo $$ > ", throttle->Procs(), " && exec \"$@\""), "sh"});
    }
    std::vector<std::string> full = argv_host;
    full.insert(full.end(), command.begin(), command.end());
    if (n == kDegradedHost && socket_group != nullptr) {
      // The whole host, its agent included, sends through the degraded link.
      full.insert(full.begin(),
                  {"/bin/sh", "-c",
                   absl::StrCat("echo $$ > ", socket_group->Procs(), " && exec \"$@\""), "sh"});
    }
    if (n == kDegradedHost && scenario == "membw") {
      // The hog beside the agent, in the host's PID namespace: it dies with the host.
      full.insert(full.begin(), {"/bin/sh", "-c",
                                 absl::StrCat("'", self, "' hog --seconds ", seconds + 60,
                                              " --mib 512 & exec \"$@\""),
                                 "sh"});
    }
    absl::Status started =
        (*cluster)->StartHost(n, {.hostname = absl::StrCat("host", n),
                                  .argv = full,
                                  .env = testing::ExampleCheckpointEnv(dir + "/run"),
                                  .log_path = absl::StrCat(dir, "/host", n, ".log")});
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.ToString().c_str());
      return 1;
    }
    if (n == 1) absl::SleepFor(absl::Seconds(1));  // host1 takes the lease and coordinates
  }
  absl::SleepFor(absl::Seconds(seconds));
  for (int n = 1; n <= started_hosts; ++n) (void)(*cluster)->KillHost(n);
  for (int n = 1; n <= started_hosts; ++n) (void)(*cluster)->WaitHost(n, absl::Seconds(10));
  int hangs = 0;
  for (int rank = 0; rank < hosts * per_host; ++rank) {
    absl::StatusOr<EventLogContents> events =
        ReadEventLog(Env::Default(), EventLogPath(dir + "/run", rank));
    if (!events.ok()) continue;
    for (const Event& e : events->events) hangs += e.type == EventType::kHang ? 1 : 0;
  }
  int suspects = 0, evictions = 0;
  for (int n = 1; n <= started_hosts; ++n) {
    const std::string log = absl::StrCat(dir, "/host", n, ".log");
    suspects += CountLines(log, "suspect host ");
    evictions += CountLines(log, "is dead (fail-slow");
  }
  std::printf(
      "%s: trace %s (%d s, %d hosts x %d ranks, --fail-slow %s); watchdog hang events: %d; "
      "suspect verdicts: %d; fail-slow evictions: %d; logs in %s\n",
      scenario.c_str(), out.c_str(), seconds, hosts, per_host, policy.c_str(), hangs, suspects,
      evictions, dir.c_str());
  return 0;
#endif
}

}  // namespace trainguard
