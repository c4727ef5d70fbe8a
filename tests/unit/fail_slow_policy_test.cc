// DecideFailSlowAction (sdk/agent/fail_slow_policy.h): what `trainguard run --fail-slow` does with a
// confirmed suspect.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/fail_slow_policy.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

TEST(FailSlowPolicy, AlertNeverEvicts) {
  const FailSlowDecision d = DecideFailSlowAction(FailSlowPolicy::kAlert, 5, 0, 10, 0.1, 8, 2);
  EXPECT_FALSE(d.evict);
  EXPECT_EQ(d.action, "alert");
}

TEST(FailSlowPolicy, EvictEvictsAtTheFirstConfirmationWhenAStandbyHostCanTakeOver) {
  const FailSlowDecision d = DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 0, 3, 0.1, 2, 2);
  EXPECT_TRUE(d.evict);
  EXPECT_EQ(d.action, "evict");
}

TEST(FailSlowPolicy, EvictRepeatedWaitsForASecondContinuityWindowInARow) {
  EXPECT_FALSE(DecideFailSlowAction(FailSlowPolicy::kEvictRepeated, 1, 0, 3, 0.1, 2, 2).evict);
  EXPECT_TRUE(DecideFailSlowAction(FailSlowPolicy::kEvictRepeated, 2, 0, 3, 0.1, 2, 2).evict);
}

TEST(FailSlowPolicy, AtMostTheShareOfTheJobIsEvictedOnMetricsAloneButAtLeastOneHost) {
  // 3 hosts x 0.1 rounds down to 0: one host may still go, the second may not.
  EXPECT_TRUE(DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 0, 3, 0.1, 2, 2).evict);
  const FailSlowDecision second = DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 1, 3, 0.1, 2, 2);
  EXPECT_FALSE(second.evict);
  EXPECT_THAT(second.action, HasSubstr("1 of at most 1 host(s) evicted on metrics alone"));
  // 40 hosts x 0.1: four.
  EXPECT_TRUE(DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 3, 40, 0.1, 2, 2).evict);
  EXPECT_FALSE(DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 4, 40, 0.1, 2, 2).evict);
  // Share 0: none.
  EXPECT_FALSE(DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 0, 40, 0, 2, 2).evict);
}

TEST(FailSlowPolicy, WithoutEnoughParkedStandbysElsewhereTheHostIsOnlyReported) {
  const FailSlowDecision d = DecideFailSlowAction(FailSlowPolicy::kEvict, 1, 0, 3, 0.1, 1, 2);
  EXPECT_FALSE(d.evict);
  EXPECT_THAT(d.action, HasSubstr("1 parked standby(s) elsewhere, 2 needed"));
}

}  // namespace
}  // namespace trainguard
