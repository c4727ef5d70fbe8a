// `trainguard run` with the example trainer: real rank processes, real SIGKILLs, real replacement.
// Each test starts the launcher as a child process, watches its output, kills what the scenario
// says, and checks the outcome: the exit status, the launcher's report, bit-identical replicas, the
// events.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/etcd_process.h"
#include "tests/support/job_shm.h"
#include "tests/support/own_process.h"
#include "tests/support/process_stacks.h"
#include "tests/support/spawn.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kDeadline = absl::Seconds(120);

class LauncherJob {
 public:
  // `environment`: extra NAME=VALUE variables for the launcher (and so its ranks); `trainer`: the
  // rank command (the example trainer, or the megatron_like one: both take --steps, --print-every
  // and --comm-timeout-s).
  LauncherJob(const testing::TempDir& dir, const std::vector<std::string>& launcher_flags,
              int steps, const std::vector<std::pair<std::string, std::string>>& environment = {},
              const std::vector<std::string>& trainer_flags = {},
              const std::string& trainer = TRAINGUARD_TRAINER_PATH)
      : run_dir_(dir.File("run")),
        output_path_(dir.File("launcher.out")),
        job_id_(absl::StrCat("launcher-test-", getpid())) {
    std::vector<std::string> args = {TRAINGUARD_CLI_PATH, "run",  "--run-dir", run_dir_,
                                     "--job-id",          job_id_};
    args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
    for (const std::string& a :
         {std::string("--"), trainer, std::string("--steps"), absl::StrCat(steps),
          std::string("--print-every"), std::string("50"), std::string("--comm-timeout-s"),
          std::string("10")}) {
      args.push_back(a);
    }
    args.insert(args.end(), trainer_flags.begin(), trainer_flags.end());
    pid_ = testing::SpawnWithOutput(std::move(args), output_path_, environment);
    EXPECT_GT(pid_, 0) << "fork failed";
  }

  ~LauncherJob() {
    // Its children die with it (PR_SET_PDEATHSIG). Reaped only if the kill went out: a blocking
    // wait for a launcher that was not signalled would hang the test.
    if (pid_ > 0 && !exited_ && testing::SignalOwnProcess(pid_, SIGKILL).ok()) {
      waitpid(pid_, nullptr, 0);
    }
    // What its killed ranks left (their rings, their arenas).
    testing::RemoveJobSharedMemory(job_id_);
  }

  std::string Output() const {
    std::ifstream in(output_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Bounded polling of the launcher's output for `needle` (appearing `count` times). In vain, it
  // prints what every process of the job is doing (DescribeHang).
  bool AwaitOutput(const std::string& needle, int count = 1) const {
    for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
      const std::string out = Output();
      int seen = 0;
      for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1))
        ++seen;
      if (seen >= count) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    DescribeHang(absl::StrCat("no \"", needle, "\" in the launcher's output after ",
                              absl::FormatDuration(kDeadline)));
    return false;
  }

  // Prints, once per job, what each of its processes is doing: every rank's and standby's state
  // and threads' stacks (tests/support/process_stacks.h) and the last records of every rank's
  // flight-recorder ring (which collective it is in). For a wait that ran out: a rank left blocked
  // in an old generation's collective, in a store wait or in the rendezvous shows where.
  void DescribeHang(const std::string& why) const {
    if (std::exchange(described_, true)) return;
    std::string text = absl::StrCat("==== job ", job_id_, ": ", why, "\n",
                                    testing::DescribeOwnProcesses(RunDirEntry()));
    for (const std::string& name : PidFiles()) {
      int rank = -1;
      if (!absl::SimpleAtoi(absl::StripPrefix(name, "rank-"), &rank) || rank < 0) continue;
      absl::StrAppend(
          &text, "=== flight recorder of rank ", rank, "\n",
          testing::CommandOutput(absl::StrCat(TRAINGUARD_CLI_PATH, " flight-recorder show --job ",
                                              job_id_, " --rank ", rank, " --last 6 2>&1")));
    }
    std::printf("%s", text.c_str());
    std::fflush(stdout);
  }

  // The pid in the launcher's pid file of `rank` (-1 when there is none). Only ever signalled
  // through Signal(), which refuses -1 and any pid that is not this job's.
  pid_t RankPid(int rank) const {
    auto contents = Env::Default()->ReadFileToString(absl::StrCat(run_dir_, "/pids/rank-", rank));
    int pid = -1;
    if (!contents.ok() || !absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(*contents), &pid))
      return -1;
    return pid;
  }

  // The names of the files in the launcher's pid directory.
  std::set<std::string> PidFiles() const {
    std::set<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(run_dir_ + "/pids", ec)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

  // The pid the launcher printed for "started standby I (pid P" (-1 when it has not).
  pid_t StandbyPid(int index) const {
    std::smatch m;
    const std::string out = Output();
    std::regex re(absl::StrCat("started standby ", index, " \\(pid ([0-9]+)"));
    return std::regex_search(out, m, re) ? std::stoi(m[1]) : -1;
  }

  // Sends `sig` to `pid` if it is a process of this job: a descendant of the test, or a process
  // whose environment carries this job's run directory (a rank that outlived its launcher).
  absl::Status Signal(pid_t pid, int sig) const {
    return testing::SignalOwnProcess(pid, sig, RunDirEntry());
  }

  // Whether a process of this job still runs under `pid`.
  bool IsRunning(pid_t pid) const { return testing::OwnProcessIsRunning(pid, RunDirEntry()); }

  // The launcher's exit status, or -1 if it did not exit in time.
  int Wait(absl::Duration deadline = kDeadline) {
    for (absl::Time end = absl::Now() + deadline; absl::Now() < end;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    DescribeHang(absl::StrCat("the launcher did not exit in ", absl::FormatDuration(deadline)));
    return -1;
  }

  // Signals the launcher itself.
  absl::Status SignalLauncher(int sig) const { return testing::SignalOwnProcess(pid_, sig); }

  // rank -> params_checksum from the "final_loss" lines.
  std::map<int, std::string> FinalChecksums() const {
    std::map<int, std::string> sums;
    const std::string out = Output();
    std::regex re("rank ([0-9]+) final_loss [^ ]+ params_checksum ([0-9a-f]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      sums[std::stoi((*it)[1])] = (*it)[2];
    }
    return sums;
  }

  std::vector<Event> Events(int rank) const {
    auto contents = ReadEventLog(Env::Default(), EventLogPath(run_dir_, rank));
    return contents.ok() ? contents->events : std::vector<Event>{};
  }

 private:
  // The launcher gives every rank and standby TRAINGUARD_RUN_DIR=<run dir>.
  std::string RunDirEntry() const { return absl::StrCat("TRAINGUARD_RUN_DIR=", run_dir_); }

  const std::string run_dir_;
  const std::string output_path_;
  const std::string job_id_;
  pid_t pid_ = -1;
  bool exited_ = false;
  mutable bool described_ = false;  // DescribeHang printed
};

void ExpectIdenticalReplicas(const LauncherJob& job, int world) {
  std::map<int, std::string> sums = job.FinalChecksums();
  ASSERT_EQ(sums.size(), static_cast<size_t>(world)) << job.Output();
  std::set<std::string> distinct;
  for (const auto& [rank, sum] : sums) distinct.insert(sum);
  EXPECT_EQ(distinct.size(), 1u) << "replicas diverged:\n" << job.Output();
}

TEST(Launcher, AKilledRankIsReplacedByAStandbyAndTheReplicasEndIdentical) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1"}, 200);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  const pid_t killed = job.RankPid(2);
  ASSERT_EQ(job.Signal(killed, SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr(absl::StrCat("rank 2 (pid ", killed)));
  EXPECT_THAT(out, HasSubstr("killed by SIGKILL"));
  // The replacement's pid replaced the dead rank's in its pid file (written aside and renamed:
  // no temporary file is left behind).
  EXPECT_THAT(job.PidFiles(), ::testing::ElementsAre("rank-0", "rank-1", "rank-2", "rank-3"));
  EXPECT_GT(job.RankPid(2), 0);
  EXPECT_NE(job.RankPid(2), killed);
  EXPECT_THAT(out, HasSubstr("takes rank 2 in generation 1"));
  EXPECT_THAT(out, HasSubstr("recovered from the loss of rank 2 in"));
  EXPECT_THAT(out, HasSubstr("1 replacement(s)"));
  ExpectIdenticalReplicas(job, 4);

  // The replacement is in the events: rank 2's file records the standby's start in generation 1,
  // the survivors' files their re-rendezvous decision.
  bool replaced = false;
  for (const Event& e : job.Events(2)) {
    replaced |= e.type == EventType::kRuntimeStarted && e.Attribute("replaced_rank") == "2" &&
                e.generation == 1;
  }
  EXPECT_TRUE(replaced);
  bool decided = false;
  for (const Event& e : job.Events(0)) {
    decided |= e.type == EventType::kRecoveryDecision && e.Attribute("decision") == "re_rendezvous";
  }
  EXPECT_TRUE(decided);
}

// With checkpointing, the replacement takes the dead rank's state from its shared-memory arena and
// every survivor rolls back to the same committed step: nobody broadcasts, and because the
// example's data is a function of the step, the job ends bit-identical to an uninterrupted run.
TEST(Launcher, AReplacementRestoresTheDeadRanksArenaAndTheJobEndsAsIfUninterrupted) {
  const std::vector<std::pair<std::string, std::string>> checkpointing = {
      {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "25"}, {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "4"}};
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "4"}, 200, checkpointing);
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 4u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1"}, 200, checkpointing);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(2), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("rank 2 restored step ([0-9]+) from arena")))
      << out;
  const std::string step = m[1];
  EXPECT_GE(std::stoi(step), 100);
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("rank ", r, " restored step ", step, " from arena")));
  }
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
  // The replicas were compared at every snapshot, the replacement's included: no false verdict.
  EXPECT_THAT(out, Not(HasSubstr("silent corruption")));
  // Rank 2's event file records the restore by the replacement (generation 1).
  bool restored = false;
  for (const Event& e : job.Events(2)) {
    restored |=
        KindOf(e) == EventKind::kRestored && e.Attribute("source") == "arena" && e.generation == 1;
  }
  EXPECT_TRUE(restored);
}

// A rank's links drop (it closes every connection before step 50's allreduce): every process is
// alive, so no death starts a new generation. The ranks ask for one, the launcher renews the
// generation with the same members, and the job ends bit-identical to an uninterrupted run without
// any replacement (the job has no standby).
TEST(Launcher, ADroppedConnectionRenewsTheGenerationAndTheJobEndsAsIfUninterrupted) {
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "4"}, 200);
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 4u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4"}, 200, {}, {"--drop-connections", "1:50"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("rank 1 step 50 fault communication_failure action re_rendezvous"));
  EXPECT_THAT(out, HasSubstr("generation 1 renewed with the same ranks (asked by "));
  EXPECT_THAT(out, HasSubstr("0 replacement(s)"));
  EXPECT_THAT(out, Not(HasSubstr("killing it")));
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
  std::smatch took;
  ASSERT_TRUE(
      std::regex_search(out, took, std::regex("recovered with the same ranks in ([0-9.]+ s)")))
      << out;
  std::printf("a dropped connection: recovered with the same ranks in %s\n", took[1].str().c_str());
}

// Silent data corruption: rank 1 flips one bit of its parameters after step 35's update, in its
// own memory; nothing fails. The snapshot after it (every 10 steps) is compared across the
// data-parallel group: rank 1, its host and the buffer are named, the step is never committed,
// every rank goes back to the last snapshot the replicas agreed on (silent_corruption=repair, the
// default) and the job ends bit-identical to an uninterrupted run.
const std::vector<std::pair<std::string, std::string>> kEvery10 = {
    {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "10"}};

TEST(Launcher, AFlippedBitIsNamedAtTheNextSnapshotRepairedAndTheJobEndsAsIfUninterrupted) {
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "3"}, 160, kEvery10, {"--step-time-ms", "20"});
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 3u) << clean.Output();

  testing::TempDir dir;
  // 125 steps after the flip, 20 ms each: the verdict (a few tens of milliseconds after the
  // snapshot) comes long before the end.
  LauncherJob job(dir, {"--nproc", "3"}, 160, kEvery10,
                  {"--step-time-ms", "20", "--flip-bit", "1:35"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex("silent corruption: step ([0-9]+): data-parallel group tp0.cp0.pp0 \\(ranks "
                 "0,1,2\\): rank 1 \\(host [^)]+\\) buffer mlp.parameters: fingerprint")))
      << out;
  const int detected = std::stoi(m[1]);
  EXPECT_GE(detected, 40);
  EXPECT_EQ(detected % 10, 0);
  EXPECT_THAT(out, HasSubstr("generation 1 renewed with the same ranks"));
  EXPECT_THAT(out, HasSubstr("0 replacement(s)"));
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
  // The judge's event, and every rank restored a step before the flip.
  int events = 0;
  for (int r = 0; r < 3; ++r) {
    for (const Event& e : job.Events(r)) {
      if (KindOf(e) == EventKind::kSilentCorruption) {
        ++events;
        EXPECT_EQ(e.Attribute("corrupt_rank"), "1");
        EXPECT_EQ(e.Attribute("buffers"), "mlp.parameters");
        EXPECT_EQ(e.Attribute("action"), "repair");
        EXPECT_NE(e.Attribute("majority"), "");
      }
      if (KindOf(e) == EventKind::kRestored) {
        EXPECT_LE(e.step, 30) << "rank " << r << " restored a step after the flip";
      }
    }
  }
  EXPECT_GE(events, 1);
  std::printf("a bit flipped at step 35: named at the snapshot of step %d (%d steps later)\n",
              detected, detected - 35);
}

// The reduced-gradient check (Step::CheckReplicated right after the allreduce, every step): rank 1
// flips a bit of its reduced gradients at step 35, after the reduction, as a faulty reduction
// would leave them. The group's last rank to publish names rank 1 and the buffer in the same step;
// every rank rolls back and the job ends as an uninterrupted run with the check on, which raises
// no verdict.
TEST(Launcher, AReducedGradientThatDiffersIsNamedInItsStepAndRepaired) {
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "3"}, 120, kEvery10,
                    {"--step-time-ms", "20", "--check-reduced-grad", "1"});
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  EXPECT_THAT(clean.Output(), Not(HasSubstr("silent corruption")));
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 3u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(
      dir, {"--nproc", "3"}, 120, kEvery10,
      {"--step-time-ms", "20", "--check-reduced-grad", "1", "--corrupt-reduced-grad", "1:35"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("silent corruption: step 35: data-parallel group tp0.cp0.pp0 (ranks "
                             "0,1,2): rank 1 (host "));
  EXPECT_THAT(out, HasSubstr(") buffer mlp.reduced_gradients: fingerprint"));
  EXPECT_THAT(out, HasSubstr("generation 1 renewed with the same ranks"));
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
}

// Between snapshots too (silent_corruption_every_steps=5, a snapshot every 50 steps): the bit rank
// 1 flips after step 55 is found by the comparison after step 59, long before the snapshot of step
// 100; every rank goes back to the snapshot of step 50 and the job ends as an uninterrupted run
// with the same comparisons, which raises no verdict.
TEST(Launcher, BetweenSnapshotsAFlippedBitIsNamedAtTheNextComparisonAndRepaired) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "50"},
      {"TRAINGUARD_SILENT_CORRUPTION_EVERY_STEPS", "5"}};
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "3"}, 140, env, {"--step-time-ms", "20"});
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  EXPECT_THAT(clean.Output(), Not(HasSubstr("silent corruption")));
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 3u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "3"}, 140, env, {"--step-time-ms", "20", "--flip-bit", "1:55"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("silent corruption: step 59: data-parallel group tp0.cp0.pp0 (ranks "
                             "0,1,2): rank 1 (host "));
  EXPECT_THAT(out, HasSubstr(") buffer replicated buffers: fingerprint"));
  EXPECT_THAT(out, HasSubstr("generation 1 renewed with the same ranks"));
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
}

// With silent_corruption=alert the job is only told: it trains on, and no step after the flip is
// ever committed or written to disk (only the agreeing steps before it are there).
TEST(Launcher, WithAlertAFlippedBitIsNamedAndNoLaterSnapshotIsCommittedOrPersisted) {
  testing::TempDir dir;
  std::vector<std::pair<std::string, std::string>> env = kEvery10;
  env.emplace_back("TRAINGUARD_SILENT_CORRUPTION", "alert");
  LauncherJob job(dir, {"--nproc", "3"}, 100, env, {"--step-time-ms", "20", "--flip-bit", "1:35"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, ContainsRegex("silent corruption: step [0-9]+: data-parallel group "
                                 "tp0.cp0.pp0 \\(ranks 0,1,2\\): rank 1 "));
  EXPECT_THAT(out, Not(HasSubstr("renewed")));
  // Named again at later snapshots, its host is handed over for eviction: on one host there is
  // nowhere to evict it to, and under alert the job is never stopped for it.
  EXPECT_THAT(out, Not(HasSubstr("job stopped")));
  const std::map<int, std::string> sums = job.FinalChecksums();
  ASSERT_EQ(sums.size(), 3u) << out;
  EXPECT_EQ(sums.at(0), sums.at(2));
  EXPECT_NE(sums.at(0), sums.at(1));
  // No snapshot after the flip is committed, in memory or on disk, on any rank, and the judged
  // step was refused persistence (save_failed), the judge's at least. (A rank whose ballot was not
  // judged within 1 s persists its shard, as without the comparison; the step is never complete.)
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("silent corruption: step ([0-9]+): ")));
  const int64_t judged = std::stoi(m[1]);
  int refused = 0;
  for (int r = 0; r < 3; ++r) {
    for (const Event& e : job.Events(r)) {
      if (KindOf(e) == EventKind::kSaved && e.step > 35) {
        EXPECT_EQ(e.Attribute("committed"), "false") << "rank " << r << " step " << e.step;
        EXPECT_EQ(e.Attribute("durable_committed"), "false") << "rank " << r << " step " << e.step;
      }
      refused += KindOf(e) == EventKind::kSaveFailed && e.step == judged &&
                 absl::StrContains(e.message, "not committed, not persisted");
    }
  }
  EXPECT_GE(refused, 1) << "no rank refused to persist the judged step " << judged;
  const std::string listed = testing::CommandOutput(
      absl::StrCat(TRAINGUARD_CLI_PATH, " ckpt list ", dir.File("run"), "/checkpoints 2>&1"));
  EXPECT_THAT(listed, Not(HasSubstr(absl::StrCat("step ", judged, ": 3 shards")))) << listed;
}

// A machine that keeps corrupting: rank 1 flips the same bit in every generation, so the replay
// after the repair is corrupted again. The second verdict naming its host hands it to the
// coordinator for eviction; on one host there is no other host to evict it to, so the job stops
// with one message instead of rolling back forever.
TEST(Launcher, AHostNamedTwiceForSilentCorruptionStopsTheJob) {
  testing::TempDir dir;
  LauncherJob job(
      dir, {"--nproc", "3"}, 160, kEvery10,
      {"--step-time-ms", "20", "--flip-bit", "1:35", "--flip-bit-every-generation", "1"});
  EXPECT_EQ(job.Wait(), 1) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("generation 1 renewed with the same ranks"));
  // One host: there is no other host's standby to evict it to.
  // At least twice: the coordinator reads the request every 500 ms, and a third naming may come
  // first.
  EXPECT_THAT(out,
              ContainsRegex("job stopped: host [^ ]+ was named for silent data corruption "
                            "([2-9]|[1-9][0-9]+) times: a rollback does not cure it, and it "
                            "cannot be evicted "
                            "\\(alert \\(not evicted: 0 parked standby\\(s\\) elsewhere, [0-9]+ "
                            "needed\\)\\); replace the host"));
}

// Two replicas that disagree: no majority names either. The job goes back to the last step they
// agreed on and replays; the healthy rank is not singled out, and the job ends as if uninterrupted.
TEST(Launcher, TwoReplicasThatDisagreeAreUndecidableAndTheJobReplaysFromTheirLastAgreement) {
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "2"}, 140, kEvery10, {"--step-time-ms", "20"});
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  const std::map<int, std::string> expected = clean.FinalChecksums();
  ASSERT_EQ(expected.size(), 2u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "2"}, 140, kEvery10,
                  {"--step-time-ms", "20", "--flip-bit", "0:35"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, ContainsRegex("silent corruption: step [0-9]+: data-parallel group "
                                 "tp0.cp0.pp0: its 2 replicas disagree and no majority decides"));
  EXPECT_THAT(out, HasSubstr("buffer mlp.parameters differs between them"));
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
}

TEST(Launcher, TwoFailuresOneAfterTheOtherAreBothReplaced) {
  testing::TempDir dir;
  // 600 steps after the first kill: its recovery and the pool's refill take far fewer.
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1"}, 700);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(1), SIGKILL), absl::OkStatus());
  ASSERT_TRUE(job.AwaitOutput("recovered from the loss of rank 1")) << job.Output();
  ASSERT_TRUE(job.AwaitOutput("started standby 1")) << job.Output();  // the pool was refilled
  ASSERT_EQ(job.Signal(job.RankPid(3), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("takes rank 3 in generation 2"));
  EXPECT_THAT(job.Output(), HasSubstr("2 replacement(s)"));
  ExpectIdenticalReplicas(job, 4);
}

TEST(Launcher, ARankKilledDuringTheReRendezvousIsReplacedToo) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "2"}, 200);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  const pid_t second = job.RankPid(2);
  ASSERT_EQ(job.Signal(job.RankPid(1), SIGKILL), absl::OkStatus());
  // As soon as generation 1 is published, while the ranks meet in it, rank 2 dies too.
  ASSERT_TRUE(job.AwaitOutput("takes rank 1 in generation 1")) << job.Output();
  ASSERT_EQ(job.Signal(second, SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("takes rank 2 in generation 2"));
  ExpectIdenticalReplicas(job, 4);
}

TEST(Launcher, AStandbyKilledWhileParkedIsForgottenAndThePoolRefilled) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "2", "--standby", "1"}, 450);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.StandbyPid(0), SIGKILL), absl::OkStatus());
  ASSERT_TRUE(job.AwaitOutput("standby 0 (pid")) << job.Output();
  ASSERT_TRUE(job.AwaitOutput("started standby 1")) << job.Output();
  ASSERT_TRUE(job.AwaitOutput("step 300 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(0), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("while parked"));
  EXPECT_THAT(job.Output(), HasSubstr("standby 1 (pid"));
  EXPECT_THAT(job.Output(), HasSubstr("takes rank 0 in generation 1"));
  ExpectIdenticalReplicas(job, 2);
}

// Only the heartbeat may find the stopped rank here: with the watchdogs on, the survivors waiting
// for it in the allreduce would declare a hang, and the hang diagnosis could kill it first (a race
// with ~1.5 s of margin that a loaded machine loses); with the 10 s collective timeout, they would
// give up and have the generation renewed without it. Both are tested elsewhere.
TEST(Launcher, AStoppedRankIsDetectedByItsHeartbeatKilledAndReplaced) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "3", "--standby", "1", "--heartbeat-timeout", "3"}, 200,
                  {{"TRAINGUARD_WATCHDOG_POLL_MS", "0"}}, {"--comm-timeout-s", "600"});
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  const absl::Time stopped = absl::Now();
  // Hung: no exit for waitpid to see.
  ASSERT_EQ(job.Signal(job.RankPid(1), SIGSTOP), absl::OkStatus());
  ASSERT_TRUE(job.AwaitOutput("has not sent a heartbeat")) << job.Output();
  const absl::Duration detection = absl::Now() - stopped;
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("rank 1 (pid"));
  EXPECT_THAT(job.Output(), HasSubstr("takes rank 1 in generation 1"));
  ExpectIdenticalReplicas(job, 3);
  // Reported, not asserted (no timing thresholds in tests): the heartbeat timeout plus the
  // launcher's 0.5 s check period bound it.
  std::printf("hung rank detected after %s\n", absl::FormatDuration(detection).c_str());
}

// The hung rank stops itself before an allreduce: the launcher reads every rank's flight recorder
// (the stopped one's too) and names it as the rank the others are waiting for, then replaces it.
// Event attribute `key` parsed as an integer (false when absent or not a number).
bool IntAttribute(const Event& event, std::string_view key, int64_t* value) {
  const std::string_view text = event.Attribute(key);
  return absl::SimpleAtoi(absl::string_view(text.data(), text.size()), value);
}

// How long each survivor's guard of step `step` took to return its communication failure, against
// the learned bound of the hang its watchdog declared (or the largest declared by any rank, for a
// rank that was woken by another's abort first). Issue 5 asks for bound + 2 s at most.
void ExpectGuardsReturnedWithinTheBoundPlusTwoSeconds(const LauncherJob& job,
                                                      const std::vector<int>& survivors,
                                                      int64_t step) {
  std::map<int, int64_t> bound_ms;
  std::map<int, int64_t> returned_ms;
  int64_t largest_bound = 0;
  for (int r : survivors) {
    for (const Event& e : job.Events(r)) {
      int64_t value = 0;
      if (e.type == EventType::kHang && e.generation == 0 && e.Attribute("remote").empty() &&
          IntAttribute(e, "bound_ms", &value)) {
        bound_ms[r] = value;
        largest_bound = std::max(largest_bound, value);
      }
      if (e.type == EventType::kStepFault && e.step == step && e.generation == 0 &&
          e.Attribute("fault") == "communication_failure" &&
          IntAttribute(e, "duration_us", &value)) {
        returned_ms[r] = value / 1000;
      }
    }
  }
  ASSERT_GT(largest_bound, 0) << "no survivor declared the hang\n" << job.Output();
  for (int r : survivors) {
    ASSERT_TRUE(returned_ms.count(r)) << "rank " << r << " has no failed step " << step;
    const int64_t bound = bound_ms.count(r) ? bound_ms[r] : largest_bound;
    EXPECT_LE(returned_ms[r], bound + 2000) << "rank " << r << " (bound " << bound << " ms)";
    std::printf("rank %d: guard of step %lld returned after %lld ms (bound %lld ms)\n", r,
                static_cast<long long>(step), static_cast<long long>(returned_ms[r]),
                static_cast<long long>(bound));
  }
}

// The heartbeat timeout is set far away: with a short one, the liveness check killed the stopped
// rank before the survivors' watchdogs declared the hang (a clean clone's test run lost that race),
// and the path under test, the hang diagnosis, never ran.
//
// The stopped rank is replaced as soon as the hang is published, before the other survivor's dump
// is in; the diagnosis follows. Which survivors' rings show them still waiting depends on whether
// their dump came before the kill woke them: the declaring rank's always does (it dumps before it
// publishes), so the laggard is named either way.
TEST(Launcher, AHungRankIsNamedAsTheLaggardFromTheRanksFlightRecorders) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "3", "--standby", "1", "--heartbeat-timeout", "600"}, 200, {},
                  {"--stop-before-collective", "1:100"});
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  ExpectGuardsReturnedWithinTheBoundPlusTwoSeconds(job, {0, 2}, 100);
  const std::string output = job.Output();
  EXPECT_THAT(output, HasSubstr("hang diagnosis: rank(s) 1 stopped (SIGSTOP): replaced now"))
      << output;
  EXPECT_THAT(output, ContainsRegex("rank 1 \\(pid [0-9]+\\) is the hang's suspect: killing it"))
      << output;
  EXPECT_THAT(output, ContainsRegex("hang diagnosis: rank 1 never entered all_reduce #[0-9]+ "
                                    "\\(comm 1\\) that ranks? [02,]+ (is|are) waiting in"))
      << output;
  EXPECT_THAT(output, HasSubstr("hang diagnosis: suspects: rank 1\n")) << output;
  EXPECT_THAT(output, HasSubstr("hang diagnosis: rank(s) 1 replaced already (stopped); no one "
                                "else is"))
      << output;
  EXPECT_THAT(output, Not(HasSubstr("has not sent a heartbeat"))) << output;
  EXPECT_THAT(output, HasSubstr("takes rank 1 in generation 1")) << output;
  ExpectIdenticalReplicas(job, 3);
}

// Bounded polling of /proc/<pid>/stat until the process is stopped (state T).
bool AwaitStopped(pid_t pid) {
  for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T') {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// A hang overtaken by a death (what a chaos run met: a kill 1.7 s after a stop): rank 1 stops
// itself before step 100's allreduce, and rank 3 is SIGKILLed as soon as rank 1 is seen stopped.
// Rank 3's replacement renews the generation; ranks 0 and 2, still waiting in generation 0's
// allreduce, declare the hang when their bound runs out, but the store rejects their superseded
// generation's writes, so the hang is found from their dumps. The stopped rank, which still holds
// its rank and never joins the new generation, must be replaced all the same: with the heartbeat
// timeout out of reach, nothing else would, and the job would not end.
//
// Which path replaces it depends on when the kill lands: after ranks 0 and 2 wait in step 100's
// allreduce, the hang diagnosis names rank 1 as the suspect; before, they fail on the broken
// connection, the new generation waits for the stopped rank, and its host's agent reports it
// stopped: it is killed after --host-timeout (KillMembersStoppedInFormation). The test asserts
// the outcome either way.
TEST(Launcher, AHangsSuspectIsReplacedThoughAnotherRanksDeathRenewedTheGeneration) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "2", "--heartbeat-timeout", "600"}, 200, {},
                  {"--stop-before-collective", "1:100"});
  ASSERT_TRUE(job.AwaitOutput("step 50 loss")) << job.Output();
  const pid_t stopped = job.RankPid(1);
  ASSERT_GT(stopped, 0);
  ASSERT_TRUE(AwaitStopped(stopped)) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(3), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string output = job.Output();
  EXPECT_THAT(output, ContainsRegex("rank 1 \\(pid [0-9]+\\)(: killing it: rank 1 is stopped \\(its "
                                    "agent says\\)| is the hang's suspect: killing it)"))
      << output;
  EXPECT_THAT(output, Not(HasSubstr("has not sent a heartbeat"))) << output;
  EXPECT_THAT(output, ContainsRegex("takes rank 1 in generation [12]")) << output;
  EXPECT_THAT(output, ContainsRegex("takes rank 3 in generation [12]")) << output;
  ExpectIdenticalReplicas(job, 4);
}

// The path of the test above that a kill landing early takes, made certain: rank 1 is stopped
// from outside (no watchdog and a 600 s heartbeat timeout, so neither a hang nor a heartbeat can
// find it), then rank 3 is killed. Rank 3's replacement forms generation 1, which waits for rank
// 1; its host's agent reports it stopped, and after --host-timeout (1 s) the launcher kills it and
// a second standby takes it in generation 2. Ranks 0 and 2 wait for rank 1 in generation 0's
// allreduce until its death closes its connections; but a receive gloo is in the middle of (a
// message of rank 1's only partly read) is not failed by the closing (docs/GUIDE.md, section 8,
// the step that outlives its generation): it waits for its own timeout, and generation 2's
// agreement for that rank. The test hung once, most likely so, with a 600 s collective timeout.
// Such a rank now exits superseded_step_exit_ms (10 s) after its generation was superseded,
// watchdog or not; the collective timeout, 30 s, is far beyond the stopped rank's path (a second
// or two, loaded) and within the test's bound; a wait of the test that runs out prints every
// process's stacks.
TEST(Launcher, ARankStoppedWhileANewGenerationFormsIsKilledAfterTheHostTimeoutAndReplaced) {
  testing::TempDir dir;
  LauncherJob job(
      dir, {"--nproc", "4", "--standby", "2", "--heartbeat-timeout", "600", "--host-timeout", "1"},
      200, {{"TRAINGUARD_WATCHDOG_POLL_MS", "0"}}, {"--comm-timeout-s", "30"});
  ASSERT_TRUE(job.AwaitOutput("step 50 loss")) << job.Output();
  const pid_t stopped = job.RankPid(1);
  ASSERT_GT(stopped, 0);
  ASSERT_EQ(job.Signal(stopped, SIGSTOP), absl::OkStatus());
  ASSERT_TRUE(AwaitStopped(stopped)) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(3), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string output = job.Output();
  EXPECT_THAT(output, ContainsRegex(absl::StrCat(
                          "rank 1 \\(pid ", stopped,
                          "\\): killing it: rank 1 is stopped \\(its agent says\\) for "
                          "[0-9.]+m?s while generation 1 waits for it")))
      << output;
  EXPECT_THAT(output, Not(HasSubstr("has not sent a heartbeat"))) << output;
  EXPECT_THAT(output, HasSubstr("takes rank 3 in generation 1")) << output;
  EXPECT_THAT(output, HasSubstr("takes rank 1 in generation 2")) << output;
  EXPECT_THAT(output, Not(HasSubstr("in generation 3"))) << "replaced once\n" << output;
  ExpectIdenticalReplicas(job, 4);
}

// Rank 2 enters step 100's allreduce and then sleeps inside it: every rank entered the same
// collective, so the rings alone cannot tell it from the ranks waiting for it. Its training
// thread's stack, dumped by every rank on the hang, is the odd one out; the launcher names it,
// replaces it, and the job ends as if nothing happened.
TEST(Launcher, ARankStalledInsideACollectiveIsNamedFromTheRanksStacksAndReplaced) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1"}, 200, {},
                  {"--sleep-in-collective", "2:100:120"});
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string output = job.Output();
  EXPECT_THAT(output, HasSubstr("hang diagnosis: suspects: rank 2\n")) << output;
  EXPECT_THAT(output, HasSubstr("hang diagnosis: ranks 0,1,3 wait together in:")) << output;
  EXPECT_THAT(output, ContainsRegex("hang diagnosis: rank 2's training thread is elsewhere: "
                                    "[^\n]*SleepFor"))
      << output;
  EXPECT_THAT(output, Not(HasSubstr("laggard:"))) << "every rank entered the collective\n" << output;
  EXPECT_THAT(output, HasSubstr("is the hang's suspect: killing it")) << output;
  EXPECT_THAT(output, HasSubstr("takes rank 2 in generation 1")) << output;
  ExpectIdenticalReplicas(job, 4);
  for (absl::string_view line : absl::StrSplit(output, '\n')) {  // the evidence, for the log
    if (absl::StrContains(line, "hang") || absl::StrContains(line, "takes rank")) {
      std::printf("%s\n", std::string(line).c_str());
    }
  }
}

// A stall that ends by itself, as when the whole machine is starved for a moment: rank 2 sleeps
// 2.5 s inside step 100's allreduce, past the allreduce's bound (the 1 s floor), so every rank
// declares a hang; the sleep then ends and the allreduce completes within the declaring ranks'
// wait (hang_dump_wait_ms, 5 s here). The hang is withdrawn: nothing is aborted, the launcher,
// which saw every rank running, replaces no one, and generation 0 goes on. A real hang later in
// the same generation (rank 1 stops itself before step 250's allreduce) is still declared, dumped
// again and diagnosed: rank 1 is replaced in generation 1.
TEST(Launcher, AStallThatEndsWithinTheHangWaitIsWithdrawnAndALaterHangIsStillDiagnosed) {
  testing::TempDir dir;
  LauncherJob job(
      dir, {"--nproc", "4", "--standby", "1"}, 400,
      {{"TRAINGUARD_WATCHDOG_FLOOR_MS", "1000"}, {"TRAINGUARD_HANG_DUMP_WAIT_MS", "5000"}},
      {"--sleep-in-collective", "2:100:2.5", "--stop-before-collective", "1:250"});
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string output = job.Output();
  EXPECT_THAT(output, ContainsRegex("hang in generation 0 withdrawn: rank [0-3]: its wait ended "
                                    "[^\n]* after the hang; no one replaced"))
      << output;
  EXPECT_THAT(output, Not(ContainsRegex("rank [023] \\(pid [0-9]+\\) is the hang's suspect")))
      << output;
  EXPECT_THAT(output, ContainsRegex("rank 1 \\(pid [0-9]+\\) is the hang's suspect: killing it"))
      << output;
  EXPECT_THAT(output, HasSubstr("takes rank 1 in generation 1")) << output;
  EXPECT_THAT(output, Not(HasSubstr("in generation 2"))) << output;
  ExpectIdenticalReplicas(job, 4);
  // No step failed before the stop: the hangs declared at step 100 were withdrawn.
  int withdrawn = 0;
  for (int rank = 0; rank < 4; ++rank) {
    for (const Event& e : job.Events(rank)) {
      if (e.type == EventType::kStepFault) {
        EXPECT_GE(e.step, 250) << "rank " << rank << ": " << e.message;
      }
      if (KindOf(e) == EventKind::kHangWithdrawn && e.step == 100) ++withdrawn;
    }
  }
  EXPECT_GE(withdrawn, 1);
  for (absl::string_view line : absl::StrSplit(output, '\n')) {  // the evidence, for the log
    if (absl::StrContains(line, "hang") || absl::StrContains(line, "takes rank")) {
      std::printf("%s\n", std::string(line).c_str());
    }
  }
}

// The watchdog settings of the RL-shaped tests: tight on purpose (bounds 1.5 x the longest recent
// sample) so that the generation's heavy tail outruns the learned duration bound and the fast
// ranks' waits outrun the allreduce's bound; peers publish progress every 100 ms.
//
// The time scale is chosen for a machine whose cores are all busy. With generations of median 4 ms
// and a 50 ms floor, the learned bounds of a step and of its allreduce were ~90 ms and ~70 ms, and
// a 4-rank allreduce that every rank had entered, waiting for the scheduler at each hop, sat 110 ms
// without progress under `stress -c 2`: a real hang by the watchdog's rule, and a failed test. With
// generations of median 15 ms (bounds of ~350 ms) and a 250 ms floor (the tick-gap bound of the
// 1 ms ticks), such a wait stays well inside every bound; the heavy tail still outruns the learned
// duration bound now and then, which is the scenario.
const std::vector<std::pair<std::string, std::string>> kRlWatchdog = {
    {"TRAINGUARD_WATCHDOG_FLOOR_MS", "250"},
    {"TRAINGUARD_WATCHDOG_BOUND_FACTOR_PCT", "150"},
    {"TRAINGUARD_WATCHDOG_PEER_PROGRESS_MS", "100"}};
// --generate MEDIAN_MS:P99_OVER_MEDIAN of the RL-shaped tests.
constexpr char kRlGeneration[] = "15:10";

struct GenerateSummary {
  int64_t phases = 0;
  int64_t over_duration_bound = 0;
  int64_t hangs_declared = 0;
  int64_t hangs_postponed = 0;
  int64_t longest_ms = 0;
};

// rank -> the trainer's "generate phases ..." line.
std::map<int, GenerateSummary> GenerateSummaries(const std::string& output) {
  std::map<int, GenerateSummary> summaries;
  std::regex re(
      "rank ([0-9]+) generate phases ([0-9]+) tokens [0-9]+ longest_ms ([0-9]+) "
      "over_duration_bound ([0-9]+) hangs_declared ([0-9]+) hangs_postponed ([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    GenerateSummary& s = summaries[std::stoi((*it)[1])];
    s.phases = std::stoll((*it)[2]);
    s.longest_ms = std::stoll((*it)[3]);
    s.over_duration_bound = std::stoll((*it)[4]);
    s.hangs_declared = std::stoll((*it)[5]);
    s.hangs_postponed = std::stoll((*it)[6]);
  }
  return summaries;
}

// (d) An RL-shaped job: every step, each rank generates for a lognormal time (median 15 ms,
// p99/median 10), ticking once per token, then the ranks average their gradients, the fast ones
// waiting in the allreduce for the slowest; and at step 50 rank 1 generates for 3 s, far beyond
// any bound learned from the others (--long-generation). Over 100 steps no rank may be declared
// hung for a generating peer: the long generations keep ticking, and the waits are excused by the
// peers' progress records. The watchdog is tight on purpose (floor 250 ms), so on a machine starved
// of CPU (a CI run with both cores busy) every rank can sit in an allreduce they all entered for a
// second with nothing moving: that is a hang by the watchdog's rule, not a false alarm about a
// slow peer, and the job renews its generation and goes on. What must never happen is the
// generating rank being named: no diagnosis may find a suspect, nobody is killed or replaced.
TEST(Launcher, AnRlJobWhoseHeavyTailedGenerationKeepsTickingRaisesNoHangIn100Steps) {
  constexpr int kSteps = 100;
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4"}, kSteps, kRlWatchdog,
                  {"--generate", kRlGeneration, "--long-generation", "1:50:3"});
  ASSERT_EQ(job.Wait(absl::Minutes(5)), 0) << job.Output();
  const std::string output = job.Output();
  // Every hang the launcher diagnosed found every rank inside the collective: no laggard.
  const std::regex diagnosis("hang diagnosis: suspects: ([^\n]*)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), diagnosis);
       it != std::sregex_iterator(); ++it) {
    EXPECT_EQ((*it)[1], "none found") << output;
  }
  EXPECT_THAT(output, Not(HasSubstr("killing it"))) << output;
  EXPECT_THAT(output, HasSubstr("succeeded: 4 ranks finished, 0 replacement(s)")) << output;
  const std::map<int, GenerateSummary> summaries = GenerateSummaries(output);
  ASSERT_EQ(summaries.size(), 4u) << output;
  GenerateSummary total;
  for (const auto& [rank, s] : summaries) {
    // A renewed generation replays the step it failed in.
    EXPECT_GE(s.phases, kSteps) << "rank " << rank;
    total.hangs_declared += s.hangs_declared;
    total.over_duration_bound += s.over_duration_bound;
    total.hangs_postponed += s.hangs_postponed;
    total.longest_ms = std::max(total.longest_ms, s.longest_ms);
  }
  // The scenario really arose: rank 1's 3 s generation outran its learned duration bound while
  // ticking, and the others' waits in step 50's allreduce outran theirs and were postponed.
  EXPECT_GE(summaries.at(1).over_duration_bound, 1) << output;
  EXPECT_GE(summaries.at(1).longest_ms, 3000) << output;
  EXPECT_GT(total.hangs_postponed, 0) << output;
  ExpectIdenticalReplicas(job, 4);
  std::printf(
      "%d generate phases (longest %lld ms): %lld outran their learned duration bound while "
      "ticking, %lld waits in the allreduce were postponed for a generating peer, %lld hangs "
      "(every rank inside the collective: CPU starvation, none naming a rank)\n",
      4 * kSteps, static_cast<long long>(total.longest_ms),
      static_cast<long long>(total.over_duration_bound),
      static_cast<long long>(total.hangs_postponed), static_cast<long long>(total.hangs_declared));
}

// (e) The same job, but rank 2's decoding stops ticking halfway through step 80's generation: its
// own watchdog declares the "generate" phase hung, every rank dumps, the launcher names rank 2 (it
// never entered the allreduce the others wait in) and replaces it, and the job finishes.
TEST(Launcher, AGenerationThatStopsTickingIsDetectedNamedAndReplaced) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1"}, 150, kRlWatchdog,
                  {"--generate", kRlGeneration, "--stall-generation", "2:80:120"});
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string output = job.Output();
  EXPECT_THAT(output, HasSubstr("rank 2 stalling generation at step 80")) << output;
  // Which of the others still wait when they dump is theirs to race: each one's own watchdog may
  // already have aborted its wait (under ThreadSanitizer rank 3 had). Rank 2 is the one named.
  EXPECT_THAT(output, ContainsRegex("hang diagnosis: rank 2 never entered all_reduce #80 "
                                    "\\(comm 1\\) that ranks? [013,]+ (is|are) waiting in"))
      << output;
  EXPECT_THAT(output, HasSubstr("takes rank 2 in generation 1")) << output;
  ExpectIdenticalReplicas(job, 4);
  // Rank 2's own watchdog caught it: the phase, not a peer's timeout. The stalled process's hang
  // is the one of generation 0 at the stalled step in rank 2's event file; its replacement
  // (generation 1) appends to the same file, and what its watchdog sees later is not this test's
  // outcome. Nor is a hang of an earlier step: starved of CPU, all four ranks can sit in an
  // allreduce they all entered past its tight bound (the RL test above), and that hang is
  // withdrawn or renewed.
  std::optional<Event> hang;
  for (const Event& e : job.Events(2)) {
    if (e.type != EventType::kHang || !e.Attribute("remote").empty()) continue;
    if (e.generation == 0 && e.step == 80 && !hang.has_value()) {
      hang = e;
    } else {
      std::printf("rank 2 also declared: generation %lld: %s\n",
                  static_cast<long long>(e.generation), e.message.c_str());
    }
  }
  ASSERT_TRUE(hang.has_value()) << output;
  EXPECT_EQ(hang->Attribute("cause"), "phase");
  EXPECT_EQ(hang->Attribute("phase"), "step/generate");
  std::smatch silence;
  ASSERT_TRUE(std::regex_search(hang->message, silence, std::regex("no progress for ([^ ]+) ")))
      << hang->message;
  std::printf("stalled generation detected after %s without a tick: %s\n", silence[1].str().c_str(),
              hang->message.c_str());
}

// Whether a step of the checkpoint directory `dir` holds a committed shard of each of `ranks`
// ranks (its manifests: docs/FORMATS.md), polled until `timeout`.
bool AwaitStepCommittedOnDisk(const std::string& dir, int ranks, absl::Duration timeout) {
  for (const absl::Time end = absl::Now() + timeout; absl::Now() < end;) {
    std::error_code ec;
    for (const auto& step : std::filesystem::directory_iterator(dir, ec)) {
      if (!absl::StartsWith(step.path().filename().string(), "step-")) continue;
      int committed = 0;
      for (int r = 0; r < ranks; ++r) {
        char manifest[32];
        std::snprintf(manifest, sizeof(manifest), "rank-%05d.manifest", r);
        if (std::filesystem::exists(step.path() / manifest, ec)) ++committed;
      }
      if (committed == ranks) return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// --restart-all, the torchrun-style baseline of `trainguard chaos`: a killed rank stops every rank,
// and all of them start again from the newest checkpoint on disk (their shared memory is removed),
// so the survivors lose their processes too; the job still ends bit-identical to an uninterrupted
// run, and the launcher's events record the death and the restart.
TEST(Launcher, UnderRestartAllAKilledRankRestartsEveryRankFromTheCheckpointOnDisk) {
  const std::vector<std::pair<std::string, std::string>> checkpointing = {
      {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "25"}, {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "1"}};
  testing::TempDir clean_dir;
  LauncherJob clean(clean_dir, {"--nproc", "3"}, 300, checkpointing);
  ASSERT_EQ(clean.Wait(), 0) << clean.Output();
  const std::map<int, std::string> uninterrupted = clean.FinalChecksums();
  ASSERT_EQ(uninterrupted.size(), 3u) << clean.Output();

  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "3", "--restart-all", "1"}, 300, checkpointing);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  // Persisting is asynchronous: on a loaded machine the disk can lag the training by more than
  // 100 steps. The kill waits for a step committed on disk by every rank, which the restart must
  // then find.
  ASSERT_TRUE(AwaitStepCommittedOnDisk(dir.File("run") + "/checkpoints", 3, absl::Seconds(60)))
      << job.Output();
  const pid_t survivor = job.RankPid(0);
  const pid_t killed = job.RankPid(1);
  ASSERT_EQ(job.Signal(killed, SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, ContainsRegex("restarting every rank \\(restart 1 of at most 1\\): rank 1 "
                                 "killed by SIGKILL"));
  EXPECT_THAT(out, ContainsRegex("rank 0 restored step [0-9]+ from disk")) << out;
  EXPECT_NE(job.RankPid(0), survivor) << "the survivor was restarted too";
  EXPECT_EQ(job.FinalChecksums(), uninterrupted) << out;

  absl::StatusOr<EventLogContents> launcher =
      ReadEventLog(Env::Default(), dir.File("run") + "/events/launcher.tgev");
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  std::vector<EventKind> kinds;
  for (const Event& e : launcher->events) {
    if (std::optional<EventKind> kind = KindOf(e); kind.has_value()) kinds.push_back(*kind);
  }
  EXPECT_THAT(kinds, ::testing::IsSupersetOf(
                         {EventKind::kRankDied, EventKind::kRestartAll, EventKind::kRecovered}));
}

TEST(Launcher, WithoutAStandbyALostRankFailsTheJobWithStatus1) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "2"}, 100000);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(1), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 1) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("job failed: rank 1 died and the job has no standbys"));
}

TEST(Launcher, AKilledRankIsReplacedWithTheEtcdBackendToo) {
  auto etcd = testing::EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::string address = (*etcd)->endpoint();
  address.erase(0, std::string("http://").size());
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "4", "--standby", "1", "--store", "etcd://" + address}, 200);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_EQ(job.Signal(job.RankPid(2), SIGKILL), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("store etcd://"));
  EXPECT_THAT(job.Output(), HasSubstr("takes rank 2 in generation 1"));
  EXPECT_THAT(job.Output(), HasSubstr("recovered from the loss of rank 2 in"));
  ExpectIdenticalReplicas(job, 4);
}

TEST(Launcher, SigtermStopsEveryRankAndStandbyAndExitsWith143) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "2", "--standby", "1"}, 100000);
  ASSERT_TRUE(job.AwaitOutput("step 100 loss")) << job.Output();
  ASSERT_TRUE(job.AwaitOutput("started standby 0")) << job.Output();
  const pid_t rank0 = job.RankPid(0);
  const pid_t standby = job.StandbyPid(0);
  ASSERT_TRUE(job.IsRunning(rank0)) << "rank 0's pid file names pid " << rank0;
  ASSERT_TRUE(job.IsRunning(standby)) << "standby 0: pid " << standby << "\n" << job.Output();
  ASSERT_EQ(job.SignalLauncher(SIGTERM), absl::OkStatus());
  EXPECT_EQ(job.Wait(), 128 + SIGTERM) << job.Output();
  EXPECT_THAT(job.Output(), HasSubstr("interrupted by SIGTERM"));
  // The launcher reaped them: they no longer exist.
  EXPECT_FALSE(job.IsRunning(rank0));
  EXPECT_FALSE(job.IsRunning(standby));
}

TEST(Launcher, BadUsageExitsWithStatus2) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "zero"}, 10);
  EXPECT_EQ(job.Wait(), 2);
  EXPECT_THAT(job.Output(), HasSubstr("--nproc 'zero'"));
}

// The megatron_like example (examples/megatron_like): 8 ranks as tensor 2 x pipeline 2 x data 2
// (ranks 0-3 are stage 0, 4-7 stage 1; tensor groups {0,1} {2,3} {4,5} {6,7}, data-parallel
// groups {0,2} {1,3} {4,6} {5,7}, pipeline links 0-4 1-5 2-6 3-7), each group its own gloo
// communicator, a snapshot every 5 steps. Each rank's state is its shard: a restore, never a
// broadcast, brings a replacement up to date.
const std::vector<std::pair<std::string, std::string>>& MegatronEnv() {
  static const auto* env = new std::vector<std::pair<std::string, std::string>>{
      {"TRAINGUARD_TP", "2"},
      {"TRAINGUARD_PP", "2"},
      {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "5"},
      {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "4"}};
  return *env;
}
constexpr int kMegatronSteps = 40;

// rank -> params_checksum of the same job without faults.
std::map<int, std::string> MegatronUninterrupted() {
  testing::TempDir dir;
  LauncherJob clean(dir, {"--nproc", "8"}, kMegatronSteps, MegatronEnv(), {"--print-every", "10"},
                    TRAINGUARD_MEGATRON_PATH);
  EXPECT_EQ(clean.Wait(), 0) << clean.Output();
  return clean.FinalChecksums();
}

// Fault 1 of the issue: rank 1 (stage 0) stops itself inside its send of activations to rank 5.
// Three kinds of communicator then hold waiting ranks: rank 5 in the pipeline link's receive, rank
// 0 in their tensor-parallel allreduce, rank 3 in their data-parallel reduce-scatter; and behind
// them rank 4 waits for rank 5 (in tp2), ranks 2, 6 and 7 for ranks 0, 4 and 5 (in their dp
// groups): laggards of their own groups, though only waiting. The diagnosis follows the waits from
// group to group and names rank 1 alone; it is replaced, every rank restores the last snapshot,
// and the job ends as if uninterrupted.
TEST(MegatronLike, AStageStoppedInASendIsNamedFromEveryKindOfCommunicatorReplacedAndTheJobGoesOn) {
  const std::map<int, std::string> expected = MegatronUninterrupted();
  ASSERT_EQ(expected.size(), 8u);
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "8", "--standby", "1", "--heartbeat-timeout", "600"},
                  kMegatronSteps, MegatronEnv(), {"--print-every", "10", "--stop-in-send", "1:22"},
                  TRAINGUARD_MEGATRON_PATH);
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("rank 1 stopping in a send at step 22")) << out;
  EXPECT_THAT(out, HasSubstr("hang diagnosis: rank(s) 1 stopped (SIGSTOP): replaced now")) << out;
  EXPECT_THAT(out, HasSubstr("hang diagnosis: suspects: rank 1\n")) << out;
  for (const char* via : {"all_reduce #[0-9]+ \\(comm [0-9]+ \"tp0\"\\)",
                          "reduce_scatter #[0-9]+ \\(comm [0-9]+ \"dp1\"\\)",
                          "recv #[0-9]+ \\(comm [0-9]+ \"pp1.link0\"\\)"}) {
    EXPECT_THAT(out, ContainsRegex(
                         absl::StrCat("hang diagnosis: rank 1 is where the waits end:[^\n]*", via)))
        << out;
  }
  EXPECT_THAT(out, Not(ContainsRegex("rank [02-7] is where the waits end"))) << out;
  EXPECT_THAT(out, HasSubstr("takes rank 1 in generation 1")) << out;
  ExpectGuardsReturnedWithinTheBoundPlusTwoSeconds(job, {0, 2, 3, 4, 5, 6, 7}, 22);
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
}

// Fault 5: rank 6 of the distributed optimizer dies between step 22's reduce-scatter and its
// all-gather. Its data-parallel peer, rank 4, has applied its shard of the update and fails in the
// all-gather; the other groups finished the step. Nothing of step 22 survives: every rank restores
// the same snapshot, the replacement included, and the job ends as if uninterrupted.
TEST(MegatronLike, ARankKilledBetweenTheReduceScatterAndTheAllGatherRollsEveryRankBack) {
  const std::map<int, std::string> expected = MegatronUninterrupted();
  ASSERT_EQ(expected.size(), 8u);
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "8", "--standby", "1"}, kMegatronSteps, MegatronEnv(),
                  {"--print-every", "10", "--kill-between", "6:22"}, TRAINGUARD_MEGATRON_PATH);
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, ContainsRegex("rank 6 \\(pid [0-9]+, member [^)]*\\) killed by SIGKILL")) << out;
  EXPECT_THAT(out, ContainsRegex("rank 4 step 22 fault communication_failure action re_rendezvous: "
                                 "[^\n]*dp2 all_gather"))
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("rank 6 restored step ([0-9]+) from arena")))
      << out;
  EXPECT_LE(std::stoi(m[1]), 22);
  for (int r = 0; r < 8; ++r) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("rank ", r, " restored step ", std::string(m[1]),
                                            " from arena")))
        << out;
  }
  EXPECT_EQ(job.FinalChecksums(), expected) << out;
}

// Fault 4: a NaN born in rank 5's activations (stage 1, its first block, before the
// tensor-parallel allreduce) at step 13 reaches its tensor-parallel peer, the other stage (through
// the gradients) and, through the flag in the reduce-scatter, every data-parallel replica. Only
// rank 5 is named, with the buffer where it was born; every rank of every group skips step 13, and
// the replicas stay identical (the last stage's four ranks end with the same loss). The job asks
// for a placement of peer backups that one host cannot give, and is told so.
TEST(MegatronLike, ANanBornInOneStageIsNamedWhereItWasBornAndTheStepSkippedOnEveryRank) {
  testing::TempDir dir;
  LauncherJob job(dir, {"--nproc", "8", "--backup-evict", "host,tp,pp,dp"}, 30, MegatronEnv(),
                  {"--print-every", "10", "--nan-activation", "5:13"}, TRAINGUARD_MEGATRON_PATH);
  EXPECT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_THAT(out, HasSubstr("rank 5 step 13 fault step_failure action skip: ABORTED: rank 5 step "
                             "13: step_failure: non-finite values in buffer "
                             "\"stage1.block0.partial\" on rank 5"))
      << out;
  int named = 0;
  for (size_t at = out.find("non-finite values in buffer"); at != std::string::npos;
       at = out.find("non-finite values in buffer", at + 1)) {
    ++named;
  }
  EXPECT_EQ(named, 1) << out;
  for (int r = 0; r < 8; ++r) {
    if (r != 5) {
      EXPECT_THAT(out, ContainsRegex(absl::StrCat("rank ", r,
                                                  " step 13 fault step_failure action "
                                                  "skip: [^\n]*born on another rank")))
          << out;
    }
    EXPECT_THAT(out, HasSubstr(absl::StrCat("rank ", r, " recover step 13 next 14"))) << out;
  }
  std::set<std::string> last_stage_losses;
  std::regex re("rank [4-7] final_loss ([^ ]+) ");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    last_stage_losses.insert((*it)[1]);
  }
  EXPECT_EQ(last_stage_losses.size(), 1u) << out;
  EXPECT_THAT(out, Not(HasSubstr("silent corruption"))) << out;
  EXPECT_THAT(out, HasSubstr("backup placement: one host, so no peer backups (--backup-evict "
                             "host,tp,pp,dp places them on other hosts)"))
      << out;
}

}  // namespace
}  // namespace trainguard
