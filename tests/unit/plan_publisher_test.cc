// The plan of a job of several hosts: published once by the agent that holds the coordinator lease
// (PlanPublisher, sdk/coordinator/plan_publisher.h; LeaseKeeper, lease_keeper.h, says who
// coordinates) and followed by each host's agent (HostAgent::ReadPlan: its ranks, its standbys).
// On an in-memory store shared by the hosts' agents, each with its own ManualClock, a real
// CoordinatorLease per agent and a FakeProcessSupervisor: no processes, no sleeps. The joins are
// written as JoinAsHost writes them.
#include "sdk/coordinator/plan_publisher.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/coordinator/lease_keeper.h"
#include "sdk/core/agent_keys.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kHostTimeout = absl::Seconds(3);  // the lease's expiry
constexpr int kRanksPerHost = 2;

// One host's agent: its lease, whether it coordinates, its plan publisher, its own agent duties.
struct Agent {
  Agent(const std::string& id, Store* store, PlanOptions plan_options, int spares = 0,
        bool restart_all = false)
      : id(id), lease(store, id, kHostTimeout, &clock) {
    LeaseKeeper::Hooks keeper;
    keeper.say = [this](const std::string& line) { said.push_back(line); };
    keeper.resume = [] { return absl::NotFoundError("no generation yet"); };
    keeper.generation = [] { return int64_t{-1}; };
    keeper.took_over = [this] { ++takeovers; };
    keeper.deposed = [this] { ++depositions; };
    lease_keeper = std::make_unique<LeaseKeeper>(&lease, kCall, std::move(keeper));
    PlanPublisher::Hooks hooks;
    hooks.coordinating = [this] { return lease_keeper->Coordinating(); };
    hooks.say = [this](const std::string& line) { said.push_back(line); };
    hooks.backup_lines = [](int training_hosts) -> absl::StatusOr<std::vector<std::string>> {
      return std::vector<std::string>{absl::StrCat("backups across ", training_hosts, " hosts")};
    };
    hooks.fail = [this](const std::string& why) { failed.push_back(why); };
    publisher = std::make_unique<PlanPublisher>(store, &clock, plan_options, std::move(hooks));
    HostAgentOptions options;
    options.host_id = id;
    options.call_timeout = kCall;
    options.ranks_per_host = kRanksPerHost;
    options.spares = spares;
    options.restart_all = restart_all;
    HostAgent::Hooks agent_hooks;
    agent_hooks.workers = [] { return std::vector<HostWorker*>{}; };
    agent_hooks.say = [this](const std::string& line) { said.push_back(line); };
    agent_hooks.record = [](int, EventKind, const std::string&, HostAgent::Attributes) {};
    agent_hooks.latest_term = [this] { return lease.latest_term(); };
    agent_hooks.pid_file = [](int rank) { return absl::StrCat("/nonexistent/rank-", rank); };
    agent_hooks.rank_taken = [](HostWorker&) {};
    agent =
        std::make_unique<HostAgent>(store, &clock, &supervisor, options, std::move(agent_hooks));
  }

  std::string id;
  ManualClock clock{absl::UnixEpoch()};
  CoordinatorLease lease;
  std::unique_ptr<LeaseKeeper> lease_keeper;
  std::unique_ptr<PlanPublisher> publisher;
  testing::FakeProcessSupervisor supervisor;
  std::unique_ptr<HostAgent> agent;
  std::vector<std::string> said;
  std::vector<std::string> failed;
  int takeovers = 0;
  int depositions = 0;
};

class PlanTest : public ::testing::Test {
 protected:
  // Host `host` joins as the `seq`-th, as Job::JoinAsHost records it.
  void Join(const std::string& host, int64_t seq, bool standby, int port = 29500) {
    ASSERT_TRUE(store_
                    .Set(store_keys::kAgentJoins.Key(host),
                         store_keys::EncodeJoinRecord(
                             {host, seq, standby, absl::StrCat("10.0.0.", seq), port}),
                         kCall)
                    .ok());
  }
  std::optional<std::string> Plan() {
    absl::StatusOr<std::string> value = store_.Get(store_keys::kAgentPlan, kCall);
    if (!value.ok()) return std::nullopt;
    return *value;
  }

  InMemoryStore store_;
};

// --nnodes 2 --standby-nodes 1, two ranks per host.
PlanOptions TwoWorkersAndAStandbyHost() {
  PlanOptions options;
  options.nnodes_min = 2;
  options.nnodes_max = 2;
  options.standby_nodes = 1;
  options.ranks_per_host = kRanksPerHost;
  options.call_timeout = kCall;
  return options;
}

TEST_F(PlanTest, ThePlanIsPublishedOnceByTheLeaseHolderAndFollowedByEachAgent) {
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost(), /*spares=*/1);
  Agent h2("h2", &store_, TwoWorkersAndAStandbyHost(), /*spares=*/1);
  Agent h3("h3", &store_, TwoWorkersAndAStandbyHost(), /*spares=*/1);
  h1.lease_keeper->Update();  // the first agent takes the lease
  h2.lease_keeper->Update();  // the others watch it
  EXPECT_THAT(h1.said, ElementsAre("coordinating the job (lease term 1; generation -1)"));
  EXPECT_EQ(h1.takeovers, 1);
  EXPECT_FALSE(h2.lease_keeper->Coordinating());

  Join("h1", 1, /*standby=*/false, 29501);
  Join("h3", 2, /*standby=*/true);
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);  // one worker of the two
  EXPECT_EQ(h1.agent->ReadPlan().status().code(), absl::StatusCode::kNotFound);
  Join("h2", 3, /*standby=*/false);
  // Only the lease holder publishes.
  EXPECT_EQ(h2.publisher->PublishWhenReady(), std::nullopt);
  EXPECT_EQ(Plan(), std::nullopt);
  const std::optional<store_keys::Plan> plan = h1.publisher->PublishWhenReady();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->training_hosts, 2);
  EXPECT_EQ(plan->master_addr, "10.0.0.1");  // group 0's: the first worker to join
  EXPECT_EQ(plan->master_port, 29501);
  EXPECT_EQ(Plan(), store_keys::EncodePlan(*plan));
  EXPECT_THAT(h1.said,
              ElementsAre("coordinating the job (lease term 1; generation -1)",
                          "2 host(s) train, 1 are standby hosts", "backups across 2 hosts"));
  // Once: the plan is there, for this coordinator as for a successor.
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);
  EXPECT_EQ(h1.said.size(), 3u);

  // Each agent follows it: the workers their group's ranks and their spares, the standby host one
  // standby for each rank of a host it may replace.
  absl::StatusOr<HostAssignment> a1 = h1.agent->ReadPlan();
  absl::StatusOr<HostAssignment> a2 = h2.agent->ReadPlan();
  absl::StatusOr<HostAssignment> a3 = h3.agent->ReadPlan();
  ASSERT_TRUE(a1.ok() && a2.ok() && a3.ok());
  EXPECT_EQ(a1->group_rank, 0);
  EXPECT_THAT(a1->ranks, ElementsAre(0, 1));
  EXPECT_EQ(a1->standbys, 1);
  EXPECT_EQ(a1->world_size, 4);
  EXPECT_EQ(a1->master_addr, "10.0.0.1");
  EXPECT_EQ(a1->master_port, 29501);
  EXPECT_EQ(a2->group_rank, 1);
  EXPECT_THAT(a2->ranks, ElementsAre(2, 3));
  EXPECT_EQ(a3->group_rank, -1);
  EXPECT_THAT(a3->ranks, IsEmpty());
  EXPECT_EQ(a3->standbys, kRanksPerHost);
  EXPECT_EQ(a3->world_size, 4);
  EXPECT_EQ(a1->Describe("h1", 0), "host h1 is group 0 of 2: ranks 0..1");
  EXPECT_EQ(a2->Describe("h2", 2), "host h2 is group 1 of 2: ranks 2..3 (restart round 2)");
  EXPECT_EQ(a3->Describe("h3", 0), "host h3 is a standby host: 2 standbys");
}

TEST_F(PlanTest, UnderRestartAllAStandbyHostHoldsNoProcess) {
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost(), /*spares=*/0, /*restart_all=*/true);
  Agent h3("h3", &store_, TwoWorkersAndAStandbyHost(), /*spares=*/0, /*restart_all=*/true);
  h1.lease_keeper->Update();
  Join("h1", 1, false);
  Join("h2", 2, false);
  Join("h3", 3, true);
  ASSERT_TRUE(h1.publisher->PublishWhenReady().has_value());
  absl::StatusOr<HostAssignment> a3 = h3.agent->ReadPlan();
  ASSERT_TRUE(a3.ok());
  EXPECT_EQ(a3->standbys, 0);
  EXPECT_EQ(a3->Describe("h3", 0), "host h3 is a standby host: 0 standbys");
}

// One host follows a plan of its own, never published: the training host of a job of one host,
// every rank and its --standby spares, so the launcher starts its processes and keeps its spares
// with the code that follows a published plan.
TEST(OneHostAssignment, OneHostIsGroupZeroOfOneHostWithEveryRankAndItsSpares) {
  const HostAssignment own = OneHostAssignment(3, 2, "127.0.0.1", 29600);
  EXPECT_EQ(own.group_rank, 0);
  EXPECT_EQ(own.training_hosts, 1);
  EXPECT_EQ(own.world_size, 3);
  EXPECT_THAT(own.ranks, ElementsAre(0, 1, 2));
  EXPECT_EQ(own.standbys, 2);
  EXPECT_EQ(own.master_addr, "127.0.0.1");
  EXPECT_EQ(own.master_port, 29600);
  EXPECT_EQ(own.Describe("m", 0), "host m is group 0 of 1: ranks 0..2");
  EXPECT_THAT(OneHostAssignment(1, 0, "127.0.0.1", 1).ranks, ElementsAre(0));
}

TEST_F(PlanTest, BetweenMinAndMaxWorkersThePlanWaitsExactlyTheLastCall) {
  PlanOptions options = TwoWorkersAndAStandbyHost();
  options.nnodes_max = 3;
  options.standby_nodes = 0;
  options.last_call = absl::Seconds(10);
  Agent h1("h1", &store_, options);
  h1.lease_keeper->Update();
  Join("h1", 1, false);
  Join("h2", 2, false);
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);
  h1.clock.Advance(absl::Seconds(10) - absl::Nanoseconds(1));
  h1.lease_keeper->Update();  // renewed: still the coordinator
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);
  EXPECT_EQ(Plan(), std::nullopt);
  h1.clock.Advance(absl::Nanoseconds(1));
  h1.lease_keeper->Update();
  const std::optional<store_keys::Plan> plan = h1.publisher->PublishWhenReady();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->training_hosts, 2);
  EXPECT_THAT(h1.said,
              ElementsAre("coordinating the job (lease term 1; generation -1)",
                          "2 of at most 3 hosts joined: forming in 10s unless all join",
                          "2 host(s) train, 0 are standby hosts", "backups across 2 hosts"));
}

TEST_F(PlanTest, ADeposedCoordinatorPublishesNoPlanAndItsSuccessorDoes) {
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost());
  Agent h2("h2", &store_, TwoWorkersAndAStandbyHost());
  h1.lease_keeper->Update();
  h2.lease_keeper->Update();  // h2 first reads h1's lease at 0 of its clock
  Join("h1", 1, false);
  Join("h2", 2, false);
  Join("h3", 3, true);
  // h1 is cut off (no renewal) past its acting deadline: it stands down before anyone can take
  // over, and publishes nothing.
  h1.clock.Advance(kHostTimeout);
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);
  EXPECT_EQ(Plan(), std::nullopt);
  ASSERT_EQ(h1.said.size(), 2u);
  EXPECT_THAT(h1.said[1],
              HasSubstr("no longer coordinating (lease term 1 was not renewed in time"));
  // h2 takes the lease over once it saw it unrenewed for the expiry, and publishes.
  h2.clock.Advance(kHostTimeout);
  h2.lease_keeper->Update();
  EXPECT_THAT(h2.said, ElementsAre("coordinating the job (lease term 2; generation -1)"));
  EXPECT_EQ(h2.takeovers, 1);
  ASSERT_TRUE(h2.publisher->PublishWhenReady().has_value());
  // h1 back: it learns that it was deposed, says by whom once, and still publishes nothing.
  h1.lease_keeper->Update();
  EXPECT_EQ(h1.depositions, 1);
  EXPECT_FALSE(h1.lease_keeper->Coordinating());
  EXPECT_EQ(h1.publisher->PublishWhenReady(), std::nullopt);
  EXPECT_EQ(h1.said.size(), 2u);  // "no longer coordinating" was said when it stood down
}

TEST_F(PlanTest, ACoordinatorStalledPastTheExpirySaysWhoTookTheLeaseOnceItsRenewalFails) {
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost());
  Agent h2("h2", &store_, TwoWorkersAndAStandbyHost());
  h1.lease_keeper->Update();
  h2.lease_keeper->Update();
  // h1's loop stalls (no act, no renewal) while h2 takes the lease over.
  h1.clock.Advance(kHostTimeout);
  h2.clock.Advance(kHostTimeout);
  h2.lease_keeper->Update();
  EXPECT_TRUE(h2.lease_keeper->Coordinating());
  h1.lease_keeper->Update();  // its renewal finds h2's lease
  EXPECT_THAT(h1.said, ElementsAre("coordinating the job (lease term 1; generation -1)",
                                   "no longer coordinating (the lease is h2's now)"));
  EXPECT_EQ(h1.depositions, 1);
  EXPECT_FALSE(h1.lease_keeper->Coordinating());
  EXPECT_EQ(h1.said.size(), 2u);  // said once
}

TEST_F(PlanTest, ACoordinatorRenewedAfterItsDeadlineWithNobodyTakingOverCoordinatesAgain) {
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost());
  h1.lease_keeper->Update();
  h1.clock.Advance(kHostTimeout - absl::Milliseconds(500));  // past the acting deadline
  EXPECT_FALSE(h1.lease_keeper->Coordinating());
  h1.lease_keeper->Update();  // its renewal: nobody took the lease
  EXPECT_TRUE(h1.lease_keeper->Coordinating());
  ASSERT_EQ(h1.said.size(), 3u);
  EXPECT_THAT(h1.said[1], HasSubstr("no longer coordinating (lease term 1 was not renewed"));
  EXPECT_EQ(h1.said[2], "coordinating the job again (lease term 1 renewed; generation -1)");
  EXPECT_EQ(h1.depositions, 0);
}

TEST_F(PlanTest, OnOneHostThereIsNoLeaseAndItsCoordinatorAlwaysActs) {
  std::vector<std::string> said;
  LeaseKeeper::Hooks hooks;
  hooks.say = [&](const std::string& line) { said.push_back(line); };
  hooks.resume = [] { return absl::OkStatus(); };
  hooks.generation = [] { return int64_t{0}; };
  hooks.took_over = [] {};
  hooks.deposed = [] {};
  LeaseKeeper keeper(/*lease=*/nullptr, kCall, std::move(hooks));
  keeper.Update();
  EXPECT_TRUE(keeper.Coordinating());
  EXPECT_THAT(said, IsEmpty());
}

TEST_F(PlanTest, AHostWithAnotherNumberOfRanksPerHostCannotFollowThePlan) {
  store_keys::Plan plan;
  plan.training_hosts = 1;
  plan.ranks_per_host = 4;
  plan.master_addr = "10.0.0.1";
  plan.master_port = 29500;
  plan.hosts = {{"h1", 0}};
  ASSERT_TRUE(store_.Set(store_keys::kAgentPlan, store_keys::EncodePlan(plan), kCall).ok());
  Agent h1("h1", &store_, TwoWorkersAndAStandbyHost());
  absl::StatusOr<HostAssignment> a = h1.agent->ReadPlan();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.status().message(), "host h1 has --nproc-per-node 2 but the job has 4 per host");
  ASSERT_TRUE(store_.Set(store_keys::kAgentPlan, "2 x", kCall).ok());
  a = h1.agent->ReadPlan();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status().message(), HasSubstr("malformed plan: "));
}

}  // namespace
}  // namespace trainguard
