// CoordinatorLease: one holder at a time, takeover after the expiry of the watcher's own clock,
// deposition of a holder whose lease was taken, release for an immediate handover.
#include "sdk/rendezvous/coordinator_lease.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

constexpr absl::Duration kExpiry = absl::Seconds(3);
constexpr absl::Duration kTimeout = absl::Seconds(5);

class CoordinatorLeaseTest : public ::testing::Test {
 protected:
  InMemoryStore store_;
  ManualClock clock_a_, clock_b_;
  CoordinatorLease a_{&store_, "hostA", kExpiry, &clock_a_};
  CoordinatorLease b_{&store_, "hostB", kExpiry, &clock_b_};
};

TEST_F(CoordinatorLeaseTest, TheFirstAgentTakesAnAbsentLeaseAndTheOtherOnlyWatches) {
  EXPECT_TRUE(*a_.Update(kTimeout));
  EXPECT_FALSE(*b_.Update(kTimeout));
  EXPECT_EQ(b_.last_holder(), "hostA");
  EXPECT_EQ(a_.term(), 1);
}

TEST_F(CoordinatorLeaseTest, ARenewedLeaseIsNeverTakenHoweverLongTheWatcherWaits) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  for (int i = 0; i < 20; ++i) {
    clock_b_.Advance(absl::Seconds(1));
    EXPECT_FALSE(*b_.Update(kTimeout));
    EXPECT_TRUE(*a_.Update(kTimeout));
  }
  EXPECT_TRUE(a_.held());
}

TEST_F(CoordinatorLeaseTest, ALeaseUnrenewedForTheExpiryIsTakenWithAHigherTermAndTheOldHolderIsDeposed) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));  // b starts watching
  clock_b_.Advance(kExpiry - absl::Milliseconds(1));
  EXPECT_FALSE(*b_.Update(kTimeout));  // not yet
  clock_b_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(*b_.Update(kTimeout));
  EXPECT_EQ(b_.term(), 2);
  EXPECT_EQ(b_.taken_from(), "hostA");
  // A, stopped all this time, comes back: its renewal fails and it is no longer the holder.
  EXPECT_FALSE(*a_.Update(kTimeout));
  EXPECT_FALSE(a_.held());
  EXPECT_EQ(a_.last_holder(), "hostB");
}

// Every agent knows the newest term it has seen, held or read: the deposed holder learns its
// successor's at its first renewal after coming back, and a watcher the holder's at its first read.
TEST_F(CoordinatorLeaseTest, EveryAgentKnowsTheNewestTermItHasSeen) {
  EXPECT_EQ(a_.latest_term(), 0);
  ASSERT_TRUE(*a_.Update(kTimeout));
  EXPECT_EQ(a_.latest_term(), 1);
  ASSERT_FALSE(*b_.Update(kTimeout));
  EXPECT_EQ(b_.latest_term(), 1);
  clock_b_.Advance(kExpiry);
  ASSERT_TRUE(*b_.Update(kTimeout));
  EXPECT_EQ(b_.latest_term(), 2);
  EXPECT_EQ(a_.latest_term(), 1);  // cut off: it has not seen term 2 yet
  EXPECT_FALSE(*a_.Update(kTimeout));
  EXPECT_EQ(a_.latest_term(), 2);
  EXPECT_EQ(a_.term(), 1);  // the term it held
}

// A holder whose loop stalls must stop acting before a watcher can take over, even if it never
// calls Update() again: held() turns false at the expiry of its last renewal by its own clock. A
// renewal that then succeeds (nobody took the lease) makes it the holder again.
TEST_F(CoordinatorLeaseTest, AHolderStopsHoldingAtItsExpiryWithoutAnotherUpdate) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  clock_a_.Advance(kExpiry - absl::Milliseconds(1));
  EXPECT_TRUE(a_.held());
  clock_a_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(a_.held());
  EXPECT_TRUE(a_.claimed());  // not deposed: nobody took it
  EXPECT_TRUE(*a_.Update(kTimeout));
  EXPECT_TRUE(a_.held());
  EXPECT_EQ(a_.term(), 1);
}

TEST_F(CoordinatorLeaseTest, OfTwoWatchersTakingAnExpiredLeaseAtOnceExactlyOneWins) {
  ManualClock clock_c;
  CoordinatorLease c(&store_, "hostC", kExpiry, &clock_c);
  ASSERT_TRUE(*a_.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));
  ASSERT_FALSE(*c.Update(kTimeout));
  clock_b_.Advance(kExpiry);
  clock_c.Advance(kExpiry);
  const bool b_won = *b_.Update(kTimeout);
  const bool c_won = *c.Update(kTimeout);
  EXPECT_NE(b_won, c_won);
}

TEST_F(CoordinatorLeaseTest, AReleasedLeaseIsTakenAtOnceWithAHigherTerm) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));
  a_.Release(kTimeout);
  EXPECT_FALSE(a_.held());
  EXPECT_TRUE(*b_.Update(kTimeout));
  EXPECT_EQ(b_.term(), 2);
  EXPECT_EQ(b_.taken_from(), CoordinatorLease::kReleasedHolder);
}

TEST_F(CoordinatorLeaseTest, ARenewalThatWasAppliedThoughItsReplyWasLostKeepsTheLease) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  // What a renewal whose reply timed out leaves behind: the next beat of the same term.
  ASSERT_TRUE(store_.Set(CoordinatorLease::kKey, "1 hostA 1", kTimeout).ok());
  EXPECT_TRUE(*a_.Update(kTimeout));
  EXPECT_TRUE(a_.held());
  EXPECT_TRUE(*a_.Update(kTimeout));  // and renews from it
  EXPECT_EQ(*store_.Get(CoordinatorLease::kKey, kTimeout), "1 hostA 2");
}

TEST_F(CoordinatorLeaseTest, AMalformedLeaseValueIsTakenOverLikeAnExpiredOne) {
  ASSERT_TRUE(store_.Set(CoordinatorLease::kKey, "garbage", kTimeout).ok());
  EXPECT_FALSE(*a_.Update(kTimeout));
  clock_a_.Advance(kExpiry);
  EXPECT_TRUE(*a_.Update(kTimeout));
  EXPECT_EQ(a_.term(), 1);
}

}  // namespace
}  // namespace trainguard
