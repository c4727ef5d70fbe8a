// DecideRestartRound (sdk/agent/restart_rounds.h): --restart-all's rounds on several hosts, from
// plain values: the bound, which joined host takes a dead host's group rank, the round's plan. No
// store, no processes.
#include "sdk/agent/restart_rounds.h"

#include <string>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// h1 and h2 train (group ranks 0 and 1), h3 and h4 are standby hosts, in join order h1..h4.
RestartRoundHosts FourHosts() {
  RestartRoundHosts hosts;
  hosts.groups = {{"h1", 0}, {"h2", 1}, {"h3", -1}, {"h4", -1}};
  hosts.joined = {{"h1", "10.0.0.1", 29500},
                  {"h2", "10.0.0.2", 29501},
                  {"h3", "10.0.0.3", 29502},
                  {"h4", "10.0.0.4", 29503}};
  return hosts;
}

RestartRoundRequest HostDied(const std::string& host, RestartRoundHosts hosts) {
  RestartRoundRequest request;
  request.round = 0;
  request.limit = 3;
  request.why = absl::StrCat("host ", host, " is dead (no heartbeat for 3s)");
  request.dead_host = host;
  request.own_host = "h1";
  request.master_addr = "10.0.0.1";
  request.master_port = 29500;
  request.hosts = std::move(hosts);
  return request;
}

RestartRoundDecision::Start ExpectStart(const RestartRoundDecision::Action& action) {
  const auto* start = std::get_if<RestartRoundDecision::Start>(&action);
  EXPECT_NE(start, nullptr) << "not a round (action " << action.index() << ")";
  return start != nullptr ? *start : RestartRoundDecision::Start{};
}

std::string ExpectFail(const RestartRoundDecision::Action& action) {
  const auto* fail = std::get_if<RestartRoundDecision::Fail>(&action);
  EXPECT_NE(fail, nullptr) << "the job does not fail (action " << action.index() << ")";
  return fail != nullptr ? fail->why : "";
}

// "host:group" per host of the plan, in its order.
std::vector<std::string> Groups(const RestartRoundPlan& plan) {
  std::vector<std::string> groups;
  for (const RestartRoundPlan::Host& h : plan.hosts) {
    groups.push_back(absl::StrCat(h.host, ":", h.group));
  }
  return groups;
}

TEST(RestartRounds, TheMPlusFirstFaultFailsTheJobAndEveryEarlierOneStartsTheNextRound) {
  RestartRoundRequest request;
  request.limit = 2;
  request.why = "rank 1 (h2:41:rank1) exited with status 1";
  for (int64_t round = 0; round < 2; ++round) {
    request.round = round;
    const RestartRoundDecision::Start start = ExpectStart(DecideRestartRound(request));
    EXPECT_EQ(start.round, round + 1);
    EXPECT_EQ(start.plan, std::nullopt);  // a rank's fault: the plan stays
    EXPECT_THAT(start.taker, IsEmpty());
  }
  request.round = 2;
  EXPECT_EQ(ExpectFail(DecideRestartRound(request)),
            "rank 1 (h2:41:rank1) exited with status 1; --restart-all=2 reached");
  // --restart-all=0: the first fault fails, a host's death too, before anything is read.
  RestartRoundRequest none = HostDied("h2", FourHosts());
  none.limit = 0;
  none.hosts.reset();
  EXPECT_THAT(ExpectFail(DecideRestartRound(none)), HasSubstr("--restart-all=0 reached"));
}

TEST(RestartRounds, AHostsDeathAsksForThePlanAndTheHostsBeforeDeciding) {
  RestartRoundRequest request = HostDied("h2", FourHosts());
  request.hosts.reset();
  EXPECT_TRUE(std::holds_alternative<RestartRoundDecision::ReadHosts>(DecideRestartRound(request)));
}

TEST(RestartRounds, ADeadHostsGroupRankGoesToTheFirstStandbyHostInJoinOrder) {
  const RestartRoundDecision::Start start =
      ExpectStart(DecideRestartRound(HostDied("h2", FourHosts())));
  EXPECT_EQ(start.round, 1);
  EXPECT_EQ(start.taker, "restart round 1: host h3 takes host h2's group rank 1");
  ASSERT_TRUE(start.plan.has_value());
  EXPECT_THAT(Groups(*start.plan), ElementsAre("h1:0", "h2:-1", "h3:1", "h4:-1"));
  EXPECT_EQ(start.plan->training_hosts, 2);
  EXPECT_EQ(start.plan->master_addr, "10.0.0.1");
  EXPECT_EQ(start.plan->master_port, 29500);
}

TEST(RestartRounds, ADeadLeftOrSilentCandidateIsSkippedButTheCoordinatorsOwnHostIsNeverSilent) {
  for (const char* skipped : {"dead", "left", "silent"}) {
    RestartRoundHosts hosts = FourHosts();
    (std::string(skipped) == "dead"   ? hosts.dead
     : std::string(skipped) == "left" ? hosts.left
                                      : hosts.silent)
        .insert("h3");
    const RestartRoundDecision::Start start =
        ExpectStart(DecideRestartRound(HostDied("h2", std::move(hosts))));
    EXPECT_EQ(start.taker, "restart round 1: host h4 takes host h2's group rank 1") << skipped;
    ASSERT_TRUE(start.plan.has_value());
    EXPECT_THAT(Groups(*start.plan), ElementsAre("h1:0", "h2:-1", "h3:-1", "h4:1")) << skipped;
  }
  // The coordinator runs on standby host h3 (it took the lease over): its own heartbeat, which it
  // may read as standing still, does not make it silent.
  RestartRoundHosts hosts = FourHosts();
  hosts.silent = {"h3"};
  RestartRoundRequest request = HostDied("h2", std::move(hosts));
  request.own_host = "h3";
  EXPECT_EQ(ExpectStart(DecideRestartRound(request)).taker,
            "restart round 1: host h3 takes host h2's group rank 1");
}

TEST(RestartRounds, WithNoHostLeftToTakeTheGroupRankTheJobFailsNamingHostWhyAndGroupRank) {
  RestartRoundHosts hosts = FourHosts();
  hosts.dead = {"h3"};
  hosts.left = {"h4"};
  RestartRoundRequest request = HostDied("h2", std::move(hosts));
  EXPECT_EQ(ExpectFail(DecideRestartRound(request)),
            "host h2 died (host h2 is dead (no heartbeat for 3s)) and no standby host is left to "
            "take its group rank 1 in a restart");
}

TEST(RestartRounds, TheMasterAddressFollowsGroupRankZerosHost) {
  RestartRoundRequest request = HostDied("h1", FourHosts());
  request.own_host = "h2";
  const RestartRoundDecision::Start start = ExpectStart(DecideRestartRound(request));
  EXPECT_EQ(start.taker, "restart round 1: host h3 takes host h1's group rank 0");
  ASSERT_TRUE(start.plan.has_value());
  EXPECT_THAT(Groups(*start.plan), ElementsAre("h1:-1", "h2:1", "h3:0", "h4:-1"));
  EXPECT_EQ(start.plan->master_addr, "10.0.0.3");
  EXPECT_EQ(start.plan->master_port, 29502);
  EXPECT_EQ(start.plan->training_hosts, 2);
}

TEST(RestartRounds, ADeadStandbyHostRestartsTheJobAndChangesNoGroupRank) {
  RestartRoundRequest request = HostDied("h3", FourHosts());
  request.round = 1;
  const RestartRoundDecision::Start start = ExpectStart(DecideRestartRound(request));
  EXPECT_EQ(start.round, 2);
  EXPECT_THAT(start.taker, IsEmpty());
  ASSERT_TRUE(start.plan.has_value());
  EXPECT_THAT(Groups(*start.plan), ElementsAre("h1:0", "h2:1", "h3:-1", "h4:-1"));
  EXPECT_EQ(start.plan->training_hosts, 2);
  EXPECT_EQ(start.plan->master_addr, "10.0.0.1");
}

// A host that joined after the plan was written holds no group rank: it may take one, and the
// round's plan names it.
TEST(RestartRounds, AHostThatJoinedAfterThePlanIsAStandbyHostThatMayTakeTheGroupRank) {
  RestartRoundHosts hosts;
  hosts.groups = {{"h1", 0}, {"h2", 1}};
  hosts.joined = {{"h1", "10.0.0.1", 29500}, {"h2", "10.0.0.2", 29501}, {"h5", "10.0.0.5", 1}};
  const RestartRoundDecision::Start start =
      ExpectStart(DecideRestartRound(HostDied("h2", std::move(hosts))));
  EXPECT_EQ(start.taker, "restart round 1: host h5 takes host h2's group rank 1");
  ASSERT_TRUE(start.plan.has_value());
  EXPECT_THAT(Groups(*start.plan), ElementsAre("h1:0", "h2:-1", "h5:1"));
}

}  // namespace
}  // namespace trainguard
