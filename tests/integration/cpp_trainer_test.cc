// The example trainer (examples/cpp_trainer) run as a real multi-process job: each test spawns its
// rank processes with trainguard's TRAINGUARD_* environment, waits for them with a deadline (a hung
// job is killed and fails the test, it never hangs it), and checks what the ranks printed (the
// output format is documented at the top of examples/cpp_trainer/trainer.cc) and how they exited.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/job_shm.h"
#include "tests/support/own_process.h"

extern char** environ;

namespace trainguard {
namespace {

using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using ::trainguard::testing::SignalOwnProcess;
using Clock = std::chrono::steady_clock;

constexpr char kTrainerPath[] = TRAINGUARD_TRAINER_PATH;
constexpr auto kPollInterval = std::chrono::milliseconds(5);

// One rank of a job: a child process whose stdout and stderr go to `output_path`.
struct RankProcess {
  int rank = -1;
  pid_t pid = -1;
  std::string output_path;
  bool running = false;
  int wait_status = 0;  // valid once !running

  bool exited() const { return !running && WIFEXITED(wait_status); }
  int exit_code() const { return exited() ? WEXITSTATUS(wait_status) : -1; }
  int term_signal() const {
    return !running && WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
  }

  std::string Output() const {
    std::ifstream in(output_path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Reaps the process if it has ended. Returns true when it is no longer running.
  bool Poll() {
    if (!running) {
      return true;
    }
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      running = false;
      wait_status = status;
    }
    return !running;
  }

  void KillAndReap() {
    if (!running) {
      return;
    }
    // Reaped only once the kill went out: a blocking wait for a rank not signalled would hang.
    const absl::Status killed = SignalOwnProcess(pid, SIGKILL);
    EXPECT_EQ(killed, absl::OkStatus()) << "rank " << rank;
    int status = 0;
    if (killed.ok() && waitpid(pid, &status, 0) == pid) {
      wait_status = status;
    }
    running = false;
  }
};

// A job of trainer ranks sharing a fresh run directory and a unique job id. The destructor kills -9
// and reaps whatever is still running, so a failed assertion never leaves processes behind.
class TrainerJob {
 public:
  explicit TrainerJob(absl::string_view name) {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe): nothing sets it
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                       "/cpp_trainer_test.", name, ".XXXXXX");
    if (mkdtemp(pattern.data()) != nullptr) {
      run_dir_ = pattern;
    }
    job_id_ = absl::StrCat(name, "-", getpid());
  }

  ~TrainerJob() {
    for (RankProcess& p : ranks_) {
      p.KillAndReap();
    }
    // A killed rank leaves its flight-recorder ring and its arena behind on purpose; the test is
    // done with them.
    testing::RemoveJobSharedMemory(job_id_);
    // Kept when the test failed: the rank outputs and event files are the evidence.
    if (!run_dir_.empty() && !::testing::Test::HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(run_dir_, ec);
    }
  }

  const std::string& run_dir() const { return run_dir_; }
  const std::string& job_id() const { return job_id_; }
  // The processes in the order they were started.
  std::vector<RankProcess>& ranks() { return ranks_; }
  // The process started `r`-th: rank r when the ranks were started in order (StartAll).
  RankProcess& rank(int r) { return ranks_.at(r); }

  // Starts rank `rank` of `world_size` with the trainer flags `args`. Returns false (with a test
  // failure) if the spawn fails.
  // `extra_env`: more NAME=VALUE variables for this rank only.
  bool Start(int rank, int world_size, const std::vector<std::string>& args,
             const std::map<std::string, std::string>& extra_env = {}) {
    RankProcess p;
    p.rank = rank;
    p.output_path = absl::StrCat(run_dir_, "/rank", rank, ".out");

    std::map<std::string, std::string> env = InheritedEnvironment();
    env["TRAINGUARD_RANK"] = absl::StrCat(rank);
    env["TRAINGUARD_WORLD_SIZE"] = absl::StrCat(world_size);
    env["TRAINGUARD_JOB_ID"] = job_id_;
    env["TRAINGUARD_RUN_DIR"] = run_dir_;
    for (const auto& [key, value] : extra_env) env[key] = value;
    std::vector<std::string> env_strings;
    env_strings.reserve(env.size());
    for (const auto& [key, value] : env) {
      env_strings.push_back(absl::StrCat(key, "=", value));
    }

    std::vector<std::string> argv_strings = {kTrainerPath};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, p.output_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int err = posix_spawn(&p.pid, kTrainerPath, &actions, nullptr,
                                CStrings(argv_strings).data(), CStrings(env_strings).data());
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      ADD_FAILURE() << "posix_spawn " << kTrainerPath << " for rank " << rank << ": "
                    << std::strerror(err);  // NOLINT(concurrency-mt-unsafe): one thread
      return false;
    }
    p.running = true;
    ranks_.push_back(std::move(p));
    return true;
  }

  // Starts ranks 0..world_size-1 with the same flags.
  bool StartAll(int world_size, const std::vector<std::string>& args) {
    for (int r = 0; r < world_size; ++r) {
      if (!Start(r, world_size, args)) {
        return false;
      }
    }
    return true;
  }

  // Waits until every rank has exited. On the deadline, kills them all and returns false.
  bool WaitAll(std::chrono::seconds timeout) {
    std::vector<int> all;
    all.reserve(ranks_.size());
    for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
      all.push_back(i);
    }
    return WaitForExit(all, timeout);
  }

  // Waits until the ranks `which` have exited. On the deadline, kills every rank of the job and
  // returns false.
  bool WaitForExit(const std::vector<int>& which, std::chrono::seconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (true) {
      bool all_done = true;
      for (int r : which) {
        all_done &= rank(r).Poll();
      }
      if (all_done) {
        return true;
      }
      if (Clock::now() >= deadline) {
        for (RankProcess& p : ranks_) {
          p.KillAndReap();
        }
        return false;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // Waits until rank `r`'s output contains `needle`; false if the rank ends or the deadline passes
  // first.
  bool WaitForOutput(int r, absl::string_view needle, std::chrono::seconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    RankProcess& p = rank(r);
    while (Clock::now() < deadline) {
      if (absl::StrContains(p.Output(), needle)) {
        return true;
      }
      if (p.Poll()) {
        return absl::StrContains(p.Output(), needle);
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    return false;
  }

  // Every rank's output, for failure messages.
  std::string AllOutput() const {
    std::string all;
    for (const RankProcess& p : ranks_) {
      absl::StrAppend(&all, "----- rank ", p.rank, " (", p.output_path, ")\n", p.Output());
    }
    return all;
  }

 private:
  // The test's environment without any variable that would configure the ranks behind our back.
  static std::map<std::string, std::string> InheritedEnvironment() {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const absl::string_view entry = *e;
      const size_t eq = entry.find('=');
      if (eq == absl::string_view::npos) {
        continue;
      }
      const std::string key(entry.substr(0, eq));
      if (absl::StartsWith(key, "TRAINGUARD_") || key == "RANK" || key == "WORLD_SIZE" ||
          key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" || key == "CPP_TRAINER_RENDEZVOUS_ID") {
        continue;
      }
      env[key] = std::string(entry.substr(eq + 1));
    }
    return env;
  }

  static std::vector<char*> CStrings(std::vector<std::string>& strings) {
    std::vector<char*> pointers;
    pointers.reserve(strings.size() + 1);
    for (std::string& s : strings) {
      pointers.push_back(s.data());
    }
    pointers.push_back(nullptr);
    return pointers;
  }

  std::string run_dir_;
  std::string job_id_;
  std::vector<RankProcess> ranks_;
};

struct LossLine {
  int64_t step;
  double loss;
};

// The "rank R step S loss L" lines of one rank's output, in order.
std::vector<LossLine> LossLines(const std::string& output) {
  std::vector<LossLine> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    int rank = 0;
    int64_t step = 0;
    double loss = 0;
    char tail = 0;
    if (std::sscanf(line.c_str(), "rank %d step %" SCNd64 " loss %lf%c", &rank, &step, &loss,
                    &tail) == 3) {
      lines.push_back({step, loss});
    }
  }
  return lines;
}

// The params_checksum of the "rank R final_loss L params_checksum H" line, if there is one.
std::optional<std::string> ParamsChecksum(const std::string& output) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    int rank = 0;
    double loss = 0;
    char checksum[17] = {};
    if (std::sscanf(line.c_str(), "rank %d final_loss %lf params_checksum %16[0-9a-f]", &rank,
                    &loss, checksum) == 3) {
      return std::string(checksum);
    }
  }
  return std::nullopt;
}

constexpr int kWorldSize = 4;
// Rank processes exit by themselves well within this; it only turns a hang into a failure.
constexpr std::chrono::seconds kJobDeadline(120);
// Passed to the ranks so that a lost peer fails their collectives well before kJobDeadline.
const std::string kCommTimeoutSeconds = "30";
// For the tests that kill or stop a rank: a survivor notices a dead peer at once when it reads from
// it, but gloo may leave a send to an exited peer pending until the timeout.
const std::string kFaultCommTimeoutSeconds = "5";

TEST(CppTrainerTest, FourRanksLowerTheLossAndEndWithBitIdenticalParameters) {
  TrainerJob job("train");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  ASSERT_TRUE(job.StartAll(kWorldSize, {"--steps", "60", "--print-every", "10", "--comm-timeout-s",
                                        kCommTimeoutSeconds}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << "ranks still running after the deadline; killed\n"
                                         << job.AllOutput();

  std::vector<std::string> checksums;
  for (RankProcess& p : job.ranks()) {
    const std::string output = p.Output();
    ASSERT_EQ(p.exit_code(), 0) << "rank " << p.rank << " wait status " << p.wait_status << "\n"
                                << output;
    const std::vector<LossLine> losses = LossLines(output);
    ASSERT_GE(losses.size(), 2u) << output;
    EXPECT_EQ(losses.front().step, 0) << output;
    EXPECT_EQ(losses.back().step, 59) << output;
    EXPECT_LT(losses.back().loss, 0.5 * losses.front().loss) << "rank " << p.rank << "\n" << output;
    std::optional<std::string> checksum = ParamsChecksum(output);
    ASSERT_TRUE(checksum.has_value()) << output;
    checksums.push_back(*checksum);
  }
  for (int r = 1; r < kWorldSize; ++r) {
    EXPECT_EQ(checksums[r], checksums[0]) << "rank " << r << " diverged from rank 0";
  }
}

TEST(CppTrainerTest, RankOutsideTheWorldExitsWithStatus2AndNamesTheRank) {
  TrainerJob job("badrank");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  ASSERT_TRUE(job.Start(/*rank=*/7, kWorldSize, {"--steps", "1"}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << job.AllOutput();

  RankProcess& p = job.ranks().front();
  const std::string output = p.Output();
  EXPECT_EQ(p.exit_code(), 2) << "wait status " << p.wait_status << "\n" << output;
  EXPECT_THAT(output, HasSubstr("invalid options"));
  EXPECT_THAT(output, ContainsRegex("(TRAINGUARD_RANK|rank)[ =']*7"));
}

TEST(CppTrainerTest, NanLossOnOneRankIsNamedAndSkippedByEveryRankWhichThenTrainOnInStep) {
  TrainerJob job("nan");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  ASSERT_TRUE(job.StartAll(kWorldSize, {"--steps", "40", "--inject-nan", "2:20", "--comm-timeout-s",
                                        kCommTimeoutSeconds}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << "ranks still running after the deadline; killed\n"
                                         << job.AllOutput();

  std::vector<std::string> checksums;
  for (RankProcess& p : job.ranks()) {
    const std::string output = p.Output();
    ASSERT_EQ(p.exit_code(), 0) << "rank " << p.rank << "\n" << output;
    EXPECT_THAT(output, HasSubstr(absl::StrCat("rank ", p.rank,
                                               " step 20 fault step_failure action skip")));
    EXPECT_THAT(output, HasSubstr(absl::StrCat("rank ", p.rank, " recover step 20 next 21")));
    if (p.rank == 2) {
      EXPECT_THAT(output, HasSubstr("loss is not finite")) << output;
    } else {
      EXPECT_THAT(output, HasSubstr("other rank(s) had a non-finite loss")) << output;
    }
    std::optional<std::string> checksum = ParamsChecksum(output);
    ASSERT_TRUE(checksum.has_value()) << output;
    checksums.push_back(*checksum);
  }
  for (int r = 1; r < kWorldSize; ++r) {
    EXPECT_EQ(checksums[r], checksums[0]) << "rank " << r << " diverged from rank 0";
  }
}

TEST(CppTrainerTest, KilledRankMakesEverySurvivorReportACommunicationFailureAndExit1) {
  TrainerJob job("kill");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  // Far more steps than the test lets it run: rank 2 is killed mid-training.
  ASSERT_TRUE(job.StartAll(kWorldSize, {"--steps", "100000000", "--print-every", "50",
                                        "--comm-timeout-s", kFaultCommTimeoutSeconds}));
  ASSERT_TRUE(job.WaitForOutput(2, "rank 2 step 100 loss", kJobDeadline)) << job.AllOutput();
  ASSERT_EQ(SignalOwnProcess(job.rank(2).pid, SIGKILL), absl::OkStatus());

  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << "survivors still running after the deadline; killed\n"
                                         << job.AllOutput();
  EXPECT_EQ(job.rank(2).term_signal(), SIGKILL);
  for (RankProcess& p : job.ranks()) {
    if (p.rank == 2) {
      continue;
    }
    const std::string output = p.Output();
    EXPECT_EQ(p.exit_code(), 1) << "rank " << p.rank << " wait status " << p.wait_status << "\n"
                                << output;
    EXPECT_THAT(output, HasSubstr("fault communication_failure action re_rendezvous")) << output;
    EXPECT_THAT(output, HasSubstr("cannot recover")) << output;
  }
}

// The last all_reduce sequence number a rank's flight recorder shows it entering (-1: none).
int64_t LastAllReduceEntered(const FlightRecorderContents& ring) {
  int64_t last = -1;
  for (const FlightRecord& r : ring.records) {
    if (r.type == FlightRecordType::kCollectiveBegin && r.Name() == "all_reduce") {
      last = std::max(last, r.comm_seq);
    }
  }
  return last;
}

TEST(CppTrainerTest, StoppedRankIsCaughtByTheWatchdogsAndItsRingShowsItNeverEnteredTheCollective) {
  TrainerJob job("stop");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  // A stopped process keeps its connections open: gloo alone would wait out its timeout. Ranks 1
  // and 3's watchdogs declare the hang once the step runs past its learned bound (floor 2 s). Rank
  // 0 runs without a watchdog: its collective fails when a peer aborts, and it must still dump its
  // ring (nobody tells it of the hang in a job without a store).
  const std::vector<std::string> args = {"--steps",
                                         "100000000",
                                         "--print-every",
                                         "50",
                                         "--comm-timeout-s",
                                         kFaultCommTimeoutSeconds,
                                         "--stop-before-collective",
                                         "2:120"};
  ASSERT_TRUE(job.Start(0, kWorldSize, args, {{"TRAINGUARD_WATCHDOG_POLL_MS", "0"}}));
  for (int r = 1; r < kWorldSize; ++r) ASSERT_TRUE(job.Start(r, kWorldSize, args));
  ASSERT_TRUE(job.WaitForOutput(2, "rank 2 step 100 loss", kJobDeadline)) << job.AllOutput();
  const absl::Time stopped = absl::Now();  // within ~20 steps of the SIGSTOP
  ASSERT_TRUE(job.WaitForOutput(0, "fault communication_failure", kJobDeadline)) << job.AllOutput();
  const absl::Duration detected = absl::Now() - stopped;
  ::testing::Test::RecordProperty("detection_ms",
                                  absl::StrCat(absl::ToInt64Milliseconds(detected)));
  std::printf("rank 0's guard returned a communication failure %s after the SIGSTOP\n",
              absl::FormatDuration(detected).c_str());

  // While rank 2 is stopped, its ring is read from outside.
  absl::StatusOr<FlightRecorderContents> stopped_ring = ReadFlightRecorder(job.job_id(), 2);
  ASSERT_TRUE(stopped_ring.ok()) << stopped_ring.status();
  const int64_t laggard_seq = LastAllReduceEntered(*stopped_ring);

  ASSERT_TRUE(job.WaitForExit({0, 1, 3}, kJobDeadline))
      << "survivors still running after the deadline; killed\n"
      << job.AllOutput();
  // The survivors' rings, as they dumped them on the hang: each had entered the all_reduce that
  // rank 2 never entered. Rank 0 has no watchdog: its dump is for the communication failure. Ranks
  // 1 and 3 each dump for the hang their watchdog declared, or, when the other's abort failed
  // their collective first, for that failure: which one wins that race is not the outcome.
  int hang_dumps = 0;
  for (int r : {0, 1, 3}) {
    absl::StatusOr<FlightRecorderDump> dump = ReadFlightRecorderDump(
        absl::StrFormat("%s/flight_recorder/rank-%05d.1.pb", job.run_dir(), r));
    ASSERT_TRUE(dump.ok()) << "rank " << r << ": " << dump.status();
    EXPECT_EQ(LastAllReduceEntered(dump->contents), laggard_seq + 1) << "rank " << r;
    std::string reason;
    for (const auto& [key, value] : dump->evidence) {
      if (key == "reason") reason = value;
    }
    if (r == 0) {
      EXPECT_THAT(reason, StartsWith("communication failure: ")) << "rank 0";
    } else {
      EXPECT_THAT(reason, AnyOf(StartsWith("hang: "), StartsWith("communication failure: ")))
          << "rank " << r;
      hang_dumps += absl::StartsWith(reason, "hang: ") ? 1 : 0;
    }
  }
  EXPECT_GE(hang_dumps, 1) << "neither rank 1 nor rank 3 dumped for a hang";
  int hung = 0;
  for (int r : {0, 1, 3}) {
    RankProcess& p = job.rank(r);
    const std::string output = p.Output();
    EXPECT_EQ(p.exit_code(), 1) << "rank " << r << " wait status " << p.wait_status << "\n"
                                << output;
    EXPECT_THAT(output, HasSubstr("fault communication_failure action re_rendezvous")) << output;
    hung += absl::StrContains(output, "the watchdog declared a hang") ? 1 : 0;
  }
  EXPECT_GE(hung, 1) << job.AllOutput();
  EXPECT_THAT(job.rank(0).Output(), Not(HasSubstr("the watchdog declared a hang")));
}

TEST(CppTrainerTest, NanInOneRanksGradientIsNamedByThatRankBeforeTheReduction) {
  TrainerJob job("nangrad");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  ASSERT_TRUE(job.StartAll(kWorldSize, {"--steps", "40", "--inject-nan-grad", "1:30",
                                        "--comm-timeout-s", kCommTimeoutSeconds}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << job.AllOutput();
  for (RankProcess& p : job.ranks()) {
    const std::string output = p.Output();
    ASSERT_EQ(p.exit_code(), 0) << output;
    if (p.rank == 1) {
      EXPECT_THAT(output, HasSubstr("non-finite values in buffer \"mlp.gradients\" on rank 1 at "
                                    "step 30: 1 of"))
          << output;
    } else {
      EXPECT_THAT(output, HasSubstr("step 30 fault step_failure action skip")) << output;
      EXPECT_THAT(output, Not(HasSubstr("non-finite values in buffer"))) << output;
    }
  }
}

// The lines of `output` that contain `needle`.
int CountLines(const std::string& output, absl::string_view needle) {
  int n = 0;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) n += absl::StrContains(line, needle) ? 1 : 0;
  return n;
}

TEST(CppTrainerTest, ANanOnEveryRankWithoutCheckpointsStopsTheJobWithOneClearMessage) {
  TrainerJob job("nanall");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  ASSERT_TRUE(job.StartAll(kWorldSize, {"--steps", "100000000", "--nan-from-step", "20",
                                        "--comm-timeout-s", kCommTimeoutSeconds}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << job.AllOutput();
  for (RankProcess& p : job.ranks()) {
    const std::string output = p.Output();
    EXPECT_EQ(p.exit_code(), 1) << "rank " << p.rank << "\n" << output;
    // Skipped three times, then one message naming the step and the limit.
    EXPECT_EQ(CountLines(output, "action skip"), 4) << output;
    EXPECT_EQ(CountLines(output, "error:"), 1) << output;
    EXPECT_THAT(output,
                HasSubstr(absl::StrCat(
                    "rank ", p.rank,
                    " error: cannot recover from step 23: "
                    "FAILED_PRECONDITION: rank ",
                    p.rank,
                    ": 4 consecutive steps failed (limit 3: max_consecutive_step_failures), "
                    "the last at step 23, and checkpointing is off")))
        << output;
  }
}

TEST(CppTrainerTest, ANanThatRecursAfterRollbackStopsTheJobAfterABoundedNumberOfRestores) {
  TrainerJob job("nanckpt");
  ASSERT_FALSE(job.run_dir().empty()) << "mkdtemp failed";
  // One rank: which committed step a rollback finds depends on how far the asynchronous saves got,
  // and a single rank needs no agreement on it.
  ASSERT_TRUE(job.Start(0, 1, {"--steps", "100000000", "--nan-from-step", "25"},
                        {{"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "10"}}));
  ASSERT_TRUE(job.WaitAll(kJobDeadline)) << job.AllOutput();
  RankProcess& p = job.rank(0);
  const std::string output = p.Output();
  EXPECT_EQ(p.exit_code(), 1) << output;
  // A rollback that lands on a newer commit than the last one starts the count again, so there
  // are one or two replays, never more.
  const int replays = CountLines(output, "restored step");
  EXPECT_GE(replays, 1) << output;
  EXPECT_LE(replays, 2) << output;
  EXPECT_EQ(CountLines(output, "error:"), 1) << output;
  EXPECT_THAT(output, ContainsRegex("rank 0 error: cannot recover from step 28: "
                                    "FAILED_PRECONDITION: rank 0: step 28 failed again after 1 "
                                    "rollback\\(s\\) to step (10|20) \\(limit 1: "
                                    "max_rollbacks_per_step\\): the fault recurs after rollback"))
      << output;
}

}  // namespace
}  // namespace trainguard
