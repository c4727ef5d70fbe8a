// The keys and values of `trainguard run`'s host agents, as every agent has always spelled them: a
// change here is a protocol change that the agents of an older launcher would not follow.
#include "sdk/core/agent_keys.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "sdk/runtime/peer_progress.h"

namespace trainguard::store_keys {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// InvalidArgument whose message names `what` (the key, the field).
MATCHER_P(RefusedNaming, what, "") {
  if (arg.ok()) {
    *result_listener << "decoded";
    return false;
  }
  *result_listener << arg.status();
  return arg.status().code() == absl::StatusCode::kInvalidArgument &&
         arg.status().message().find(what) != absl::string_view::npos;
}

TEST(AgentKeys, EveryKeyIsSpelledAsTheProtocolSays) {
  EXPECT_STREQ(kAgentSeq, "agents/seq");
  EXPECT_STREQ(kAgentPlan, "agents/plan");
  EXPECT_STREQ(kAgentRestart, "agents/restart");
  EXPECT_STREQ(kCoordLease, "coord/lease");
  EXPECT_STREQ(CoordinatorLease::kKey, "coord/lease");
  EXPECT_STREQ(kJobFailed, "job/failed");
  EXPECT_STREQ(kJobDone, "job/done");
  EXPECT_EQ(kAgentJoins.Key("h1"), "agents/join/h1");
  EXPECT_EQ(kAgentHeartbeats.Key("h1"), "agents/hb/h1");
  EXPECT_EQ(kAgentsDead.Key("h1"), "agents/dead/h1");
  EXPECT_EQ(kAgentsLeft.Key("h1"), "agents/left/h1");
  EXPECT_EQ(kAgentMetrics.Key("h1"), "agents/metrics/h1");
  EXPECT_EQ(HostMetricsKey("h1"), "agents/metrics/h1");
  EXPECT_EQ(kAgentDeaths.Key("h1:41:rank3"), "agents/deaths/h1:41:rank3");
  EXPECT_EQ(kAgentStopped.Key("h1:41:rank3"), "agents/stopped/h1:41:rank3");
  EXPECT_STREQ(runtime_internal::kStoppedMemberPrefix, "agents/stopped/");
  EXPECT_STREQ(kHostMetricsPrefix, "agents/metrics/");
  EXPECT_EQ(AgentFinishedPrefix(0), "agents/finished/");
  EXPECT_EQ(AgentFinished(0, 7), "agents/finished/7");
  EXPECT_EQ(AgentFinishedPrefix(2), "agents/round2/finished/");
  EXPECT_EQ(AgentFinished(2, 7), "agents/round2/finished/7");
  EXPECT_STREQ(kJobPersistFailedPrefix, "job/persist_failed/");
  EXPECT_EQ(JobPersistFailed(42, 3), "job/persist_failed/000000000042/3");
}

TEST(AgentKeys, AKeyOfAFamilyNamesItsHostOrMember) {
  EXPECT_EQ(kAgentJoins.Name("agents/join/h1"), "h1");
  EXPECT_EQ(kAgentDeaths.Name("agents/deaths/h1:41:round2:rank3"), "h1:41:round2:rank3");
  EXPECT_EQ(kAgentJoins.Name("agents/join/"), std::nullopt);
  EXPECT_EQ(kAgentJoins.Name("agents/left/h1"), std::nullopt);
  EXPECT_EQ(kAgentJoins.Name("agents/joi"), std::nullopt);
  EXPECT_THAT(
      kAgentsLeft.Names({"agents/left/a", "agents/left/", "agents/dead/b", "agents/left/c"}),
      ElementsAre("a", "c"));
}

TEST(AgentKeys, AMemberIdNamesItsHost) {
  EXPECT_EQ(MemberHost("h1:41:rank3"), "h1");
  EXPECT_EQ(MemberHost("h1:41:round2:standby0"), "h1");
  EXPECT_EQ(MemberHost("h1"), "h1");
}

// Spawn (sdk/launch/launch_agent.cc) has always written these bytes: the agents of an older
// launcher, and the keys per member in a store, hold them.
TEST(AgentKeys, AMemberIdRoundTripsItsHostPidRoundAndRole) {
  using Role = MemberId::Role;
  const struct {
    MemberId id;
    const char* bytes;
  } cases[] = {
      {{"h1", 41, 0, Role::kRank, 3}, "h1:41:rank3"},
      {{"h1", 41, 0, Role::kStandby, 0}, "h1:41:standby0"},
      {{"host-2.a_b", 7, 2, Role::kRank, 0}, "host-2.a_b:7:round2:rank0"},
      {{"h1", 41, 12, Role::kStandby, 5}, "h1:41:round12:standby5"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(EncodeMemberId(c.id), c.bytes);
    absl::StatusOr<MemberId> back = DecodeMemberId(c.bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->host, c.id.host) << c.bytes;
    EXPECT_EQ(back->pid, c.id.pid) << c.bytes;
    EXPECT_EQ(back->round, c.id.round) << c.bytes;
    EXPECT_EQ(back->role, c.id.role) << c.bytes;
    EXPECT_EQ(back->index, c.id.index) << c.bytes;
    EXPECT_EQ(EncodeMemberId(*back), c.bytes);
    EXPECT_EQ(MemberHost(c.bytes), c.id.host);
  }
}

TEST(AgentKeys, AMalformedMemberIdIsRefusedNamingTheIdAndTheField) {
  const struct {
    const char* id;
    const char* field;
  } cases[] = {
      {"h1", "the id"},  // a rank's own id ("<host>:<pid>") is no launcher's
      {"h1:41", "the id"},
      {"h1:41:round2:rank3:x", "the id"},
      {":41:rank3", "host"},
      {"h1::rank3", "pid"},
      {"h1:x:rank3", "pid"},
      {"h1:-41:rank3", "pid"},
      {"h1:+41:rank3", "pid"},
      {"h1:041:rank3", "pid"},  // would encode back as 41
      {"h1:41:2:rank3", "round"},
      {"h1:41:round:rank3", "round"},
      {"h1:41:roundx:rank3", "round"},
      {"h1:41:round0:rank3", "round"},  // round 0 is written as no round
      {"h1:41:captain3", "role"},
      {"h1:41:round2:", "role"},
      {"h1:41:rank", "rank"},
      {"h1:41:rank-1", "rank"},
      {"h1:41:rank 1", "rank"},
      {"h1:41:standbyA", "standby index"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(DecodeMemberId(c.id), RefusedNaming(absl::StrCat("member id \"", c.id, "\"")))
        << c.id;
    EXPECT_THAT(DecodeMemberId(c.id), RefusedNaming(absl::StrCat("\": ", c.field, " "))) << c.id;
  }
}

TEST(AgentKeys, AJoinRecordRoundTripsWithItsHostFromTheKey) {
  for (bool standby : {false, true}) {
    const JoinRecord j{"h2", 3, standby, "10.0.0.2", 29500};
    const std::string value = EncodeJoinRecord(j);
    EXPECT_EQ(value, standby ? "3 standby 10.0.0.2 29500" : "3 worker 10.0.0.2 29500");
    absl::StatusOr<JoinRecord> back = DecodeJoinRecord(kAgentJoins.Key("h2"), value);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->host, "h2");
    EXPECT_EQ(back->seq, 3);
    EXPECT_EQ(back->standby, standby);
    EXPECT_EQ(back->addr, "10.0.0.2");
    EXPECT_EQ(back->port, 29500);
  }
}

TEST(AgentKeys, AMalformedJoinRecordIsRefusedNamingTheKeyAndField) {
  const std::string key = kAgentJoins.Key("h2");
  EXPECT_THAT(DecodeJoinRecord(key, ""), RefusedNaming("agents/join/h2"));
  EXPECT_THAT(DecodeJoinRecord(key, "3 worker 10.0.0.2"), RefusedNaming("the record"));
  EXPECT_THAT(DecodeJoinRecord(key, "3 worker 10.0.0.2 1 x"), RefusedNaming("the record"));
  EXPECT_THAT(DecodeJoinRecord(key, "x worker a 1"), RefusedNaming("seq"));
  EXPECT_THAT(DecodeJoinRecord(key, "0 worker a 1"), RefusedNaming("seq"));
  EXPECT_THAT(DecodeJoinRecord(key, "1 spare a 1"), RefusedNaming("role"));
  EXPECT_THAT(DecodeJoinRecord(key, "1 worker  1"), RefusedNaming("addr"));
  EXPECT_THAT(DecodeJoinRecord(key, "1 worker a port"), RefusedNaming("port"));
  EXPECT_THAT(DecodeJoinRecord(key, "1 worker a 65536"), RefusedNaming("port"));
  EXPECT_THAT(DecodeJoinRecord("agents/left/h2", "1 worker a 1"), RefusedNaming("agents/join/"));
}

TEST(AgentKeys, APlanRoundTripsInJoinOrder) {
  Plan p;
  p.training_hosts = 2;
  p.ranks_per_host = 4;
  p.master_addr = "10.0.0.1";
  p.master_port = 29500;
  p.hosts = {{"h1", 0}, {"h3", -1}, {"h2", 1}};
  const std::string value = EncodePlan(p);
  EXPECT_EQ(value, "2 4 10.0.0.1 29500\nh1 0\nh3 -1\nh2 1");
  absl::StatusOr<Plan> back = DecodePlan(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->training_hosts, 2);
  EXPECT_EQ(back->ranks_per_host, 4);
  EXPECT_EQ(back->master_addr, "10.0.0.1");
  EXPECT_EQ(back->master_port, 29500);
  ASSERT_EQ(back->hosts.size(), 3u);
  EXPECT_EQ(back->hosts[1].host, "h3");
  EXPECT_EQ(back->hosts[1].group, -1);
  EXPECT_EQ(back->GroupOf("h2"), 1);
  EXPECT_EQ(back->GroupOf("h3"), -1);
  EXPECT_EQ(back->GroupOf("h9"), -1);
  EXPECT_EQ(back->Groups(), (std::map<std::string, int>{{"h1", 0}, {"h2", 1}, {"h3", -1}}));
  // A plan that names no host yet is still a plan.
  absl::StatusOr<Plan> bare = DecodePlan("1 8 a 1");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->hosts.empty());
}

TEST(AgentKeys, AMalformedPlanIsRefusedNamingTheField) {
  EXPECT_THAT(DecodePlan(""), RefusedNaming("agents/plan"));
  EXPECT_THAT(DecodePlan("2 4 10.0.0.1"), RefusedNaming("line 1"));
  EXPECT_THAT(DecodePlan("x 4 a 1"), RefusedNaming("training hosts"));
  EXPECT_THAT(DecodePlan("0 4 a 1"), RefusedNaming("training hosts"));
  EXPECT_THAT(DecodePlan("2 0 a 1"), RefusedNaming("ranks per host"));
  EXPECT_THAT(DecodePlan("2 4  1"), RefusedNaming("master addr"));
  EXPECT_THAT(DecodePlan("2 4 a -1"), RefusedNaming("port"));
  EXPECT_THAT(DecodePlan("2 4 a 1\nh1"), RefusedNaming("line 2"));
  EXPECT_THAT(DecodePlan("2 4 a 1\nh1 0\nh2 x"), RefusedNaming("line 3's group rank"));
  EXPECT_THAT(DecodePlan("2 4 a 1\nh1 -2"), RefusedNaming("line 2's group rank"));
  EXPECT_THAT(DecodePlan("2 4 a 1\n"), RefusedNaming("line 2"));
}

TEST(AgentKeys, ADeathReportRoundTripsWithItsMemberFromTheKey) {
  const DeathReport d{"h1:41:rank3", 3, "killed by signal 9 (Killed)", ""};
  const std::string value = EncodeDeathReport(d);
  EXPECT_EQ(value, "3 killed by signal 9 (Killed)");
  absl::StatusOr<DeathReport> back = DecodeDeathReport(kAgentDeaths.Key(d.member), value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->member, d.member);
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->how, d.how);
  EXPECT_EQ(back->cause, "");
}

TEST(AgentKeys, ADeathReportCarriesItsCauseOnASecondLine) {
  const DeathReport d{"h2:57:rank2", 2, "exited with status 1",
                      "rank 2 error: cannot start: snapshot arena /trainguard.j.rank2 needs "
                      "64.00 MiB: No space left on device"};
  const std::string value = EncodeDeathReport(d);
  EXPECT_EQ(value, absl::StrCat("2 exited with status 1\n", d.cause));
  absl::StatusOr<DeathReport> back = DecodeDeathReport(kAgentDeaths.Key(d.member), value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->member, d.member);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->how, d.how);
  EXPECT_EQ(back->cause, d.cause);
}

// The bytes an agent without causes wrote still decode, with no cause.
TEST(AgentKeys, AnOlderAgentsDeathReportDecodesWithNoCause) {
  absl::StatusOr<DeathReport> back =
      DecodeDeathReport(kAgentDeaths.Key("h1:41:rank3"), "3 killed by SIGKILL");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->how, "killed by SIGKILL");
  EXPECT_EQ(back->cause, "");
}

TEST(AgentKeys, ADeathReportKeepsItsHowAndCauseToOneLineEach) {
  const DeathReport d{"h1:41:rank3", 3, "exited\nwith status 1", "line one\nline two"};
  absl::StatusOr<DeathReport> back =
      DecodeDeathReport(kAgentDeaths.Key(d.member), EncodeDeathReport(d));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->how, "exited with status 1");
  EXPECT_EQ(back->cause, "line one line two");
}

TEST(AgentKeys, AMalformedDeathReportIsRefusedNamingTheKeyAndField) {
  const std::string key = kAgentDeaths.Key("h1:41:rank3");
  EXPECT_THAT(DecodeDeathReport(key, "exited"), RefusedNaming("agents/deaths/h1:41:rank3"));
  EXPECT_THAT(DecodeDeathReport(key, "x exited with status 1"), RefusedNaming("rank"));
  EXPECT_THAT(DecodeDeathReport(key, "-1 exited with status 1"), RefusedNaming("rank"));
  EXPECT_THAT(DecodeDeathReport("agents/deaths/", "1 x"), RefusedNaming("<member>"));
}

TEST(AgentKeys, ARestartRoundRoundTrips) {
  const RestartRound r{2, "host h2 is dead (no heartbeat for 3s)"};
  const std::string value = EncodeRestartRound(r);
  EXPECT_EQ(value, "2 host h2 is dead (no heartbeat for 3s)");
  absl::StatusOr<RestartRound> back = DecodeRestartRound(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->round, 2);
  EXPECT_EQ(back->why, r.why);
  absl::StatusOr<RestartRound> bare = DecodeRestartRound("3");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->why, "");
}

TEST(AgentKeys, AMalformedRestartRoundIsRefused) {
  for (const char* bad : {"", " why", "x why", "0 why", "-1 why"}) {
    EXPECT_THAT(DecodeRestartRound(bad), RefusedNaming("agents/restart")) << bad;
    EXPECT_THAT(DecodeRestartRound(bad), RefusedNaming("round")) << bad;
  }
}

TEST(AgentKeys, ALeaseRecordRoundTrips) {
  for (const LeaseRecord& l :
       {LeaseRecord{1, "hostA", 0}, LeaseRecord{7, CoordinatorLease::kReleasedHolder, 0},
        LeaseRecord{3, "h2", 12345}}) {
    const std::string value = EncodeLeaseRecord(l);
    absl::StatusOr<LeaseRecord> back = DecodeLeaseRecord(value);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->term, l.term);
    EXPECT_EQ(back->holder, l.holder);
    EXPECT_EQ(back->beat, l.beat);
  }
  EXPECT_EQ(EncodeLeaseRecord({3, "h2", 12}), "3 h2 12");
  EXPECT_EQ(EncodeLeaseRecord({3, CoordinatorLease::kReleasedHolder, 0}), "3 - 0");
}

TEST(AgentKeys, AMalformedLeaseRecordIsRefusedNamingTheField) {
  EXPECT_THAT(DecodeLeaseRecord("garbage"), RefusedNaming("coord/lease"));
  EXPECT_THAT(DecodeLeaseRecord("1 a"), RefusedNaming("the lease"));
  EXPECT_THAT(DecodeLeaseRecord("1 a 2 3"), RefusedNaming("the lease"));
  EXPECT_THAT(DecodeLeaseRecord("x a 2"), RefusedNaming("term"));
  EXPECT_THAT(DecodeLeaseRecord("-1 a 2"), RefusedNaming("term"));
  EXPECT_THAT(DecodeLeaseRecord("1  2"), RefusedNaming("holder"));
  EXPECT_THAT(DecodeLeaseRecord("1 a b"), RefusedNaming("beat"));
}

}  // namespace
}  // namespace trainguard::store_keys
