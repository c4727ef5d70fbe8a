// How a host's agent is in the job beside the others (HostMembership), one host and several
// through the same calls the launcher's loop makes: several hosts join, take their turn, publish a
// failure and leave through the store (StoreHostMembership); one host has no other host to meet and
// writes nothing but its ranks' stop reports (OneHostMembership). An in-memory store, a ManualClock
// and a FakeProcessSupervisor whose workers are not processes: no processes, no sleeps.
#include "sdk/host_agent/host_membership.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/host_agent/host_agent.h"
#include "tests/support/agent_connection.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/counting_store.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kTick = absl::Milliseconds(250);  // --host-timeout 3 / 12
constexpr absl::Duration kStoreLossBound = absl::Seconds(30);
constexpr absl::Duration kLeaveWait = absl::Seconds(11);
constexpr int kFailed = 1;

enum class Layout { kOneHost, kSeveralHosts };

// One host's agent as the launcher wires it: its HostAgent, its workers, and the membership the
// layout chooses, whose hooks record what the launcher's part of the turn would do.
struct Agent {
  Agent(const std::string& id, Layout layout, Store* store, ManualClock* clock,
        bool serves_store = false)
      : id(id), link(store), counted(&link), turn_reads(&counted) {
    const HostAgentOptions options =
        testing::TestHostAgentOptions(id, kCall, kFailed, kStoreLossBound);
    HostAgent::Hooks hooks;
    hooks.workers = testing::WorkersIn(&workers);
    hooks.say = [this](const std::string& line) { said.push_back(line); };
    hooks.record = [](int, EventKind, const std::string&, HostAgent::Attributes) {};
    hooks.latest_term = [] { return int64_t{1}; };
    hooks.pid_file = [this](int rank) {
      return absl::StrCat("/run/job/pids/", this->id, "/rank-", rank);
    };
    hooks.rank_taken = [](HostWorker&) {};
    agent = std::make_unique<HostAgent>(&turn_reads, clock, &supervisor, options, std::move(hooks));
    if (layout == Layout::kOneHost) {
      OneHostMembership::Hooks h;
      h.formed = [this] { return formed; };
      h.start_every_rank = [this](int64_t round) {
        turn.push_back(absl::StrCat("start every rank, round ", round));
        return start_result;
      };
      membership = std::make_unique<OneHostMembership>(agent.get(), /*ranks=*/2, std::move(h));
      return;
    }
    StoreHostMembershipOptions m;
    m.host_id = id;
    m.local_addr = "10.0.0.1";
    m.master_port = 29500;
    m.job_id = "j";
    m.join_timeout = kCall;
    m.tick_interval = kTick;
    m.serves_store = serves_store;
    m.leave_wait = kLeaveWait;
    StoreHostMembership::Hooks h;
    h.fail = [this](const std::string& why) {
      failed.push_back(why);
      ended = true;
    };
    h.ended = [this] { return ended; };
    h.update_lease = [this] { turn.push_back("lease"); };
    h.release_lease = [this] { turn.push_back("release lease"); };
    h.follow = [this] {
      turn.push_back("follow");
      ended = ended || end_in_follow;
    };
    h.coordinate = [this] { turn.push_back("coordinate"); };
    h.start_planned = [this] {
      turn.push_back("start planned");
      return start_result;
    };
    // The keys the launcher's turn reads that this agent's own parts read (Job::TurnKeys).
    h.turn_keys = [this] {
      return std::vector<std::string>{store_keys::kAgentsDead.Key(this->id), store_keys::kJobFailed,
                                      store_keys::kJobDone, store_keys::AgentKillCount(this->id)};
    };
    membership = std::make_unique<StoreHostMembership>(&turn_reads, clock, agent.get(), &turn_reads,
                                                       std::move(m), std::move(h));
  }

  HostWorker& StartRank(int rank) {
    return testing::StartHostWorker(supervisor, workers, rank, testing::RankMember(id, 100, rank));
  }

  std::string id;
  testing::AgentConnection link;
  testing::CountingStore counted;  // what this agent asks of the store
  TurnReadStore turn_reads;        // in front of it, as the launcher's agent reads the store
  testing::FakeProcessSupervisor supervisor;
  std::vector<std::unique_ptr<HostWorker>> workers;
  std::unique_ptr<HostAgent> agent;
  std::unique_ptr<HostMembership> membership;
  bool formed = false;            // one host: generation 0 formed and said
  bool ended = false;             // several: the job ended for this agent (a hook failed it)
  bool end_in_follow = false;     // several: following the plan fails the job
  absl::Status start_result;      // what starting this host's processes returns
  std::vector<std::string> turn;  // the launcher's parts of the turn and the starts, in order
  std::vector<std::string> failed;
  std::vector<std::string> said;
};

class HostMembershipTest : public ::testing::TestWithParam<Layout> {
 protected:
  bool several() const { return GetParam() == Layout::kSeveralHosts; }
  std::vector<std::string> Keys() {
    absl::StatusOr<std::vector<std::string>> keys = store_.ListKeys("", kCall);
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys.ok() ? *keys : std::vector<std::string>{};
  }
  bool Has(const std::string& key) { return store_.Get(key, kCall).ok(); }

  InMemoryStore store_;
  ManualClock clock_{absl::UnixEpoch()};
  Agent h1_{"h1", GetParam(), &store_, &clock_};
};

INSTANTIATE_TEST_SUITE_P(Layouts, HostMembershipTest,
                         ::testing::Values(Layout::kOneHost, Layout::kSeveralHosts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return info.param == Layout::kOneHost ? "OneHost" : "SeveralHosts";
                         });

// Several hosts' agents meet through the store: the join record (the plan orders the hosts by its
// sequence) and the leaving word the store's own host waits for. One host meets nobody.
TEST_P(HostMembershipTest, JoiningAndLeavingAreWrittenOnlyWhereOtherHostsAreThere) {
  ASSERT_TRUE(h1_.membership->Join().ok());
  h1_.membership->Leave(0);
  if (!several()) {
    EXPECT_THAT(Keys(), IsEmpty());
    return;
  }
  const std::string key = store_keys::kAgentJoins.Key("h1");
  absl::StatusOr<store_keys::JoinRecord> joined =
      store_keys::DecodeJoinRecord(key, store_.Get(key, kCall).value_or(""));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->host, "h1");
  EXPECT_EQ(joined->seq, 1);
  EXPECT_FALSE(joined->standby);
  EXPECT_EQ(joined->addr, "10.0.0.1");
  EXPECT_EQ(joined->port, 29500);
  EXPECT_EQ(store_.Get(store_keys::kAgentsLeft.Key("h1"), kCall).value_or(""), "0");
  EXPECT_THAT(h1_.turn, ElementsAre("release lease"));  // before the word it left
}

// A failure is published for every other host's agent to stop on (and say why); one host has no
// other agent to tell.
TEST_P(HostMembershipTest, AFailureReachesTheOtherHostsAgentsOnlyWhereThereAreOthers) {
  ASSERT_TRUE(h1_.membership->Join().ok());
  h1_.membership->AnnounceFailure("rank 3 died (exited with status 1)");
  if (!several()) {
    EXPECT_FALSE(Has(store_keys::kJobFailed));
    return;
  }
  Agent h2("h2", Layout::kSeveralHosts, &store_, &clock_);
  EXPECT_EQ(h2.agent->WatchJobEnd(), (AgentExit{kFailed, "rank 3 died (exited with status 1)"}));
  EXPECT_THAT(h2.said, ElementsAre("job failed: rank 3 died (exited with status 1)"));
}

// The ranks waiting in a collective for a stopped peer read its stop report. One host writes it
// from generation 0's formation on, and writes nothing else in its turn (no heartbeat: no host
// watches it); several write it in every turn, beside the heartbeat.
TEST_P(HostMembershipTest, AStoppedRankIsReportedInTheHostsTurn) {
  HostWorker& rank0 = h1_.StartRank(0);
  h1_.supervisor.Stop(rank0.worker);
  const std::string stopped = store_keys::kAgentStopped.Key(rank0.member_id);
  EXPECT_EQ(h1_.membership->Tick(), std::nullopt);
  if (!several()) {
    EXPECT_THAT(Keys(), IsEmpty());  // generation 0 has not formed
    h1_.formed = true;
    EXPECT_EQ(h1_.membership->Tick(), std::nullopt);
    EXPECT_THAT(Keys(), ElementsAre(stopped));
    return;
  }
  EXPECT_TRUE(Has(stopped));
  EXPECT_TRUE(Has(store_keys::kAgentHeartbeats.Key("h1")));
}

// The job's last line says what finished: on one host, every rank of the job; on several, every
// rank, and this host's share.
TEST_P(HostMembershipTest, ASuccessIsDescribedWithTheRanksThisHostFinished) {
  EXPECT_EQ(
      h1_.membership->DescribeSuccess(2),
      several() ? "every rank finished; host h1: 2 rank(s) finished here" : "2 ranks finished");
  if (several()) {
    EXPECT_EQ(h1_.membership->DescribeSuccess(0),
              "every rank finished; host h1: 0 rank(s) finished here");
  }
}

// One host's plan is its own: every rank starts at once, at the job's start and in each restart
// round, and a process that cannot start is the caller's error. Several hosts start nothing before
// a plan names them (their turn follows it); a restart round starts what the published plan gives
// this host.
TEST_P(HostMembershipTest, ProcessesStartAtOnceOnlyWhereThisHostIsTheWholeJob) {
  ASSERT_TRUE(h1_.membership->Join().ok());
  ASSERT_TRUE(h1_.membership->Start().ok());
  ASSERT_TRUE(h1_.membership->StartRound(2).ok());
  h1_.start_result = absl::ResourceExhaustedError("rank 1: fork: out of memory");
  const absl::Status failed = h1_.membership->StartRound(3);
  EXPECT_TRUE(absl::IsResourceExhausted(failed)) << failed;
  EXPECT_EQ(failed.message(), "rank 1: fork: out of memory");
  if (several()) {
    EXPECT_THAT(h1_.turn, ElementsAre("start planned", "start planned"));
    return;
  }
  EXPECT_THAT(h1_.turn, ElementsAre("start every rank, round 0", "start every rank, round 2",
                                    "start every rank, round 3"));
  EXPECT_THAT(Keys(), IsEmpty());
}

// The loop turns every 50 ms or at once on a worker's event; several hosts' agent acts once per
// tick interval by the clock (one heartbeat each), not at every turn.
TEST(StoreHostMembership, ATurnActsAtMostOncePerTickInterval) {
  InMemoryStore store;
  ManualClock clock;
  Agent h1("h1", Layout::kSeveralHosts, &store, &clock);
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_EQ(h1.agent->beats(), 1);
  clock.Advance(kTick - absl::Nanoseconds(1));
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_EQ(h1.agent->beats(), 1);
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_EQ(h1.agent->beats(), 2);
  EXPECT_THAT(h1.turn,
              ElementsAre("lease", "follow", "coordinate", "lease", "follow", "coordinate"));
}

// A quiet turn costs the store two requests, whatever the agent's parts read: its keys in one
// MultiGet and its heartbeat. A kill request moves the count the turn reads: the next turn lists
// the requests, carries it out, and the turn after is quiet again.
TEST(StoreHostMembership, AQuietTurnReadsItsKeysInOneRequestAndListsKillsOnlyWhenTheirCountMoved) {
  InMemoryStore store;
  ManualClock clock;
  Agent h1("h1", Layout::kSeveralHosts, &store, &clock);
  HostWorker& rank0 = h1.StartRank(0);
  ASSERT_EQ(h1.membership->Tick(), std::nullopt);  // the first turn lists the requests once
  h1.counted.Reset();
  clock.Advance(kTick);
  ASSERT_EQ(h1.membership->Tick(), std::nullopt);
  using Counts = testing::CountingStore::Counts;
  EXPECT_EQ(h1.counted.counts(),
            (Counts{{{"MultiGet", "agents/dead/hN|job/failed|job/done|agents/kills/hN"}, 1},
                    {{"Set", "agents/hb/hN"}, 1}}));
  EXPECT_GE(h1.turn_reads.reads_answered(), 4);

  ASSERT_TRUE(RequestKill(&store, "h1", rank0.member_id,
                          {1, std::string(EventKindName(EventKind::kRankUnresponsive)), "stale"},
                          kCall)
                  .ok());
  clock.Advance(kTick);
  ASSERT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_TRUE(rank0.killed_for_liveness);
  EXPECT_FALSE(store.Get(store_keys::AgentKill("h1", rank0.member_id), kCall).ok());

  h1.counted.Reset();
  clock.Advance(kTick);
  ASSERT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_EQ(h1.counted.counts().count({"ListKeys", "agents/kill/hN/"}), 0u);
}

// A turn carries out the kill requests addressed to this host between following the generation
// and coordinating; once the job ended for this agent (following the plan failed it), the rest of
// the turn is skipped: no kill carried out, no stop report, no coordination.
TEST(StoreHostMembership, ATurnStopsWhereTheJobEndedForThisAgent) {
  InMemoryStore store;
  ManualClock clock;
  Agent h1("h1", Layout::kSeveralHosts, &store, &clock);
  HostWorker& rank0 = h1.StartRank(0);
  const std::string kill = store_keys::AgentKill("h1", rank0.member_id);
  ASSERT_TRUE(RequestKill(&store, "h1", rank0.member_id,
                          {1, std::string(EventKindName(EventKind::kRankUnresponsive)), "stale"},
                          kCall)
                  .ok());
  h1.end_in_follow = true;
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_THAT(h1.turn, ElementsAre("lease", "follow"));
  EXPECT_TRUE(store.Get(kill, kCall).ok());
  EXPECT_FALSE(rank0.killed_for_liveness);

  h1.end_in_follow = false;
  h1.ended = false;
  clock.Advance(kTick);
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_TRUE(rank0.killed_for_liveness);
  EXPECT_FALSE(store.Get(kill, kCall).ok());
  EXPECT_THAT(h1.turn, ElementsAre("lease", "follow", "lease", "follow", "coordinate"));
}

// A fenced host ends first, even when the job ended meanwhile (its ranks were given to others: it
// did not succeed with them), and the job's end ends an agent before it could take over the lease
// the leaving coordinator released.
TEST(StoreHostMembership, AFenceThenTheJobsEndEndTheAgentBeforeTheLeaseIsTouched) {
  InMemoryStore store;
  ManualClock clock;
  Agent h1("h1", Layout::kSeveralHosts, &store, &clock);
  Agent h2("h2", Layout::kSeveralHosts, &store, &clock);
  ASSERT_TRUE(store.Set(store_keys::kJobDone, "", kCall).ok());
  ASSERT_TRUE(store.Set(store_keys::kAgentsDead.Key("h1"), "silent for 3s", kCall).ok());
  const std::optional<AgentExit> fenced = h1.membership->Tick();
  ASSERT_TRUE(fenced.has_value());
  EXPECT_EQ(fenced->code, kFailed);
  EXPECT_THAT(fenced->failure, HasSubstr("this host (h1) was declared dead by the coordinator "
                                         "(silent for 3s)"));
  EXPECT_EQ(h2.membership->Tick(), (AgentExit{0, ""}));
  EXPECT_THAT(h1.turn, IsEmpty());
  EXPECT_THAT(h2.turn, IsEmpty());
}

// A host cut off from the store past its bound fails the job (said by the launcher with the
// job's first fault), and does nothing else in that turn; within the bound it goes on.
TEST(StoreHostMembership, AHostCutOffFromTheStorePastItsBoundFailsTheJob) {
  InMemoryStore store;
  ManualClock clock;
  Agent h1("h1", Layout::kSeveralHosts, &store, &clock);
  ASSERT_EQ(h1.membership->Tick(), std::nullopt);
  h1.link.cut_off = true;
  h1.turn.clear();
  clock.Advance(kStoreLossBound);
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  EXPECT_THAT(h1.failed, IsEmpty());
  clock.Advance(kTick);
  EXPECT_EQ(h1.membership->Tick(), std::nullopt);
  ASSERT_EQ(h1.failed.size(), 1u);
  EXPECT_THAT(h1.failed[0], HasSubstr("host h1 has not reached the job's store"));
  // The turn within the bound ran on (its store calls failed); the failing one stopped at once.
  EXPECT_THAT(h1.turn, ElementsAre("lease", "follow", "coordinate"));
}

TEST(StoreHostMembership, ASecondAgentWithTheSameHostIdCannotJoin) {
  InMemoryStore store;
  ManualClock clock;
  Agent first("h1", Layout::kSeveralHosts, &store, &clock);
  Agent second("h1", Layout::kSeveralHosts, &store, &clock);
  ASSERT_TRUE(first.membership->Join().ok());
  const absl::Status joined = second.membership->Join();
  EXPECT_TRUE(absl::IsAlreadyExists(joined)) << joined;
  EXPECT_THAT(joined.message(), HasSubstr("host id h1 already joined job j (1 worker 10.0.0.1 "
                                          "29500): give every host its own --host-id"));
}

// The agent that serves the store keeps it until the other hosts left, so that they read the
// job's end; at most its bound, and it says who is still in the job when it stops waiting.
TEST(StoreHostMembership, TheStoresHostLeavesOnceTheOthersLeftAndAtMostItsBound) {
  InMemoryStore store;
  ManualClock clock;
  Agent server("h0", Layout::kSeveralHosts, &store, &clock, /*serves_store=*/true);
  Agent other("h1", Layout::kSeveralHosts, &store, &clock);
  ASSERT_TRUE(server.membership->Join().ok());
  ASSERT_TRUE(other.membership->Join().ok());
  other.membership->Leave(0);
  const absl::Time start = clock.Now();
  server.membership->Leave(0);
  EXPECT_EQ(clock.Now(), start);  // the other had left: no wait
  EXPECT_THAT(server.said, IsEmpty());

  InMemoryStore store2;
  Agent server2("h0", Layout::kSeveralHosts, &store2, &clock, /*serves_store=*/true);
  Agent stays("h1", Layout::kSeveralHosts, &store2, &clock);
  ASSERT_TRUE(server2.membership->Join().ok());
  ASSERT_TRUE(stays.membership->Join().ok());
  const absl::Time start2 = clock.Now();
  server2.membership->Leave(0);
  EXPECT_GE(clock.Now() - start2, kLeaveWait);
  EXPECT_THAT(server2.said,
              ElementsAre(HasSubstr("stopping the store before every host left (still in the "
                                    "job: h1;")));
}

}  // namespace
}  // namespace trainguard
