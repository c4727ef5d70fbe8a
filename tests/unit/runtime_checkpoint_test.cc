// The guard's checkpoint policy and Runtime::recover()'s rollback, in a single-rank static job:
// NaN written into the model, then a rollback that restores the last committed state.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/runtime/runtime_impl.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

class RuntimeCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.job_id = absl::StrCat("rt-ckpt-", getpid(), "-", ++counter_);
    options_.run_dir = dir_.path();
    options_.checkpoint_every_steps = 10;
    options_.max_consecutive_step_failures = 1;
    ASSERT_NO_FATAL_FAILURE(CreateRuntime());
  }

  // (Re)creates the runtime from options_, its state registered (a restarted process).
  void CreateRuntime() {
    rt_.reset();
    absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(options_);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = *std::move(rt);
    ASSERT_TRUE(rt_->state()
                    .Register({"w",
                               "model",
                               weights_.data(),
                               weights_.size() * sizeof(float),
                               DType::kF32,
                               {static_cast<int64_t>(weights_.size())},
                               {}})
                    .ok());
  }

  // README's loop from `start` to `end`, step `poison_at` writing NaN into the model every time it
  // runs. Returns recover()'s error, or OK when `end` was reached; counts the restores.
  absl::Status RunLoop(int64_t start, int64_t end, int64_t poison_at) {
    for (int64_t step = start; step < end;) {
      StepResult r = Train(step, step == poison_at);
      // These steps take microseconds; a real one outlasts the save (see the first test).
      if (RuntimeImpl::Of(*rt_).checkpointer() != nullptr) {
        EXPECT_TRUE(RuntimeImpl::Of(*rt_).checkpointer()->WaitIdle(absl::Seconds(30)).ok());
      }
      if (r.ok()) {
        ++step;
        continue;
      }
      absl::StatusOr<int64_t> next = rt_->recover(r);
      if (!next.ok()) return next.status();
      step = *next;
    }
    return absl::OkStatus();
  }

  int Restores() {
    int n = 0;
    for (const Event& e : CheckpointEvents()) n += KindOf(e) == EventKind::kRestored ? 1 : 0;
    return n;
  }
  void TearDown() override {
    rt_.reset();
    (void)Snapshotter::RemoveArena(options_.job_id, 0);
  }

  // A step that adds 1 to every weight, or writes NaN into weight 7 when `poison`.
  StepResult Train(int64_t step, bool poison = false) {
    return guard(*rt_, step, [&](Step& s) {
      for (float& w : weights_) w += 1.0f;
      if (poison) weights_[7] = std::numeric_limits<float>::quiet_NaN();
      if (std::isnan(weights_[7])) s.ReportFault(FaultKind::kStepFailure, "weight 7 is NaN");
    });
  }

  std::vector<Event> CheckpointEvents() {
    absl::StatusOr<EventLogContents> log =
        ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 0));
    std::vector<Event> out;
    if (!log.ok()) return out;
    for (const Event& e : log->events) {
      if (e.type == EventType::kCheckpoint) out.push_back(e);
    }
    return out;
  }

  static inline int counter_ = 0;
  testing::TempDir dir_;
  Options options_;
  std::unique_ptr<Runtime> rt_;
  std::vector<float> weights_ = std::vector<float>(5000, 0.0f);
};

TEST_F(RuntimeCheckpointTest, AfterANanTheRollbackRestoresTheLastCommittedStepAndTrainingReplays) {
  for (int64_t step = 0; step < 25; ++step) {
    ASSERT_TRUE(Train(step).ok());
    // These steps take microseconds; a real one outlasts the save (a save still in flight when
    // the next is due is skipped, and the event file says so).
    if (RuntimeImpl::Of(*rt_).checkpointer() != nullptr) {
      ASSERT_TRUE(RuntimeImpl::Of(*rt_).checkpointer()->WaitIdle(absl::Seconds(30)).ok());
    }
  }
  // Snapshots were taken after steps 9 and 19 (tagged 10 and 20) and committed.
  absl::StatusOr<std::vector<int64_t>> committed =
      RuntimeImpl::Of(*rt_).checkpointer()->CommittedSteps();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_THAT(*committed, ::testing::Contains(20));

  // NaN is written into the model; the step fails, stays failed, and the skip budget runs out.
  StepResult r = Train(25, /*poison=*/true);
  ASSERT_FALSE(r.ok());
  absl::StatusOr<int64_t> next = rt_->recover(r);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 26);  // the first failure is skipped
  r = Train(26);
  ASSERT_FALSE(r.ok());
  next = rt_->recover(r);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 20) << "the second consecutive failure rolls back to the committed step 20";
  EXPECT_EQ(rt_->last_restore_source(), "arena");
  for (float w : weights_) ASSERT_EQ(w, 20.0f);

  // Replaying from step 20 reaches the state an uninterrupted run has.
  for (int64_t step = 20; step < 30; ++step) ASSERT_TRUE(Train(step).ok());
  for (float w : weights_) ASSERT_EQ(w, 30.0f);

  bool restored = false;
  for (const Event& e : CheckpointEvents()) {
    restored |= KindOf(e) == EventKind::kRestored && e.step == 20;
  }
  EXPECT_TRUE(restored);
}

TEST_F(RuntimeCheckpointTest, AnExplicitRollbackWithoutACommittedStepIsAnErrorNotAGuess) {
  ASSERT_TRUE(Train(0).ok());
  StepResult r;
  r.step = 1;
  r.action = StepAction::kRollback;
  r.fault = FaultKind::kStepFailure;
  r.status = absl::InternalError("loss spiked");
  absl::StatusOr<int64_t> next = rt_->recover(r);
  // Nothing to go back to: the job cannot go on (a new generation would start from scratch).
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("no committed checkpoint"));
}

// A snapshot of the layout before a late buffer could no longer be restored into the registry.
TEST_F(RuntimeCheckpointTest, ABufferRegisteredAfterTheFirstSnapshotIsRefusedNamingIt) {
  std::vector<float> late(16, 0.0f);
  const StateBuffer buffer{"late", "model", late.data(), late.size() * sizeof(float),
                           DType::kF32, {16}, {}};
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());  // step 9 snapshots
  absl::Status s = rt_->state().Register(buffer);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("state buffer \"late\": registered after the first checkpoint"));
  EXPECT_EQ(rt_->state().buffers().size(), 1u);
  EXPECT_TRUE(rt_->state().SetBlob("new-blob", "still fine").ok());
}

// A rerun of the job with another model: its arena holds state of another layout, which must be
// neither restored nor lost; Start() fails naming both layouts instead of beginning at step 0.
TEST_F(RuntimeCheckpointTest, ARerunWithAnotherModelFailsNamingBothLayoutsAndKeepsTheOldState) {
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());  // step 9 snapshots
  ASSERT_TRUE(rt_->WaitForCheckpoints(absl::Seconds(30)).ok());
  const uint64_t old_layout = rt_->state().LayoutHash();
  rt_.reset();
  absl::StatusOr<std::unique_ptr<Runtime>> rerun = Runtime::Create(options_);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  std::vector<float> bigger(6000, 0.0f);
  ASSERT_TRUE((*rerun)->state()
                  .Register({"w", "model", bigger.data(), bigger.size() * sizeof(float),
                             DType::kF32, {6000}, {}})
                  .ok());
  absl::StatusOr<int64_t> start = (*rerun)->Start();
  EXPECT_TRUE(absl::IsFailedPrecondition(start.status())) << start.status();
  EXPECT_THAT(std::string(start.status().message()),
              HasSubstr(absl::StrFormat("holds the state of layout hash %016x", old_layout)));
  EXPECT_THAT(std::string(start.status().message()), HasSubstr("1 buffers, 24000 bytes: w"));
  rerun->reset();
  ASSERT_NO_FATAL_FAILURE(CreateRuntime());  // the original model restores its step
  absl::StatusOr<int64_t> resumed = rt_->Start();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, 10);
}

// The policy's question without its side effect: checkpoint_every_steps 10 saves after step 9, 19...
TEST_F(RuntimeCheckpointTest, CheckpointDueAfterAnswersThePolicyWithoutCheckpointing) {
  EXPECT_FALSE(rt_->CheckpointDueAfter(0));
  EXPECT_FALSE(rt_->CheckpointDueAfter(8));
  EXPECT_TRUE(rt_->CheckpointDueAfter(9));
  EXPECT_TRUE(rt_->CheckpointDueAfter(19));
  EXPECT_EQ(RuntimeImpl::Of(*rt_).checkpointer(), nullptr);  // asking saved nothing
}

// Two unrelated runs under the default id would share one arena and run dir.
TEST_F(RuntimeCheckpointTest, ARuntimeThatCheckpointsRefusesTheDefaultJobId) {
  Options o = options_;
  o.job_id = Options().job_id;
  absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(rt.status())) << rt.status();
  EXPECT_THAT(std::string(rt.status().message()), HasSubstr("job_id is not set"));
  o.checkpoint_every_steps = 0;  // nothing kept between runs: the default is fine
  EXPECT_TRUE(Runtime::Create(o).ok());
}

TEST_F(RuntimeCheckpointTest, TheGuardFencesTheSnapshotSoTheNextStepCannotTearIt) {
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());
  // Step 9 started a snapshot (tagged 10); step 10's body overwrites every weight at once. The
  // snapshot must still hold the values after step 9.
  ASSERT_TRUE(Train(10).ok());
  ASSERT_TRUE(RuntimeImpl::Of(*rt_).checkpointer()->WaitIdle(absl::Seconds(30)).ok());
  std::fill(weights_.begin(), weights_.end(), -1.0f);
  absl::StatusOr<int64_t> step = rt_->RestoreCheckpoint();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  for (float w : weights_) ASSERT_EQ(w, 10.0f);
}

TEST_F(RuntimeCheckpointTest, FencingARegisteredBufferLetsTheTrainerWriteItBeforeTheNextGuard) {
  EXPECT_TRUE(absl::IsNotFound(rt_->FenceStateBuffer("no-such-buffer", absl::Seconds(1))));
  EXPECT_TRUE(rt_->FenceStateBuffer("w", absl::Seconds(1)).ok());  // nothing in flight yet
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());
  // Step 9 started a snapshot (tagged 10). Outside any guard, the trainer fences "w" and then
  // overwrites it: the snapshot still holds the values after step 9.
  ASSERT_TRUE(rt_->FenceStateBuffer("w", absl::Seconds(30)).ok());
  std::fill(weights_.begin(), weights_.end(), -1.0f);
  ASSERT_TRUE(RuntimeImpl::Of(*rt_).checkpointer()->WaitIdle(absl::Seconds(30)).ok());
  absl::StatusOr<int64_t> step = rt_->RestoreCheckpoint();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 10);
  for (float w : weights_) ASSERT_EQ(w, 10.0f);
}

TEST_F(RuntimeCheckpointTest, Sigusr2DumpsTheFlightRecorderAndEveryThreadsStack) {
  ASSERT_TRUE(Train(0).ok());
  ASSERT_EQ(raise(SIGUSR2), 0);
  const std::string dump = dir_.File("flight_recorder/rank-00000.1.pb");
  for (int i = 0; i < 1000 && !std::filesystem::exists(dump); ++i) {
    absl::SleepFor(absl::Milliseconds(10));  // bounded polling: at most 10 s
  }
  ASSERT_TRUE(std::filesystem::exists(dump));
  absl::StatusOr<FlightRecorderDump> read = ReadFlightRecorderDump(dump);
  ASSERT_TRUE(read.ok()) << read.status();
  bool has_stacks = false;
  for (const auto& [key, value] : read->evidence) {
    has_stacks |= key == "stacks" && !value.empty();
  }
  EXPECT_TRUE(has_stacks);
  // The guarded step is in the ring (as the watchdog's "step" phase).
  bool step_seen = false;
  for (const FlightRecord& r : read->contents.records) {
    step_seen |= r.type == FlightRecordType::kPhaseBegin && r.Name() == "step";
  }
  EXPECT_TRUE(step_seen);
  // The rank's event file names the dump (the event follows the file: bounded polling, 10 s).
  std::string named;
  for (int i = 0; i < 1000 && named.empty(); ++i) {
    absl::StatusOr<EventLogContents> log =
        ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 0));
    if (log.ok()) {
      for (const Event& e : log->events) {
        if (KindOf(e) == EventKind::kEvidenceDumped) named = std::string(e.Attribute("dump"));
      }
    }
    if (named.empty()) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(named, dump);
}

TEST_F(RuntimeCheckpointTest, ADumpKeepsTheDumpAnEarlierProcessOfTheRankWrote) {
  // An earlier process of rank 0 (replaced, or on another host sharing the run dir) left its
  // first dump; this process's first dump is the next number, and the earlier one is intact.
  const std::string earlier = dir_.File("flight_recorder/rank-00000.1.pb");
  std::filesystem::create_directories(dir_.File("flight_recorder"));
  FlightRecorderContents contents;
  contents.segment = "earlier";
  ASSERT_TRUE(
      WriteFlightRecorderDump(contents, 0, {{"reason", "the earlier process's hang"}}, earlier)
          .ok());
  ASSERT_TRUE(Train(0).ok());
  ASSERT_EQ(raise(SIGUSR2), 0);
  const std::string dump = dir_.File("flight_recorder/rank-00000.2.pb");
  for (int i = 0; i < 1000 && !std::filesystem::exists(dump); ++i) {
    absl::SleepFor(absl::Milliseconds(10));  // bounded polling: at most 10 s
  }
  ASSERT_TRUE(std::filesystem::exists(dump));
  absl::StatusOr<FlightRecorderDump> read = ReadFlightRecorderDump(earlier);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->contents.segment, "earlier");
  absl::StatusOr<FlightRecorderDump> mine = ReadFlightRecorderDump(dump);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_NE(mine->contents.segment, "earlier");
}

TEST_F(RuntimeCheckpointTest, AFaultThatRecursAfterRollbackStopsTheJobNamingTheStepAndTheLimit) {
  // Step 25 corrupts the model every time it runs (a bad batch, a diverging update): step 26 then
  // fails too, the skip budget (1) runs out and the job rolls back to step 20; the replay reaches
  // step 25 again and fails the same way.
  absl::Status stopped = RunLoop(0, 100, /*poison_at=*/25);
  EXPECT_TRUE(absl::IsFailedPrecondition(stopped)) << stopped;
  EXPECT_EQ(std::string(stopped.message()),
            "rank 0: step 26 failed again after 1 rollback(s) to step 20 (limit 1: "
            "max_rollbacks_per_step): the fault recurs after rollback, so the job stops; last "
            "fault: rank 0 step 26: step_failure: weight 7 is NaN");
  // One rollback replayed; the second restore is the one after which the job stopped.
  EXPECT_EQ(Restores(), 2);
  absl::StatusOr<EventLogContents> log = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), 0));
  ASSERT_TRUE(log.ok());
  const Event& last = log->events.back();
  EXPECT_EQ(last.type, EventType::kRecoveryDecision);
  EXPECT_EQ(last.Attribute("decision"), "give_up");
  EXPECT_EQ(last.Attribute("job_stop"), "true");
}

TEST_F(RuntimeCheckpointTest, MoreRollbacksPerStepAreAllowedWhenConfigured) {
  options_.max_rollbacks_per_step = 3;
  ASSERT_NO_FATAL_FAILURE(CreateRuntime());
  absl::Status stopped = RunLoop(0, 100, /*poison_at=*/25);
  EXPECT_TRUE(absl::IsFailedPrecondition(stopped)) << stopped;
  EXPECT_THAT(std::string(stopped.message()),
              HasSubstr("failed again after 3 rollback(s) to step 20 (limit 3"));
  EXPECT_EQ(Restores(), 4);
}

TEST_F(RuntimeCheckpointTest, AReplayThatGetsPastTheFailedStepForgetsTheRollback) {
  ASSERT_TRUE(RunLoop(0, 25, /*poison_at=*/-1).ok());
  // A transient fault: steps 25 and 26 fail once, the job rolls back to 20 and the replay passes.
  ASSERT_TRUE(rt_->recover(Train(25, /*poison=*/true)).ok());
  absl::StatusOr<int64_t> next = rt_->recover(Train(26));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(*next, 20);
  ASSERT_TRUE(RunLoop(20, 28, /*poison_at=*/-1).ok());
  // Another transient fault before the next commit rolls back to step 20 again: it is a new fault,
  // not the old one recurring.
  ASSERT_TRUE(rt_->recover(Train(28, /*poison=*/true)).ok());
  next = rt_->recover(Train(29));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 20);
}

TEST_F(RuntimeCheckpointTest,
       WithRepeatedFaultActionSkipTheBatchesUpToTheFailedStepAreSkippedOnce) {
  options_.repeated_fault_action = "skip";
  ASSERT_NO_FATAL_FAILURE(CreateRuntime());
  // The rollback replays into the fault; the second time the job resumes after step 25, where the
  // failures began, with the state committed at step 20: batches 20..25 are skipped.
  struct Decisions : StepObserver {
    void OnStepBegin(int64_t) override {}
    void OnStepEnd(const StepResult&) override {}
    void OnRecovery(const RecoveryReport& report) override { seen.push_back(report); }
    std::vector<RecoveryReport> seen;
  } decisions;
  rt_->AddObserver(&decisions);
  ASSERT_TRUE(RunLoop(0, 27, /*poison_at=*/25).ok());
  ASSERT_FALSE(decisions.seen.empty());
  const RecoveryReport& skip = decisions.seen.back();
  EXPECT_EQ(skip.decision, "skip_batches");
  EXPECT_EQ(skip.failed_step, 26);
  EXPECT_EQ(skip.next_step, 26);
  EXPECT_EQ(skip.restored_from, "arena");
  // Step 26 ran once on the state committed at step 20, and training goes on.
  for (float w : weights_) ASSERT_EQ(w, 21.0f);
  ASSERT_TRUE(RunLoop(27, 40, /*poison_at=*/-1).ok());
  for (float w : weights_) ASSERT_EQ(w, 34.0f);
}

TEST_F(RuntimeCheckpointTest, WithRepeatedFaultActionSkipAFaultThatRecursAfterTheSkipStopsTheJob) {
  options_.repeated_fault_action = "skip";
  ASSERT_NO_FATAL_FAILURE(CreateRuntime());
  // The model is corrupted at 25 and, after the skip, at 27: skipping did not cure it.
  ASSERT_TRUE(RunLoop(0, 27, /*poison_at=*/25).ok());
  absl::Status stopped = RunLoop(27, 100, /*poison_at=*/27);
  EXPECT_TRUE(absl::IsFailedPrecondition(stopped)) << stopped;
  EXPECT_THAT(std::string(stopped.message()),
              HasSubstr("rank 0: step 28 failed again after 2 rollback(s) to step 20 (limit 1: "
                        "max_rollbacks_per_step; the batches up to the first failed step were "
                        "skipped)"));
  EXPECT_EQ(Restores(), 3);
}

TEST_F(RuntimeCheckpointTest, StartRestoresTheNewestCommittedStepOfARestartedRank) {
  ASSERT_TRUE(RunLoop(0, 25, /*poison_at=*/-1).ok());
  std::fill(weights_.begin(), weights_.end(), -1.0f);
  ASSERT_NO_FATAL_FAILURE(CreateRuntime());  // the process restarts
  absl::StatusOr<int64_t> start = rt_->Start();
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(*start, 20);
  EXPECT_EQ(rt_->resume_step(), 20);
  for (float w : weights_) ASSERT_EQ(w, 20.0f);
  EXPECT_TRUE(absl::IsFailedPrecondition(rt_->Start().status()));  // once
}

TEST_F(RuntimeCheckpointTest, StartWithNothingCommittedBeginsAtStepZero) {
  absl::StatusOr<int64_t> start = rt_->Start();
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(*start, 0);
  EXPECT_EQ(rt_->communicator(), nullptr);  // no factory: the trainer's own communicators
  // Issue 40, 10: a fresh start is not a failed restore, and its event does not say it is.
  std::vector<EventKind> kinds;
  for (const Event& e : CheckpointEvents()) {
    if (std::optional<EventKind> kind = KindOf(e); kind.has_value()) kinds.push_back(*kind);
  }
  EXPECT_THAT(kinds, ::testing::Contains(EventKind::kNothingToRestore));
  EXPECT_THAT(kinds, ::testing::Not(::testing::Contains(EventKind::kRestoreFailed)));
}

// Issue 40: the loss-spike detector's window is part of the checkpoint. A rank restarted from the
// snapshot of step 20 (or rolled back to it) judges step 22's spike as the uninterrupted run does;
// with an empty window it would still be warming up (20 losses) and let the spike through.
class LossWindowCheckpointTest : public RuntimeCheckpointTest {
 protected:
  // A guarded step that judges `loss` and, when `fail`, fails afterwards; whether it succeeded.
  StepResult LossStep(int64_t step, double loss, bool fail = false) {
    StepResult r = guard(*rt_, step, [&](Step& s) {
      s.CheckLoss(loss);
      if (fail) s.ReportFault(FaultKind::kStepFailure, "the step failed after its loss was judged");
    });
    EXPECT_TRUE(RuntimeImpl::Of(*rt_).checkpointer() == nullptr ||
                RuntimeImpl::Of(*rt_).checkpointer()->WaitIdle(absl::Seconds(30)).ok());
    return r;
  }
  static double Loss(int64_t step) { return 1.0 + 0.01 * static_cast<double>(step % 7); }
  static constexpr double kSpike = 50.0;
};

TEST_F(LossWindowCheckpointTest, ARestartedRankJudgesASpikeAsTheUninterruptedRun) {
  std::string window_at_20;
  for (int64_t step = 0; step < 22; ++step) {
    ASSERT_TRUE(LossStep(step, Loss(step)).ok()) << step;
    if (step == 19) window_at_20 = rt_->LossWindowState();  // what the snapshot of 20 holds
  }
  StepResult uninterrupted = LossStep(22, kSpike);
  ASSERT_FALSE(uninterrupted.ok());
  EXPECT_THAT(uninterrupted.status.message(), HasSubstr("loss spike on rank 0 at step 22"));

  ASSERT_NO_FATAL_FAILURE(CreateRuntime());  // the process restarts (or a standby takes over)
  EXPECT_EQ(rt_->LossWindowState(), "");
  absl::StatusOr<int64_t> start = rt_->Start();
  ASSERT_TRUE(start.ok()) << start.status();
  ASSERT_EQ(*start, 20);
  EXPECT_EQ(rt_->LossWindowState(), window_at_20);
  ASSERT_TRUE(LossStep(20, Loss(20)).ok());
  ASSERT_TRUE(LossStep(21, Loss(21)).ok());
  StepResult replay = LossStep(22, kSpike);
  ASSERT_FALSE(replay.ok()) << "the restarted rank let the spike through";
  EXPECT_EQ(replay.status.message(), uninterrupted.status.message());  // same median, same score
}

TEST_F(LossWindowCheckpointTest, ARollbackBringsBackTheWindowOfTheCommittedStep) {
  std::string window_at_20;
  for (int64_t step = 0; step < 25; ++step) {
    ASSERT_TRUE(LossStep(step, Loss(step)).ok()) << step;
    if (step == 19) window_at_20 = rt_->LossWindowState();
  }
  ASSERT_NE(rt_->LossWindowState(), window_at_20);
  StepResult r = LossStep(25, Loss(25), /*fail=*/true);
  ASSERT_FALSE(r.ok());
  r.action = StepAction::kRollback;
  absl::StatusOr<int64_t> next = rt_->recover(r);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(*next, 20);
  EXPECT_EQ(rt_->LossWindowState(), window_at_20);
}

TEST_F(LossWindowCheckpointTest, AFailedStepsLossStaysOutOfTheWindowSoItsReplayIsJudgedTheSame) {
  for (int64_t step = 0; step < 25; ++step) ASSERT_TRUE(LossStep(step, Loss(step)).ok());
  const std::string before = rt_->LossWindowState();
  ASSERT_FALSE(LossStep(25, Loss(25), /*fail=*/true).ok());
  EXPECT_EQ(rt_->LossWindowState(), before);
  ASSERT_TRUE(LossStep(25, Loss(25)).ok());
  EXPECT_NE(rt_->LossWindowState(), before);
}

TEST_F(LossWindowCheckpointTest, ASnapshotTakenBeforeTheFirstCheckLossRestoresAnEmptyWindow) {
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());  // snapshot of 10
  for (int64_t step = 10; step < 15; ++step) ASSERT_TRUE(LossStep(step, Loss(step)).ok());
  ASSERT_NE(rt_->LossWindowState(), "");
  StepResult r = LossStep(15, Loss(15), /*fail=*/true);
  r.action = StepAction::kRollback;
  absl::StatusOr<int64_t> next = rt_->recover(r);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(*next, 10);
  LossSpikeDetector empty = *LossSpikeDetector::Create({});
  EXPECT_EQ(rt_->LossWindowState(), empty.SaveState());
}

TEST(RuntimeRecoveryOptions, TheRepeatedFaultOptionsAreValidated) {
  Options o;
  o.max_rollbacks_per_step = 0;
  EXPECT_THAT(std::string(Runtime::Create(o).status().message()),
              HasSubstr("max_rollbacks_per_step must be >= 1, got 0"));
  o = Options();
  o.repeated_fault_action = "retry";
  EXPECT_THAT(std::string(Runtime::Create(o).status().message()),
              HasSubstr("repeated_fault_action \"retry\" is neither \"stop\" nor \"skip\""));
  absl::StatusOr<Options> env = Options::FromEnvironment(
      {{"TRAINGUARD_MAX_ROLLBACKS_PER_STEP", "2"}, {"TRAINGUARD_REPEATED_FAULT_ACTION", "skip"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->max_rollbacks_per_step, 2);
  EXPECT_EQ(env->repeated_fault_action, "skip");
}

}  // namespace
}  // namespace trainguard
