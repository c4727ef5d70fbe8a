#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "tests/support/runtime_fixture.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class Guard : public testing::RuntimeTest {};

TEST_F(Guard, ASuccessfulStepContinuesWithItsDurationAndNoEvidence) {
  bool ran = false;
  StepResult r = guard(*rt_, 5, [&](Step& s) {
    ran = true;
    EXPECT_EQ(s.number(), 5);
    EXPECT_EQ(&s.runtime(), rt_.get());
    clock_.Advance(absl::Milliseconds(7));
  });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.fault, FaultKind::kNone);
  EXPECT_EQ(r.duration, absl::Milliseconds(7));
  EXPECT_TRUE(r.evidence.empty());
  EXPECT_TRUE(EventsOfType(EventType::kStepFault).empty());
}

TEST_F(Guard, ABodyWithoutTheStepHandleIsAccepted) {
  int calls = 0;
  EXPECT_TRUE(guard(*rt_, 0, [&] { ++calls; }).ok());
  EXPECT_EQ(calls, 1);
}

TEST_F(Guard, ARecoverableErrorIsAStepFailureToSkip) {
  StepResult r = guard(*rt_, 3, [] { throw RecoverableError("corrupt batch 17"); });
  EXPECT_EQ(r.fault, FaultKind::kStepFailure);
  EXPECT_EQ(r.action, StepAction::kSkip);
  EXPECT_TRUE(absl::IsAborted(r.status));
  EXPECT_EQ(r.status.message(), "rank 1 step 3: step_failure: corrupt batch 17");
  EXPECT_EQ(r.Evidence("exception_type"), "trainguard::RecoverableError");
  EXPECT_EQ(r.Evidence("what"), "corrupt batch 17");
}

TEST_F(Guard, ACommunicationErrorAsksForReRendezvousAndNamesThePeer) {
  StepResult r = guard(*rt_, 3, [] { throw CommunicationError("allreduce: connection reset", 2); });
  EXPECT_EQ(r.fault, FaultKind::kCommunicationFailure);
  EXPECT_EQ(r.action, StepAction::kReRendezvous);
  EXPECT_TRUE(absl::IsUnavailable(r.status));
  EXPECT_EQ(r.Evidence("peer"), "2");
}

TEST_F(Guard, AStickyDeviceErrorIsFatalAndRejectsEveryLaterStep) {
  StepResult r = guard(*rt_, 9, [] {
    ThrowCudaError(700, "cudaErrorIllegalAddress", "an illegal memory access was encountered",
                   "cudaStreamSynchronize(stream)", "train.cc", 42);
  });
  EXPECT_EQ(r.fault, FaultKind::kFatalDeviceError);
  EXPECT_EQ(r.action, StepAction::kFatal);
  EXPECT_EQ(r.Evidence("cuda_error"), "700");
  EXPECT_EQ(r.Evidence("sticky"), "true");
  EXPECT_THAT(r.Evidence("what"), HasSubstr("cudaStreamSynchronize(stream) failed at train.cc:42"));
  EXPECT_TRUE(rt_->fatal());

  bool ran = false;
  StepResult next = guard(*rt_, 10, [&] { ran = true; });
  EXPECT_FALSE(ran);
  EXPECT_EQ(next.fault, FaultKind::kUsageError);
  EXPECT_EQ(next.action, StepAction::kFatal);
  EXPECT_THAT(next.status.message(), HasSubstr("the runtime is fatal since step 9"));
}

TEST_F(Guard, ANonStickyDeviceErrorIsAStepFailure) {
  StepResult r = guard(*rt_, 1, [] {
    ThrowCudaError(2, "cudaErrorMemoryAllocation", "out of memory", "cudaMalloc(&p, n)", "a.cc", 1);
  });
  EXPECT_EQ(r.fault, FaultKind::kStepFailure);
  EXPECT_EQ(r.Evidence("sticky"), "false");
  EXPECT_FALSE(rt_->fatal());
}

TEST_F(Guard, NcclErrorsAreCommunicationFailuresExceptUnhandledCudaErrors) {
  StepResult remote = guard(
      *rt_, 1, [] { ThrowNcclError(6, "remote process exited", "ncclAllReduce(...)", "a.cc", 1); });
  EXPECT_EQ(remote.fault, FaultKind::kCommunicationFailure);
  EXPECT_EQ(remote.Evidence("nccl_error"), "6");
  StepResult cuda = guard(
      *rt_, 2, [] { ThrowNcclError(1, "unhandled cuda error", "ncclAllReduce(...)", "a.cc", 1); });
  EXPECT_EQ(cuda.fault, FaultKind::kFatalDeviceError);
}

TEST_F(Guard, AnUnknownStdExceptionIsUnclassifiedAndTreatedAsFatal) {
  StepResult r = guard(*rt_, 4, [] { throw std::out_of_range("vector::at"); });
  EXPECT_EQ(r.fault, FaultKind::kUnclassified);
  EXPECT_EQ(r.action, StepAction::kFatal);
  EXPECT_EQ(r.Evidence("exception_type"), "std::out_of_range");
  EXPECT_FALSE(rt_->fatal()) << "only a device fault poisons the runtime";
  EXPECT_TRUE(guard(*rt_, 5, [] {}).ok());
}

TEST_F(Guard, AThrownNonExceptionIsUnclassified) {
  StepResult r = guard(*rt_, 4, [] { throw 42; });
  EXPECT_EQ(r.fault, FaultKind::kUnclassified);
  EXPECT_THAT(r.Evidence("exception_type"), HasSubstr("not a std::exception"));
}

TEST_F(Guard, AReportedFaultFailsTheStepWithoutThrowing) {
  bool finished_body = false;
  StepResult r = guard(*rt_, 8, [&](Step& s) {
    s.ReportFault(FaultKind::kStepFailure, "loss is NaN");
    finished_body = true;
  });
  EXPECT_TRUE(finished_body);
  EXPECT_EQ(r.fault, FaultKind::kStepFailure);
  EXPECT_EQ(r.status.message(), "rank 1 step 8: step_failure: loss is NaN");
  EXPECT_EQ(r.Evidence("reported_message"), "loss is NaN");
}

// Losses that fall with noise, then one 20 times the level: that step fails naming rank, step and
// loss, is kept out of the reference, and training goes on; a NaN loss fails its step at once.
TEST_F(Guard, CheckLossFailsTheStepOfALossSpikeOrANonFiniteLossAndNamesIt) {
  auto loss_at = [](int64_t step) { return 2.0 / (1.0 + 0.01 * step) + 0.01 * (step % 5); };
  for (int64_t step = 0; step < 40; ++step) {
    StepResult r = guard(*rt_, step, [&](Step& s) { EXPECT_TRUE(s.CheckLoss(loss_at(step))); });
    ASSERT_TRUE(r.ok()) << r.status;
  }
  StepResult spike = guard(*rt_, 40, [&](Step& s) { EXPECT_FALSE(s.CheckLoss(20 * loss_at(40))); });
  EXPECT_EQ(spike.fault, FaultKind::kStepFailure);
  EXPECT_EQ(spike.action, StepAction::kSkip);
  EXPECT_THAT(spike.status.message(), HasSubstr("loss spike on rank 1 at step 40: loss 28.5714 is "));
  EXPECT_THAT(spike.status.message(), HasSubstr("scaled MADs above the median"));
  StepResult next = guard(*rt_, 41, [&](Step& s) { EXPECT_TRUE(s.CheckLoss(loss_at(41))); });
  EXPECT_TRUE(next.ok()) << "the spike did not become the reference: " << next.status;
  StepResult nan = guard(*rt_, 42, [&](Step& s) {
    EXPECT_FALSE(s.CheckLoss(std::numeric_limits<double>::quiet_NaN()));
  });
  EXPECT_EQ(nan.fault, FaultKind::kStepFailure);
  EXPECT_THAT(nan.status.message(), HasSubstr("loss is not finite (nan) on rank 1 at step 42"));
}

TEST_F(Guard, BeforeItsWarmUpCheckLossJudgesOnlyFiniteness) {
  for (int64_t step = 0; step < 5; ++step) {
    StepResult r = guard(*rt_, step, [&](Step& s) { EXPECT_TRUE(s.CheckLoss(step == 3 ? 1e6 : 1)); });
    EXPECT_TRUE(r.ok()) << r.status;
  }
  StepResult inf = guard(*rt_, 5, [&](Step& s) {
    EXPECT_FALSE(s.CheckLoss(std::numeric_limits<double>::infinity()));
  });
  EXPECT_EQ(inf.fault, FaultKind::kStepFailure);
}

TEST_F(Guard, TheMostSevereFaultOfAStepWins) {
  StepResult r = guard(*rt_, 8, [&](Step& s) {
    s.ReportFault(FaultKind::kStepFailure, "loss is NaN");
    throw CommunicationError("peer 3 closed the connection", 3);
  });
  EXPECT_EQ(r.fault, FaultKind::kCommunicationFailure);
  EXPECT_EQ(r.Evidence("reported_message"), "loss is NaN");
  EXPECT_EQ(r.Evidence("peer"), "3");
}

TEST_F(Guard, ANestedGuardIsRejectedWithoutRunningItsBody) {
  bool inner_ran = false;
  StepResult inner;
  StepResult outer = guard(*rt_, 1, [&] { inner = guard(*rt_, 2, [&] { inner_ran = true; }); });
  EXPECT_TRUE(outer.ok()) << outer.status;
  EXPECT_FALSE(inner_ran);
  EXPECT_EQ(inner.fault, FaultKind::kUsageError);
  EXPECT_TRUE(absl::IsFailedPrecondition(inner.status));
  EXPECT_THAT(inner.status.message(), HasSubstr("guards do not nest"));
  EXPECT_TRUE(guard(*rt_, 2, [] {}).ok()) << "the runtime recovers from the misuse";
}

TEST_F(Guard, AGuardOnAnotherThreadDuringAStepIsRejected) {
  Notification inside;
  Notification release;
  std::thread trainer([&] {
    guard(*rt_, 1, [&] {
      inside.Notify();
      ASSERT_TRUE(release.WaitForNotificationWithTimeout(absl::Seconds(30)));
    });
  });
  ASSERT_TRUE(inside.WaitForNotificationWithTimeout(absl::Seconds(30)));
  bool ran = false;
  StepResult r = guard(*rt_, 2, [&] { ran = true; });
  release.Notify();
  trainer.join();
  EXPECT_FALSE(ran);
  EXPECT_EQ(r.fault, FaultKind::kUsageError);
}

TEST_F(Guard, AFaultIsWrittenToTheEventFileWithItsEvidence) {
  guard(*rt_, 6, [] { throw RecoverableError("bad batch"); });
  std::vector<Event> faults = EventsOfType(EventType::kStepFault);
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].step, 6);
  EXPECT_EQ(faults[0].rank, 1);
  EXPECT_EQ(faults[0].Attribute("fault"), "step_failure");
  EXPECT_EQ(faults[0].Attribute("action"), "skip");
  EXPECT_EQ(faults[0].Attribute("what"), "bad batch");
  EXPECT_THAT(faults[0].message, StartsWith("rank 1 step 6"));
}

TEST_F(Guard, TheHeartbeatBeatsOnEntryAndExit) {
  const HeartbeatSnapshot before = rt_->heartbeat().Read();
  HeartbeatSnapshot inside;
  clock_.Advance(absl::Seconds(1));
  guard(*rt_, 11, [&] {
    inside = rt_->heartbeat().Read();
    clock_.Advance(absl::Milliseconds(250));
  });
  const HeartbeatSnapshot after = rt_->heartbeat().Read();
  EXPECT_EQ(inside.beats, before.beats + 1);
  EXPECT_TRUE(inside.in_step);
  EXPECT_EQ(inside.step, 11);
  EXPECT_EQ(inside.last_beat_ns, absl::ToInt64Nanoseconds(absl::Seconds(1)));
  EXPECT_EQ(after.beats, before.beats + 2);
  EXPECT_FALSE(after.in_step);
  EXPECT_EQ(after.steps_completed, before.steps_completed + 1);
  EXPECT_EQ(after.last_step_duration_ns, absl::ToInt64Nanoseconds(absl::Milliseconds(250)));
}

class RecordingObserver : public StepObserver {
 public:
  void OnStepBegin(int64_t step) override { log += "begin " + std::to_string(step) + ";"; }
  void OnStepEnd(const StepResult& r) override {
    log += "end " + std::to_string(r.step) + " " + std::string(FaultKindName(r.fault)) + ";";
  }
  std::string log;
};

TEST_F(Guard, ObserversSeeEveryStepBoundaryWithItsResult) {
  RecordingObserver observer;
  rt_->AddObserver(&observer);
  guard(*rt_, 1, [] {});
  guard(*rt_, 2, [] { throw RecoverableError("x"); });
  EXPECT_EQ(observer.log, "begin 1;end 1 none;begin 2;end 2 step_failure;");
}

TEST_F(Guard, StepScopeRecordsWhatItsOwnerCatches) {
  StepScope scope(*rt_, 3);
  ASSERT_TRUE(scope.active());
  try {
    throw CommunicationError("timeout");
  } catch (...) {
    scope.RecordException(std::current_exception());
  }
  StepResult r = scope.Finish();
  EXPECT_EQ(r.fault, FaultKind::kCommunicationFailure);
  StepResult again = scope.Finish();
  EXPECT_EQ(again.fault, FaultKind::kUsageError);
  EXPECT_THAT(again.status.message(), HasSubstr("Finish() called twice"));
}

TEST_F(Guard, AStepScopeLeftByAnUnrecordedExceptionIsReportedInTheEventFile) {
  try {
    StepScope scope(*rt_, 4);
    throw std::runtime_error("escaped");
  } catch (const std::runtime_error&) {
  }
  std::vector<Event> faults = EventsOfType(EventType::kStepFault);
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].step, 4);
  EXPECT_EQ(faults[0].Attribute("fault"), "unclassified");
  EXPECT_TRUE(guard(*rt_, 5, [] {}).ok()) << "the scope released the runtime";
}

TEST_F(Guard, AStepScopeNeverFinishedIsFinishedByItsDestructor) {
  { StepScope scope(*rt_, 4); }
  EXPECT_EQ(rt_->heartbeat().Read().steps_completed, 1);
  EXPECT_TRUE(guard(*rt_, 5, [] {}).ok());
}

}  // namespace
}  // namespace trainguard
