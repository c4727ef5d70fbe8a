// RenewalPolicy (sdk/agent/renewal_policy.h): when the ranks' requests for a new generation renew
// it with the same ranks, or restart every rank under --restart-all, decided at explicit instants:
// no processes, no store, no clock, no sleeps.
#include "sdk/agent/renewal_policy.h"

#include <map>
#include <string>
#include <variant>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kNanosecond = absl::Nanoseconds(1);
constexpr absl::Duration kHostTimeout = absl::Seconds(3);  // --host-timeout with a TcpStore

absl::Time At(absl::Duration since_start) { return absl::UnixEpoch() + since_start; }

RenewalPolicyOptions OneHost(bool restart_all = false) {
  RenewalPolicyOptions options;
  options.restart_all = restart_all;
  return options;
}

RenewalPolicyOptions SeveralHosts(bool restart_all = false) {
  RenewalPolicyOptions options;
  options.multi_host = true;
  options.host_timeout = kHostTimeout;
  options.restart_all = restart_all;
  return options;
}

// Generation `generation` of `world_size` ranks, with the requests read.
RenewalObservations Asked(int64_t generation, int world_size, std::map<int, std::string> requests) {
  RenewalObservations observed;
  observed.generation = generation;
  observed.world_size = world_size;
  observed.requests = std::move(requests);
  return observed;
}

RenewalPolicy::Renew ExpectRenew(const RenewalPolicy::Action& action) {
  const auto* renew = std::get_if<RenewalPolicy::Renew>(&action);
  EXPECT_NE(renew, nullptr) << "not a renewal (action " << action.index() << ")";
  return renew != nullptr ? *renew : RenewalPolicy::Renew{};
}

RenewalPolicy::Wait ExpectWait(const RenewalPolicy::Action& action) {
  const auto* wait = std::get_if<RenewalPolicy::Wait>(&action);
  EXPECT_NE(wait, nullptr) << "not a wait (action " << action.index() << ")";
  return wait != nullptr ? *wait : RenewalPolicy::Wait{};
}

RenewalPolicy::RestartAll ExpectRestartAll(const RenewalPolicy::Action& action) {
  const auto* restart = std::get_if<RenewalPolicy::RestartAll>(&action);
  EXPECT_NE(restart, nullptr) << "not a restart (action " << action.index() << ")";
  return restart != nullptr ? *restart : RenewalPolicy::RestartAll{};
}

TEST(RenewalPolicy, TheGraceIsOneSecondOnOneHostAndTheHostTimeoutPlusOneOnSeveral) {
  EXPECT_EQ(RenewalPolicy(OneHost()).grace(), absl::Seconds(1));
  EXPECT_EQ(RenewalPolicy(SeveralHosts()).grace(), kHostTimeout + absl::Seconds(1));
}

TEST(RenewalPolicy, EveryRankAskingRenewsTheGenerationAtOnceNamingTheFirstAsk) {
  RenewalPolicy policy(OneHost());
  const RenewalPolicy::Renew renew = ExpectRenew(policy.Decide(
      Asked(3, 2, {{0, "peer 1 hung up"}, {1, "peer 0 hung up"}}), At(absl::Seconds(10))));
  EXPECT_THAT(renew.asked_by, ElementsAre(0, 1));
  EXPECT_EQ(renew.first_asked, At(absl::Seconds(10)));
  EXPECT_EQ(renew.first_ask, "rank 0 asks for a new generation: peer 1 hung up");
  // The renewal failed (the store did not answer): asked again, the same, said once.
  const RenewalPolicy::Renew again = ExpectRenew(policy.Decide(
      Asked(3, 2, {{0, "peer 1 hung up"}, {1, "peer 0 hung up"}}), At(absl::Seconds(11))));
  EXPECT_EQ(again.first_asked, At(absl::Seconds(10)));
  EXPECT_THAT(again.first_ask, IsEmpty());
}

TEST(RenewalPolicy, APartialAskWaitsExactlyTheGraceFromTheFirstAskAndNotOneNanosecondLess) {
  for (const RenewalPolicyOptions& options : {OneHost(), SeveralHosts()}) {
    RenewalPolicy policy(options);
    const absl::Time first = At(absl::Seconds(5));
    const RenewalPolicy::Wait wait =
        ExpectWait(policy.Decide(Asked(1, 4, {{2, "connection reset by rank 3"}}), first));
    EXPECT_EQ(wait.what, RenewalPolicy::Wait::For::kGrace);
    EXPECT_EQ(wait.until, first + policy.grace());
    EXPECT_EQ(wait.first_ask, "rank 2 asks for a new generation: connection reset by rank 3");
    // More ranks ask meanwhile: the wait still counts from the first ask, said once.
    const RenewalPolicy::Wait later =
        ExpectWait(policy.Decide(Asked(1, 4, {{1, "x"}, {2, "connection reset by rank 3"}}),
                                 first + policy.grace() - kNanosecond));
    EXPECT_EQ(later.until, first + policy.grace());
    EXPECT_THAT(later.first_ask, IsEmpty());
    const RenewalPolicy::Renew renew = ExpectRenew(policy.Decide(
        Asked(1, 4, {{1, "x"}, {2, "connection reset by rank 3"}}), first + policy.grace()));
    EXPECT_THAT(renew.asked_by, ElementsAre(1, 2));
    EXPECT_EQ(renew.first_asked, first);
    EXPECT_THAT(renew.first_ask, IsEmpty());
  }
}

TEST(RenewalPolicy, ANewGenerationStartsTheWaitAfresh) {
  RenewalPolicy policy(OneHost());
  ExpectWait(policy.Decide(Asked(1, 3, {{0, "a"}}), At(absl::Seconds(1))));
  // Generation 1 was renewed (or a replacement's generation answered): generation 2's first ask
  // waits a full grace from when it is seen, and is said again.
  const absl::Time seen = At(absl::Seconds(30));
  const RenewalPolicy::Wait wait = ExpectWait(policy.Decide(Asked(2, 3, {{1, "b"}}), seen));
  EXPECT_EQ(wait.until, seen + absl::Seconds(1));
  EXPECT_EQ(wait.first_ask, "rank 1 asks for a new generation: b");
  ExpectWait(policy.Decide(Asked(2, 3, {{1, "b"}}), seen + absl::Seconds(1) - kNanosecond));
  EXPECT_EQ(
      ExpectRenew(policy.Decide(Asked(2, 3, {{1, "b"}}), seen + absl::Seconds(1))).first_asked,
      seen);
}

TEST(RenewalPolicy, ResetForgetsTheFirstAskAsARestartRoundsGenerationZeroDoes) {
  RenewalPolicy policy(SeveralHosts());
  ExpectWait(policy.Decide(Asked(0, 2, {{0, "a"}}), At(absl::Seconds(1))));
  policy.Reset();
  const absl::Time seen = At(absl::Seconds(20));
  const RenewalPolicy::Wait wait = ExpectWait(policy.Decide(Asked(0, 2, {{0, "a"}}), seen));
  EXPECT_EQ(wait.until, seen + kHostTimeout + absl::Seconds(1));
  EXPECT_EQ(wait.first_ask, "rank 0 asks for a new generation: a");
}

TEST(RenewalPolicy, UnderRestartAllOnSeveralHostsAnAskWaitsLikeARenewalThenRestartsEveryRank) {
  RenewalPolicy policy(SeveralHosts(/*restart_all=*/true));
  const absl::Time first = At(absl::Seconds(2));
  const RenewalPolicy::Wait wait =
      ExpectWait(policy.Decide(Asked(4, 4, {{3, "peer 0 hung up"}}), first));
  EXPECT_EQ(wait.what, RenewalPolicy::Wait::For::kGrace);
  EXPECT_EQ(wait.until, first + kHostTimeout + absl::Seconds(1));
  EXPECT_THAT(wait.first_ask, IsEmpty());  // the restart says it
  ExpectWait(policy.Decide(Asked(4, 4, {{3, "peer 0 hung up"}}),
                           first + kHostTimeout + absl::Seconds(1) - kNanosecond));
  const RenewalPolicy::RestartAll restart = ExpectRestartAll(
      policy.Decide(Asked(4, 4, {{3, "peer 0 hung up"}}), first + kHostTimeout + absl::Seconds(1)));
  EXPECT_EQ(restart.why, "rank 3 asks for a new generation: peer 0 hung up");
  EXPECT_EQ(restart.first_asked, first);
  // Every rank asking restarts at once.
  RenewalPolicy everyone(SeveralHosts(/*restart_all=*/true));
  EXPECT_EQ(ExpectRestartAll(everyone.Decide(Asked(0, 2, {{1, "b"}, {0, "a"}}), first)).why,
            "rank 0 asks for a new generation: a");
}

TEST(RenewalPolicy, UnderRestartAllOnOneHostAnAskRestartsEveryRankAtOnce) {
  RenewalPolicy policy(OneHost(/*restart_all=*/true));
  const RenewalPolicy::RestartAll restart =
      ExpectRestartAll(policy.Decide(Asked(2, 8, {{5, "peer 6 hung up"}}), At(absl::Seconds(7))));
  EXPECT_EQ(restart.why, "rank 5 asks for a new generation: peer 6 hung up");
  EXPECT_EQ(restart.first_asked, At(absl::Seconds(7)));
}

TEST(RenewalPolicy, NoRequestsReadAsksForThemAndNoneAskedWaits) {
  RenewalPolicy policy(OneHost());
  RenewalObservations unread;
  unread.generation = 1;
  unread.world_size = 2;
  EXPECT_TRUE(std::holds_alternative<RenewalPolicy::ReadRequests>(policy.Decide(unread, At({}))));
  const RenewalPolicy::Wait none = ExpectWait(policy.Decide(Asked(1, 2, {}), At({})));
  EXPECT_EQ(none.what, RenewalPolicy::Wait::For::kRequests);
  EXPECT_EQ(none.until, absl::InfiniteFuture());
  // Nothing asked started no wait: the first ask, much later, gets a full grace.
  const RenewalPolicy::Wait wait =
      ExpectWait(policy.Decide(Asked(1, 2, {{0, "a"}}), At(absl::Minutes(1))));
  EXPECT_EQ(wait.until, At(absl::Minutes(1) + absl::Seconds(1)));
}

// A death pending (its replacement's generation answers the requests), a hang pending (its
// diagnosis comes first), a rank killed for liveness not yet reaped (its death is next): nothing is
// decided, nothing read, and the requests do not count as seen meanwhile.
TEST(RenewalPolicy, WhileADeathAHangOrAnUnreapedKilledRankComesFirstNothingIsDecided) {
  for (int blocker = 0; blocker < 3; ++blocker) {
    for (const RenewalPolicyOptions& options :
         {OneHost(), SeveralHosts(), OneHost(true), SeveralHosts(true)}) {
      RenewalPolicy policy(options);
      RenewalObservations blocked = Asked(1, 2, {{0, "a"}, {1, "b"}});
      blocked.death_pending = blocker == 0;
      blocked.hang_pending = blocker == 1;
      blocked.killed_rank_unreaped = blocker == 2;
      for (const absl::Duration t : {absl::ZeroDuration(), absl::Minutes(5)}) {
        const RenewalPolicy::Wait wait = ExpectWait(policy.Decide(blocked, At(t)));
        EXPECT_EQ(wait.what, RenewalPolicy::Wait::For::kBlocked) << blocker;
        EXPECT_THAT(wait.first_ask, IsEmpty());
      }
      blocked.requests.reset();
      EXPECT_EQ(ExpectWait(policy.Decide(blocked, At({}))).what,
                RenewalPolicy::Wait::For::kBlocked);
      // Unblocked: the first ask is seen now, not while blocked.
      const absl::Time now = At(absl::Minutes(6));
      const RenewalPolicy::Action action = policy.Decide(Asked(1, 3, {{0, "a"}}), now);
      if (options.restart_all && !options.multi_host) {
        EXPECT_EQ(ExpectRestartAll(action).first_asked, now);
      } else {
        EXPECT_EQ(ExpectWait(action).until, now + policy.grace());
      }
    }
  }
}

}  // namespace
}  // namespace trainguard
