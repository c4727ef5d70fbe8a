// BusyPoll: when a TcpStore socket is polled before its thread sleeps, as a pure function of the
// outcomes of earlier polls; PollingSlots' bound; PollFor's budget on a ManualClock.
#include "sdk/rendezvous/busy_poll.h"

#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "trainguard/clock.h"

namespace trainguard::testing {
namespace {

constexpr absl::Duration kBudget = absl::Microseconds(50);

// Which of the next `n` waits poll (1) and which block at once (0), none of them answered.
std::vector<int> PolledWhileMissing(BusyPoll& poll, int n) {
  std::vector<int> polled;
  for (int i = 0; i < n; ++i) {
    const absl::Duration budget = poll.NextWait();
    polled.push_back(budget > absl::ZeroDuration() ? 1 : 0);
    if (budget > absl::ZeroDuration()) poll.Record(/*answered=*/false);
  }
  return polled;
}

TEST(BusyPollTest, EveryWaitPollsForTheBudgetWhileAnswersComeWithinIt) {
  BusyPoll poll(kBudget);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(poll.NextWait(), kBudget) << "wait " << i;
    poll.Record(/*answered=*/true);
  }
}

TEST(BusyPollTest, AZeroBudgetNeverPolls) {
  BusyPoll poll(absl::ZeroDuration());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(poll.NextWait(), absl::ZeroDuration());
}

TEST(BusyPollTest, AfterConsecutiveMissesOneTwoFourThenEveryThirtySecondWaitPolls) {
  BusyPoll poll(kBudget);
  // Poll, miss, block 1; poll, miss, block 3; poll, miss, block 7; ...
  const std::vector<int> expected = [] {
    std::vector<int> e;
    for (int skipped : {1, 3, 7, 15, 31, 31}) {
      e.push_back(1);
      e.insert(e.end(), skipped, 0);
    }
    e.push_back(1);
    return e;
  }();
  EXPECT_EQ(PolledWhileMissing(poll, static_cast<int>(expected.size())), expected);
}

TEST(BusyPollTest, OneAnsweredPollRestoresPollingOnEveryWait) {
  BusyPoll poll(kBudget);
  PolledWhileMissing(poll, 40);  // well into the back-off
  while (poll.NextWait() == absl::ZeroDuration()) {
  }
  poll.Record(/*answered=*/true);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(poll.NextWait(), kBudget) << "wait " << i;
    poll.Record(/*answered=*/true);
  }
  // And the next miss skips one wait again, not 31.
  ASSERT_EQ(poll.NextWait(), kBudget);
  poll.Record(/*answered=*/false);
  EXPECT_EQ(poll.NextWait(), absl::ZeroDuration());
  EXPECT_EQ(poll.NextWait(), kBudget);
}

TEST(PollingSlotsTest, NoMoreThreadsThanSlotsPollAtOnceAndAReleasedSlotIsTakenAgain) {
  PollingSlots slots(2);
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_FALSE(slots.TryAcquire());
  slots.Release();
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_FALSE(slots.TryAcquire());
}

TEST(PollingSlotsTest, NoSlotsNeverPoll) {
  PollingSlots slots(0);
  EXPECT_FALSE(slots.TryAcquire());
}

// PollFor on a ManualClock: each pause between polls takes `pause_takes` of its time.
struct ManualPoll {
  ManualClock clock;
  absl::Duration pause_takes = absl::Microseconds(1);
  int pauses = 0;
  template <typename Ready>
  bool For(absl::Duration budget, Ready&& ready) {
    return PollFor(budget, ready, clock, [&] {
      ++pauses;
      clock.Advance(pause_takes);
    });
  }
};

TEST(PollForTest, StopsAtTheFirstReadyCallAndPausesBetweenCalls) {
  ManualPoll poll;
  int calls = 0;
  EXPECT_TRUE(poll.For(kBudget, [&] { return ++calls == 3; }));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(poll.pauses, 2);
}

TEST(PollForTest, GivesUpOnceTheBudgetHasPassed) {
  ManualPoll poll;
  int calls = 0;
  EXPECT_FALSE(poll.For(kBudget, [&] {
    ++calls;
    return false;
  }));
  // A call at 0 us, then one after each pause that ends within the 50 us.
  EXPECT_EQ(calls, 50);
  EXPECT_EQ(poll.pauses, 50);
}

TEST(PollForTest, AThreadPreemptedPastTheBudgetMissesEvenIfTheAnswerCameMeanwhile) {
  ManualPoll poll;
  poll.pause_takes = absl::Milliseconds(3);  // the thread waited for its turn on a busy CPU
  int calls = 0;
  EXPECT_FALSE(poll.For(kBudget, [&] { return ++calls == 2; }));
  EXPECT_EQ(calls, 1) << "the answer is left for the sleeping wait that follows";
}

TEST(PollForTest, AZeroBudgetCallsOnceAndReportsTheOutcome) {
  ManualPoll poll;
  int calls = 0;
  EXPECT_FALSE(poll.For(absl::ZeroDuration(), [&] {
    ++calls;
    return false;
  }));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(poll.pauses, 0);
  EXPECT_TRUE(poll.For(absl::ZeroDuration(), [] { return true; }));
}

}  // namespace
}  // namespace trainguard::testing
