// The one reader of /proc/<pid>/stat (sdk/core/proc_stat.h): the fields the launcher, the chaos
// tool, the fail-slow sampler and the tests rely on.
#include "sdk/core/proc_stat.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

TEST(ProcStat, FieldsAreCountedFromTheLastParenthesisSoACommandNameWithSpacesAndParensParses) {
  const std::string text =
      "4242 (a) b (c) R 17 4242 4242 0 -1 4194560 100 0 0 0 31 7 0 0 20 0 1 0 98765 1000 10 "
      "18446744073709551615\n";
  absl::StatusOr<ProcStat> stat = ParseProcStat(text, "test");
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_EQ(stat->state, 'R');
  EXPECT_EQ(stat->ppid, 17);
  EXPECT_EQ(stat->flags, 4194560u);
  EXPECT_FALSE(stat->io_worker());
  // 0x208050: PF_IO_WORKER (0x10) among the flags of an io_uring worker thread.
  EXPECT_TRUE(ParseProcStat("9 (iou-wrk-8) S 1 9 9 0 -1 2130000 0 0 0 0 0 0 0 0 20 0 1 0 5", "f")
                  ->io_worker());
  EXPECT_EQ(stat->utime_ticks, 31);
  EXPECT_EQ(stat->stime_ticks, 7);
  EXPECT_EQ(stat->cpu_ticks(), 38);
  EXPECT_EQ(stat->start_time_ticks, 98765u);
  EXPECT_FALSE(stat->stopped());
}

TEST(ProcStat, ATruncatedFileIsAnErrorNamingTheFileAndTheField) {
  absl::StatusOr<ProcStat> stat = ParseProcStat("12 (x) S 1 12 12 0 -1 4194560", "/proc/12/stat");
  ASSERT_FALSE(stat.ok());
  EXPECT_EQ(stat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(stat.status().message()), HasSubstr("/proc/12/stat"));
  EXPECT_THAT(std::string(stat.status().message()), HasSubstr("utime"));
  EXPECT_THAT(std::string(ParseProcStat("12 (x) S 1 12 12 0", "g").status().message()),
              HasSubstr("field 9 (flags)"));
  EXPECT_FALSE(ParseProcStat("12 x S 1", "f").ok());  // no ')' at all
}

TEST(ProcStat, ThisProcessReadsAsRunningWithItsParentAndAStartTime) {
  absl::StatusOr<ProcStat> self = ReadProcStat(getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(self->ppid, getppid());
  EXPECT_GT(self->start_time_ticks, 0u);
  EXPECT_FALSE(self->stopped());
  absl::StatusOr<ProcStat> thread = ReadThreadStat(gettid());
  ASSERT_TRUE(thread.ok()) << thread.status();
  EXPECT_EQ(thread->start_time_ticks, self->start_time_ticks);
}

TEST(ProcStat, AStoppedChildReadsAsStoppedAndAPidThatCannotExistIsNotFound) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  ASSERT_GT(child, 0);  // our own child: safe to signal
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  bool stopped = false;
  for (absl::Time end = absl::Now() + absl::Seconds(30); !stopped && absl::Now() < end;) {
    absl::StatusOr<ProcStat> stat = ReadProcStat(child);
    ASSERT_TRUE(stat.ok()) << stat.status();
    EXPECT_EQ(stat->ppid, getpid());
    stopped = stat->stopped();
    if (!stopped) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(stopped);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);

  long pid_max = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  ASSERT_GT(pid_max, 0);
  absl::StatusOr<ProcStat> none = ReadProcStat(static_cast<pid_t>(pid_max + 1));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_EQ(ReadProcStat(0).status().code(), absl::StatusCode::kInvalidArgument);
}

void IgnoreSignal(int) {}

TEST(ProcStat, TheCaughtSignalMaskShowsAHandlerOnceItIsInstalled) {
  const std::string status = absl::StrCat("/proc/", getpid(), "/status");
  struct sigaction old_action = {};
  ASSERT_EQ(sigaction(SIGURG, nullptr, &old_action), 0);
  absl::StatusOr<uint64_t> before = ReadStatusSignalMask(status, "SigCgt");
  ASSERT_TRUE(before.ok()) << before.status();
  struct sigaction action = {};
  action.sa_handler = IgnoreSignal;
  ASSERT_EQ(sigaction(SIGURG, &action, nullptr), 0);
  absl::StatusOr<uint64_t> after = ReadStatusSignalMask(status, "SigCgt");
  ASSERT_EQ(sigaction(SIGURG, &old_action, nullptr), 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*before >> (SIGURG - 1)) & 1, 0u);
  EXPECT_EQ((*after >> (SIGURG - 1)) & 1, 1u);
  EXPECT_EQ(ReadStatusSignalMask(status, "NoSuchField").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainguard
