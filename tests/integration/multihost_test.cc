// `trainguard run` as one agent per simulated host (tests/support/sim_cluster.h): real namespaces,
// real processes, real sockets on 127.0.1.N. Each scenario kills, partitions or loses what the
// issue names, asserts that every rank ends bit-identical to an uninterrupted run (each rank's final
// line printed exactly once: no rank ever trains twice), and prints the time to recovery.
//
// The jobs are as short as their scenarios allow: 200 steps, a snapshot every 10 (step 40 is the
// first on disk), the fault once step 60 is printed. Training steps show nothing a scenario checks;
// what takes the time is the host timeout and the recovery.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/health/fail_slow_dump.h"
#include "trainguard/env.h"
#include "trainguard/events.h"
#include "tests/support/cpu_throttle.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/example_trainer_job.h"
#include "tests/support/sim_cluster.h"
#include "tests/support/spawn.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::SimCluster;

constexpr absl::Duration kDeadline = absl::Seconds(150);
constexpr int kPerHost = 2;
constexpr int kSteps = 200;
constexpr int kPrintEvery = 10;
// A snapshot every 10 steps, persisted every 4th: steps 40, 80, 120 and 160 are on disk.
constexpr int kSnapshotEvery = 10;
// What a scenario waits for before its fault: step 40 is persisted by then, or about to be (the
// scenarios that need it on disk wait for it: AwaitPersistedByEveryRank).
constexpr char kFaultAfter[] = "step 60 loss";
constexpr char kStoreAddress[] = "127.0.1.254";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory every simulated host sees (theirs /tmp is private): under the build tree.
class SharedDir {
 public:
  SharedDir() {
    std::string pattern = std::string(TRAINGUARD_SHARED_TMP) + "/mh-XXXXXX";
    std::filesystem::create_directories(TRAINGUARD_SHARED_TMP);
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~SharedDir() {
    std::error_code ec;
    if (!path_.empty() && !::testing::Test::HasFailure()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// rank -> params_checksum from "rank R final_loss L params_checksum C" lines; a rank printed twice
// (two processes finished the same rank) is recorded as "duplicate".
std::map<int, std::string> FinalChecksums(const std::vector<std::string>& outputs) {
  std::map<int, std::string> checksums;
  const std::regex re("rank ([0-9]+) final_loss [^ ]+ params_checksum ([0-9a-f]+)");
  for (const std::string& out : outputs) {
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      const int rank = std::stoi((*it)[1]);
      checksums[rank] = checksums.count(rank) != 0 ? "duplicate" : std::string((*it)[2]);
    }
  }
  return checksums;
}

std::vector<std::string> TrainerArgs() {
  return testing::ExampleTrainerArgs(TRAINGUARD_TRAINER_PATH, kSteps, kPrintEvery);
}

std::vector<std::string> CheckpointEnv(const std::string& dir) {
  return testing::ExampleCheckpointEnv(dir, kSnapshotEvery);
}

// "<size>:<modification time>" of the file at `path` (empty if absent): a rebuilt binary is
// another binary.
std::string FileVersion(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return "";
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  return absl::StrCat(size, ":", mtime);
}

// The same job on one host without faults: what every rank's parameters must end as. `env`: the
// job's extra variables (a parallel layout), `trainer`: its command. The answer depends only on
// the world, the variables, the command and the binaries (the launcher's and the command's), so it
// is computed once per build and kept in TRAINGUARD_SHARED_TMP for every test that asks the same
// (--step-time-ms, a sleep, is left out: it changes no arithmetic).
std::map<int, std::string> UninterruptedChecksums(const std::string& shared, int world,
                                                  const std::vector<std::string>& extra_env = {},
                                                  const std::vector<std::string>& trainer =
                                                      TrainerArgs()) {
  std::vector<std::string> command;
  for (size_t i = 0; i < trainer.size(); ++i) {
    if (trainer[i] == "--step-time-ms" && i + 1 < trainer.size()) {
      ++i;
      continue;
    }
    command.push_back(trainer[i]);
  }
  std::vector<std::string> all_env = CheckpointEnv(shared + "/reference");
  all_env.insert(all_env.end(), extra_env.begin(), extra_env.end());
  std::string key = absl::StrCat("world ", world, "\ncli ", FileVersion(TRAINGUARD_CLI_PATH),
                                 "\ntrainer ", FileVersion(command.front()), "\n");
  for (const std::string& kv : all_env) {
    if (!absl::StartsWith(kv, "TRAINGUARD_CHECKPOINT_DIR=")) absl::StrAppend(&key, kv, "\n");
  }
  absl::StrAppend(&key, absl::StrJoin(command, " "));
  const std::string cached = absl::StrFormat("%s/reference-%016x.out", TRAINGUARD_SHARED_TMP,
                                             std::hash<std::string>{}(key));
  if (std::map<int, std::string> sums = FinalChecksums({ReadFile(cached)});
      static_cast<int>(sums.size()) == world) {
    return sums;
  }

  const std::string out_path = shared + "/reference.out";
  std::vector<std::string> args = {TRAINGUARD_CLI_PATH, "run", "--nproc", absl::StrCat(world),
                                   "--run-dir", shared + "/reference", "--job-id",
                                   absl::StrCat("mh-reference-", getpid()), "--"};
  for (const std::string& a : command) args.push_back(a);
  std::vector<std::pair<std::string, std::string>> env;
  for (const std::string& kv : all_env) {
    env.push_back({kv.substr(0, kv.find('=')), kv.substr(kv.find('=') + 1)});
  }
  const pid_t pid = testing::SpawnWithOutput(std::move(args), out_path, env);
  if (pid <= 0) return {};
  int status = 0;
  for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      const std::string out = ReadFile(out_path);
      std::map<int, std::string> sums = FinalChecksums({out});
      if (static_cast<int>(sums.size()) == world) {
        // Whole or not at all: another test may be reading it (rename is atomic).
        const std::string temp = absl::StrCat(cached, ".", getpid());
        std::ofstream(temp) << out;
        std::filesystem::rename(temp, cached);
      }
      return sums;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  (void)testing::SignalOwnProcess(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return {};
}

// One multi-host job: an agent per simulated host, the store on the test's own address.
class MultiHostJob {
 public:
  // `endpoint`: tcp://... (the test serves it) or etcd://...
  MultiHostJob(SimCluster& cluster, const std::string& shared, std::string endpoint, int nnodes)
      : cluster_(cluster), shared_(shared), endpoint_(std::move(endpoint)), nnodes_(nnodes),
        job_id_(absl::StrCat("mh-", getpid())) {
    std::ofstream(shared_ + "/token") << "multihost-test-token\n";
  }

  // Every host's: extra environment (a parallel layout) and flags (--backup-copies ...).
  std::vector<std::string> extra_env;
  // Every host's snapshot interval in steps (persisted every 4th).
  int snapshot_every = kSnapshotEvery;
  std::vector<std::string> job_flags;
  // Host n's /dev/shm size in bytes (absent: tmpfs's default).
  std::map<int, uint64_t> shm_bytes;

  void StartHost(int n, bool standby, const std::vector<std::string>& extra_flags = {},
                 const std::vector<std::string>& command = TrainerArgs()) {
    std::vector<std::string> argv = {TRAINGUARD_CLI_PATH,
                                     "run",
                                     "--nnodes",
                                     absl::StrCat(nnodes_),
                                     "--nproc-per-node",
                                     absl::StrCat(kPerHost),
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--token-file",
                                     shared_ + "/token",
                                     "--job-id",
                                     job_id_,
                                     "--run-dir",
                                     shared_ + "/run",
                                     "--host-id",
                                     absl::StrCat("host", n),
                                     "--local-addr",
                                     SimCluster::Address(n),
                                     "--host-timeout",
                                     "3"};
    if (standby) {
      argv.push_back("--role");
      argv.push_back("standby");
    }
    argv.insert(argv.end(), job_flags.begin(), job_flags.end());
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    std::vector<std::string> env = testing::ExampleCheckpointEnv(shared_ + "/run", snapshot_every);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    ASSERT_EQ(cluster_.StartHost(n, {.hostname = absl::StrCat("host", n),
                                     .argv = argv,
                                     .env = env,
                                     .log_path = Log(n),
                                     .shm_bytes = shm_bytes.count(n) != 0 ? shm_bytes.at(n) : 0}),
              absl::OkStatus());
    hosts_.push_back(n);
  }

  std::string Log(int n) const { return absl::StrCat(shared_, "/host", n, ".log"); }
  std::string Output(int n) const { return ReadFile(Log(n)); }
  std::string AllOutput() const {
    std::string all;
    for (int n : hosts_) absl::StrAppend(&all, "==== host", n, "\n", Output(n));
    return all;
  }

  // Bounded polling of host n's log (n == 0: any host's) for `needle`.
  bool Await(int n, const std::string& needle, absl::Duration deadline = kDeadline) const {
    for (absl::Time end = absl::Now() + deadline; absl::Now() < end;) {
      if (n > 0 ? absl::StrContains(Output(n), needle)
                : absl::StrContains(AllOutput(), needle)) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  // The same for host n's log from byte `from` on: what it said after that point.
  bool AwaitAfter(int n, const std::string& needle, size_t from) const {
    for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
      if (Output(n).find(needle, from) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // The exit status of host n's agent (-1: it did not end in time or was killed).
  int Wait(int n) {
    absl::StatusOr<int> status = cluster_.WaitHost(n, kDeadline);
    if (!status.ok()) return -1;
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  std::map<int, std::string> FinalChecksums() const {
    std::vector<std::string> outs;
    for (int n : hosts_) outs.push_back(Output(n));
    return trainguard::FinalChecksums(outs);
  }

  // "recovered from the loss of host hostN in X s" from whichever agent coordinated.
  double ReportedRecoverySeconds(int n) const {
    std::smatch m;
    const std::string all = AllOutput();
    if (!std::regex_search(all, m, std::regex(absl::StrCat("recovered from the loss of host host",
                                                           n, " in ([0-9.]+) s")))) {
      return -1;
    }
    return std::stod(m[1]);
  }

 private:
  SimCluster& cluster_;
  const std::string shared_;
  const std::string endpoint_;
  const int nnodes_;
  std::vector<int> hosts_;

 public:
  const std::string job_id_;
};

// Every event of rank `rank`'s event file (all the processes that held the rank append to it).
std::vector<Event> RankEvents(const std::string& shared, int rank) {
  absl::StatusOr<EventLogContents> contents = ReadEventLog(
      Env::Default(), absl::StrFormat("%s/run/events/rank-%05d.tgev", shared, rank));
  return contents.ok() ? contents->events : std::vector<Event>{};
}

// The newest step that every one of `world` ranks had persisted (a saved event with
// persisted=true) before `before`; -1 if none.
int64_t NewestPersistedByEveryRank(const std::string& shared, int world, absl::Time before) {
  std::map<int64_t, int> ranks_persisted;
  for (int rank = 0; rank < world; ++rank) {
    std::set<int64_t> steps;
    for (const Event& e : RankEvents(shared, rank)) {
      if (e.time < before && KindOf(e) == EventKind::kSaved && e.Attribute("persisted") == "true") {
        steps.insert(e.step);
      }
    }
    for (int64_t step : steps) ++ranks_persisted[step];
  }
  int64_t newest = -1;
  for (const auto& [step, count] : ranks_persisted) {
    if (count == world) newest = std::max(newest, step);
  }
  return newest;
}

// Bounded polling of the ranks' event files until every one of `world` ranks persisted a step:
// the scenarios that fall back to the disk need a checkpoint there before their fault.
bool AwaitPersistedByEveryRank(const std::string& shared, int world) {
  for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
    if (NewestPersistedByEveryRank(shared, world, absl::InfiniteFuture()) > 0) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
    ASSERT_TRUE(cluster.ok()) << cluster.status();  // fails (never skips) without namespaces
    cluster_ = *std::move(cluster);
    ASSERT_FALSE(shared_.path().empty());
  }

  // The job's TcpStore, served by the test on its own address (not by a host that a test kills).
  std::string ServeStore() {
    TcpStoreServerOptions options;
    options.host = kStoreAddress;
    options.job_token = "multihost-test-token";
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    store_ = *std::move(server);
    return absl::StrCat("tcp://", kStoreAddress, ":", store_->port());
  }

  // Starts host 1 first and waits until it coordinates, so the scenario knows which host does.
  void StartJob(MultiHostJob& job, int workers, int standby_hosts) {
    job.StartHost(1, false);
    ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
    for (int n = 2; n <= workers; ++n) job.StartHost(n, false);
    for (int n = workers + 1; n <= workers + standby_hosts; ++n) job.StartHost(n, true);
    ASSERT_TRUE(job.Await(0, kFaultAfter)) << job.AllOutput();
  }

  // Starts hosts 1..workers, then the standby hosts, each once the previous one joined: host n
  // holds host slot n - 1 (ranks (n-1)*2 and (n-1)*2 + 1). Host 1 coordinates: the next host starts
  // once it said so (its agent joins before it takes the lease, and host 2's could take it first).
  void StartJobInOrder(MultiHostJob& job, int workers, int standby_hosts,
                       const std::vector<std::string>& command = TrainerArgs()) {
    for (int n = 1; n <= workers + standby_hosts; ++n) {
      job.StartHost(n, n > workers, {}, command);
      ASSERT_TRUE(job.Await(n, absl::StrCat("host host", n))) << job.AllOutput();
      ASSERT_TRUE(job.Await(n, " joined as ")) << job.AllOutput();
      if (n == 1) {
        ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
      }
    }
    ASSERT_TRUE(job.Await(0, kFaultAfter)) << job.AllOutput();
  }

  // `trainer`: the job's command, for the uninterrupted run too.
  void ExpectFinishedAsIfUninterrupted(MultiHostJob& job, const std::vector<int>& hosts,
                                       int world = 3 * kPerHost,
                                       const std::vector<std::string>& trainer = TrainerArgs()) {
    for (int n : hosts) EXPECT_EQ(job.Wait(n), 0) << "host " << n << "\n" << job.AllOutput();
    const std::map<int, std::string> expected =
        UninterruptedChecksums(shared_.path(), world, job.extra_env, trainer);
    ASSERT_EQ(expected.size(), static_cast<size_t>(world));
    EXPECT_EQ(job.FinalChecksums(), expected) << job.AllOutput();
  }

  SharedDir shared_;
  // Destroyed after the cluster, whose hosts (its processes) must be gone before it can be removed.
  std::unique_ptr<testing::CpuThrottle> throttle_;
  std::unique_ptr<SimCluster> cluster_;
  std::unique_ptr<TcpStoreServer> store_;
};

// Ranks by host in join order, the environment torchrun gives (and TRAINGUARD_HOST_ADDR), and
// --standby-nodes: the job forms once the standby host joined too, and the host that joined after
// the training ones holds standbys though it asked for no role.
TEST_F(MultiHost, RanksAreAssignedByHostWithTorchrunsEnvironmentAndTheLastHostIsAStandbyHost) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 2);
  const std::vector<std::string> print_env = {
      "/bin/sh", "-c",
      "echo ENV ROLE=$TRAINGUARD_ROLE RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
      "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK ROLE_RANK=$ROLE_RANK "
      "MASTER_ADDR=$MASTER_ADDR RUN_ID=$TORCHELASTIC_RUN_ID "
      "RESTARTS=$TORCHELASTIC_RESTART_COUNT HOST_ADDR=$TRAINGUARD_HOST_ADDR "
      "AGENT_STORE=$TORCHELASTIC_USE_AGENT_STORE NCCL_AEH=$TORCH_NCCL_ASYNC_ERROR_HANDLING"};
  const std::vector<std::string> flags = {"--standby-nodes", "1"};
  job.StartHost(1, false, flags, print_env);
  ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
  job.StartHost(2, false, flags, print_env);
  ASSERT_TRUE(job.Await(2, "joined as a worker")) << job.AllOutput();
  EXPECT_THAT(job.Output(1), ::testing::Not(HasSubstr("host(s) train")));  // waits for host 3
  job.StartHost(3, false, flags, print_env);
  for (int n : {1, 2, 3}) EXPECT_EQ(job.Wait(n), 0) << job.AllOutput();
  const std::string id = job.job_id_;
  for (int rank = 0; rank < 4; ++rank) {
    const int host = rank / 2 + 1;
    EXPECT_THAT(job.Output(host),
                HasSubstr(absl::StrFormat(
                    "ENV ROLE=rank RANK=%d LOCAL_RANK=%d WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 "
                    "GROUP_RANK=%d ROLE_RANK=%d MASTER_ADDR=127.0.1.1 RUN_ID=%s RESTARTS=0 "
                    "HOST_ADDR=127.0.1.%d AGENT_STORE=False NCCL_AEH=2",
                    rank, rank % 2, host - 1, rank, id, host)))
        << job.AllOutput();
  }
  EXPECT_THAT(job.Output(3), HasSubstr("host host3 is a standby host: 2 standbys"));
  EXPECT_THAT(job.Output(3), HasSubstr("ENV ROLE=standby RANK= LOCAL_RANK= WORLD_SIZE=4"));
  EXPECT_THAT(job.Output(1), HasSubstr("2 host(s) train, 1 are standby hosts"));
}

// A rank that gives up publishes job/stop: every host's agent reads it in its turn (with the turn's
// other keys), stops its ranks and exits 1 naming it; nobody is replaced.
TEST_F(MultiHost, ARanksJobStopStopsEveryHostAndNobodyIsReplaced) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 2);
  const std::vector<std::string> stop_job = {TRAINGUARD_FAULT_RANK_PATH, "stop-job"};
  job.StartHost(1, false, {}, stop_job);
  ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
  job.StartHost(2, false, {}, stop_job);
  for (int n : {1, 2}) {
    EXPECT_EQ(job.Wait(n), 1) << job.AllOutput();
    EXPECT_THAT(job.Output(n), HasSubstr("job stopped: rank 0: step 7 failed again after 2 "
                                         "rollbacks (limit 2)"))
        << job.AllOutput();
  }
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("takes rank")));
}

// 1. A whole host dies (its PID namespace is killed): its two ranks are replaced at once by the
// standby host's two, in one generation, which restore its snapshots from the memory of the host
// that held their backups; nothing is read from disk, and the job finishes. Before that, one of the
// standby host's standbys dies while parked: its agent starts another, so the standby host still
// has a standby for every rank when the host dies. (One job for both: the same hosts and the same
// host kill; the standby's death comes first and changes nothing the host kill shows.)
TEST_F(MultiHost, AStandbyHostRefillsADeadStandbyThenTakesAKilledHostsRanksFromPeerMemory) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  StartJob(job, 3, 1);
  // Inside host 4 every process is the test's: its agent (named trainguard), its two standbys
  // (named cpp_trainer); -o: the older of the two.
  ASSERT_TRUE(cluster_->RunInHost(4, {"/usr/bin/pkill", "-KILL", "-o", "-x", "cpp_trainer"},
                                  absl::Seconds(30))
                  .ok());
  ASSERT_TRUE(job.Await(4, "killed by SIGKILL while parked")) << job.AllOutput();
  ASSERT_TRUE(job.Await(4, "started standby 2")) << job.AllOutput();
  const absl::StatusOr<absl::Time> killed = cluster_->KillHost(2);
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_TRUE(job.Await(1, "recovered from the loss of host host2")) << job.AllOutput();
  const absl::Duration seen = absl::Now() - *killed;
  std::printf("host kill -> recovery seen: %.3f s (reported from the last heartbeat: %.3f s)\n",
              absl::ToDoubleSeconds(seen), job.ReportedRecoverySeconds(2));
  const std::string coordinator = job.Output(1);
  EXPECT_THAT(coordinator, HasSubstr("host host2 is dead"));
  // Group ranks follow the join order: host2 holds ranks 2,3 or 4,5. Both go to host4's standbys:
  // the one left of the first two and the one started in place of the dead one.
  EXPECT_THAT(coordinator, ::testing::ContainsRegex("host host2's ranks taken by [0-9]<-host4:"
                                                    "[0-9]+:standby[0-9], [0-9]<-host4:"));
  // host2's shared memory died with it, but its snapshots have backups on host1 or host3: the
  // standby host's ranks restore the newest step committed in memory from there, the survivors
  // the same step from their arenas, and no rank reads the disk.
  std::smatch m;
  const std::string standby_host = job.Output(4);
  ASSERT_TRUE(std::regex_search(standby_host, m,
                                std::regex("rank [0-9] restored step ([0-9]+) from peer host "
                                           "host[13]\n")))
      << job.AllOutput();
  EXPECT_THAT(coordinator, HasSubstr(absl::StrCat("restored step ", std::string(m[1]), " from arena")));
  // The placement is re-established (the standby host's ranks pushed their restored snapshots to
  // their holders, and receive their sources') before the job says it is protected again.
  ASSERT_TRUE(job.Await(0, "the job is protected again")) << job.AllOutput();
  ExpectFinishedAsIfUninterrupted(job, {1, 3, 4});
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("from disk")));
}

// Silent data corruption with silent_corruption=evict: rank 2 (on host2) flips one bit of its
// parameters after step 70, in its own memory. The next snapshot names rank 2, host2 and the
// buffer; every rank rolls back, and the coordinator evicts host2 as a fail-slow host is evicted
// (declared dead, its ranks taken by the standby host's, which restore from peer memory). The job
// ends as if uninterrupted.
TEST_F(MultiHost, WithEvictAHostWhoseReplicaDisagreesIsEvictedAndTheStandbyHostTakesItsRanks) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  job.extra_env = {"TRAINGUARD_SILENT_CORRUPTION=evict"};
  std::vector<std::string> trainer = TrainerArgs();
  trainer.insert(trainer.end(), {"--flip-bit", "2:70"});
  StartJobInOrder(job, 3, 1, trainer);
  ASSERT_TRUE(job.Await(1, "silent corruption: evicting host host2")) << job.AllOutput();
  ASSERT_TRUE(job.Await(1, "recovered from the loss of host host2")) << job.AllOutput();
  const std::string coordinator = job.Output(1);
  EXPECT_THAT(coordinator, ::testing::ContainsRegex(
                               "silent corruption: step [0-9]+: data-parallel group "
                               "tp0.cp0.pp0 \\(ranks 0,1,2,3,4,5\\): rank 2 \\(host host2\\) "
                               "buffer mlp.parameters"));
  EXPECT_THAT(coordinator,
              HasSubstr("host host2 is dead (silent data corruption: named 1 time(s))"));
  std::smatch took;
  if (std::regex_search(coordinator, took,
                        std::regex("recovered from the loss of host host2 in ([0-9.]+ s)"))) {
    std::printf("a corrupt host evicted: recovered from its loss in %s\n", took[1].str().c_str());
  }
  EXPECT_EQ(job.Wait(2), 1) << job.AllOutput();  // fenced out, as an evicted slow host
  ExpectFinishedAsIfUninterrupted(job, {1, 3, 4});
  EXPECT_THAT(job.AllOutput(), ::testing::Not(::testing::ContainsRegex("evicting host host[134]")));
}

// 2. The host whose agent coordinates dies: another agent takes the lease over, declares the host
// dead and replaces its ranks; the job finishes.
TEST_F(MultiHost, WhenTheCoordinatorsHostDiesAnotherAgentTakesOverAndTheJobFinishes) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  StartJob(job, 3, 1);
  const absl::StatusOr<absl::Time> killed = cluster_->KillHost(1);
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host1")) << job.AllOutput();
  std::printf("coordinator's host kill -> recovery seen: %.3f s\n",
              absl::ToDoubleSeconds(absl::Now() - *killed));
  EXPECT_THAT(job.AllOutput(), ::testing::ContainsRegex("coordinating the job \\(lease term 2"));
  ExpectFinishedAsIfUninterrupted(job, {2, 3, 4});
}

// 3. A host is cut off for longer than the liveness bound, then the link heals: it was declared
// dead and fenced out, its agent stops its ranks when it is back, and no rank trains twice. The
// job's store is the one host1's agent serves (torchrun's c10d rule): at the end it keeps serving
// until every other host left, the fenced one (declared dead, and left) counted once, so that no
// agent is cut off from the job's end (issue 36: it used to stop while host2 still read it).
TEST_F(MultiHost, APartitionedHostIsFencedOutAndNoRankEverTrainsTwice) {
  const absl::StatusOr<int> port = testing::FreeTcpPort(SimCluster::Address(1));
  ASSERT_TRUE(port.ok()) << port.status();
  MultiHostJob job(*cluster_, shared_.path(),
                   absl::StrCat("tcp://", SimCluster::Address(1), ":", *port), 3);
  StartJob(job, 3, 1);
  EXPECT_THAT(job.Output(1), HasSubstr("serving the job's store on "));
  ASSERT_EQ(cluster_->Isolate(3), absl::OkStatus());
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(job.Await(1, "recovered from the loss of host host3")) << job.AllOutput();
  std::printf("partition -> recovery seen: %.3f s\n", absl::ToDoubleSeconds(absl::Now() - cut));
  ASSERT_EQ(cluster_->HealAll(), absl::OkStatus());
  EXPECT_EQ(job.Wait(3), 1) << job.AllOutput();
  EXPECT_THAT(job.Output(3), HasSubstr("was declared dead by the coordinator"));
  ExpectFinishedAsIfUninterrupted(job, {1, 2, 4});
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("has not reached the job's store")));
  EXPECT_THAT(job.Output(1), ::testing::Not(HasSubstr("stopping the store before every host left")));
}

// Issue 36: with etcd, the coordinator's host is cut off (from etcd and every host) long enough
// for another agent to take the lease, declare it dead and replace its ranks, then the link heals.
// The cut-off coordinator stands down while it is cut off (it cannot renew, so it stops acting
// before the lease can pass), and after the heal it acts no more as the coordinator: it neither
// reports protection, nor asks for a kill, nor publishes or renews a generation, nor diagnoses a
// hang; it learns it was fenced and leaves. No rank trains twice.
TEST_F(MultiHost, WithEtcdACutOffCoordinatorStandsDownBeforeTheLeasePassesAndNeverActsAfter) {
  absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> etcd =
      testing::EtcdCluster::Start(3, {"127.0.1.201", "127.0.1.202", "127.0.1.203"});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  MultiHostJob job(*cluster_, shared_.path(), (*etcd)->StoreUrl(), 3);
  // The lease is under test, not the hang: the other hosts' ranks wait in allreduces with host1's
  // and would declare a hang after the watchdog's 1 s floor. The new coordinator holds that hang's
  // diagnosis off while host1 is silent and host1's death explains it (HangCoordinator; without the
  // floor this test saw "hang diagnosis: host host1 has sent no heartbeat ..." then "... explained
  // by the loss of host host1"), but the faster recovery can end the job before host1's agent is
  // back, and an agent reads job/done before its fence (AgentTick): it then exits 0, not fenced.
  // With a 20 s floor host1's death (about 7 s) comes first and the job ends later.
  job.extra_env = {"TRAINGUARD_WATCHDOG_FLOOR_MS=20000"};
  StartJob(job, 3, 1);  // host1 coordinates
  // The cut is of the coordinator: host1's last word on the lease, just before, is that it holds it
  // (a slow build can see it stand down and take the lease again before; the lines before the cut
  // are not what this test is about).
  const std::string before_cut = job.Output(1);
  const size_t held = before_cut.rfind("coordinating the job");
  const size_t lost = before_cut.rfind("no longer coordinating");
  ASSERT_TRUE(held != std::string::npos && (lost == std::string::npos || held > lost))
      << "host1 does not coordinate at the cut:\n" << job.AllOutput();
  ASSERT_EQ(cluster_->Isolate(1), absl::OkStatus());
  const absl::Time cut = absl::Now();
  // Stood down while still cut off, before any other agent coordinates.
  ASSERT_TRUE(job.AwaitAfter(1, "no longer coordinating", before_cut.size())) << job.AllOutput();
  const std::string stood_down = job.Output(1);
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host1")) << job.AllOutput();
  std::printf("coordinator cut off -> stood down: seen; -> recovery seen: %.3f s\n",
              absl::ToDoubleSeconds(absl::Now() - cut));
  EXPECT_THAT(job.AllOutput(), ::testing::ContainsRegex("coordinating the job \\(lease term 2"));
  ASSERT_EQ(cluster_->HealAll(), absl::OkStatus());
  EXPECT_EQ(job.Wait(1), 1) << job.AllOutput();
  const std::string host1 = job.Output(1);
  EXPECT_THAT(host1, HasSubstr("was declared dead by the coordinator"));
  // Everything host1 said after the line where it stood down: no act of a coordinator.
  const std::string after = host1.substr(
      stood_down.find('\n', stood_down.find("no longer coordinating", before_cut.size())));
  for (const char* act : {"the job is protected", "asking host", "taken by", "hang in generation",
                          "renewed with the same ranks", "is dead", "coordinating the job"}) {
    EXPECT_THAT(after, ::testing::Not(HasSubstr(act))) << host1;
  }
  // The only fault is host1's cut: a hang's suspect named on another host would be a healthy rank.
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("the hang's suspect"))) << job.AllOutput();
  ExpectFinishedAsIfUninterrupted(job, {2, 3, 4});
}

// Without a standby host, with --spread-standbys, a dead host's ranks go to the spare processes of
// the surviving training hosts (--standby 1 each), still in one generation.
TEST_F(MultiHost, WithSpreadStandbysADeadHostsRanksGoToSpareProcessesOnTheSurvivingHosts) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  const std::vector<std::string> spread = {"--standby", "1", "--spread-standbys"};
  job.StartHost(1, false, spread);
  ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
  job.StartHost(2, false, spread);
  job.StartHost(3, false, spread);
  ASSERT_TRUE(job.Await(0, kFaultAfter)) << job.AllOutput();
  ASSERT_TRUE(cluster_->KillHost(2).ok());
  ASSERT_TRUE(job.Await(1, "recovered from the loss of host host2")) << job.AllOutput();
  std::printf("recovery reported from host2's last heartbeat: %.3f s\n",
              job.ReportedRecoverySeconds(2));
  EXPECT_THAT(job.Output(1), ::testing::ContainsRegex(
                                 "host host2's ranks taken by [0-9]<-host[13]:[0-9]+:standby0, "
                                 "[0-9]<-host[13]:[0-9]+:standby0"));
  ExpectFinishedAsIfUninterrupted(job, {1, 3});
}

// Issue 36: a host whose /dev/shm is too small for its ranks' snapshot arenas. Its ranks fail at
// start-up, before they publish their arena sizes; the standby host takes them. The holders of
// their backups must not wait for those sizes (their wait notices the newer generation), and the
// job trains on to the end; the deaths' cause (the full /dev/shm) is in the coordinator's output.
TEST_F(MultiHost, AHostWhoseSharedMemoryIsTooSmallHasItsRanksTakenByTheStandbyHost) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  job.shm_bytes[3] = 64 << 10;  // no arena fits: the trainer's needs more than 64 KiB
  StartJobInOrder(job, 3, 1);     // host3 holds ranks 4 and 5
  for (int n : {1, 2, 3, 4}) EXPECT_EQ(job.Wait(n), 0) << "host " << n << "\n" << job.AllOutput();
  EXPECT_THAT(job.Output(3), ::testing::ContainsRegex(
                                 "rank [45] error: cannot start: RESOURCE_EXHAUSTED: .*snapshot "
                                 "arena .* No space left on device"));
  // The coordinator, on host1, names the deaths' cause on host3.
  EXPECT_THAT(job.Output(1), ::testing::ContainsRegex(
                                 "rank 4 \\(host3:[0-9]+:rank4\\) exited with status 1: replacing "
                                 "it; its error: rank 4 error: cannot start: RESOURCE_EXHAUSTED"));
  EXPECT_THAT(job.Output(1), ::testing::ContainsRegex("rank 4 taken by host4:[0-9]+:standby"));
  EXPECT_THAT(job.Output(1), ::testing::ContainsRegex("rank 5 taken by host4:[0-9]+:standby"));
  const std::map<int, std::string> expected = UninterruptedChecksums(shared_.path(), 3 * kPerHost);
  EXPECT_EQ(job.FinalChecksums(), expected) << job.AllOutput();
}

// ---- Redundant in-memory backups (peer backups across parallel groups) ----

// Flips the first payload byte of both slots of `source_rank`'s backup arena in host n's shared
// memory (the SnapshotArena layout, docs/FORMATS.md: ArenaHeader.payload_capacity at offset 32,
// slot_header_bytes at 48; the payloads follow both slot headers).
absl::Status CorruptBackup(SimCluster& cluster, int n, const std::string& job_id, int source_rank) {
  const std::string path = absl::StrCat("/dev/shm/trainguard.", job_id, ".backup.rank", source_rank);
  const std::string script = absl::StrCat(
      "set -e; f=", path, "; cap=$(od -An -tu8 -j32 -N8 $f | tr -d ' '); ",
      "hdr=$(od -An -tu8 -j48 -N8 $f | tr -d ' '); ",
      "for off in $((4096 + 2 * hdr)) $((4096 + 2 * hdr + cap)); do ",
      "v=$(od -An -tu1 -j$off -N1 $f | tr -d ' '); ",
      "printf \"\\\\$(printf %o $((255 - v)))\" | dd of=$f bs=1 seek=$off conv=notrunc status=none; ",
      "echo flipped $off; done");
  absl::StatusOr<std::string> out = cluster.RunInHost(n, {"/bin/sh", "-c", script}, absl::Seconds(30));
  if (!out.ok()) return out.status();
  if (std::count(out->begin(), out->end(), '\n') != 2) {
    return absl::InternalError(absl::StrCat("corrupting ", path, ": ", *out));
  }
  return absl::OkStatus();
}

// The coordinator's placement line of host slot `slot`: its holder slots.
std::string HoldersOfSlot(const std::string& output, int slot) {
  std::smatch m;
  if (!std::regex_search(output, m,
                         std::regex(absl::StrCat("host slot ", slot, " \\(ranks [0-9-]+\\) -> "
                                                 "backups on ([0-9,]+)")))) {
    return "";
  }
  return m[1];
}

// 2. Over-eviction: with dp and pp declared as eviction classes (pp=2 on 4 hosts: host slots
// {0,1} and {2,3} are the two DP groups, {0,2} and {1,3} the PP groups), every host's backups
// are on the one host that shares neither group. Evicting a whole DP group (both its hosts at
// once) still leaves a copy of every rank's snapshot: all four replaced ranks restore from memory.
TEST_F(MultiHost, OverEvictingAWholeDpGroupStillRestoresEveryRankFromPeerMemory) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 4);
  job.extra_env = {"TRAINGUARD_PP=2"};
  job.job_flags = {"--backup-evict", "host,dp,pp"};
  StartJobInOrder(job, 4, 2);
  const std::string coordinator = job.Output(1);
  EXPECT_THAT(coordinator, HasSubstr("host slot 0 (ranks 0-1) -> backups on 3"));
  EXPECT_THAT(coordinator, HasSubstr("host slot 2 (ranks 4-5) -> backups on 1"));
  EXPECT_THAT(coordinator, ::testing::Not(HasSubstr("dropped")));
  ASSERT_TRUE(job.Await(0, "the job is protected")) << job.AllOutput();
  // Host slots 2 and 3 (hosts 3 and 4): the DP group of pipeline stage 1.
  ASSERT_TRUE(cluster_->KillHost(3).ok());
  ASSERT_TRUE(cluster_->KillHost(4).ok());
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host3")) << job.AllOutput();
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host4")) << job.AllOutput();
  const std::string all = job.AllOutput();
  for (int rank = 4; rank < 8; ++rank) {
    EXPECT_THAT(all, ::testing::ContainsRegex(absl::StrCat("rank ", rank,
                                                           " restored step [0-9]+ from peer host "
                                                           "host[12]\n")))
        << all;
  }
  ExpectFinishedAsIfUninterrupted(job, {1, 2, 5, 6}, 8);
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("from disk")));
}

// 3a. A host and its backup holder die together: with two copies nothing in memory is left of the
// host's snapshots, so its ranks restore the newest durable checkpoint (every rank restores the
// same step: a newer one committed only in memory is skipped), and the output says why.
TEST_F(MultiHost, AHostAndItsHolderLostTogetherFallBackToDiskWithTwoCopies) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  StartJobInOrder(job, 3, 2);
  const std::string holders = HoldersOfSlot(job.Output(1), 1);
  ASSERT_FALSE(holders.empty()) << job.AllOutput();
  const int holder_host = std::stoi(holders) + 1;  // host n holds slot n - 1
  ASSERT_TRUE(AwaitPersistedByEveryRank(shared_.path(), 3 * kPerHost)) << job.AllOutput();
  ASSERT_TRUE(cluster_->KillHost(2).ok());
  ASSERT_TRUE(cluster_->KillHost(holder_host).ok());
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host2")) << job.AllOutput();
  const std::string all = job.AllOutput();
  EXPECT_THAT(all, ::testing::ContainsRegex("rank 2 restored step [0-9]+ from disk\n")) << all;
  // Either the step restored was committed in memory and on disk ("step S from peer memory: ...")
  // or only in memory, and every rank moved on to an older durable one ("step S: rank 2: ...").
  EXPECT_THAT(all, ::testing::ContainsRegex("rank 2 restore skipped step [0-9]+.*no backup holder "
                                            "of rank 2 served step"))
      << all;
  std::vector<int> left;
  for (int n : {1, 2, 3}) {
    if (n != 2 && n != holder_host) left.push_back(n);
  }
  left.push_back(4);
  left.push_back(5);
  ExpectFinishedAsIfUninterrupted(job, left);
}

// 3b. The same with three copies, the two hosts lost half a second apart (each declared dead on
// its own heartbeat): the third host still holds both lost hosts' snapshots, two standby hosts
// take their ranks, and every replaced rank restores from its memory.
TEST_F(MultiHost, WithThreeCopiesTwoHostsLostHalfASecondApartAreReplacedAndRestoreFromPeerMemory) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  job.job_flags = {"--backup-copies", "3"};
  StartJobInOrder(job, 3, 2);
  EXPECT_THAT(job.Output(1), HasSubstr("host slot 1 (ranks 2-3) -> backups on "));
  ASSERT_TRUE(job.Await(0, "the job is protected")) << job.AllOutput();
  const absl::StatusOr<absl::Time> killed = cluster_->KillHost(2);
  ASSERT_TRUE(killed.ok()) << killed.status();
  absl::SleepFor(absl::Milliseconds(500));  // the scenario's spacing, not a synchronization
  ASSERT_TRUE(cluster_->KillHost(3).ok());
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host2")) << job.AllOutput();
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host3")) << job.AllOutput();
  std::printf("first host kill -> both recoveries seen: %.3f s (reported from the last heartbeats: "
              "%.3f s and %.3f s)\n",
              absl::ToDoubleSeconds(absl::Now() - *killed), job.ReportedRecoverySeconds(2),
              job.ReportedRecoverySeconds(3));
  const std::string all = job.AllOutput();
  EXPECT_THAT(all, ::testing::ContainsRegex("host host2's ranks taken by [0-9]<-host[45]:"));
  EXPECT_THAT(all, ::testing::ContainsRegex("host host3's ranks taken by [0-9]<-host[45]:"));
  for (int rank = 2; rank < 6; ++rank) {
    EXPECT_THAT(all, ::testing::ContainsRegex(
                         absl::StrCat("rank ", rank, " restored step [0-9]+ from peer host host1\n")))
        << all;
  }
  ExpectFinishedAsIfUninterrupted(job, {1, 4, 5});
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("from disk")));
}

// 4. A backup corrupted in its holder's memory (a byte flipped in both slots): the replacement's
// fetch fails its chunk checksum, and with no other holder the disk is used, never the bad copy.
TEST_F(MultiHost, ABackupCorruptedInTheHoldersMemoryIsRejectedAndTheDiskIsUsed) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 3);
  StartJobInOrder(job, 3, 1);
  const std::string holders = HoldersOfSlot(job.Output(1), 1);
  ASSERT_FALSE(holders.empty()) << job.AllOutput();
  const int holder_host = std::stoi(holders) + 1;
  ASSERT_TRUE(job.Await(0, "the job is protected")) << job.AllOutput();
  ASSERT_TRUE(AwaitPersistedByEveryRank(shared_.path(), 3 * kPerHost)) << job.AllOutput();
  // Killed first, so that no newer backup of its ranks can reach the holder; the host is declared
  // dead only after --host-timeout (3 s) of silence, long after the bytes are flipped.
  ASSERT_TRUE(cluster_->KillHost(2).ok());
  for (int rank : {2, 3}) {
    ASSERT_EQ(CorruptBackup(*cluster_, holder_host, job.job_id_, rank), absl::OkStatus());
  }
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host2")) << job.AllOutput();
  const std::string all = job.AllOutput();
  EXPECT_THAT(all, ::testing::ContainsRegex("rank 2 restore skipped step [0-9]+.*DATA_LOSS: .*the "
                                            "holder's copy is corrupt"))
      << all;
  EXPECT_THAT(all, ::testing::ContainsRegex("rank 2 restored step [0-9]+ from disk\n")) << all;
  EXPECT_THAT(all, ::testing::Not(::testing::ContainsRegex("rank [23] restored step [0-9]+ from "
                                                           "peer")));
  std::vector<int> left = {4};
  for (int n : {1, 3}) left.push_back(n);
  ExpectFinishedAsIfUninterrupted(job, left);
}

// 5. With a 3-member etcd cluster as the store, one member is killed mid-job: no agent notices a
// host fault, no new generation is needed, and the job finishes.
TEST_F(MultiHost, LosingOneMemberOfAThreeMemberEtcdClusterDoesNotDisturbTraining) {
  absl::StatusOr<std::unique_ptr<testing::EtcdCluster>> etcd =
      testing::EtcdCluster::Start(3, {"127.0.1.201", "127.0.1.202", "127.0.1.203"});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  MultiHostJob job(*cluster_, shared_.path(), (*etcd)->StoreUrl(), 3);
  // The election after the leader's death stalls every write for 1-2 s (etcd's election timeout),
  // longer on a loaded machine: the agents' heartbeats and the coordinator's lease must outlast it.
  // With the 3 s host timeout of the other tests, the suite under load once saw the coordinator
  // lose its lease and its host declared dead. The failover is under test, not the host timeout.
  job.job_flags = {"--host-timeout", "10"};
  StartJob(job, 3, 1);
  absl::StatusOr<int> leader = (*etcd)->Leader(absl::Seconds(30));
  ASSERT_TRUE(leader.ok()) << leader.status();
  (*etcd)->Kill(*leader);  // the member every write goes through
  std::printf("etcd leader (member %d) killed mid-job: no recovery is needed\n", *leader);
  ExpectFinishedAsIfUninterrupted(job, {1, 2, 3, 4});
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("is dead")));
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("generation 1")));
}

// Fail-slow hosts (docs/GUIDE.md): four hosts train and a standby host waits; host 3's ranks run
// in a CPU cgroup capped at 2% of one CPU (tests/support/cpu_throttle.h; a rank here needs about
// 4%), so every step waits for them. Under --fail-slow evict-repeated the coordinator's detector
// names host 3 in a suspect_host event (an alert: nothing is evicted on one window), names it
// again after another continuity window and evicts it then: declared dead and fenced out like a
// partitioned host, its ranks taken by the standby host from peer memory, and the job trains on.
// No healthy host is ever named, and every confirmation left the hosts' metrics up to it.
TEST_F(MultiHost, AThrottledHostIsNamedThenEvictedOnItsSecondWindowAndNoHealthyHostEverIs) {
  absl::StatusOr<std::unique_ptr<testing::CpuThrottle>> throttle =
      testing::CpuThrottle::Create(absl::StrCat("trainguard-fail-slow-", getpid()), 0.02);
  ASSERT_TRUE(throttle.ok()) << throttle.status();
  throttle_ = *std::move(throttle);
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 4);
  job.job_flags = {"--fail-slow", "evict-repeated", "--fail-slow-continuity", "5",
                   "--fail-slow-trace", shared_.path() + "/fail-slow.trace"};
  // Snapshots every 25 steps, as bench_fail_slow_record's hosts take them: this job runs until
  // killed, so a shorter interval would shorten nothing and only change the hosts' load.
  job.snapshot_every = 25;
  const std::vector<std::string> trainer =
      testing::ExampleTrainerArgs(TRAINGUARD_TRAINER_PATH, 10'000'000);  // runs until killed
  std::vector<std::string> throttled = {
      "/bin/sh", "-c", absl::StrCat("echo $$ > ", throttle_->Procs(), " && exec \"$@\""), "sh"};
  throttled.insert(throttled.end(), trainer.begin(), trainer.end());
  job.StartHost(1, false, {}, trainer);
  ASSERT_TRUE(job.Await(1, "coordinating the job")) << job.AllOutput();
  for (int n = 2; n <= 4; ++n) job.StartHost(n, false, {}, n == 3 ? throttled : trainer);
  job.StartHost(5, true, {}, trainer);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(job.Await(1, "suspect host host3: ", absl::Seconds(80))) << job.AllOutput();
  std::printf("job start -> host3 named: %.1f s\n", absl::ToDoubleSeconds(absl::Now() - start));
  ASSERT_TRUE(job.Await(1, "recovered from the loss of host host3", absl::Seconds(60)))
      << job.AllOutput();
  const std::string coordinator = job.Output(1);
  EXPECT_THAT(coordinator, HasSubstr("action: alert (evict-repeated: "));
  EXPECT_THAT(coordinator, HasSubstr("action: evict\n"));
  EXPECT_THAT(coordinator, HasSubstr("host host3 is dead (fail-slow: "));
  EXPECT_EQ(job.Wait(3), 1) << job.AllOutput();  // fenced out, as a partitioned host
  EXPECT_THAT(job.Output(3), HasSubstr("was declared dead by the coordinator"));
  // The standby host's ranks train on (a standby prints no loss before it holds a rank).
  ASSERT_TRUE(job.Await(5, " loss ", absl::Seconds(30))) << job.AllOutput();
  for (int n : {1, 2, 4, 5}) (void)cluster_->KillHost(n);
  for (int n : {1, 2, 4, 5}) (void)cluster_->WaitHost(n, absl::Seconds(10));
  absl::StatusOr<EventLogContents> events =
      ReadEventLog(Env::Default(), shared_.path() + "/run/events/agent-host1.tgev");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->events.size(), 2u);
  for (const Event& e : events->events) {
    ASSERT_EQ(e.type, EventType::kSuspectHost) << e.message;
    EXPECT_EQ(e.Attribute("host"), "host3") << e.message;
    EXPECT_FALSE(e.Attribute("metric").empty());
    EXPECT_FALSE(e.Attribute("z").empty());
  }
  EXPECT_THAT(std::string(events->events.front().Attribute("action")),
              ::testing::StartsWith("alert"));
  EXPECT_EQ(events->events.back().Attribute("action"), "evict");
  EXPECT_THAT(job.AllOutput(), ::testing::Not(::testing::ContainsRegex("suspect host host[1245]")));
  // Every confirmation left the hosts' metrics up to it (sdk/health/fail_slow_dump.h), written before
  // it was said: one dump per confirmation, all of host3, each holding the training hosts' curves.
  const std::vector<std::string> dumps = ListFailSlowDumps(
      Env::Default(), FailSlowDumpDir(shared_.path() + "/run"));
  EXPECT_EQ(dumps.size(), events->events.size());
  for (const std::string& path : dumps) {
    EXPECT_THAT(path, ::testing::EndsWith("-host3.trace"));
    absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(path);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(*text);
    ASSERT_TRUE(dump.ok()) << dump.status();
    EXPECT_EQ(dump->header.host, "host3");
    for (const char* host : {"host1", "host2", "host3", "host4"}) {
      EXPECT_EQ(dump->hosts.count(host), 1u) << host << "\n" << *text;
    }
    ASSERT_FALSE(dump->hosts["host3"].empty());
    EXPECT_EQ(dump->hosts["host3"].back().second, dump->header.second);  // up to the detection
  }
}

// ---- --restart-all on several hosts: torchrun's elastic agent, bench_chaos_hosts' baseline ----

// The example trainer with steps of at least 10 ms: a snapshot every 10 steps, on disk every 40
// (CheckpointEnv), so a fault injected at step 100 lands midway between two persists.
std::vector<std::string> PacedTrainerArgs() {
  std::vector<std::string> args = TrainerArgs();
  args.insert(args.end(), {"--step-time-ms", "10"});
  return args;
}

// The pid file of rank `rank` on host n (a pid of that host's PID namespace), or -1.
int64_t RankPid(const std::string& shared, int n, int rank) {
  int64_t pid = -1;
  const std::string text = ReadFile(absl::StrCat(shared, "/run/pids/host", n, "/rank-", rank));
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid)) return -1;
  return pid;
}

// The time of the coordinator's first restart_all event (every agent's launcher file is read).
std::optional<absl::Time> FirstRestart(const std::string& shared) {
  std::optional<absl::Time> first;
  for (const auto& entry : std::filesystem::directory_iterator(shared + "/run/events")) {
    if (!absl::StartsWith(entry.path().filename().string(), "launcher-")) continue;
    absl::StatusOr<EventLogContents> contents = ReadEventLog(Env::Default(), entry.path());
    if (!contents.ok()) continue;
    for (const Event& e : contents->events) {
      if (KindOf(e) == EventKind::kRestartAll && (!first.has_value() || e.time < *first)) {
        first = e.time;
      }
    }
  }
  return first;
}

// Every rank's first restore after `after`: rank -> "<step> from <source>".
std::map<int, std::string> RestoresAfter(const std::string& shared, int world, absl::Time after) {
  std::map<int, std::string> restores;
  for (int rank = 0; rank < world; ++rank) {
    for (const Event& e : RankEvents(shared, rank)) {
      if (e.time > after && KindOf(e) == EventKind::kRestored) {
        restores[rank] = absl::StrCat(e.step, " from ", std::string(e.Attribute("source")));
        break;
      }
    }
  }
  return restores;
}

// Hosts 1 and 2 train under --restart-all 5 (host 1 coordinating), host 3 is a standby host;
// succeeds once the job reached step 100 (steps 40 and 80 are on disk by then, or about to be).
::testing::AssertionResult StartRestartAllJobWithAStandbyHost(MultiHostJob& job) {
  job.job_flags = {"--restart-all", "5", "--standby-nodes", "1"};
  for (int n = 1; n <= 3; ++n) {
    job.StartHost(n, n == 3, {}, PacedTrainerArgs());
    if (!job.Await(n, " joined as ") || (n == 1 && !job.Await(1, "coordinating the job"))) {
      return ::testing::AssertionFailure() << "host" << n << " did not join: " << job.AllOutput();
    }
  }
  if (!job.Await(0, "step 100 loss")) {
    return ::testing::AssertionFailure() << "no step 100: " << job.AllOutput();
  }
  return ::testing::AssertionSuccess();
}

// Two faults of a job of two training hosts and a standby host (torchrun's spare node: it holds no
// process) under --restart-all 5, host 1 coordinating:
// 1. One rank of host 1 is killed: the coordinator restarts every rank on both hosts (new
//    processes), and nothing of the old processes' memory serves them: every rank restores the
//    newest step persisted on disk before the restart, from the disk.
// 2. Then the coordinator's host is killed: another agent takes the lease over, declares the host
//    dead and goes on with the restart rounds; the standby host takes host 1's group rank 0 (and
//    the master address), every rank restores from the disk again, and the job finishes as if
//    uninterrupted.
TEST_F(MultiHost, WithRestartAllAKilledRankRestartsEveryRankFromDiskThenTheCoordinatorsHostIsReplaced) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 2);
  ASSERT_TRUE(StartRestartAllJobWithAStandbyHost(job));
  EXPECT_THAT(job.Output(3), HasSubstr("host host3 is a standby host: 0 standbys"));
  std::map<int, int64_t> old_pids;
  for (int rank = 0; rank < 4; ++rank) {
    old_pids[rank] = RankPid(shared_.path(), rank / 2 + 1, rank);
    ASSERT_GT(old_pids[rank], 1) << "rank " << rank << "\n" << job.AllOutput();
  }
  // Inside host 1 every process is the test's: its agent (trainguard) and its ranks (cpp_trainer);
  // -o: the older of the two ranks.
  ASSERT_TRUE(cluster_->RunInHost(1, {"/usr/bin/pkill", "-KILL", "-o", "-x", "cpp_trainer"},
                                  absl::Seconds(30))
                  .ok());
  ASSERT_TRUE(job.Await(1, "restarting every rank on every host (restart 1 of at most 5)"))
      << job.AllOutput();
  for (int n = 1; n <= 2; ++n) {
    ASSERT_TRUE(job.Await(n, "restart round 1: stopped ")) << job.AllOutput();
  }
  const std::optional<absl::Time> restart = FirstRestart(shared_.path());
  ASSERT_TRUE(restart.has_value()) << job.AllOutput();
  std::map<int, std::string> restores;
  for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
    restores = RestoresAfter(shared_.path(), 4, *restart);
    if (restores.size() == 4) break;
    absl::SleepFor(absl::Milliseconds(50));  // bounded polling of the event files
  }
  const int64_t persisted = NewestPersistedByEveryRank(shared_.path(), 4, *restart);
  ASSERT_GT(persisted, 0) << job.AllOutput();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(restores[rank], absl::StrCat(persisted, " from disk"))
        << "rank " << rank << "\n" << job.AllOutput();
    const int64_t pid = RankPid(shared_.path(), rank / 2 + 1, rank);
    EXPECT_GT(pid, 1) << job.AllOutput();
    EXPECT_NE(pid, old_pids[rank]) << "rank " << rank << " kept its process\n" << job.AllOutput();
  }
  // The restarted ranks run under the round's own job id.
  EXPECT_THAT(job.Output(2), HasSubstr(absl::StrCat("shared memory of job id ", job.job_id_,
                                                    " removed")));

  // Round 1 trains to step 120 before the second fault (80 steps before the job's end): bounded
  // polling of what host 2 printed after its agent stopped round 0's processes.
  bool trained_on = false;
  for (absl::Time end = absl::Now() + kDeadline; !trained_on && absl::Now() < end;) {
    const std::string out = job.Output(2);
    trained_on = out.find("rank 2 step 120 loss", out.find("restart round 1: stopped ")) !=
                 std::string::npos;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(trained_on) << job.AllOutput();
  const size_t host2_before = job.Output(2).size();
  ASSERT_TRUE(cluster_->KillHost(1).ok());
  // Host 2's or host 3's agent: whichever takes the lease first.
  ASSERT_TRUE(job.Await(0, "coordinating the job (lease term 2")) << job.AllOutput();
  ASSERT_TRUE(job.Await(0, "host host3 takes host host1's group rank 0")) << job.AllOutput();
  ASSERT_TRUE(job.Await(3, "host host3 is group 0 of 2: ranks 0..1 (restart round 2"))
      << job.AllOutput();
  ASSERT_TRUE(job.Await(3, "rank 0 restored step")) << job.AllOutput();
  ASSERT_TRUE(job.Await(3, "rank 1 restored step")) << job.AllOutput();
  EXPECT_THAT(job.Output(3), ::testing::ContainsRegex("rank 0 restored step [0-9]+ from disk"));
  EXPECT_THAT(job.Output(3), ::testing::ContainsRegex("rank 1 restored step [0-9]+ from disk"));
  ExpectFinishedAsIfUninterrupted(job, {2, 3}, 4, PacedTrainerArgs());
  EXPECT_THAT(job.Output(2).substr(host2_before),
              ::testing::ContainsRegex("rank 2 restored step [0-9]+ from disk"))
      << job.AllOutput();
}

// The megatron_like example (examples/megatron_like) on 4 hosts of 2 ranks and a standby host:
// tensor 2 x pipeline 2 x data 2, so each host holds one tensor-parallel group (a shard of one
// pipeline stage that no other rank holds). With --backup-evict host,tp,pp,dp each host's backups
// go to the one host that shares none of its groups, and the coordinator prints the proof.
// `trainer_flags`: the faults. 100 steps: the faults come after step 60, and its steps are longer
// than the example trainer's.
class MegatronOnHosts : public MultiHost {
 protected:
  static constexpr int kMegatronSteps = 100;

  std::vector<std::string> Command(const std::vector<std::string>& trainer_flags = {}) const {
    std::vector<std::string> command =
        testing::ExampleTrainerArgs(TRAINGUARD_MEGATRON_PATH, kMegatronSteps, kPrintEvery);
    command.insert(command.end(), trainer_flags.begin(), trainer_flags.end());
    return command;
  }

  void Start(MultiHostJob& job, const std::vector<std::string>& trainer_flags = {}) {
    job.extra_env = {"TRAINGUARD_TP=2", "TRAINGUARD_PP=2"};
    job.job_flags = {"--backup-evict", "host,tp,pp,dp"};
    StartJobInOrder(job, 4, 1, Command(trainer_flags));
    const std::string coordinator = job.Output(1);
    EXPECT_THAT(coordinator, HasSubstr("eviction classes honoured: host,tp,pp,dp")) << coordinator;
    EXPECT_THAT(coordinator, HasSubstr("host slot 1 (ranks 2-3) -> backups on 2")) << coordinator;
    EXPECT_THAT(coordinator, HasSubstr("host slot 2 (ranks 4-5) -> backups on 1")) << coordinator;
    EXPECT_THAT(coordinator, HasSubstr("proof (every eviction unit of the honoured classes)"))
        << coordinator;
    EXPECT_THAT(coordinator, ::testing::Not(HasSubstr("dropped"))) << coordinator;
  }
};

// Fault 3 of the issue: the host of ranks 2 and 3 (tensor-parallel group 1 of stage 0) dies. Both
// shards are restored by the standby host's ranks from the memory of host3, which shares none of
// their groups; the other ranks roll back to the same step from their arenas, every group is
// rebuilt, and the job ends as if uninterrupted.
TEST_F(MegatronOnHosts, AHostHoldingATensorParallelGroupIsRestoredFromBackupsOutsideItsGroups) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 4);
  Start(job);
  ASSERT_TRUE(job.Await(0, "the job is protected")) << job.AllOutput();
  ASSERT_TRUE(cluster_->KillHost(2).ok());
  ASSERT_TRUE(job.Await(0, "recovered from the loss of host host2")) << job.AllOutput();
  // Each rank's line reaches its host's log through that host's agent: awaited, not assumed there
  // with the coordinator's.
  for (int rank : {2, 3}) {
    ASSERT_TRUE(job.Await(0, absl::StrCat("rank ", rank, " restored step"))) << job.AllOutput();
  }
  const std::string all = job.AllOutput();
  for (int rank : {2, 3}) {
    EXPECT_THAT(all, ::testing::ContainsRegex(absl::StrCat(
                         "rank ", rank, " restored step [0-9]+ from peer host host3\n")))
        << all;
  }
  ExpectFinishedAsIfUninterrupted(job, {1, 3, 4, 5}, 8, Command());
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("from disk")));
}

// Fault 2: rank 5 (tensor-parallel group 2, stage 1) is killed at step 70. A standby of the standby
// host takes it and restores its shard from host2's memory (its data-parallel neighbour, rank 7,
// holds another shard of the optimizer and is never asked); its tensor-parallel group is rebuilt,
// the other ranks only roll back, and the job ends as if uninterrupted.
TEST_F(MegatronOnHosts, ATensorParallelRankKilledRestoresItsShardFromAPeerBackup) {
  MultiHostJob job(*cluster_, shared_.path(), ServeStore(), 4);
  Start(job, {"--kill-at", "5:70"});
  // The ranks restore at once, each printing through its host's agent: every line is awaited.
  for (int rank = 0; rank < 8; ++rank) {
    ASSERT_TRUE(job.Await(0, absl::StrCat("rank ", rank, " restored step"))) << job.AllOutput();
  }
  const std::string all = job.AllOutput();
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(all, m, std::regex("rank 5 restored step ([0-9]+) from peer host host2\n")))
      << all;
  for (int rank : {0, 1, 2, 3, 4, 6, 7}) {
    EXPECT_THAT(all, HasSubstr(absl::StrCat("rank ", rank, " restored step ", std::string(m[1]),
                                            " from arena")))
        << all;
  }
  ExpectFinishedAsIfUninterrupted(job, {1, 2, 3, 4, 5}, 8, Command());
  EXPECT_THAT(job.AllOutput(), ::testing::Not(HasSubstr("from disk")));
}

}  // namespace
}  // namespace trainguard
