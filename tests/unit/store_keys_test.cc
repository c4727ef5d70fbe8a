// The keys processes share through the store, as each side has always spelled them: a change here
// is a protocol change that old ranks and launchers would not follow.
#include "sdk/core/store_keys.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/runtime.h"

namespace trainguard::store_keys {
namespace {

TEST(StoreKeys, EveryKeyIsSpelledAsTheProtocolSays) {
  EXPECT_STREQ(kJobStop, "job/stop");
  EXPECT_STREQ(kJobStop, Runtime::kJobStopKey);
  EXPECT_EQ(Hang(3), "hang/gen3");
  EXPECT_EQ(HangAborted(3, 12), "hang/gen3/aborted/12");
  EXPECT_EQ(HangWithdrawn(0, 1), "hang/gen0/withdrawn/1");
  EXPECT_EQ(HangProgress(7, 0), "hang/gen7/progress/0");
  EXPECT_EQ(Resumed(2, 5), "rdzv/gen/2/resumed/5");
  EXPECT_EQ(AgentKill("host2", "host2:41:rank"), "agents/kill/host2/host2:41:rank");
  EXPECT_EQ(AgentKillPrefix("host2"), "agents/kill/host2/");
}

TEST(StoreKeys, TheRendezvousKeysAreSpelledAsTheProtocolSays) {
  EXPECT_STREQ(kRdzvCurrent, "rdzv/current");
  EXPECT_EQ(RdzvTable(4), "rdzv/gen/4/table");
  EXPECT_EQ(RdzvClaim(4), "rdzv/claim/4");
  EXPECT_EQ(RdzvJoin(2), "rdzv/join/2");
  EXPECT_EQ(RdzvStandby("host:41:standby0"), "rdzv/standby/host:41:standby0");
  EXPECT_EQ(RdzvStandbyMember("rdzv/standby/host:41:standby0"), "host:41:standby0");
  EXPECT_EQ(RdzvStandbyMember("rdzv/standby/"), std::nullopt);
  EXPECT_EQ(RdzvStandbyMember("rdzv/assign/host:41:standby0"), std::nullopt);
  EXPECT_EQ(RdzvAssign("host:41:standby0"), "rdzv/assign/host:41:standby0");
  EXPECT_EQ(RdzvHeartbeat("host:41:rank1"), "rdzv/hb/host:41:rank1");
  EXPECT_EQ(RdzvRenewPrefix(3), "rdzv/gen/3/renew/");
  EXPECT_EQ(RdzvBarrierPrefix(3, "ready"), "rdzv/gen/3/barrier/ready/");
  EXPECT_EQ(RdzvProgressPrefix(3), "rdzv/gen/3/progress/");
}

TEST(StoreKeys, AStandbysAssignmentRoundTrips) {
  const std::string value = EncodeAssignment({7, 12});
  EXPECT_EQ(value, "7 12");
  absl::StatusOr<Assignment> back = DecodeAssignment(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 7);
  EXPECT_EQ(back->rank, 12);
}

TEST(StoreKeys, AnAssignmentThatIsNotAGenerationAndARankIsRefused) {
  for (const char* bad : {"", "7", "7 ", " 12", "x 12", "7 x", "-1 12", "7 -1", "7 12 3"}) {
    absl::StatusOr<Assignment> a = DecodeAssignment(bad);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(a.status().message(), testing::HasSubstr("rdzv/assign/")) << bad;
  }
}

TEST(StoreKeys, TheGenerationsAgreementKeysAreSpelledAsTheProtocolSays) {
  EXPECT_EQ(RdzvChanges(4), "rdzv/gen/4/changes");
  EXPECT_EQ(RdzvAgreed(4), "rdzv/gen/4/agreed");
  EXPECT_EQ(RdzvPlan(4), "rdzv/gen/4/plan");
  EXPECT_EQ(RdzvBarrierArrived(3, "ready"), "rdzv/gen/3/barrier/ready/arrived");
  EXPECT_EQ(RdzvBarrierPassed(3, "ready"), "rdzv/gen/3/barrier/ready/passed");
}

TEST(StoreKeys, AGenerationsChangesRoundTrip) {
  const GenerationChanges c{7, 16, {{2, "h1:40:standby0"}, {9, "h3:41:standby 1"}}};
  const std::string value = EncodeGenerationChanges(c);
  EXPECT_EQ(value, "7\n16\n2 h1:40:standby0\n9 h3:41:standby 1");
  absl::StatusOr<GenerationChanges> back = DecodeGenerationChanges(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 7);
  EXPECT_EQ(back->world_size, 16);
  EXPECT_EQ(back->taken, c.taken);
  absl::StatusOr<GenerationChanges> none = DecodeGenerationChanges("0\n4");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->taken.empty());
}

TEST(StoreKeys, ChangesThatAreNotRanksOfTheWorldInOrderAreRefused) {
  for (const char* bad : {"", "7", "x\n4", "-1\n4", "7\n0", "7\n4\n", "7\n4\n2", "7\n4\n2 ",
                          "7\n4\n4 m", "7\n4\n-1 m", "7\n4\n2 m\n2 n", "7\n4\n3 m\n1 n"}) {
    absl::StatusOr<GenerationChanges> c = DecodeGenerationChanges(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(c.status().message(), testing::HasSubstr("rdzv/gen/<g>/changes")) << bad;
  }
}

TEST(StoreKeys, ARecoveryPlanRoundTripsWithItsNewRanksAsRuns) {
  RecoveryPlan p;
  p.generation = 3;
  p.resume_step = 120;
  p.state_source_rank = 4;
  p.new_ranks = {0, 1, 2, 5, 7, 8};
  const std::string value = EncodeRecoveryPlan(p);
  EXPECT_EQ(value, "3 120 4 0-2,5,7-8");
  absl::StatusOr<RecoveryPlan> back = DecodeRecoveryPlan(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 3);
  EXPECT_EQ(back->resume_step, 120);
  EXPECT_EQ(back->state_source_rank, 4);
  EXPECT_EQ(back->new_ranks, p.new_ranks);
  RecoveryPlan none;
  none.generation = 0;
  none.state_source_rank = -1;
  EXPECT_EQ(EncodeRecoveryPlan(none), "0 0 -1 -");
  absl::StatusOr<RecoveryPlan> empty = DecodeRecoveryPlan("0 0 -1 -");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->state_source_rank, -1);
  EXPECT_TRUE(empty->new_ranks.empty());
}

TEST(StoreKeys, APlanMarkedSupersededIsToldFromAPlan) {
  EXPECT_EQ(SupersededPlan(5), "superseded by 5");
  EXPECT_TRUE(IsSupersededPlan(SupersededPlan(5)));
  EXPECT_FALSE(IsSupersededPlan("4 120 2 -"));
  EXPECT_FALSE(DecodeRecoveryPlan(SupersededPlan(5)).ok());
}

TEST(StoreKeys, APlanThatIsNotAPlanIsRefused) {
  for (const char* bad :
       {"", "3 120 4", "3 120 4 -  ", "x 120 4 -", "3 -1 4 -", "3 120 -2 -", "3 120 4 ",
        "3 120 4 2,1", "3 120 4 2-1", "3 120 4 1-", "3 120 4 -1", "3 120 4 1,1", "3 120 4 0-2,2"}) {
    absl::StatusOr<RecoveryPlan> p = DecodeRecoveryPlan(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(p.status().message(), testing::HasSubstr("rdzv/gen/<g>/plan")) << bad;
  }
}

TEST(StoreKeys, AKillKeyNamesItsMember) {
  EXPECT_EQ(AgentKillMember("host2", AgentKill("host2", "host2:41:rank3")), "host2:41:rank3");
  EXPECT_EQ(AgentKillMember("host2", "agents/kill/host2/"), std::nullopt);
  EXPECT_EQ(AgentKillMember("host2", "agents/kill/host3/host3:41:rank3"), std::nullopt);
  EXPECT_EQ(AgentKillMember("host2", "agents/kill/host"), std::nullopt);
}

TEST(StoreKeys, AHangDeclarationRoundTrips) {
  const HangDeclaration d{17, "hang (phase) at step 9: step phase: no beat for 2s: rank 3 waits"};
  const std::string value = EncodeHangDeclaration(d);
  EXPECT_EQ(value, "rank 17: hang (phase) at step 9: step phase: no beat for 2s: rank 3 waits");
  absl::StatusOr<HangDeclaration> back = DecodeHangDeclaration(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 17);
  EXPECT_EQ(back->report, d.report);
}

TEST(StoreKeys, AValueThatIsNotADeclarationIsRefused) {
  for (const char* bad : {"", "rank", "rank : x", "rank -1: x", "rank x: y", "rank 3 x", "3: x",
                          "hang: x"}) {
    absl::StatusOr<HangDeclaration> d = DecodeHangDeclaration(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(d.status().message(), testing::HasSubstr("hang/gen<G>")) << bad;
  }
}

TEST(StoreKeys, AKillRequestRoundTripsWithItsLeaseTerm) {
  const KillRequest r{3, "hang_suspect", "rank 2 never entered all_reduce #150 (comm 1)"};
  const std::string value = EncodeKillRequest(r);
  EXPECT_EQ(value, "3 hang_suspect rank 2 never entered all_reduce #150 (comm 1)");
  absl::StatusOr<KillRequest> back = DecodeKillRequest(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->term, 3);
  EXPECT_EQ(back->what, "hang_suspect");
  EXPECT_EQ(back->why, r.why);
  absl::StatusOr<KillRequest> bare = DecodeKillRequest("1 rank_unresponsive");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->why, "");
}

// Without a term (as the agents wrote them before the requests were fenced) or with a term that no
// lease has, a request is refused: the agent does not kill on it.
TEST(StoreKeys, AKillRequestWithoutAValidTermIsRefused) {
  for (const char* bad : {"", "rank_unresponsive stopped", "0 hang_suspect x", "-2 hang_suspect x",
                          "x hang_suspect y", "4", "4 ", "4  why"}) {
    absl::StatusOr<KillRequest> r = DecodeKillRequest(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), testing::HasSubstr("agents/kill/")) << bad;
  }
}

}  // namespace
}  // namespace trainguard::store_keys
