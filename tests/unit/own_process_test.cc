// SignalOwnProcess (tests/support/own_process.h): the guard in front of every signal a test sends.
// The refusals are checked with signal 0, which only probes: a guard that wrongly let one through
// would harm nothing.
#include "tests/support/own_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(30);

TEST(SignalOwnProcess, RefusesMinusOneAndZeroWhichKillWouldTakeForEveryProcessOrTheGroup) {
  const absl::Status minus_one = SignalOwnProcess(-1, 0);
  EXPECT_EQ(minus_one.code(), absl::StatusCode::kInvalidArgument) << minus_one;
  EXPECT_THAT(minus_one.message(), HasSubstr("refusing to send signal 0 to pid -1"));
  EXPECT_THAT(minus_one.message(), HasSubstr("every process of the user"));
  const absl::Status zero = SignalOwnProcess(0, 0);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument) << zero;
  EXPECT_THAT(zero.message(), HasSubstr("the whole process group"));
  EXPECT_EQ(SignalOwnProcess(-12345, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SignalOwnProcess, RefusesAnAncestorAndInit) {
  const absl::Status parent = SignalOwnProcess(getppid(), 0);
  EXPECT_EQ(parent.code(), absl::StatusCode::kFailedPrecondition) << parent;
  EXPECT_THAT(parent.message(), HasSubstr(absl::StrCat("pid ", getppid(), " is not this test's")));
  EXPECT_EQ(SignalOwnProcess(1, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(OwnProcessIsRunning(getppid()));
}

TEST(SignalOwnProcess, KillsAChildWhichIsThenNotRunning) {
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    for (;;) pause();
  }
  EXPECT_TRUE(OwnProcessIsRunning(child));
  ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
  // Dead but not reaped, a zombie is still ours (signalling it is harmless) but no longer running.
  bool zombie = false;
  for (absl::Time end = absl::Now() + kDeadline; !zombie && absl::Now() < end;) {
    zombie = !OwnProcessIsRunning(child);
    if (!zombie) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(zombie);
  EXPECT_EQ(CheckOwnProcess(child), absl::OkStatus());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_FALSE(OwnProcessIsRunning(child));
}

TEST(SignalOwnProcess, SignalsAGrandchild) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    const pid_t grandchild = fork();
    if (grandchild == 0) {
      for (;;) pause();
    }
    if (write(pipe_fds[1], &grandchild, sizeof(grandchild)) != sizeof(grandchild)) _exit(2);
    int status = 0;
    waitpid(grandchild, &status, 0);
    _exit(WIFSIGNALED(status) ? 0 : 3);
  }
  close(pipe_fds[1]);
  pid_t grandchild = -1;
  ASSERT_EQ(read(pipe_fds[0], &grandchild, sizeof(grandchild)),
            static_cast<ssize_t>(sizeof(grandchild)));
  close(pipe_fds[0]);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(OwnProcessIsRunning(grandchild));
  ASSERT_EQ(SignalOwnProcess(grandchild, SIGKILL), absl::OkStatus());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the grandchild was not killed";
}

// A process whose parent died is reparented: no longer a descendant, it is recognised by the
// environment entry the test gave it (the launcher's ranks carry TRAINGUARD_RUN_DIR).
TEST(SignalOwnProcess, AcceptsAnOrphanOnlyByTheEnvironmentEntryItCarries) {
  const std::string entry = absl::StrCat("TG_OWN_PROCESS_TEST=", getpid(), "-orphan");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  std::string sleep_path = "/bin/sleep";
  std::string sleep_arg = "600";
  std::string env_entry = entry;
  char* argv[] = {sleep_path.data(), sleep_arg.data(), nullptr};
  char* envp[] = {env_entry.data(), nullptr};
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    const pid_t orphan = fork();
    if (orphan == 0) {
      close(pipe_fds[0]);
      close(pipe_fds[1]);
      execve(argv[0], argv, envp);
      _exit(127);
    }
    _exit(write(pipe_fds[1], &orphan, sizeof(orphan)) == sizeof(orphan) ? 0 : 2);
  }
  close(pipe_fds[1]);
  pid_t orphan = -1;
  ASSERT_EQ(read(pipe_fds[0], &orphan, sizeof(orphan)), static_cast<ssize_t>(sizeof(orphan)));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // the orphan's parent is gone
  ASSERT_GT(orphan, 0);

  // Bounded polling until the orphan has exec'd (its environment is then the entry alone).
  bool recognised = false;
  for (absl::Time end = absl::Now() + kDeadline; !recognised && absl::Now() < end;) {
    recognised = CheckOwnProcess(orphan, entry).ok();
    if (!recognised) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(recognised) << CheckOwnProcess(orphan, entry);
  const absl::Status without_entry = SignalOwnProcess(orphan, 0);
  EXPECT_EQ(without_entry.code(), absl::StatusCode::kFailedPrecondition) << without_entry;
  EXPECT_EQ(SignalOwnProcess(orphan, 0, "TG_OWN_PROCESS_TEST=another-test").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(OwnProcessIsRunning(orphan, entry));

  ASSERT_EQ(SignalOwnProcess(orphan, SIGKILL, entry), absl::OkStatus());
  // Its new parent reaps it (or leaves a zombie, whose environment is empty): either way it is no
  // longer running.
  bool gone = false;
  for (absl::Time end = absl::Now() + kDeadline; !gone && absl::Now() < end;) {
    gone = !OwnProcessIsRunning(orphan, entry);
    if (!gone) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(gone);
}

}  // namespace
}  // namespace trainguard::testing
