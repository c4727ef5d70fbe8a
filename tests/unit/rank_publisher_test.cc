// RankPublisher (sdk/runtime/rank_publisher.h): a rank's progress and work records, written to an
// in-memory store at instants a ManualClock sets.
#include "sdk/runtime/rank_publisher.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/runtime/peer_progress.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/store.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

constexpr uint64_t kDp = 7;
constexpr int kRank = 3;
constexpr absl::Duration kPeriod = absl::Milliseconds(100);

class RankPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CollectiveTrackerOptions t;
    t.clock = &clock_;
    tracker_ = *CollectiveTracker::Create(t);
    ASSERT_TRUE(tracker_->RegisterCommunicator(kDp, "dp", [] {}).ok());
    WatchdogOptions w;
    w.poll_period = absl::ZeroDuration();  // no monitor thread: nothing is declared here
    w.clock = &clock_;
    w.tracker = tracker_.get();
    watchdog_ = *Watchdog::Create(w);
    clock_.Advance(absl::Seconds(10));  // a monotonic time of 0 means "never"
  }

  RankPublisherOptions Options() {
    return RankPublisherOptions{.store = &store_,
                                .rank = kRank,
                                .clock = &clock_,
                                .progress_period = kPeriod,
                                .heartbeat = &heartbeat_,
                                .watchdog = watchdog_.get(),
                                .collectives = tracker_.get(),
                                .generation = [this] { return generation_; }};
  }
  RankPublisher Publisher() { return RankPublisher(Options()); }

  // One step of `step_time`, with a phase "forward" and an all_reduce inside it.
  void Step(int64_t step, absl::Duration step_time) {
    heartbeat_.Enter(step, clock_.MonotonicNanos());
    {
      ScopedPhase s(watchdog_.get(), kStepPhase);
      {
        ScopedPhase forward(watchdog_.get(), "forward");
        clock_.Advance(step_time / 2);
      }
      ScopedCollective c(tracker_.get(), "all_reduce", kDp, 4096);
      clock_.Advance(step_time / 2);
    }
    heartbeat_.Exit(absl::ToInt64Nanoseconds(step_time), clock_.MonotonicNanos());
  }

  std::optional<runtime_internal::ProgressRecord> Progress(int64_t generation) {
    absl::StatusOr<std::string> text =
        store_.Get(runtime_internal::ProgressKey(generation, kRank), absl::Seconds(1));
    if (!text.ok()) return std::nullopt;
    absl::StatusOr<runtime_internal::ProgressRecord> r =
        runtime_internal::ParseProgressRecord(*text);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return std::nullopt;
    return *r;
  }
  std::optional<RankWorkRecord> Work() {
    absl::StatusOr<std::string> text = store_.Get(RankWorkKey(kRank), absl::Seconds(1));
    if (!text.ok()) return std::nullopt;
    absl::StatusOr<RankWorkRecord> r = ParseRankWorkRecord(*text);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return std::nullopt;
    return *r;
  }
  void Forget() {
    (void)store_.Delete(runtime_internal::ProgressKey(generation_, kRank), absl::Seconds(1));
    (void)store_.Delete(RankWorkKey(kRank), absl::Seconds(1));
  }

  ManualClock clock_;
  InMemoryStore store_;
  Heartbeat heartbeat_;
  std::unique_ptr<CollectiveTracker> tracker_;
  std::unique_ptr<Watchdog> watchdog_;
  int64_t generation_ = 0;
};

TEST_F(RankPublisherTest, PublishesNoProgressBeforeTheRankMadeAny) {
  RankPublisher publisher = Publisher();
  publisher.WantProgress(0);
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(0).has_value());
}

TEST_F(RankPublisherTest, PublishesNoProgressUntilAPeerAsksForTheGenerationsRecords) {
  Step(1, absl::Milliseconds(10));
  RankPublisher publisher = Publisher();
  publisher.PublishProgress();
  clock_.Advance(10 * kPeriod);
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(0).has_value());
  publisher.WantProgress(0);
  publisher.PublishProgress();
  EXPECT_TRUE(Progress(0).has_value());
}

TEST_F(RankPublisherTest, PublishesTheProgressRecordOfTheStepAndTheCollectivesEntered) {
  Step(41, absl::Milliseconds(200));
  clock_.Advance(absl::Milliseconds(30));
  RankPublisher publisher = Publisher();
  publisher.WantProgress(0);
  publisher.PublishProgress();
  std::optional<runtime_internal::ProgressRecord> r = Progress(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 41);
  EXPECT_EQ(r->published, clock_.Now());
  EXPECT_EQ(r->progress_age, absl::Milliseconds(30));
  EXPECT_THAT(r->begun, ElementsAre(Pair(kDp, 1)));
}

TEST_F(RankPublisherTest, WritesAtMostOncePerPeriodAndOnlyWhatChanged) {
  Step(1, absl::Milliseconds(10));
  RankPublisher publisher = Publisher();
  publisher.WantProgress(0);
  publisher.PublishProgress();
  ASSERT_TRUE(Progress(0).has_value());
  Forget();
  // Progress within the period: not yet.
  Step(2, absl::Milliseconds(10));
  clock_.Advance(kPeriod - absl::Milliseconds(11));  // the step took 10 ms
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(0).has_value());
  // The period is over: the new progress goes out.
  clock_.Advance(absl::Milliseconds(1));
  publisher.PublishProgress();
  std::optional<runtime_internal::ProgressRecord> r = Progress(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 2);
  EXPECT_THAT(r->begun, ElementsAre(Pair(kDp, 2)));
  Forget();
  // Nothing changed since: the peers already know, however long it lasts.
  clock_.Advance(10 * kPeriod);
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(0).has_value());
}

TEST_F(RankPublisherTest, ANewGenerationIsPublishedUnderItsKeyThoughNothingElseChanged) {
  Step(5, absl::Milliseconds(10));
  RankPublisher publisher = Publisher();
  publisher.WantProgress(0);
  publisher.PublishProgress();
  ASSERT_TRUE(Progress(0).has_value());
  generation_ = 1;
  clock_.Advance(kPeriod);
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(1).has_value()) << "no peer asked for generation 1's records yet";
  publisher.WantProgress(1);
  publisher.PublishProgress();
  std::optional<runtime_internal::ProgressRecord> r = Progress(1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, 5);
}

TEST_F(RankPublisherTest, PublishesNoProgressWithoutAPeriod) {
  Step(1, absl::Milliseconds(10));
  RankPublisherOptions o{.store = &store_,
                         .rank = kRank,
                         .clock = &clock_,
                         .heartbeat = &heartbeat_,
                         .watchdog = watchdog_.get(),
                         .collectives = tracker_.get(),
                         .generation = [] { return int64_t{0}; }};
  RankPublisher publisher(o);
  publisher.WantProgress(0);
  publisher.PublishProgress();
  EXPECT_FALSE(Progress(0).has_value());
}

TEST_F(RankPublisherTest, PublishesNoWorkRecordUntilAsked) {
  Step(1, absl::Milliseconds(200));
  RankPublisher publisher = Publisher();
  publisher.PublishWork();
  clock_.Advance(absl::Seconds(5));
  publisher.PublishWork();
  EXPECT_FALSE(Work().has_value()) << "no host agent asked for work records";
  publisher.WantWorkRecords();
  publisher.PublishWork();
  EXPECT_TRUE(Work().has_value());
}

TEST_F(RankPublisherTest, PublishesTheWorkRecordOnceASecondWithoutTheStepPhase) {
  Step(1, absl::Milliseconds(200));
  Step(2, absl::Milliseconds(200));
  RankPublisher publisher = Publisher();
  publisher.WantWorkRecords();
  publisher.PublishWork();
  std::optional<RankWorkRecord> w = Work();
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->steps, 2);
  EXPECT_EQ(w->step_ns, absl::ToInt64Nanoseconds(absl::Milliseconds(400)));
  EXPECT_EQ(w->collective_ns, absl::ToInt64Nanoseconds(absl::Milliseconds(200)));
  EXPECT_EQ(w->collective_bytes, 2 * 4096);
  EXPECT_THAT(w->phase_ns,
              ElementsAre(Pair("forward", absl::ToInt64Nanoseconds(absl::Milliseconds(200)))));
  Forget();
  Step(3, absl::Milliseconds(200));
  clock_.Advance(absl::Milliseconds(799));
  publisher.PublishWork();
  EXPECT_FALSE(Work().has_value()) << "within the second";
  clock_.Advance(absl::Milliseconds(1));
  publisher.PublishWork();
  w = Work();
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->steps, 3);
}

TEST_F(RankPublisherTest, PublishesNothingWithoutAStore) {
  Step(1, absl::Milliseconds(10));
  RankPublisherOptions o = Options();
  o.store = nullptr;
  RankPublisher publisher(o);
  publisher.WantWorkRecords();
  publisher.WantProgress(0);
  publisher.PublishProgress();
  publisher.PublishWork();
  EXPECT_FALSE(Progress(0).has_value());
  EXPECT_FALSE(Work().has_value());
}

}  // namespace
}  // namespace trainguard
