// `trainguard run` facing faults from outside the ranks' code, each injected for real: a rank that
// publishes job/stop, rank and standby commands that always die, a rank whose snapshot arena does
// not fit in /dev/shm, SIGKILL and SIGSTOP of the launcher while the ranks run under a wrapper
// shell, a full checkpoint disk (a small tmpfs in a private mount namespace), and a command that
// does not exist. Each test starts the launcher as its
// own child and asserts the outcome: the exit status, what the launcher printed, which processes
// are left.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_shm.h"
#include "tests/support/spawn.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kDeadline = absl::Seconds(120);

// For the jobs whose ranks die a dozen times: a rank that exits waits in its Runtime's destructor
// for its generation watcher's store wait, up to one heartbeat interval (1 s by default). The exit's
// speed is not what these tests show; a 100 ms interval keeps each death from costing a second.
const std::vector<std::pair<std::string, std::string>> kQuickRankExit = {
    {"TRAINGUARD_HEARTBEAT_INTERVAL_MS", "100"}};

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// The live processes whose environment carries TRAINGUARD_RUN_DIR=`run_dir`: the ranks and
// standbys of one job, however deep below a wrapper (a zombie has no environment left).
std::vector<pid_t> ProcessesOfRunDir(const std::string& run_dir) {
  const std::string needle = absl::StrCat("TRAINGUARD_RUN_DIR=", run_dir);
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 1) continue;
    const std::string environ = ReadWhole(absl::StrCat("/proc/", pid, "/environ"));
    for (size_t start = 0; start < environ.size();) {
      size_t end = environ.find('\0', start);
      if (end == std::string::npos) end = environ.size();
      if (environ.compare(start, end - start, needle) == 0) {
        pids.push_back(pid);
        break;
      }
      start = end + 1;
    }
  }
  closedir(proc);
  return pids;
}

// One `trainguard run` (or any command line) as this test's child, its stdout and stderr in a file.
class Launcher {
 public:
  explicit Launcher(const testing::TempDir& dir) : dir_(dir), run_dir_(dir.File("run")) {}

  // `trainguard run --run-dir ... --job-id ... FLAGS -- COMMAND`.
  void Run(const std::vector<std::string>& flags, const std::vector<std::string>& command,
           const std::vector<std::pair<std::string, std::string>>& environment = {}) {
    std::vector<std::string> args = {TRAINGUARD_CLI_PATH, "run",
                                     "--run-dir",         run_dir_,
                                     "--job-id",          absl::StrCat("faults-", getpid())};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("--");
    args.insert(args.end(), command.begin(), command.end());
    Exec(args, environment);
  }

  void Exec(std::vector<std::string> args,
            const std::vector<std::pair<std::string, std::string>>& environment = {}) {
    pid_ = testing::SpawnWithOutput(std::move(args), output_path(), environment);
    ASSERT_GT(pid_, 0);
  }

  ~Launcher() {
    if (pid_ > 1 && !exited_) {
      Signal(SIGCONT);  // a stopped launcher cannot act on SIGKILL's aftermath until reaped
      Signal(SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    // What its killed ranks left (their rings, their arenas).
    testing::RemoveJobSharedMemory(absl::StrCat("faults-", getpid()));
  }

  std::string output_path() const { return dir_.File("launcher.out"); }
  const std::string& run_dir() const { return run_dir_; }
  std::string Output() const { return ReadWhole(output_path()); }

  bool AwaitOutput(const std::string& needle) const {
    for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
      if (absl::StrContains(Output(), needle)) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // The exit status (128+N for signal N), or -1 if it did not exit in time.
  int Wait(absl::Duration deadline = kDeadline) {
    for (absl::Time end = absl::Now() + deadline; absl::Now() < end;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return -1;
  }

  // Only ever this test's own child, and never a pid <= 1.
  void Signal(int sig) const {
    ASSERT_GT(pid_, 1);
    ASSERT_FALSE(exited_);
    ASSERT_EQ(kill(pid_, sig), 0) << "signal " << sig << " to launcher pid " << pid_;
  }

  // SIGKILLs a rank of this job: the pid comes from the launcher's pid file and is checked to
  // carry this job's run dir in its environment before it is signalled.
  void KillRank(int rank) const {
    auto contents = Env::Default()->ReadFileToString(absl::StrCat(run_dir_, "/pids/rank-", rank));
    ASSERT_TRUE(contents.ok()) << contents.status();
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(*contents), &pid));
    ASSERT_GT(pid, 1);
    std::vector<pid_t> ours = ProcessesOfRunDir(run_dir_);
    ASSERT_NE(std::find(ours.begin(), ours.end(), pid), ours.end())
        << "pid " << pid << " is not a process of this job";
    ASSERT_EQ(kill(pid, SIGKILL), 0);
  }

  // Bounded polling until at least `n` processes of this job run.
  bool AwaitProcesses(size_t n) const {
    for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end;) {
      if (ProcessesOfRunDir(run_dir_).size() >= n) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Bounded polling until no process of this job is left; returns those still there.
  std::vector<pid_t> AwaitNoProcessesLeft(absl::Duration deadline) const {
    std::vector<pid_t> left;
    for (absl::Time end = absl::Now() + deadline; absl::Now() < end;) {
      left = ProcessesOfRunDir(run_dir_);
      if (left.empty()) return left;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return left;
  }

  // Every event of every rank's file of kind `kind`.
  std::vector<Event> EventsOfKind(int world, EventKind kind) const {
    std::vector<Event> found;
    for (int r = 0; r < world; ++r) {
      auto contents = ReadEventLog(Env::Default(), EventLogPath(run_dir_, r));
      if (!contents.ok()) continue;
      for (const Event& e : contents->events) {
        if (KindOf(e) == kind) found.push_back(e);
      }
    }
    return found;
  }

 private:
  const testing::TempDir& dir_;
  const std::string run_dir_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

TEST(LauncherFaults, ARankThatPublishesJobStopStopsEveryRankAndNobodyIsReplaced) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "3", "--standby", "1"}, {TRAINGUARD_FAULT_RANK_PATH, "stop-job"});
  EXPECT_EQ(launcher.Wait(), 1) << launcher.Output();
  const std::string out = launcher.Output();
  EXPECT_EQ(Count(out,
                  "trainguard run: job stopped: rank 0: step 7 failed again after 2 "
                  "rollbacks (limit 2)\n"),
            1)
      << out;
  EXPECT_THAT(out, Not(HasSubstr("takes rank"))) << out;
  EXPECT_THAT(out, HasSubstr("stopped by a rank: rank 0: step 7")) << out;  // the summary
  EXPECT_THAT(launcher.AwaitNoProcessesLeft(absl::Seconds(30)), IsEmpty());
}

TEST(LauncherFaults, ARankCommandThatAlwaysDiesBacksOffAndEndsAtMaxReplacementsNamingTheDeaths) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run(
      {"--nproc", "1", "--standby", "1", "--max-replacements", "3", "--restart-backoff", "1"},
      {TRAINGUARD_FAULT_RANK_PATH, "exit-1"}, kQuickRankExit);
  EXPECT_EQ(launcher.Wait(), 1) << launcher.Output();
  const std::string out = launcher.Output();
  EXPECT_EQ(Count(out, "takes rank 0"), 3) << out;
  // The first death is replaced at once; the replacements that die right after taking the rank
  // back off, 1 s then 2 s.
  EXPECT_THAT(out, HasSubstr("rank 0 died 2 times (last: exited with status 1), 2 in a row within "
                             "1m of taking its rank: replacing it in 1s"))
      << out;
  EXPECT_THAT(out, HasSubstr("replacing it in 2s")) << out;
  EXPECT_THAT(out, HasSubstr("job failed: rank 0 died 4 times (last: exited with status 1); "
                             "--max-replacements=3 reached"))
      << out;
  EXPECT_THAT(out, Not(HasSubstr("no standby is available"))) << out;
  EXPECT_THAT(out, ContainsRegex("ended \\(exit status 1\\): rank 0 died 4 times.*; 3 "
                                 "replacement\\(s\\)"))
      << out;
}

// Under --restart-all, a rank lost while the restarted ranks start (before the restarted job
// formed) restarts every rank again: the command formed a job before, so it is a fault like any
// other, not a command that cannot start (which a first formation's death still is).
TEST(LauncherFaults, UnderRestartAllARankLostBeforeTheRestartedJobFormedRestartsAgain) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "3", "--restart-all", "3"},
               {TRAINGUARD_FAULT_RANK_PATH, "die-in-restart-1"}, kQuickRankExit);
  EXPECT_EQ(launcher.Wait(), 0) << launcher.Output();
  const std::string out = launcher.Output();
  EXPECT_THAT(out, HasSubstr("restarting every rank (restart 1 of at most 3): rank 1 exited with "
                             "status 1"))
      << out;
  EXPECT_THAT(out, HasSubstr("rank 1: dying before it joins restart 1")) << out;
  EXPECT_THAT(out, HasSubstr("restarting every rank (restart 2 of at most 3): rank 1 exited with "
                             "status 1 before the restarted job formed"))
      << out;
  EXPECT_THAT(out, Not(HasSubstr("restart 3 of"))) << out;
  EXPECT_THAT(out, Not(HasSubstr("job failed"))) << out;
}

TEST(LauncherFaults, ReplacementsAreBoundedByDefault) {
  testing::TempDir dir;
  Launcher launcher(dir);
  // No --max-replacements: the default bound holds (no backoff, to keep the test short).
  launcher.Run({"--nproc", "1", "--standby", "1", "--restart-backoff", "0"},
               {TRAINGUARD_FAULT_RANK_PATH, "exit-1"}, kQuickRankExit);
  EXPECT_EQ(launcher.Wait(), 1) << launcher.Output();
  const std::string out = launcher.Output();
  EXPECT_EQ(Count(out, "takes rank 0"), 10) << out;
  EXPECT_THAT(out, HasSubstr("job failed: rank 0 died 11 times (last: exited with status 1); "
                             "--max-replacements=10 reached"))
      << out;
}

TEST(LauncherFaults, AStandbyThatAlwaysDiesIsRestartedBoundedlyAndNamedWhenARankNeedsIt) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run(
      {"--nproc", "1", "--standby", "1", "--max-replacements", "2", "--restart-backoff", "1"},
      {TRAINGUARD_FAULT_RANK_PATH, "standby-dies"});
  ASSERT_TRUE(launcher.AwaitOutput("no more standbys are started")) << launcher.Output();
  std::string out = launcher.Output();
  EXPECT_EQ(Count(out, "exited with status 1 while parked"), 3) << out;
  EXPECT_THAT(out, HasSubstr("the next starts in 1s")) << out;
  EXPECT_THAT(out, HasSubstr("standbys died 3 times while parked (last: exited with status 1); "
                             "--max-replacements=2 reached: no more standbys are started"))
      << out;
  ASSERT_TRUE(launcher.AwaitOutput("generation 0 formed")) << out;
  launcher.KillRank(0);
  EXPECT_EQ(launcher.Wait(), 1) << launcher.Output();
  out = launcher.Output();
  EXPECT_THAT(out, HasSubstr("job failed: rank 0 died (killed by SIGKILL) and no standby is "
                             "available: standbys died 3 times while parked (last: exited with "
                             "status 1)"))
      << out;
}

// The fault that starts a job's end is seldom the death that ends it. Rank 1 cannot start: its
// snapshot arena does not fit in /dev/shm (a real ENOSPC: it asks for more than /dev/shm holds).
// A standby takes rank 1; then rank 0 is killed and the one replacement allowed is spent. The
// job's last lines name the death that ended it and, as the first failure, rank 1's own error.
TEST(LauncherFaults, AJobEndedByALaterDeathNamesTheFirstFailureWithItsError) {
  struct statvfs shm;
  if (statvfs("/dev/shm", &shm) != 0 || shm.f_blocks == 0) {
    GTEST_SKIP() << "/dev/shm has no size here: no arena can be too large for it at once";
  }
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "2", "--standby", "1", "--max-replacements", "1"},
               {TRAINGUARD_FAULT_RANK_PATH, "shm-too-small"});
  ASSERT_TRUE(launcher.AwaitOutput("takes rank 1")) << launcher.Output();
  launcher.KillRank(0);
  EXPECT_EQ(launcher.Wait(), 1) << launcher.Output();
  const std::string out = launcher.Output();
  const std::string first_failure =
      "first failure: rank 1 exited with status 1: rank 1 error: cannot start: "
      "RESOURCE_EXHAUSTED: [^\n]*snapshot arena /trainguard\\.[^ ]+\\.rank1 needs [0-9.]+ [GT]iB "
      "\\(two slots of [^)]+\\): posix_fallocate of [0-9]+ bytes "
      "\\([^)]+\\) for shared-memory segment /trainguard\\.[^ ]+\\.rank1 \\(/dev/shm/trainguard"
      "\\.[^ ]+\\.rank1; its file system holds [^)]+ free\\): No space left on device";
  EXPECT_THAT(out, ContainsRegex(absl::StrCat(
                       "trainguard run: job failed: rank 0 died 1 time \\(last: killed by "
                       "SIGKILL\\); --max-replacements=1 reached; ",
                       first_failure, "\n")))
      << out;
  EXPECT_THAT(out, ContainsRegex(absl::StrCat("ended \\(exit status 1\\): rank 0 died 1 time.*; ",
                                              first_failure, "; 1 replacement\\(s\\)")))
      << out;
}

TEST(LauncherFaults, ACommandThatCannotBeExecutedIsNamedWithItsErrno) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "2"}, {dir.File("no-such-trainer"), "--steps", "1"});
  EXPECT_EQ(launcher.Wait(), 3) << launcher.Output();
  EXPECT_THAT(launcher.Output(),
              HasSubstr(absl::StrCat("cannot start the job: cannot execute the command '",
                                     dir.File("no-such-trainer"),
                                     "' for rank 0: ENOENT (No such file or directory)")));

  testing::TempDir dir2;
  Launcher not_executable(dir2);
  const std::string script = dir2.File("script.sh");
  ASSERT_TRUE(Env::Default()->NewWritableFile(script).ok());  // mode 0644: not executable
  not_executable.Run({"--nproc", "1"}, {script});
  EXPECT_EQ(not_executable.Wait(), 3) << not_executable.Output();
  EXPECT_THAT(not_executable.Output(), HasSubstr("EACCES (Permission denied)"));
}

// The ranks run under `sh -c 'trainer; true'`: the trainer is the launcher's grandchild, which
// PR_SET_PDEATHSIG does not reach. The trainers print nothing after their start, so that a write to
// the dead launcher's pipe (SIGPIPE) cannot be what ends them: the launcher watch must.
std::vector<std::string> WrappedTrainer() {
  return {"/bin/sh", "-c",
          absl::StrCat(TRAINGUARD_TRAINER_PATH,
                       " --steps 100000000 --print-every 100000000 --comm-timeout-s 30; true")};
}

// The outcome is that no process of the job is left (asserted by the caller). How each rank got
// there races: the first rank whose watch sees the launcher gone leaves, and the other may fail
// its collective with it (and exit through recover()) before its own watch fires. So at least one
// rank must say it saw the launcher go, and every rank that says so gives the reason.
void ExpectTheLauncherWatchEndedTheJob(const Launcher& launcher, int world,
                                       const std::string& why) {
  std::vector<Event> lost = launcher.EventsOfKind(world, EventKind::kLauncherLost);
  std::set<int> ranks;
  for (const Event& e : lost) {
    ranks.insert(e.rank);
    EXPECT_THAT(e.message, HasSubstr(why));
  }
  EXPECT_FALSE(ranks.empty()) << "no rank saw the launcher go";
  for (int rank : ranks) EXPECT_LT(rank, world);
}

TEST(LauncherFaults, KillingTheLauncherEndsTheRanksUnderAWrapperCommand) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "2", "--standby", "1"}, WrappedTrainer());
  ASSERT_TRUE(launcher.AwaitOutput("generation 0 formed")) << launcher.Output();
  ASSERT_TRUE(launcher.AwaitProcesses(6)) << "3 shells and their 3 trainers";
  launcher.Signal(SIGKILL);
  EXPECT_EQ(launcher.Wait(), 128 + SIGKILL);
  EXPECT_THAT(launcher.AwaitNoProcessesLeft(absl::Seconds(60)), IsEmpty());
  ExpectTheLauncherWatchEndedTheJob(launcher, 2, "exited");
}

TEST(LauncherFaults, StoppingTheLauncherEndsTheRanksAfterTheHeartbeatTimeout) {
  testing::TempDir dir;
  Launcher launcher(dir);
  launcher.Run({"--nproc", "2", "--heartbeat-timeout", "3"}, WrappedTrainer());
  ASSERT_TRUE(launcher.AwaitOutput("generation 0 formed")) << launcher.Output();
  ASSERT_TRUE(launcher.AwaitProcesses(4)) << "2 shells and their 2 trainers";
  launcher.Signal(SIGSTOP);
  EXPECT_THAT(launcher.AwaitNoProcessesLeft(absl::Seconds(60)), IsEmpty());
  ExpectTheLauncherWatchEndedTheJob(launcher, 2, "has been stopped for 3s");
  // The destructor continues and kills the launcher.
}

// A real full disk: the checkpoint directory is a 76 KiB tmpfs, mounted in a private mount
// namespace (unshare -m: needs root, as in CI), so nothing outside the test sees it. Each 2-rank
// checkpoint takes 2 x (20 KiB shard + 4 KiB manifest): step 10 fits, then there is room for one
// rank's shard at most (shards are preallocated with fallocate: all or nothing). The job itself
// goes on; the launcher must say what was lost, and `trainguard ckpt` must not pass the
// half-written step off as a checkpoint. The ckpt commands run inside the same namespace, before
// the tmpfs goes with it.
TEST(LauncherFaults, AFullCheckpointDiskIsReportedAndItsHalfWrittenStepIsNeverComplete) {
  if (system("unshare -m true 2>/dev/null") != 0) {
    GTEST_SKIP() << "unshare -m is refused here (not root): no private tmpfs to fill";
  }
  testing::TempDir dir;
  const std::string ckpt = dir.File("ckpt");
  ASSERT_TRUE(Env::Default()->CreateDirs(ckpt).ok());
  Launcher launcher(dir);
  const std::string cli = TRAINGUARD_CLI_PATH;
  const std::string script = absl::StrCat(
      "mount -t tmpfs -o size=76k tmpfs ", ckpt, " || exit 99; ", cli, " run --nproc 2 --run-dir ",
      launcher.run_dir(), " -- ", TRAINGUARD_TRAINER_PATH,
      // Steps of a few ms, so that no save is skipped for the previous one still running.
      " --steps 60 --print-every 100 --generate 2:2; echo \"launcher exit $?\"; ", cli,
      " ckpt list ", ckpt, "; ", cli, " ckpt verify ", ckpt, "; echo \"verify exit $?\"; ",
      "echo files: $(find ", ckpt, " -type f | sort)");
  launcher.Exec({"/usr/bin/unshare", "-m", "/bin/sh", "-c", script},
                {{"TRAINGUARD_CHECKPOINT_DIR", ckpt},
                 {"TRAINGUARD_CHECKPOINT_EVERY_STEPS", "10"},
                 {"TRAINGUARD_CHECKPOINT_PERSIST_EVERY", "1"}});
  EXPECT_EQ(launcher.Wait(), 0) << launcher.Output();
  const std::string out = launcher.Output();
  // The job trained to the end; what it could not persist is in its output and its summary.
  EXPECT_THAT(out, HasSubstr("launcher exit 0")) << out;
  EXPECT_THAT(out, ContainsRegex("trainguard run: checkpoint not persisted: rank [01] step 30: "
                                 "[^\n]*No space left on device"))
      << out;
  EXPECT_THAT(out, ContainsRegex("succeeded: 2 ranks finished, 0 replacement\\(s\\); [0-9]+ "
                                 "checkpoint\\(s\\) not persisted \\(last: rank [01] step 60: "))
      << out;
  // ckpt list marks every half-written step; verify fails on it and names the missing shard. Which
  // step ends up half-written depends on how the two ranks' writes interleave on the full disk
  // (usually step 20; under load a later one), so every listed step is checked, not one by name.
  EXPECT_THAT(out, HasSubstr("step 10: 2 shards, ranks 0,1, 16.01 KiB\n")) << out;
  int incomplete = 0;
  const std::regex listed("step ([0-9]+): ([0-9]+) shards?, ranks [0-9,]+, [^\n]*");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), listed); it != std::sregex_iterator();
       ++it) {
    const std::string line = (*it)[0];
    const std::string step = (*it)[1];
    if ((*it)[2] == "2") {
      EXPECT_THAT(line, Not(HasSubstr("INCOMPLETE"))) << line;
      continue;
    }
    ++incomplete;
    EXPECT_THAT(line, ContainsRegex("INCOMPLETE: no shard of rank [01]$")) << line;
    EXPECT_THAT(out, ContainsRegex(absl::StrCat("MISSING [^ ]*/step-0*", step,
                                                "/rank-0000[01]\\.shard rank [01] step ", step,
                                                ": no committed shard")))
        << out;
  }
  EXPECT_THAT(out, HasSubstr(incomplete > 0 ? "verify exit 1" : "verify exit 0")) << out;
  // The failed writes left nothing behind: every shard has its manifest, no temporary file.
  std::smatch files;
  ASSERT_TRUE(std::regex_search(out, files, std::regex("files: ([^\n]*)"))) << out;
  EXPECT_EQ(Count(files[1], ".shard"), 3) << files[1];
  EXPECT_EQ(Count(files[1], ".manifest"), 3) << files[1];
  EXPECT_THAT(files[1].str(), Not(HasSubstr(".tmp")));
}

}  // namespace
}  // namespace trainguard
