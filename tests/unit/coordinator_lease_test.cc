// CoordinatorLease: one holder at a time, takeover after the expiry of the watcher's own clock,
// deposition of a holder whose lease was taken, release for an immediate handover, and the gate of
// every coordinator act: a holder stops acting at its renewal deadline, a margin before anyone can
// take the lease over.
#include "sdk/rendezvous/coordinator_lease.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/clock.h"
#include "tests/support/agent_connection.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kExpiry = absl::Seconds(3);
constexpr absl::Duration kMargin = absl::Milliseconds(750);  // DefaultActingMargin: kExpiry / 4
constexpr absl::Duration kTimeout = absl::Seconds(5);

using testing::AgentConnection;

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
// calls Update() again: held() turns false at its renewal deadline, the acting margin before the
// expiry of its last renewal by its own clock; exactly there, not a nanosecond earlier. A renewal
// that then succeeds (nobody took the lease) makes it the holder again.
TEST_F(CoordinatorLeaseTest, AHolderStopsActingAtItsRenewalDeadlineWithoutAnotherUpdate) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  EXPECT_EQ(a_.acting_margin(), kMargin);
  const int64_t deadline_ns = absl::ToInt64Nanoseconds(kExpiry - kMargin);
  EXPECT_EQ(a_.acting_deadline_ns(), deadline_ns);
  EXPECT_TRUE(a_.HeldAt(deadline_ns - 1));
  EXPECT_FALSE(a_.HeldAt(deadline_ns));
  clock_a_.Advance(kExpiry - kMargin - absl::Nanoseconds(1));
  EXPECT_TRUE(a_.held());
  EXPECT_TRUE(a_.CheckHeld().ok());
  clock_a_.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(a_.held());
  const absl::Status refused = a_.CheckHeld();
  EXPECT_TRUE(absl::IsAborted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("hostA no longer acts under coordinator lease term 1"));
  EXPECT_TRUE(a_.claimed());  // not deposed: nobody took it
  EXPECT_TRUE(*a_.Update(kTimeout));
  EXPECT_TRUE(a_.held());
  EXPECT_EQ(a_.term(), 1);
}

// The margin is the lease's to choose: exactly `acting_margin` before the expiry, and a watcher
// still takes the lease only at the full expiry of its own clock.
TEST_F(CoordinatorLeaseTest, AnActingMarginGivenIsRespectedToTheNanosecond) {
  ManualClock clock;
  const absl::Duration margin = absl::Milliseconds(500);
  CoordinatorLease lease(&store_, "hostC", kExpiry, &clock, margin);
  ASSERT_TRUE(*lease.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));
  clock.Advance(kExpiry - margin - absl::Nanoseconds(1));
  clock_b_.Advance(kExpiry - margin - absl::Nanoseconds(1));
  EXPECT_TRUE(lease.held());
  clock.Advance(absl::Nanoseconds(1));
  clock_b_.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(lease.held());
  EXPECT_FALSE(*b_.Update(kTimeout));  // the margin is the holder's, not the watcher's
  clock_b_.Advance(margin);
  EXPECT_TRUE(*b_.Update(kTimeout));
}

// Renewals every expiry/8 keep the gate open at every instant, however long the job runs.
TEST_F(CoordinatorLeaseTest, AHolderRenewingInTimeKeepsActing) {
  ASSERT_TRUE(*a_.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));
  for (int i = 0; i < 80; ++i) {
    clock_a_.Advance(kExpiry / 8 - absl::Nanoseconds(1));
    EXPECT_TRUE(a_.held()) << "just before renewal " << i;
    clock_a_.Advance(absl::Nanoseconds(1));
    clock_b_.Advance(kExpiry / 8);
    EXPECT_TRUE(*a_.Update(kTimeout));
    EXPECT_FALSE(*b_.Update(kTimeout));
  }
  EXPECT_TRUE(a_.held());
  EXPECT_EQ(a_.term(), 1);
}

// Issue 36: the coordinator's host is cut off from the store for 9 s, the watcher's and its clocks
// running alike. Its gate closes the margin before the watcher takes the lease, the two never act
// at once, and after the heal it publishes nothing (its renewal answer is refused, and no claim of
// the generation is left behind) until its own renewal fails and it knows it is deposed.
TEST_F(CoordinatorLeaseTest, ACutOffCoordinatorStopsActingBeforeTheLeasePassesAndNeverActsAfter) {
  AgentConnection a_link(&store_, &clock_a_);
  CoordinatorLease a(&a_link, "hostA", kExpiry, &clock_a_);
  RendezvousCoordinator a_coordinator(&a_link, &clock_a_, "hostA", &a);
  RendezvousCoordinator b_coordinator(&store_, &clock_b_, "hostB", &b_);
  ASSERT_TRUE(*a.Update(kTimeout));
  ASSERT_FALSE(*b_.Update(kTimeout));
  ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(0), "hostA:0", kTimeout).ok());
  ASSERT_TRUE(a_coordinator.FormInitialGeneration(1, kTimeout).ok());
  ASSERT_TRUE(b_coordinator.Resume(kTimeout).ok());

  a_link.cut_off = true;
  const absl::Duration step = absl::Milliseconds(10);
  std::optional<absl::Duration> a_stopped, b_took;
  for (absl::Duration t = step; t <= absl::Seconds(9); t += step) {
    clock_a_.Advance(step);
    clock_b_.Advance(step);
    (void)a.Update(kTimeout);  // fails: cut off
    (void)b_.Update(kTimeout);
    if (!a.held() && !a_stopped.has_value()) a_stopped = t;
    if (b_.held() && !b_took.has_value()) b_took = t;
    ASSERT_FALSE(a.held() && b_.held()) << "two coordinators at " << t;
  }
  ASSERT_TRUE(a_stopped.has_value());
  ASSERT_TRUE(b_took.has_value());
  EXPECT_EQ(*a_stopped, kExpiry - kMargin);
  EXPECT_EQ(*b_took, kExpiry);  // from its first sight, at 0
  EXPECT_GE(*b_took - *a_stopped, kMargin);
  EXPECT_EQ(b_.term(), 2);

  // The heal. Before A's first Update since, whatever it tries is refused before any write.
  a_link.cut_off = false;
  const absl::StatusOr<Membership> renewed = a_coordinator.RenewGeneration(kTimeout);
  EXPECT_TRUE(absl::IsAborted(renewed.status())) << renewed.status();
  EXPECT_TRUE(absl::IsNotFound(store_.Get(store_keys::RdzvClaim(1), kTimeout).status()));
  EXPECT_FALSE(*a.Update(kTimeout));  // deposed
  EXPECT_FALSE(a.claimed());
  EXPECT_EQ(a.last_holder(), "hostB");
  EXPECT_EQ(a.latest_term(), 2);
  EXPECT_TRUE(absl::IsAborted(a_coordinator.RenewGeneration(kTimeout).status()));
  // The successor's answer is the one that stands.
  const absl::StatusOr<Membership> b_renewed = b_coordinator.RenewGeneration(kTimeout);
  ASSERT_TRUE(b_renewed.ok()) << b_renewed.status();
  EXPECT_EQ(b_renewed->generation, 1);
  EXPECT_EQ(*store_.Get(store_keys::RdzvClaim(1), kTimeout), "hostB");
}

// A coordinator whose gate closed decides nothing through the rendezvous: no standby is claimed,
// no generation claimed. A standby's death is still recorded (ForgetStandby is not gated: the
// agent that saw it die is the standby's own, which need not hold the lease).
TEST_F(CoordinatorLeaseTest, ARendezvousCoordinatorPastItsLeasesDeadlineWritesNothing) {
  RendezvousCoordinator coordinator(&store_, &clock_a_, "hostA", &a_);
  ASSERT_TRUE(*a_.Update(kTimeout));
  ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(0), "hostA:0", kTimeout).ok());
  ASSERT_TRUE(coordinator.FormInitialGeneration(1, kTimeout).ok());
  const std::string standby_key = store_keys::RdzvStandby("hostB:s0");
  ASSERT_TRUE(store_.Set(standby_key, "parked", kTimeout).ok());
  clock_a_.Advance(kExpiry - kMargin);
  EXPECT_TRUE(absl::IsAborted(coordinator.ReplaceRank(0, kTimeout).status()));
  EXPECT_TRUE(absl::IsAborted(coordinator.RenewGeneration(kTimeout).status()));
  const std::string dead_standby_key = store_keys::RdzvStandby("hostC:s0");
  ASSERT_TRUE(store_.Set(dead_standby_key, "parked", kTimeout).ok());
  EXPECT_TRUE(coordinator.ForgetStandby("hostC:s0", kTimeout).ok());
  EXPECT_TRUE(absl::IsNotFound(store_.Get(dead_standby_key, kTimeout).status()));
  EXPECT_EQ(*store_.Get(standby_key, kTimeout), "parked");
  EXPECT_TRUE(absl::IsNotFound(store_.Get(store_keys::RdzvClaim(1), kTimeout).status()));
  EXPECT_EQ(coordinator.generation(), 0);
  // Renewed in time (nobody took it), it acts again.
  ASSERT_TRUE(*a_.Update(kTimeout));
  const absl::StatusOr<Membership> replaced = coordinator.ReplaceRank(0, kTimeout);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->members[0], "hostB:s0");
}

// The times the gate counts from: a lease is held from the start of the write that took or renewed
// it, never from a later moment, since a watcher may read the value as soon as it is applied.
TEST_F(CoordinatorLeaseTest, ATakeIsTimedFromBeforeItsWrite) {
  AgentConnection slow(&store_, &clock_a_);
  CoordinatorLease a(&slow, "hostA", kExpiry, &clock_a_);
  slow.latency = absl::Milliseconds(700);  // each call, before it is applied
  ASSERT_TRUE(*a.Update(kTimeout));        // Get (absent), then the take: started at 0.7 s
  EXPECT_EQ(a.acting_deadline_ns(),
            absl::ToInt64Nanoseconds(absl::Milliseconds(700) + kExpiry - kMargin));
}

TEST_F(CoordinatorLeaseTest, ARenewalWhoseReplyWasLostCountsFromItsFirstAttempt) {
  AgentConnection link(&store_, &clock_a_);
  CoordinatorLease a(&link, "hostA", kExpiry, &clock_a_);
  ASSERT_TRUE(*a.Update(kTimeout));
  clock_a_.Advance(absl::Seconds(1));
  link.lose_replies = true;  // applied at 1 s: a watcher sees "1 hostA 1" from then on
  EXPECT_FALSE(a.Update(kTimeout).ok());
  clock_a_.Advance(absl::Seconds(1));
  link.lose_replies = false;
  EXPECT_TRUE(*a.Update(kTimeout));  // finds its own beat 1 in place
  EXPECT_EQ(*store_.Get(CoordinatorLease::kKey, kTimeout), "1 hostA 1");
  const int64_t deadline_ns = absl::ToInt64Nanoseconds(absl::Seconds(1) + kExpiry - kMargin);
  EXPECT_EQ(a.acting_deadline_ns(), deadline_ns);  // from 1 s, not from 2 s
  EXPECT_TRUE(a.HeldAt(deadline_ns - 1));
  EXPECT_FALSE(a.HeldAt(deadline_ns));
}

TEST_F(CoordinatorLeaseTest, AWatcherTimesItsFirstSightFromAfterItsRead) {
  AgentConnection slow(&store_, &clock_b_);
  CoordinatorLease b(&slow, "hostB", kExpiry, &clock_b_);
  ASSERT_TRUE(*a_.Update(kTimeout));
  slow.latency = absl::Milliseconds(400);
  ASSERT_FALSE(*b.Update(kTimeout));  // read from 0 to 0.4 s: first sight at 0.4 s
  slow.latency = absl::ZeroDuration();
  clock_b_.Advance(kExpiry - absl::Milliseconds(400));
  ASSERT_FALSE(*b.Update(kTimeout));  // 3 s after the read began, not after the sight
  clock_b_.Advance(absl::Milliseconds(400) - absl::Nanoseconds(1));
  ASSERT_FALSE(*b.Update(kTimeout));
  clock_b_.Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(*b.Update(kTimeout));
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
