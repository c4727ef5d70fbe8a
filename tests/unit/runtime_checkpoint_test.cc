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
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
    if (rt_->checkpointer() != nullptr) {
      ASSERT_TRUE(rt_->checkpointer()->WaitIdle(absl::Seconds(30)).ok());
    }
  }
  // Snapshots were taken after steps 9 and 19 (tagged 10 and 20) and committed.
  absl::StatusOr<std::vector<int64_t>> committed = rt_->checkpointer()->CommittedSteps();
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
    restored |= e.Attribute("what") == "restored" && e.step == 20;
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

TEST_F(RuntimeCheckpointTest, TheGuardFencesTheSnapshotSoTheNextStepCannotTearIt) {
  for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(Train(step).ok());
  // Step 9 started a snapshot (tagged 10); step 10's body overwrites every weight at once. The
  // snapshot must still hold the values after step 9.
  ASSERT_TRUE(Train(10).ok());
  ASSERT_TRUE(rt_->checkpointer()->WaitIdle(absl::Seconds(30)).ok());
  std::fill(weights_.begin(), weights_.end(), -1.0f);
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
}

}  // namespace
}  // namespace trainguard
