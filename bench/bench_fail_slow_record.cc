// `bench_fail_slow record`: one labelled run on simulated hosts (tests/support/sim_cluster.h) whose
// coordinator writes the per-second fail-slow trace that `bench_fail_slow` then replays:
//
//   bench_fail_slow record --scenario throttle|delay|healthy|rl --seconds N --out TRACE
//
// Four hosts of two ranks each train the example trainer with --fail-slow alert; host 3 is the
// degraded one: throttle: its ranks in a CPU cgroup capped at 2% of one CPU (a rank here needs
// about 4%); delay: its ranks sleep 20 ms in every step (--step-time-ms); healthy: no fault; rl:
// no fault, an RL-shaped step (--generate 20:4, generation lengths that vary by rank and step).
// After N seconds every host is killed; the run's hang events (the watchdog-only baseline) are
// counted from its event files and printed as "watchdog hang events: K".
//
// Needs root, like multihost_test. Single-threaded (the SimCluster's rule).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sdk/rendezvous/tcp_store.h"
#include "tests/support/cpu_throttle.h"
#include "tests/support/example_trainer_job.h"
#include "tests/support/sim_cluster.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {

int RecordFailSlowTrace(int argc, char** argv) {
#ifndef TRAINGUARD_TRAINER_PATH
  (void)argc;
  (void)argv;
  std::fprintf(stderr,
               "bench_fail_slow record needs the example trainer (TRAINGUARD_BUILD_EXAMPLES)\n");
  return 2;
#else
  using testing::SimCluster;
  std::string scenario, out;
  int seconds = 60;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--scenario") scenario = value;
    if (flag == "--seconds") seconds = std::stoi(value);
    if (flag == "--out") out = value;
  }
  if (out.empty() || (scenario != "throttle" && scenario != "delay" && scenario != "healthy" &&
                      scenario != "rl")) {
    std::fprintf(stderr,
                 "usage: bench_fail_slow record --scenario throttle|delay|healthy|rl --seconds N "
                 "--out TRACE\n");
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
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::string> argv_host = {TRAINGUARD_CLI_PATH,
                                          "run",
                                          "--nnodes",
                                          "4",
                                          "--nproc-per-node",
                                          "2",
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
                                          "alert",
                                          "--fail-slow-continuity",
                                          "10",
                                          "--fail-slow-trace",
                                          std::filesystem::absolute(out).string(),
                                          "--"};
    std::vector<std::string> command = trainer;
    if (n == 3 && scenario == "delay") {
      command.push_back("--step-time-ms");
      command.push_back("20");
    }
    if (n == 3 && scenario == "throttle") {
      command.insert(command.begin(),
                     {"/bin/sh", "-c",
                      absl::StrCat("echo $$ > ", throttle->Procs(), " && exec \"$@\""), "sh"});
    }
    argv_host.insert(argv_host.end(), command.begin(), command.end());
    absl::Status started =
        (*cluster)->StartHost(n, {.hostname = absl::StrCat("host", n),
                                  .argv = argv_host,
                                  .env = testing::ExampleCheckpointEnv(dir + "/run"),
                                  .log_path = absl::StrCat(dir, "/host", n, ".log")});
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.ToString().c_str());
      return 1;
    }
    if (n == 1) absl::SleepFor(absl::Seconds(1));  // host1 takes the lease and coordinates
  }
  absl::SleepFor(absl::Seconds(seconds));
  for (int n = 1; n <= 4; ++n) (void)(*cluster)->KillHost(n);
  for (int n = 1; n <= 4; ++n) (void)(*cluster)->WaitHost(n, absl::Seconds(10));
  int hangs = 0;
  for (int rank = 0; rank < 8; ++rank) {
    absl::StatusOr<EventLogContents> events =
        ReadEventLog(Env::Default(), EventLogPath(dir + "/run", rank));
    if (!events.ok()) continue;
    for (const Event& e : events->events) hangs += e.type == EventType::kHang ? 1 : 0;
  }
  std::printf("%s: trace %s (%d s); watchdog hang events: %d; logs in %s\n", scenario.c_str(),
              out.c_str(), seconds, hangs, dir.c_str());
  return 0;
#endif
}

}  // namespace trainguard
