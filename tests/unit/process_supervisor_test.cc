// The ProcessSupervisor's contract (sdk/agent/process_supervisor.h) as a test double keeps it:
// WorkerExit's decoding and wording, and tests/support/fake_process_supervisor.h, which the
// decision tests drive: what it records, the events it hands over in order, never waiting.
#include "sdk/agent/process_supervisor.h"

#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fake_process_supervisor.h"

namespace trainguard {
namespace {

using testing::FakeProcessSupervisor;
using testing::FakeProcessSupervisorOptions;
using ::testing::IsEmpty;
using Kind = WorkerEvent::Kind;

TEST(WorkerExitTest, AWaitStatusIsDecodedToAnExitCodeOrASignal) {
  EXPECT_EQ(WorkerExit::FromWaitStatus(W_EXITCODE(0, 0)), WorkerExit::Exited(0));
  EXPECT_EQ(WorkerExit::FromWaitStatus(W_EXITCODE(3, 0)), WorkerExit::Exited(3));
  EXPECT_EQ(WorkerExit::FromWaitStatus(W_EXITCODE(0, SIGKILL)), WorkerExit::Killed(SIGKILL));
  EXPECT_EQ(WorkerExit::FromWaitStatus(W_EXITCODE(0, SIGSEGV) | WCOREFLAG),
            WorkerExit::Killed(SIGSEGV));
}

TEST(WorkerExitTest, OnlyAZeroExitSucceeds) {
  EXPECT_TRUE(WorkerExit::Exited(0).succeeded());
  EXPECT_FALSE(WorkerExit::Exited(1).succeeded());
  EXPECT_FALSE(WorkerExit::Killed(SIGTERM).succeeded());
}

TEST(WorkerExitTest, IsDescribedAsTheLauncherPrintsADeath) {
  EXPECT_EQ(WorkerExit::Exited(0).Describe(), "exited with status 0");
  EXPECT_EQ(WorkerExit::Exited(137).Describe(), "exited with status 137");
  EXPECT_EQ(WorkerExit::Killed(SIGKILL).Describe(), "killed by SIGKILL");
  EXPECT_EQ(WorkerExit::Killed(SIGSEGV).Describe(), "killed by SIGSEGV");
  EXPECT_EQ(WorkerExit::Killed(200).Describe(), "killed by SIG200");  // no such signal's name
}

WorkerSpec Spec(const std::string& label, const std::string& pid_file = "") {
  WorkerSpec spec;
  spec.label = label;
  spec.argv = {"trainer", "--steps=10"};
  spec.env = {"TRAINGUARD_RANK=0"};
  spec.log_path = "/run/logs/" + label + ".log";
  spec.pid_file = pid_file;
  return spec;
}

TEST(FakeProcessSupervisorTest, RecordsEverySpawnWithAPidAndItsPidFile) {
  FakeProcessSupervisor supervisor;
  absl::StatusOr<WorkerId> rank = supervisor.Spawn(Spec("rank 0", "/run/pids/rank-0"));
  absl::StatusOr<WorkerId> standby = supervisor.Spawn(Spec("standby 0"));
  ASSERT_TRUE(rank.ok() && standby.ok());
  EXPECT_NE(*rank, *standby);
  ASSERT_EQ(supervisor.spawned().size(), 2u);
  EXPECT_EQ(supervisor.spawned()[0].worker, *rank);
  EXPECT_EQ(supervisor.spawned()[0].spec.argv, Spec("rank 0").argv);
  EXPECT_EQ(supervisor.spawned()[1].spec.label, "standby 0");
  EXPECT_EQ(supervisor.pid(*rank), 1000);
  EXPECT_EQ(supervisor.pid(*standby), 1001);
  EXPECT_EQ(supervisor.pid(99), -1);
  EXPECT_EQ(supervisor.pid_files().at("/run/pids/rank-0"), 1000);
  // A standby that takes rank 1 gets its pid file.
  ASSERT_TRUE(supervisor.WritePidFile(*standby, "/run/pids/rank-1").ok());
  EXPECT_EQ(supervisor.pid_files().at("/run/pids/rank-1"), 1001);
}

TEST(FakeProcessSupervisorTest, AFailedSpawnStartsNothing) {
  FakeProcessSupervisor supervisor;
  supervisor.FailNextSpawn(absl::FailedPreconditionError("cannot execute the command"));
  EXPECT_EQ(supervisor.Spawn(Spec("rank 0")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(supervisor.spawned(), IsEmpty());
  EXPECT_TRUE(supervisor.Spawn(Spec("rank 0")).ok());  // only the next one failed
}

TEST(FakeProcessSupervisorTest, HandsOverWhatTheTestMadeHappenInOrderWithoutWaiting) {
  FakeProcessSupervisor supervisor;
  const WorkerId a = *supervisor.Spawn(Spec("rank 0"));
  const WorkerId b = *supervisor.Spawn(Spec("rank 1"));
  supervisor.Print(a, "step 1");
  supervisor.Stop(b);
  supervisor.Continue(b);
  supervisor.Print(a, "step 2");
  supervisor.Exit(a, WorkerExit::Exited(1));
  // An infinite timeout returns at once: the fake never waits.
  const std::vector<WorkerEvent> events = supervisor.Poll(absl::InfiniteDuration());
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].kind, Kind::kOutput);
  EXPECT_EQ(events[0].line, "step 1");
  EXPECT_EQ(events[1].kind, Kind::kStopped);
  EXPECT_EQ(events[1].worker, b);
  EXPECT_EQ(events[1].stop_signal, SIGSTOP);
  EXPECT_EQ(events[2].kind, Kind::kContinued);
  EXPECT_EQ(events[3].line, "step 2");
  EXPECT_EQ(events[4].kind, Kind::kExited);
  EXPECT_EQ(events[4].worker, a);
  EXPECT_EQ(events[4].exit, WorkerExit::Exited(1));
  EXPECT_THAT(supervisor.Poll(absl::InfiniteDuration()), IsEmpty());
}

TEST(FakeProcessSupervisorTest, IsStoppedFollowsStopsContinuesAndTheExit) {
  FakeProcessSupervisor supervisor;
  const WorkerId w = *supervisor.Spawn(Spec("rank 0"));
  EXPECT_FALSE(supervisor.IsStopped(w));
  supervisor.Stop(w);
  EXPECT_TRUE(supervisor.IsStopped(w));
  supervisor.Continue(w);
  EXPECT_FALSE(supervisor.IsStopped(w));
  supervisor.Stop(w);
  supervisor.Exit(w, WorkerExit::Killed(SIGKILL));
  EXPECT_FALSE(supervisor.IsStopped(w));
}

TEST(FakeProcessSupervisorTest, SignalsAreRecordedAndActOnlyWhenAsked) {
  FakeProcessSupervisor supervisor;
  const WorkerId w = *supervisor.Spawn(Spec("rank 0"));
  ASSERT_TRUE(supervisor.Signal(w, SIGKILL).ok());
  ASSERT_EQ(supervisor.signals().size(), 1u);
  EXPECT_EQ(supervisor.signals()[0].worker, w);
  EXPECT_EQ(supervisor.signals()[0].signal, SIGKILL);
  EXPECT_TRUE(supervisor.live(w));  // the test decides when and how it ends
  EXPECT_THAT(supervisor.Poll(absl::ZeroDuration()), IsEmpty());
}

TEST(FakeProcessSupervisorTest, ActingSignalsKillStopAndContinue) {
  FakeProcessSupervisorOptions options;
  options.signals_act = true;
  FakeProcessSupervisor supervisor(options);
  const WorkerId w = *supervisor.Spawn(Spec("rank 0"));
  ASSERT_TRUE(supervisor.Signal(w, SIGSTOP).ok());
  EXPECT_TRUE(supervisor.IsStopped(w));
  ASSERT_TRUE(supervisor.Signal(w, SIGCONT).ok());
  ASSERT_TRUE(supervisor.Signal(w, SIGKILL).ok());
  const std::vector<WorkerEvent> events = supervisor.Poll(absl::ZeroDuration());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, Kind::kStopped);
  EXPECT_EQ(events[1].kind, Kind::kContinued);
  EXPECT_EQ(events[2].kind, Kind::kExited);
  EXPECT_EQ(events[2].exit, WorkerExit::Killed(SIGKILL));
  EXPECT_FALSE(supervisor.live(w));
}

TEST(FakeProcessSupervisorTest, AnExitedWorkerIsNeverSignalledAndMayBeReleased) {
  FakeProcessSupervisor supervisor;
  const WorkerId w = *supervisor.Spawn(Spec("rank 0", "/run/pids/rank-0"));
  EXPECT_EQ(supervisor.Release(w).code(), absl::StatusCode::kFailedPrecondition);
  supervisor.Exit(w, WorkerExit::Exited(0));
  EXPECT_EQ(supervisor.Signal(w, SIGKILL).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(supervisor.signals(), IsEmpty());
  EXPECT_EQ(supervisor.WritePidFile(w, "/run/pids/rank-1").code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(supervisor.Release(w).ok());
  EXPECT_EQ(supervisor.pid(w), -1);
  EXPECT_EQ(supervisor.Signal(w, SIGKILL).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(supervisor.Release(w).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainguard
