#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/runtime_fixture.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

class RuntimeRecovery : public testing::RuntimeTest {
 protected:
  StepResult Failed(int64_t step, StepAction action, FaultKind fault) {
    StepResult r;
    r.step = step;
    r.action = action;
    r.fault = fault;
    r.status = absl::AbortedError("boom");
    return r;
  }
};

TEST(RuntimeCreate, InvalidOptionsAreRejectedNamingTheField) {
  TempDir dir;
  Options options;
  options.run_dir = dir.path();
  options.rank = 4;
  options.world_size = 4;
  auto rt = Runtime::Create(options);
  EXPECT_TRUE(absl::IsInvalidArgument(rt.status())) << rt.status();
  EXPECT_THAT(rt.status().message(), HasSubstr("rank"));
}

TEST(RuntimeCreate, AnUnusableRunDirIsAnErrorNamingTheRankAndPath) {
  TempDir dir;
  ASSERT_TRUE((*Env::Default()->NewWritableFile(dir.File("file")))->Close().ok());
  Options options;
  options.run_dir = dir.File("file");  // a regular file: no events/ can be made under it
  auto rt = Runtime::Create(options);
  EXPECT_FALSE(rt.ok());
  EXPECT_THAT(rt.status().message(), HasSubstr("rank 0: opening the event file"));
  EXPECT_THAT(rt.status().message(), HasSubstr(dir.File("file")));
}

TEST(RuntimeCreate, StartAndStopAreRecordedAndARestartAppends) {
  TempDir dir;
  Options options;
  options.run_dir = dir.path();
  options.world_size = 8;
  options.tp = 2;
  options.rank = 0;
  for (int run = 0; run < 2; ++run) {
    auto rt = Runtime::Create(options);
    ASSERT_TRUE(rt.ok()) << rt.status();
    EXPECT_EQ((*rt)->topology().dp(), 4);
    EXPECT_EQ((*rt)->run_dir(), dir.path());
  }
  auto contents = ReadEventLog(Env::Default(), EventLogPath(dir.path(), 0));
  ASSERT_TRUE(contents.ok());
  ASSERT_EQ(contents->events.size(), 4u);
  EXPECT_EQ(contents->events[0].type, EventType::kRuntimeStarted);
  EXPECT_EQ(contents->events[0].Attribute("topology"), "world=8 tp=2 cp=1 dp=4 pp=1 hosts=1x8");
  EXPECT_EQ(contents->events[1].type, EventType::kRuntimeStopped);
  EXPECT_EQ(contents->events[2].type, EventType::kRuntimeStarted);
}

TEST_F(RuntimeRecovery, CustomEventsGetTheRankGenerationAndTime) {
  clock_.Advance(absl::Seconds(5));
  Event e;
  e.message = "data loader restarted";
  ASSERT_TRUE(rt_->EmitEvent(e).ok());
  std::vector<Event> custom = EventsOfType(EventType::kCustom);
  ASSERT_EQ(custom.size(), 1u);
  EXPECT_EQ(custom[0].rank, 1);
  EXPECT_EQ(custom[0].generation, 0);
  EXPECT_EQ(custom[0].time, absl::UnixEpoch() + absl::Seconds(5));
}

TEST_F(RuntimeRecovery, ASuccessfulStepResumesAtTheNextStep) {
  StepResult ok;
  ok.step = 7;
  EXPECT_EQ(*rt_->recover(ok), 8);
}

TEST_F(RuntimeRecovery, AFailedStepIsSkippedUntilTooManyFailInARow) {
  for (int64_t step = 10; step < 13; ++step) {
    auto next = rt_->recover(Failed(step, StepAction::kSkip, FaultKind::kStepFailure));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(*next, step + 1);
  }
  auto give_up = rt_->recover(Failed(13, StepAction::kSkip, FaultKind::kStepFailure));
  EXPECT_TRUE(absl::IsFailedPrecondition(give_up.status()));
  EXPECT_THAT(give_up.status().message(),
              HasSubstr("rank 1: 4 consecutive steps failed (limit 3: "
                        "max_consecutive_step_failures), the last at step 13"));
  std::vector<Event> decisions = EventsOfType(EventType::kRecoveryDecision);
  ASSERT_EQ(decisions.size(), 4u);
  EXPECT_EQ(decisions[0].Attribute("decision"), "skip");
  EXPECT_EQ(decisions[0].Attribute("next_step"), "11");
  EXPECT_EQ(decisions[3].Attribute("decision"), "give_up");
}

TEST_F(RuntimeRecovery, ASuccessResetsTheConsecutiveFailureCount) {
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(rt_->recover(Failed(i, StepAction::kSkip, FaultKind::kStepFailure)).ok());
    }
    StepResult ok;
    ok.step = 3;
    ASSERT_TRUE(rt_->recover(ok).ok());
  }
}

TEST_F(RuntimeRecovery, ASuccessfulGuardedStepResetsTheConsecutiveFailureCount) {
  // README's loop calls recover() only for failed steps: the guard's success must reset the count.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 3; ++i) {
      auto next = rt_->recover(Failed(10 * round + i, StepAction::kSkip, FaultKind::kStepFailure));
      ASSERT_TRUE(next.ok()) << "round " << round << ": " << next.status();
    }
    ASSERT_TRUE(guard(*rt_, 10 * round + 3, [] {}).ok());
  }
}

TEST_F(RuntimeRecovery, RollbackIsUnavailableUntilCheckpointingExists) {
  auto next = rt_->recover(Failed(5, StepAction::kRollback, FaultKind::kStepFailure));
  EXPECT_TRUE(absl::IsUnimplemented(next.status()));
  EXPECT_THAT(next.status().message(), HasSubstr("checkpoint"));
}

TEST_F(RuntimeRecovery, ReRendezvousIsUnavailableUntilRendezvousExists) {
  auto next = rt_->recover(Failed(5, StepAction::kReRendezvous, FaultKind::kCommunicationFailure));
  EXPECT_TRUE(absl::IsUnavailable(next.status()));
  EXPECT_THAT(next.status().message(), HasSubstr("rank 1 step 5"));
}

TEST_F(RuntimeRecovery, AFatalResultReturnsItsOwnStatus) {
  StepResult r = guard(*rt_, 2, [] {
    ThrowCudaError(719, "cudaErrorLaunchFailure", "unspecified launch failure", "k<<<>>>", "a.cu",
                   3);
  });
  auto next = rt_->recover(r);
  EXPECT_EQ(next.status(), r.status);
  EXPECT_TRUE(rt_->fatal());
}

}  // namespace
}  // namespace trainguard
