// PosixProcessSupervisor (sdk/agent/posix_process_supervisor.h) on real short processes: exit
// statuses, output lines and the log, the environment, a stop and a continue, signals to the whole
// process group, leftovers of an exited worker, a failed exec, pid files, and PDEATHSIG. Every wait
// is a bounded poll for an event; no test sleeps or compares a time.
#include "sdk/agent/posix_process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/process_supervisor.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = WorkerEvent::Kind;

// A bound on every wait for a process to do something: generous, since a loaded machine may be
// slow, and never reached when the code is right.
constexpr absl::Duration kBound = absl::Seconds(60);

class PosixProcessSupervisorTest : public ::testing::Test {
 protected:
  WorkerSpec Shell(const std::string& script, const std::string& label = "rank 0") {
    WorkerSpec spec;
    spec.label = label;
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.log_path = dir_.File(absl::StrCat("worker-", ++logs_, ".log"));
    return spec;
  }

  // Polls until `worker` is reported exited (or kBound passes); every event of `worker` seen.
  std::vector<WorkerEvent> PollUntilExit(ProcessSupervisor& supervisor, WorkerId worker) {
    return PollUntil(supervisor, worker, Kind::kExited);
  }
  // Events of one Poll after the awaited one are kept for the next call.
  std::vector<WorkerEvent> PollUntil(ProcessSupervisor& supervisor, WorkerId worker, Kind kind) {
    std::vector<WorkerEvent> seen;
    const absl::Time deadline = absl::Now() + kBound;
    while (true) {
      while (!unread_.empty()) {
        WorkerEvent event = std::move(unread_.front());
        unread_.pop_front();
        if (event.worker != worker) continue;
        const bool done = event.kind == kind;
        seen.push_back(std::move(event));
        if (done) return seen;
      }
      if (absl::Now() >= deadline) break;
      for (WorkerEvent& event : supervisor.Poll(absl::Milliseconds(100))) {
        unread_.push_back(std::move(event));
      }
    }
    ADD_FAILURE() << "worker " << worker << " did not reach the awaited event within " << kBound;
    return seen;
  }

  static std::vector<std::string> Lines(const std::vector<WorkerEvent>& events) {
    std::vector<std::string> lines;
    for (const WorkerEvent& e : events) {
      if (e.kind == Kind::kOutput) lines.push_back(e.line);
    }
    return lines;
  }

  // A pid a worker printed, checked to be positive and a descendant of this test.
  static pid_t OwnPid(const std::string& line) {
    int pid = 0;
    EXPECT_TRUE(absl::SimpleAtoi(line, &pid)) << line;
    EXPECT_TRUE(testing::CheckOwnProcess(pid).ok()) << testing::CheckOwnProcess(pid);
    return pid;
  }

  // Whether the process behind `pidfd` ends within kBound (a pidfd is readable once it has).
  static bool EndsWithinBound(int pidfd) {
    pollfd ended = {pidfd, POLLIN, 0};
    return poll(&ended, 1, static_cast<int>(absl::ToInt64Milliseconds(kBound))) == 1;
  }

  testing::TempDir dir_;
  int logs_ = 0;
  std::deque<WorkerEvent> unread_;
};

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

TEST_F(PosixProcessSupervisorTest, ATrueCommandExitsWithStatusZero) {
  PosixProcessSupervisor supervisor;
  WorkerSpec spec = Shell("");
  spec.argv = {"/bin/true"};
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_GT(supervisor.pid(*worker), 1);
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().exit, WorkerExit::Exited(0));
  EXPECT_TRUE(events.back().exit.succeeded());
  EXPECT_EQ(events.back().exit.Describe(), "exited with status 0");
}

TEST_F(PosixProcessSupervisorTest, AnExitStatusIsDecoded) {
  PosixProcessSupervisor supervisor;
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(Shell("exit 3"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().exit, WorkerExit::Exited(3));
  EXPECT_FALSE(events.back().exit.succeeded());
  EXPECT_EQ(events.back().exit.Describe(), "exited with status 3");
}

TEST_F(PosixProcessSupervisorTest, OutputComesAsLinesBeforeTheExitAndGoesToTheLog) {
  PosixProcessSupervisor supervisor;
  const WorkerSpec spec = Shell("echo one; echo two >&2; printf three");
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  // The last line has no newline: it still comes, before the exit.
  EXPECT_THAT(Lines(events), ElementsAre("one", "two", "three"));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, Kind::kExited);
  absl::StatusOr<std::string> log = Env::Default()->ReadFileToString(spec.log_path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(*log, "one\ntwo\nthree");
}

TEST_F(PosixProcessSupervisorTest, TheWorkerGetsExactlyItsSpecsEnvironmentAndNoStdin) {
  ASSERT_EQ(setenv("TG_SUPERVISOR_TEST_INHERITED", "yes", 1), 0);
  PosixProcessSupervisor supervisor;
  WorkerSpec spec = Shell(
      "echo \"$TG_SUPERVISOR_TEST\"; echo \"${TG_SUPERVISOR_TEST_INHERITED:-unset}\"; cat; "
      "echo read-nothing");
  spec.env.push_back("TG_SUPERVISOR_TEST=42");
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  unsetenv("TG_SUPERVISOR_TEST_INHERITED");
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  // stdin is /dev/null: cat ends at once rather than wait for the test's terminal.
  EXPECT_THAT(Lines(events), ElementsAre("42", "unset", "read-nothing"));
  EXPECT_EQ(events.back().exit, WorkerExit::Exited(0));
}

TEST_F(PosixProcessSupervisorTest, AKilledWorkerIsReportedKilledAndNeverSignalledAgain) {
  PosixProcessSupervisor supervisor;
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(Shell("echo up; exec sleep 1000"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  PollUntil(supervisor, *worker, Kind::kOutput);  // it runs
  const pid_t pid = supervisor.pid(*worker);
  ASSERT_GT(pid, 1);
  EXPECT_EQ(getpgid(pid), pid);  // the leader of a group of its own
  ASSERT_TRUE(supervisor.Signal(*worker, SIGKILL).ok());
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().exit, WorkerExit::Killed(SIGKILL));
  EXPECT_EQ(events.back().exit.Describe(), "killed by SIGKILL");
  EXPECT_EQ(supervisor.Signal(*worker, SIGKILL).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(supervisor.IsStopped(*worker));
  ASSERT_TRUE(supervisor.Release(*worker).ok());
  EXPECT_EQ(supervisor.pid(*worker), -1);
  EXPECT_EQ(supervisor.Signal(*worker, SIGKILL).code(), absl::StatusCode::kNotFound);
}

TEST_F(PosixProcessSupervisorTest, AWorkerThatStopsItselfIsReportedStoppedThenContinued) {
  PosixProcessSupervisor supervisor;
  // It lives on after the continue: an exit that follows a stop or a continue before Poll looks
  // would be reported alone (waitpid reports the exit first).
  absl::StatusOr<WorkerId> worker =
      supervisor.Spawn(Shell("echo stopping; kill -STOP $$; echo resumed; exec sleep 1000"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> stopped = PollUntil(supervisor, *worker, Kind::kStopped);
  // What it wrote before it stopped comes first.
  EXPECT_THAT(Lines(stopped), ElementsAre("stopping"));
  EXPECT_EQ(stopped.back().stop_signal, SIGSTOP);
  EXPECT_TRUE(supervisor.IsStopped(*worker));
  EXPECT_EQ(supervisor.Release(*worker).code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(supervisor.Signal(*worker, SIGCONT).ok());
  std::vector<WorkerEvent> events = PollUntil(supervisor, *worker, Kind::kContinued);
  EXPECT_FALSE(supervisor.IsStopped(*worker));
  // Its next line may be read in the same Poll as the continue, before or after it.
  if (Lines(events).empty()) events = PollUntil(supervisor, *worker, Kind::kOutput);
  EXPECT_THAT(Lines(events), ElementsAre("resumed"));
  ASSERT_TRUE(supervisor.Signal(*worker, SIGKILL).ok());
  events = PollUntilExit(supervisor, *worker);
  EXPECT_EQ(events.back().exit, WorkerExit::Killed(SIGKILL));
  EXPECT_FALSE(supervisor.IsStopped(*worker));
}

TEST_F(PosixProcessSupervisorTest, ASignalReachesEveryProcessOfTheWorkersGroup) {
  PosixProcessSupervisor supervisor;
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(Shell("sleep 1000 & echo $!; wait"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> printed = PollUntil(supervisor, *worker, Kind::kOutput);
  ASSERT_FALSE(printed.empty());
  const pid_t grandchild = OwnPid(printed.back().line);
  ASSERT_GT(grandchild, 1);
  const int pidfd = PidfdOpen(grandchild);  // names it for good: a reused pid is not it
  ASSERT_GE(pidfd, 0) << strerror(errno);

  ASSERT_TRUE(supervisor.Signal(*worker, SIGKILL).ok());
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  EXPECT_EQ(events.back().exit, WorkerExit::Killed(SIGKILL));
  EXPECT_TRUE(EndsWithinBound(pidfd));
  close(pidfd);
}

TEST_F(PosixProcessSupervisorTest, WhatAnExitedWorkerLeftRunningIsKilled) {
  PosixProcessSupervisor supervisor;
  // The shell stops until the test has checked the sleep it started (a descendant while the shell
  // lives), then exits; the sleep stays in its group, holding the output pipe.
  absl::StatusOr<WorkerId> worker =
      supervisor.Spawn(Shell("sleep 1000 & echo $!; kill -STOP $$; exit 0"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<WorkerEvent> printed = PollUntil(supervisor, *worker, Kind::kOutput);
  ASSERT_FALSE(printed.empty());
  PollUntil(supervisor, *worker, Kind::kStopped);
  const pid_t grandchild = OwnPid(printed.back().line);
  ASSERT_GT(grandchild, 1);
  const int pidfd = PidfdOpen(grandchild);
  ASSERT_GE(pidfd, 0) << strerror(errno);

  ASSERT_TRUE(supervisor.Signal(*worker, SIGCONT).ok());
  const std::vector<WorkerEvent> events = PollUntilExit(supervisor, *worker);
  EXPECT_EQ(events.back().exit, WorkerExit::Exited(0));
  EXPECT_TRUE(EndsWithinBound(pidfd));
  close(pidfd);
}

TEST_F(PosixProcessSupervisorTest, ACommandThatCannotBeExecutedFailsTheSpawnWithTheReason) {
  PosixProcessSupervisor supervisor;
  WorkerSpec spec = Shell("", "rank 3");
  spec.argv = {"/nonexistent/tg-command"};
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(worker.status().message(),
            "cannot execute the command '/nonexistent/tg-command' for rank 3: ENOENT (No such file "
            "or directory)");
  EXPECT_TRUE(supervisor.Poll(absl::ZeroDuration()).empty());
}

TEST_F(PosixProcessSupervisorTest, ALogThatCannotBeOpenedFailsTheSpawn) {
  PosixProcessSupervisor supervisor;
  WorkerSpec spec = Shell("exit 0");
  spec.log_path = dir_.File("no-such-dir/rank-0.log");
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(worker.status().message(), HasSubstr(spec.log_path));
}

TEST_F(PosixProcessSupervisorTest, ThePidFileHoldsThePidAndMayBeWrittenAgainWhileItLives) {
  PosixProcessSupervisor supervisor;
  WorkerSpec spec = Shell("echo up; exec sleep 1000");
  spec.pid_file = dir_.File("rank-0");
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string expected = absl::StrCat(supervisor.pid(*worker), "\n");
  EXPECT_EQ(Env::Default()->ReadFileToString(spec.pid_file).value_or(""), expected);
  ASSERT_TRUE(supervisor.WritePidFile(*worker, dir_.File("rank-5")).ok());
  EXPECT_EQ(Env::Default()->ReadFileToString(dir_.File("rank-5")).value_or(""), expected);

  ASSERT_TRUE(supervisor.Signal(*worker, SIGKILL).ok());
  PollUntilExit(supervisor, *worker);
  EXPECT_EQ(supervisor.WritePidFile(*worker, dir_.File("rank-6")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Env::Default()->FileExists(dir_.File("rank-6")));
}

// An Env whose renames fail: the pid file never appears. It keeps the pid the temporary file held.
class FailingRenameEnv : public EnvWrapper {
 public:
  FailingRenameEnv() : EnvWrapper(Env::Default()) {}
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    int pid = 0;
    absl::StatusOr<std::string> text = target()->ReadFileToString(from);
    if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &pid)) pid_ = pid;
    return absl::ResourceExhaustedError(absl::StrCat("rename ", from, " -> ", to, ": full"));
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

TEST_F(PosixProcessSupervisorTest, AWorkerWhosePidFileCannotBeWrittenIsKilledAndReaped) {
  FailingRenameEnv env;
  PosixProcessSupervisorOptions options;
  options.env = &env;
  PosixProcessSupervisor supervisor(options);
  WorkerSpec spec = Shell("exec sleep 1000");
  spec.pid_file = dir_.File("rank-0");
  absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(Env::Default()->FileExists(spec.pid_file));
  // It was started, then killed and reaped before Spawn returned: no longer this test's child.
  ASSERT_GT(env.pid(), 1);
  EXPECT_EQ(waitpid(env.pid(), nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  EXPECT_TRUE(supervisor.Poll(absl::ZeroDuration()).empty());
}

TEST_F(PosixProcessSupervisorTest, TheDestructorKillsAndReapsTheLiveWorkers) {
  pid_t pid = -1;
  {
    PosixProcessSupervisor supervisor;
    absl::StatusOr<WorkerId> worker = supervisor.Spawn(Shell("exec sleep 1000"));
    ASSERT_TRUE(worker.ok()) << worker.status();
    pid = supervisor.pid(*worker);
  }
  ASSERT_GT(pid, 1);
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// PDEATHSIG: a worker dies with the process that spawned it, which here exits without a word (as
// a launcher killed with SIGKILL would). This test process is made the subreaper of its
// descendants for the test, so the orphaned worker becomes its child and its death is seen.
TEST_F(PosixProcessSupervisorTest, AWorkerIsKilledWhenItsSpawnerDies) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  struct SubreaperForTheTest {
    ~SubreaperForTheTest() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
  } subreaper;
  int pid_pipe[2];
  ASSERT_EQ(pipe2(pid_pipe, O_CLOEXEC), 0);
  const WorkerSpec spec = Shell("exec sleep 1000");
  const pid_t spawner = fork();
  ASSERT_GE(spawner, 0) << strerror(errno);
  if (spawner == 0) {
    PosixProcessSupervisor supervisor;
    absl::StatusOr<WorkerId> worker = supervisor.Spawn(spec);
    const pid_t pid = worker.ok() ? supervisor.pid(*worker) : -1;
    (void)!write(pid_pipe[1], &pid, sizeof(pid));
    _exit(0);  // no destructor: the supervisor does not kill it, PDEATHSIG must
  }
  close(pid_pipe[1]);
  pid_t worker = -1;
  pollfd readable = {pid_pipe[0], POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, static_cast<int>(absl::ToInt64Milliseconds(kBound))), 1);
  ASSERT_EQ(read(pid_pipe[0], &worker, sizeof(worker)), static_cast<ssize_t>(sizeof(worker)));
  close(pid_pipe[0]);
  ASSERT_GT(worker, 1);

  const int spawner_fd = PidfdOpen(spawner);
  ASSERT_GE(spawner_fd, 0) << strerror(errno);
  ASSERT_TRUE(EndsWithinBound(spawner_fd));
  close(spawner_fd);
  int status = 0;
  ASSERT_EQ(waitpid(spawner, &status, 0), spawner);  // it has ended: no wait
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  // Reaped, the spawner has handed its orphan to this process.
  const int worker_fd = PidfdOpen(worker);
  ASSERT_GE(worker_fd, 0) << strerror(errno);
  ASSERT_TRUE(EndsWithinBound(worker_fd));
  close(worker_fd);
  ASSERT_EQ(waitpid(worker, &status, 0), worker);  // it has ended: no wait
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

}  // namespace
}  // namespace trainguard
