// RestartAll (sdk/coordinator/restart_all.h), the recovery strategy of `trainguard run
// --restart-all`, on one host and on several through the same code: an in-memory store, a
// ManualClock, a real JobCoordinator and RendezvousCoordinator on that store (each restart round's
// ranks on a store of their own, as the round's namespace is), and the host's HostAgent over a
// FakeProcessSupervisor whose workers are not processes: no processes, no sleeps.
//
// On one host the launcher hands its ranks' deaths to the strategy (OnRankDeath); on several the
// agents report them in the store and the coordinator's JobCoordinator, whose recovery strategy
// this is, hands them over (OnDeathReported, which decides them as OnRankDeath does), as it does
// the hosts it declares dead and the ranks' requests for a new generation. The start of a round is
// what the launcher's hook does to this host's workers: every one killed, the host's ranks of the
// round started.
#include "sdk/coordinator/restart_all.h"

#include <signal.h>

#include <algorithm>
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
#include "sdk/agent/failure_history.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/job_coordinator.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/host_agent/host_agent.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::RankMember;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kHostTimeout = absl::Seconds(3);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(30);
constexpr absl::Duration kNanosecond = absl::Nanoseconds(1);
constexpr int kRanksPerHost = 2;

enum class Layout { kOneHost, kSeveralHosts };

// The coordinator's host h0 (on one host: the only one, its ranks 0 and 1). On several hosts h1
// trains too (ranks 2 and 3) and h2 is a standby host; generation 0 of round 0 formed.
class RestartAllTest : public ::testing::TestWithParam<Layout> {
 protected:
  struct Round {
    int64_t from;
    int64_t to;
  };

  bool several() const { return GetParam() == Layout::kSeveralHosts; }
  int world() const { return several() ? 2 * kRanksPerHost : kRanksPerHost; }
  std::string scope() const { return several() ? "every rank on every host" : "every rank"; }

  void SetUp() override {
    if (several()) {
      Join("h0", 1, false);
      Join("h1", 2, false);
      Join("h2", 3, true);
      store_keys::Plan plan;
      plan.training_hosts = 2;
      plan.ranks_per_host = kRanksPerHost;
      plan.master_addr = "10.0.0.1";
      plan.master_port = 29500;
      plan.hosts = {{"h0", 0}, {"h1", 1}, {"h2", -1}};
      ASSERT_TRUE(store_.Set(store_keys::kAgentPlan, store_keys::EncodePlan(plan), kCall).ok());
    }
    Start(/*limit=*/3);
  }

  void Start(int limit) {
    rendezvous_ = std::make_unique<RendezvousCoordinator>(&store_, &clock_, "h0");
    ReplacementPolicyOptions policy;
    policy_.emplace(policy);
    RenewalPolicyOptions renewal;
    renewal.multi_host = several();
    renewal.host_timeout = kHostTimeout;
    renewal.restart_all = true;
    renewal_.emplace(renewal);
    JobCoordinatorOptions coordinator_options;
    coordinator_options.host_id = "h0";
    coordinator_options.host_timeout = kHostTimeout;
    coordinator_options.call_timeout = kCall;
    coordinator_options.replace_timeout = kCall;
    JobCoordinator::Hooks ch = testing::QuietJobCoordinatorHooks(&said_, &failed_);
    ch.coordinating = [this] { return gate_open_; };
    coordinator_ = std::make_unique<JobCoordinator>(&store_, &clock_, rendezvous_.get(), &*policy_,
                                                    &*renewal_, &failures_, coordinator_options,
                                                    std::move(ch));
    coordinator_->set_world_size(world());

    const HostAgentOptions agent_options = testing::TestHostAgentOptions(
        "h0", kCall, /*failed_exit_code=*/1, /*store_loss_bound=*/absl::Seconds(30));
    HostAgent::Hooks ah;
    ah.workers = testing::WorkersIn(&workers_);
    ah.say = [this](const std::string& line) { said_.push_back(line); };
    ah.record = [this](int rank, EventKind kind, const std::string&, HostAgent::Attributes) {
      if (kind == EventKind::kRankUnresponsive) killed_ranks_.push_back(rank);
    };
    ah.latest_term = [] { return int64_t{0}; };
    ah.pid_file = [](int rank) { return absl::StrCat("/run/job/pids/h0/rank-", rank); };
    ah.rank_taken = [](HostWorker&) {};
    agent_ = std::make_unique<HostAgent>(&store_, &clock_, &supervisor_, agent_options,
                                         std::move(ah));

    UseStrategy(limit);
    StartWorkers(0);
    if (form_first_start_) FormRound();
  }

  // h0's strategy, bounded by `limit` rounds, made the coordinator's (the launcher's wiring).
  void UseStrategy(int limit) {
    strategy_ = MakeStrategy("h0", limit, &rounds_);
    coordinator_->set_recovery_strategy(strategy_.get());
  }

  // The strategy of `host`'s agent; its rounds started are appended to `rounds`. h0's starts its
  // round as the launcher does: every worker of this host killed, its ranks of the round started,
  // the coordinator on the round's store.
  std::unique_ptr<RestartAll> MakeStrategy(const std::string& host, int limit,
                                           std::vector<Round>* rounds) {
    RestartAllOptions options;
    options.host_id = host;
    options.limit = limit;
    options.ranks_per_host = kRanksPerHost;
    options.heartbeat_timeout = kHeartbeatTimeout;
    options.call_timeout = kCall;
    options.scope = scope();
    RestartAll::Hooks hooks;
    hooks.coordinating = [this] { return gate_open_; };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.record = [this](int, EventKind kind, const std::string& message,
                          RestartAll::Attributes attributes) {
      if (kind == EventKind::kRestartAll) restart_events_.push_back({message, attributes});
    };
    hooks.fail = [this](const std::string& why) { failed_.push_back(why); };
    const bool own = host == "h0";
    hooks.start_round = [this, rounds, own](int64_t from, int64_t to) {
      rounds->push_back({from, to});
      if (!own) return;
      for (auto& w : workers_) {
        if (w->running) (void)supervisor_.Signal(w->worker, SIGKILL);
      }
      workers_.clear();
      StartWorkers(to);
      round_stores_.push_back(std::make_unique<InMemoryStore>());
      round_rendezvous_ = std::make_unique<RendezvousCoordinator>(round_stores_.back().get(),
                                                                  &clock_, "h0");
      coordinator_->set_round(to);
      coordinator_->set_rendezvous(round_rendezvous_.get());
    };
    hooks.kill_stopped = [this](absl::Duration bound, const std::string& context) {
      agent_->KillRanksStoppedFor(bound, context);
    };
    return std::make_unique<RestartAll>(&store_, &clock_, coordinator_.get(), options,
                                        std::move(hooks));
  }

  void Join(const std::string& host, int64_t seq, bool standby) {
    ASSERT_TRUE(store_
                    .Set(store_keys::kAgentJoins.Key(host),
                         store_keys::EncodeJoinRecord({host, seq, standby, "10.0.0.1", 29500}),
                         kCall)
                    .ok());
  }
  // This host's ranks of `round`, started as the launcher starts them.
  void StartWorkers(int64_t round) {
    for (int rank = 0; rank < kRanksPerHost; ++rank) {
      testing::StartHostWorker(supervisor_, workers_, rank, RankMember("h0", 100, rank, round));
    }
  }
  // The current round's generation 0 forms: every rank registered.
  void FormRound() {
    Store* store = round_stores_.empty() ? static_cast<Store*>(&store_) : round_stores_.back().get();
    RendezvousCoordinator* rendezvous =
        round_rendezvous_ != nullptr ? round_rendezvous_.get() : rendezvous_.get();
    const int64_t round = strategy_->round();
    for (int r = 0; r < world(); ++r) {
      const std::string host = r < kRanksPerHost ? "h0" : "h1";
      ASSERT_TRUE(store->Set(store_keys::RdzvJoin(r), RankMember(host, 100, r, round), kCall).ok());
    }
    ASSERT_TRUE(rendezvous->FormInitialGeneration(world(), kCall).ok());
  }
  bool Formed() {
    RendezvousCoordinator* rendezvous =
        round_rendezvous_ != nullptr ? round_rendezvous_.get() : rendezvous_.get();
    return rendezvous->generation() >= 0;
  }

  // A rank of the current round dies: on one host its launcher sees the exit and hands it to the
  // strategy; on several the rank is h1's, whose agent reports it, and the coordinator reads the
  // report. Returns the fault's text as the strategy receives it.
  std::string Die(int local_rank, const std::string& how) {
    const int64_t round = strategy_->round();
    if (!several()) {
      const std::string label = absl::StrCat("rank ", local_rank);
      strategy_->OnRankDeath({local_rank, label, how}, Formed(), clock_.Now());
      return absl::StrCat(label, " ", how);
    }
    const int rank = kRanksPerHost + local_rank;
    const std::string member = RankMember("h1", 200, rank, round);
    EXPECT_TRUE(store_
                    .Set(store_keys::kAgentDeaths.Key(member),
                         store_keys::EncodeDeathReport({member, rank, how, ""}), kCall)
                    .ok());
    coordinator_->ReadDeathReports();
    return absl::StrCat("rank ", rank, " (", member, ") ", how);
  }

  std::optional<std::string> Value(const std::string& key) {
    absl::StatusOr<std::string> value = store_.Get(key, kCall);
    if (!value.ok()) return std::nullopt;
    return *value;
  }
  int Said(const std::string& line) {
    return static_cast<int>(std::count(said_.begin(), said_.end(), line));
  }
  HostWorker& Worker(int rank) {
    for (auto& w : workers_) {
      if (w->rank == rank) return *w;
    }
    ADD_FAILURE() << "no worker holds rank " << rank;
    return *workers_.front();
  }
  bool SigkilledRank(int rank) {
    const WorkerId worker = Worker(rank).worker;
    return std::any_of(supervisor_.signals().begin(), supervisor_.signals().end(),
                       [&](const auto& s) { return s.worker == worker && s.signal == SIGKILL; });
  }

  ManualClock clock_{absl::UnixEpoch()};
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  std::unique_ptr<RendezvousCoordinator> rendezvous_;
  std::vector<std::unique_ptr<InMemoryStore>> round_stores_;
  std::unique_ptr<RendezvousCoordinator> round_rendezvous_;
  std::optional<ReplacementPolicy> policy_;
  std::optional<RenewalPolicy> renewal_;
  FailureHistory failures_;
  std::unique_ptr<JobCoordinator> coordinator_;
  testing::FakeProcessSupervisor supervisor_;
  std::vector<std::unique_ptr<HostWorker>> workers_;
  std::unique_ptr<HostAgent> agent_;
  std::unique_ptr<RestartAll> strategy_;
  bool gate_open_ = true;
  bool form_first_start_ = true;  // SetUp forms round 0's generation 0
  std::vector<Round> rounds_;
  std::vector<std::string> said_;
  std::vector<std::string> failed_;
  std::vector<int> killed_ranks_;
  std::vector<std::pair<std::string, RestartAll::Attributes>> restart_events_;
};

TEST_P(RestartAllTest, ADeathInRoundNPublishesRoundNPlusOneOnceAndItsPeersDeathsAreTheSameFault) {
  const std::string why = Die(1, "killed by SIGKILL");
  Die(0, "exited with status 1");  // a peer, failing in a collective with the dead rank
  EXPECT_TRUE(strategy_->restart_pending());
  EXPECT_TRUE(rounds_.empty()) << "carried out at the loop's turn, not inside the death";
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(rounds_.size(), 1u);
  EXPECT_EQ(rounds_[0].from, 0);
  EXPECT_EQ(rounds_[0].to, 1);
  EXPECT_EQ(strategy_->round(), 1);
  EXPECT_EQ(Value(store_keys::kAgentRestart), absl::StrCat("1 ", why));
  EXPECT_EQ(Said(absl::StrCat("restarting ", scope(), " (restart 1 of at most 3): ", why)), 1);
  ASSERT_EQ(restart_events_.size(), 1u);
  EXPECT_EQ(restart_events_[0].first, why);
  EXPECT_THAT(restart_events_[0].second, ElementsAre(std::pair<std::string, std::string>(
                                             "restart", "1")));
  ASSERT_EQ(coordinator_->recoveries().size(), 1u);
  EXPECT_EQ(coordinator_->recoveries()[0].died, clock_.Now());
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(rounds_.size(), 1u) << "one round for one fault";

  // The next fault, in round 1 once it formed, publishes round 2.
  FormRound();
  const std::string next = Die(0, "exited with status 1");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(rounds_.size(), 2u);
  EXPECT_EQ(rounds_[1].to, 2);
  EXPECT_EQ(Value(store_keys::kAgentRestart), absl::StrCat("2 ", next));
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_P(RestartAllTest, ARankLostBeforeTheRestartedJobFormedRestartsAgain) {
  Die(1, "killed by SIGKILL");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(strategy_->round(), 1);
  // Round 1's ranks start; one dies before its generation 0 formed.
  const std::string why = Die(1, "exited with status 1");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(strategy_->round(), 2);
  EXPECT_EQ(Value(store_keys::kAgentRestart),
            absl::StrCat("2 ", why, " before the restarted job formed"));
  EXPECT_EQ(Said(absl::StrCat("restarting ", scope(), " (restart 2 of at most 3): ", why,
                              " before the restarted job formed")),
            1);
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_P(RestartAllTest, TheLimitEndsTheJobNamingTheDeath) {
  UseStrategy(/*limit=*/1);
  Die(1, "killed by SIGKILL");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(strategy_->round(), 1);
  FormRound();
  const std::string why = Die(0, "exited with status 1");
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(strategy_->round(), 1);
  EXPECT_EQ(rounds_.size(), 1u);
  EXPECT_THAT(failed_, ElementsAre(absl::StrCat(why, "; --restart-all=1 reached")));
  EXPECT_EQ(Value(store_keys::kAgentRestart)->substr(0, 2), "1 ") << "no round 2 published";
}

TEST_P(RestartAllTest, AStoppedRankInARoundThatDoesNotFormIsKilledAfterTheHeartbeatTimeout) {
  // Round 0 formed: a stopped rank is the hang path's, not this.
  supervisor_.Stop(Worker(1).worker);
  strategy_->KillStoppedBeforeFormation(/*formed=*/true);
  clock_.Advance(kHeartbeatTimeout);
  strategy_->KillStoppedBeforeFormation(/*formed=*/true);
  EXPECT_FALSE(SigkilledRank(1));

  Die(1, "killed by SIGKILL");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(strategy_->round(), 1);
  // Round 1's rank 1 is stopped before the round formed: it has no heartbeat to go stale.
  supervisor_.Stop(Worker(1).worker);
  strategy_->KillStoppedBeforeFormation(/*formed=*/false);
  clock_.Advance(kHeartbeatTimeout - kNanosecond);
  strategy_->KillStoppedBeforeFormation(/*formed=*/false);
  EXPECT_FALSE(SigkilledRank(1)) << "not one nanosecond before --heartbeat-timeout";
  clock_.Advance(kNanosecond);
  strategy_->KillStoppedBeforeFormation(/*formed=*/false);
  EXPECT_TRUE(SigkilledRank(1));
  EXPECT_THAT(killed_ranks_, ElementsAre(1));
  EXPECT_FALSE(SigkilledRank(0));
  // Its death, or the round's formation running out, restarts every rank again.
  strategy_->OnNotFormed(absl::DeadlineExceededError("rank 1 never registered"));
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(strategy_->round(), 2);
  EXPECT_THAT(*Value(store_keys::kAgentRestart),
              HasSubstr("2 restart round 1 did not form: DEADLINE_EXCEEDED"));
}

TEST_P(RestartAllTest, ADeposedCoordinatorPublishesNoRoundAndAnotherAgentFollowsAPublishedOne) {
  Die(1, "killed by SIGKILL");
  gate_open_ = false;
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(strategy_->round(), 0);
  EXPECT_TRUE(rounds_.empty());
  EXPECT_EQ(Value(store_keys::kAgentRestart), std::nullopt);
  EXPECT_FALSE(strategy_->restart_pending()) << "the fault is the next holder's to find";

  // Another host's agent (or, on one host, the coordinator's own) follows a round once.
  gate_open_ = true;
  const std::string why = Die(0, "killed by SIGKILL");
  strategy_->Coordinate(clock_.Now());
  std::vector<Round> followed;
  std::unique_ptr<RestartAll> follower = MakeStrategy("h1", 3, &followed);
  follower->FollowRound();
  follower->FollowRound();
  ASSERT_EQ(followed.size(), 1u);
  EXPECT_EQ(followed[0].from, 0);
  EXPECT_EQ(followed[0].to, 1);
  EXPECT_EQ(follower->round(), 1);
  EXPECT_EQ(Said(absl::StrCat("restart round 1: ", why)), 1);
  strategy_->FollowRound();  // the publisher is in that round already
  EXPECT_EQ(rounds_.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Hosts, RestartAllTest,
                         ::testing::Values(Layout::kOneHost, Layout::kSeveralHosts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return info.param == Layout::kOneHost ? "OneHost" : "SeveralHosts";
                         });

// The first start has not formed yet.
class RestartAllBeforeTheFirstStartFormedTest : public RestartAllTest {
 protected:
  void SetUp() override {
    form_first_start_ = false;
    RestartAllTest::SetUp();
  }
};

TEST_P(RestartAllBeforeTheFirstStartFormedTest, ARankLostThenFailsTheJob) {
  // The command never formed a job: restarting it would only meet the same fault.
  Die(1, "exited with status 1");
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(strategy_->round(), 0);
  EXPECT_TRUE(rounds_.empty());
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_THAT(failed_[0], HasSubstr("died before generation 0 formed (exited with status 1)"));
  EXPECT_EQ(Value(store_keys::kAgentRestart), std::nullopt);
}

TEST_P(RestartAllBeforeTheFirstStartFormedTest, AFirstStartThatDoesNotFormFailsTheJob) {
  strategy_->OnNotFormed(absl::DeadlineExceededError("rank 1 never registered"));
  strategy_->Coordinate(clock_.Now());
  EXPECT_TRUE(rounds_.empty());
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_THAT(failed_[0], HasSubstr("generation 0 did not form: DEADLINE_EXCEEDED"));
}

INSTANTIATE_TEST_SUITE_P(Hosts, RestartAllBeforeTheFirstStartFormedTest,
                         ::testing::Values(Layout::kOneHost, Layout::kSeveralHosts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return info.param == Layout::kOneHost ? "OneHost" : "SeveralHosts";
                         });

// Several hosts only: a training host's death moves its group rank to the standby host in the
// round's plan, published before the round.
class RestartAllHostDeathTest : public RestartAllTest {};

TEST_P(RestartAllHostDeathTest, ADeadTrainingHostsGroupRankGoesToTheStandbyHostInTheRoundsPlan) {
  const absl::Time last_beat = clock_.Now();
  clock_.Advance(kHostTimeout);
  coordinator_->DeclareHostDead("h1", last_beat, "no heartbeat for 3s");
  strategy_->Coordinate(clock_.Now());
  ASSERT_EQ(strategy_->round(), 1);
  EXPECT_EQ(Said("restart round 1: host h2 takes host h1's group rank 1"), 1);
  absl::StatusOr<store_keys::Plan> plan =
      store_keys::DecodePlan(Value(store_keys::kAgentPlan).value_or(""));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->training_hosts, 2);
  EXPECT_EQ(plan->GroupOf("h2"), 1);
  EXPECT_EQ(plan->GroupOf("h1"), -1);
  EXPECT_EQ(plan->GroupOf("h0"), 0);
  EXPECT_EQ(Value(store_keys::kAgentRestart), "1 host h1 is dead (no heartbeat for 3s)");
  ASSERT_EQ(coordinator_->recoveries().size(), 1u);
  EXPECT_EQ(coordinator_->recoveries()[0].died, last_beat);
  EXPECT_EQ(coordinator_->recoveries()[0].host, "h1");
}

TEST_P(RestartAllHostDeathTest, ADeadStandbyHostRestartsNothing) {
  clock_.Advance(kHostTimeout);
  coordinator_->DeclareHostDead("h2", absl::UnixEpoch(), "no heartbeat for 3s");
  strategy_->Coordinate(clock_.Now());
  EXPECT_EQ(strategy_->round(), 0);
  EXPECT_TRUE(rounds_.empty());
  EXPECT_EQ(Value(store_keys::kAgentRestart), std::nullopt);
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_P(RestartAllHostDeathTest, ATrainingHostsDeathBeforeTheFirstStartFormedFailsTheJob) {
  rendezvous_ = std::make_unique<RendezvousCoordinator>(&store_, &clock_, "h0");  // none formed
  coordinator_->set_rendezvous(rendezvous_.get());
  coordinator_->DeclareHostDead("h1", absl::UnixEpoch(), "no heartbeat for 3s");
  strategy_->Coordinate(clock_.Now());
  EXPECT_TRUE(rounds_.empty());
  EXPECT_THAT(failed_, ElementsAre("host h1 died before generation 0 formed"));
}

INSTANTIATE_TEST_SUITE_P(Hosts, RestartAllHostDeathTest, ::testing::Values(Layout::kSeveralHosts),
                         [](const ::testing::TestParamInfo<Layout>&) { return "SeveralHosts"; });

}  // namespace
}  // namespace trainguard
