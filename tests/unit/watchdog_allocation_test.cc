// The watchdog's hot paths allocate nothing (issue: detection must be cheap enough to leave on):
// phases, ticks and collectives, with and without a flight recorder. This binary counts every
// global operator new (tests/support/allocation_counter.h).
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/allocation_counter.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

using testing::AllocationCount;

class WatchdogAllocation : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      auto recorder = FlightRecorder::Create(absl::StrCat("wd-alloc-", getpid()), 0, 1024);
      ASSERT_TRUE(recorder.ok()) << recorder.status();
      recorder_ = *std::move(recorder);
    }
    CollectiveTrackerOptions tracker_options;
    tracker_options.clock = &clock_;
    tracker_options.recorder = recorder_.get();
    auto tracker = CollectiveTracker::Create(tracker_options);
    ASSERT_TRUE(tracker.ok());
    tracker_ = *std::move(tracker);
    ASSERT_TRUE(tracker_->RegisterCommunicator(1, "dp", [] {}).ok());
    WatchdogOptions options;
    options.poll_period = absl::ZeroDuration();  // no monitor thread: it may allocate, we may not
    options.clock = &clock_;
    options.recorder = recorder_.get();
    options.tracker = tracker_.get();
    auto wd = Watchdog::Create(options);
    ASSERT_TRUE(wd.ok());
    wd_ = *std::move(wd);
  }

  ManualClock clock_;
  std::unique_ptr<FlightRecorder> recorder_;
  std::unique_ptr<CollectiveTracker> tracker_;
  std::unique_ptr<Watchdog> wd_;
};

TEST_P(WatchdogAllocation, PhasesTicksAndCollectivesAllocateNothingEvenForNewNames) {
  const int64_t before = AllocationCount();
  for (int step = 0; step < 10'000; ++step) {
    wd_->SetStep(step);
    ScopedPhase s(wd_.get(), "step");
    {
      // A name seen for the first time is copied into a fixed table, not allocated.
      ScopedPhase p(wd_.get(), step == 5'000 ? "first_seen_late" : "forward_backward");
      wd_->Tick(128);
      clock_.Advance(absl::Microseconds(10));
      CollectiveHandle h = tracker_->Begin(step % 2 ? "all_reduce" : "broadcast", 1, 4096);
      tracker_->End(h);
      ScopedCollective c(tracker_.get(), "send", 1, 64, /*peer=*/1);
    }
    if (wd_->TakeHang().has_value()) FAIL() << "no hang expected";
  }
  EXPECT_EQ(AllocationCount() - before, 0);
  EXPECT_EQ(wd_->usage_errors(), 0);
  EXPECT_EQ(tracker_->usage_errors(), 0);
}

INSTANTIATE_TEST_SUITE_P(RecorderOrNot, WatchdogAllocation, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithFlightRecorder" : "WithoutFlightRecorder";
                         });

TEST(WatchdogAllocationCounter, SeesAllocations) {
  const int64_t before = AllocationCount();
  int* volatile p = new int(3);
  delete p;
  EXPECT_EQ(AllocationCount() - before, 1);
}

}  // namespace
}  // namespace trainguard
