// JobCoordinator (sdk/coordinator/job_coordinator.h): the host duties and the replacements of a
// multi-host job's coordinator, on an in-memory store at instants a ManualClock sets, with a real
// RendezvousCoordinator on that store: no processes, no sleeps. The agents' side (joins,
// heartbeats, death reports, finished ranks, leaving) is written into the store with agent_keys.h's
// codecs, as the agents write it; the ranks and standbys register and park as their
// RendezvousMember does. The coordinator hands the faults it finds to the job's recovery strategy,
// a real one: StandbyReplacement (the default), which queues them for the replacements, or
// RestartAll, which restarts every rank (its rounds recorded, not carried out).
#include "sdk/coordinator/job_coordinator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/failure_history.h"
#include "sdk/agent/renewal_policy.h"
#include "sdk/agent/replacement_policy.h"
#include "sdk/coordinator/recovery_strategy.h"
#include "sdk/coordinator/restart_all.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/forwarding_store.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/agent_fixtures.h"
#include "tools/launcher.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/membership.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using testing::RankMember;
using testing::StandbyMember;

constexpr absl::Duration kHostTimeout = absl::Seconds(3);
constexpr absl::Duration kTick = absl::Milliseconds(250);  // host timeout / 12: the agents' loop
constexpr absl::Duration kNanosecond = absl::Nanoseconds(1);
constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kBackoff = absl::Seconds(1);       // --restart-backoff
constexpr absl::Duration kStandbyWait = absl::Seconds(16);  // 2 x host timeout + 10 s

// A job of two training hosts of two ranks each, h0 (whose agent coordinates) and h1, and a standby
// host h2 that parked a standby; generation 0 formed.
class JobCoordinatorTest : public ::testing::Test {
 protected:
  struct Recorded {
    int rank;
    EventKind kind;
    std::string message;
    JobCoordinator::Attributes attributes;
  };
  struct Taken {
    int rank;
    std::string member;
    int64_t generation;
  };

  void SetUp() override {
    Join("h0", 1, /*standby=*/false);
    Join("h1", 2, /*standby=*/false);
    Join("h2", 3, /*standby=*/true);
    store_keys::Plan plan;
    plan.training_hosts = 2;
    plan.ranks_per_host = 2;
    plan.master_addr = "10.0.0.1";
    plan.master_port = 29500;
    plan.hosts = {{"h0", 0}, {"h1", 1}, {"h2", -1}};
    ASSERT_TRUE(store_.Set(store_keys::kAgentPlan, store_keys::EncodePlan(plan), kCall).ok());
    // The ranks register as their RendezvousMember does; the standby parks.
    const std::vector<std::string> members = {RankMember("h0", 100, 0), RankMember("h0", 100, 1),
                                              RankMember("h1", 200, 2), RankMember("h1", 200, 3)};
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(r), members[r], kCall).ok());
    }
    ASSERT_TRUE(rendezvous_.FormInitialGeneration(4, kCall).ok());
    Park(StandbyMember("h2", 300, 0));
    Start(/*restart_all=*/false);
    BeatAll();
  }

  // A coordinator whose strategy is RestartAll (`restart_all`: at most 3 rounds) or
  // StandbyReplacement, bounded by `max_replacements`.
  void Start(bool restart_all, int max_replacements = 10) {
    ReplacementPolicyOptions policy;
    policy.max_replacements = max_replacements;
    policy.restart_backoff = kBackoff;
    policy_.emplace(policy);
    RenewalPolicyOptions renewal;
    renewal.multi_host = true;
    renewal.host_timeout = kHostTimeout;
    renewal.restart_all = restart_all;
    renewal_.emplace(renewal);
    JobCoordinatorOptions options;
    options.host_id = "h0";
    options.host_timeout = kHostTimeout;
    options.call_timeout = kCall;
    options.max_replacements = max_replacements;
    options.standby_wait = kStandbyWait;
    options.replace_timeout = kCall;
    JobCoordinator::Hooks hooks;
    hooks.coordinating = [this] { return Gate(); };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.record = [this](int rank, EventKind kind, const std::string& message,
                          JobCoordinator::Attributes attributes) {
      recorded_.push_back({rank, kind, message, std::move(attributes)});
    };
    hooks.fail = [this](const std::string& why) { failed_.push_back(why); };
    // The launcher's choice (Job::PreferredStandbys), without peer backups to keep away from.
    hooks.preferred_standbys = [this](const std::string& dead_host, const std::vector<int>& ranks) {
      absl::StatusOr<std::vector<std::string>> parked = rendezvous_.ParkedStandbys(kCall);
      if (!parked.ok()) return std::vector<std::string>{};
      return tools::ChooseStandbys(*parked, coordinator_->dead_hosts(), dead_host, ranks.size(),
                                   /*unsafe_hosts=*/{});
    };
    hooks.standby_starting = [this] { return standby_starting_; };
    hooks.rank_taken = [this](int rank, const std::string& member, int64_t generation) {
      taken_.push_back({rank, member, generation});
    };
    coordinator_ =
        std::make_unique<JobCoordinator>(&store_, &clock_, &rendezvous_, &*policy_, &*renewal_,
                                         &failures_, options, std::move(hooks));
    coordinator_->set_world_size(4);
    restart_all_ = nullptr;
    if (!restart_all) {
      strategy_ = testing::UseStandbyReplacement(coordinator_.get(), &*policy_, &said_, &failed_);
      return;
    }
    RestartAllOptions restart;
    restart.host_id = "h0";
    restart.limit = 3;
    restart.ranks_per_host = 2;
    restart.call_timeout = kCall;
    restart.scope = "every rank on every host";
    RestartAll::Hooks rh;
    rh.coordinating = [this] { return Gate(); };
    rh.say = [this](const std::string& line) { said_.push_back(line); };
    rh.record = [this](int rank, EventKind kind, const std::string& message,
                       RestartAll::Attributes attributes) {
      recorded_.push_back({rank, kind, message, std::move(attributes)});
    };
    rh.fail = [this](const std::string& why) { failed_.push_back(why); };
    // The launcher's StartRound kills and starts processes; here the round is only recorded.
    rh.start_round = [this](int64_t, int64_t to) {
      rounds_.push_back(to);
      coordinator_->set_round(to);
    };
    rh.kill_stopped = [](absl::Duration, const std::string&) {};
    auto strategy =
        std::make_unique<RestartAll>(&store_, &clock_, coordinator_.get(), restart, std::move(rh));
    restart_all_ = strategy.get();
    strategy_ = std::move(strategy);
    coordinator_->set_recovery_strategy(strategy_.get());
  }

  // The coordinator's gate (its lease): open gate_opens_ more times.
  bool Gate() {
    if (gate_opens_ == 0) return false;
    --gate_opens_;
    return true;
  }

  // The agent of `host` joins, as StoreHostMembership::Join writes it (the record, then its count).
  void Join(const std::string& host, int64_t seq, bool standby) {
    ASSERT_TRUE(
        *store_.CreateAndAdd(store_keys::kAgentJoins.Key(host),
                             store_keys::EncodeJoinRecord({host, seq, standby, "10.0.0.1", 29500}),
                             store_keys::kAgentJoinCount, 1, kCall));
  }
  // The agent of `host` advances its heartbeat counter, as AgentTick does.
  void Beat(const std::string& host) {
    ASSERT_TRUE(
        store_.Set(store_keys::kAgentHeartbeats.Key(host), absl::StrCat(++beats_[host]), kCall)
            .ok());
  }
  void BeatAll() {
    for (const char* host : {"h0", "h1", "h2"}) Beat(host);
  }
  void ReportDeath(const std::string& member, int rank, const std::string& how,
                   const std::string& cause) {
    ASSERT_TRUE(store_
                    .Set(store_keys::kAgentDeaths.Key(member),
                         store_keys::EncodeDeathReport({member, rank, how, cause}), kCall)
                    .ok());
  }
  void Finish(int rank, const std::string& member) {
    ASSERT_TRUE(store_.Set(store_keys::AgentFinished(0, rank), member, kCall).ok());
  }
  // A standby parks, as RendezvousMember::ParkAsStandby registers it.
  void Park(const std::string& member) {
    ASSERT_TRUE(store_.Set(store_keys::RdzvStandby(member), "parked", kCall).ok());
  }
  // Rank `rank` of the current generation asks for a new one, as RequestNewGeneration writes it.
  void Ask(int rank, const std::string& why) {
    ASSERT_TRUE(store_
                    .Set(absl::StrCat(store_keys::RdzvRenewPrefix(rendezvous_.generation()), rank),
                         why, kCall)
                    .ok());
  }
  // The agent of `host` leaves, as HostAgent::Leave writes it (the record, then its count).
  void Leave(const std::string& host) {
    ASSERT_TRUE(store_
                    .SetAndAdd(store_keys::kAgentsLeft.Key(host), "0", store_keys::kAgentLeftCount,
                               1, kCall)
                    .ok());
  }

  // The time since the test started.
  absl::Duration Elapsed() { return clock_.Now() - absl::UnixEpoch(); }
  void AdvanceTo(absl::Duration since_start) { clock_.Advance(since_start - Elapsed()); }
  // One coordinator tick at every agent tick up to and including `until` (since the start), the
  // hosts of `beating` beating before each.
  void RunUntil(absl::Duration until, const std::vector<std::string>& beating) {
    while (Elapsed() + kTick <= until) {
      clock_.Advance(kTick);
      for (const std::string& host : beating) Beat(host);
      coordinator_->CoordinateHosts();
    }
  }

  std::optional<std::string> Value(const std::string& key) {
    absl::StatusOr<std::string> value = store_.Get(key, kCall);
    if (!value.ok()) return std::nullopt;
    return *value;
  }
  int Said(const std::string& line) {
    return static_cast<int>(std::count(said_.begin(), said_.end(), line));
  }

  ManualClock clock_{absl::UnixEpoch()};
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  RendezvousCoordinator rendezvous_{&store_, &clock_, "h0"};
  std::optional<ReplacementPolicy> policy_;
  std::optional<RenewalPolicy> renewal_;
  FailureHistory failures_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<RecoveryStrategy> strategy_;
  RestartAll* restart_all_ = nullptr;  // strategy_ when it is RestartAll
  std::vector<int64_t> rounds_;        // the restart rounds RestartAll started
  std::map<std::string, int64_t> beats_;
  int gate_opens_ = std::numeric_limits<int>::max();
  std::vector<std::string> said_;
  std::vector<Recorded> recorded_;
  std::vector<std::string> failed_;
  bool standby_starting_ = false;
  std::vector<Taken> taken_;
};

TEST_F(JobCoordinatorTest, AHostSilentForExactlyTheHostTimeoutIsDeclaredDeadAndNotOneNsBefore) {
  coordinator_->CoordinateHosts();  // h1's last beat is read at 0
  RunUntil(kHostTimeout - kTick, {"h0", "h2"});
  AdvanceTo(kHostTimeout - kNanosecond);
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_THAT(said_, IsEmpty());

  AdvanceTo(kHostTimeout);
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  ASSERT_EQ(coordinator_->replacements().size(), 1u);  // the host's ranks, in one entry
  const PendingReplacement& host = coordinator_->replacements().front();
  EXPECT_EQ(host.rank, -1);
  EXPECT_THAT(host.ranks, ElementsAre(2, 3));
  EXPECT_EQ(host.host, "h1");
  EXPECT_EQ(host.how, "no heartbeat for 3s");
  EXPECT_EQ(host.died, absl::UnixEpoch());  // its last heartbeat: the recovery's start
  EXPECT_THAT(said_, ElementsAre("host h1 is dead (no heartbeat for 3s): replacing its ranks 2,3 "
                                 "at once"));
  ASSERT_EQ(recorded_.size(), 1u);
  EXPECT_EQ(recorded_[0].kind, EventKind::kHostLost);
  EXPECT_EQ(recorded_[0].message, "host h1 is dead (no heartbeat for 3s)");
  EXPECT_THAT(recorded_[0].attributes, ElementsAre(Pair("host", "h1"), Pair("ranks", "2,3")));
  ASSERT_TRUE(failures_.first().has_value());
  EXPECT_EQ(failures_.first()->Describe(), "host h1 died: no heartbeat for 3s");
  EXPECT_TRUE(coordinator_->DeathTaken(RankMember("h1", 200, 2)));
  EXPECT_THAT(coordinator_->dead_hosts(), ElementsAre("h1"));
  // The standby host beat on: alive.
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_F(JobCoordinatorTest, ADeathReportedBetweenTicksIsReplacedAtTheLoopsNextTurnWithoutATick) {
  coordinator_->CoordinateHosts();  // the tick at 0
  // Rank 2's agent reports its death 10 ms after the tick; the loop's next turn (the launcher's
  // ~50 ms poll of its workers) takes it and replaces it, 240 ms before the next tick.
  AdvanceTo(absl::Milliseconds(10));
  ReportDeath(RankMember("h1", 200, 2), 2, "exited with status 1", "");
  coordinator_->CoordinateBetweenTicks();
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(coordinator_->replacements().front().rank, 2);
  EXPECT_EQ(coordinator_->replacements().front().died, absl::UnixEpoch() + absl::Milliseconds(10));
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_EQ(rendezvous_.current().members[2], StandbyMember("h2", 300, 0));
  // Taken once: the tick's read of the same report (CoordinateHosts) queues nothing more.
  RunUntil(kTick, {"h0", "h1", "h2"});
  coordinator_->CoordinateBetweenTicks();
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_F(JobCoordinatorTest, AHostIsDeclaredDeadBetweenTicksAtExactlyItsBoundAndNotOneNsBefore) {
  coordinator_->CoordinateHosts();  // h1's last beat is read at 0
  RunUntil(kHostTimeout - kTick, {"h0", "h2"});
  // The loop's turns between the last tick before the bound and the next tick: h1, quiet for half
  // the host timeout, is read at each, and declared at the first turn at its bound.
  AdvanceTo(kHostTimeout - kNanosecond);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  AdvanceTo(kHostTimeout);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_THAT(coordinator_->replacements().front().ranks, ElementsAre(2, 3));
  EXPECT_EQ(coordinator_->replacements().front().died, absl::UnixEpoch());
  EXPECT_THAT(coordinator_->dead_hosts(), ElementsAre("h1"));
  // h2 beat at every tick: never declared, between ticks either.
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(failed_, IsEmpty());
}

// With the store's ages, a host's silence counts from its last write itself: one that beat between
// two ticks is declared exactly the host timeout after that beat, by the loop's first turn at it.
TEST_F(JobCoordinatorTest, WithAgesAHostIsDeclaredExactlyTheTimeoutAfterItsLastWrite) {
  coordinator_->CoordinateHosts();  // every host first seen at 0
  const absl::Duration last_beat = absl::Milliseconds(300);
  RunUntil(kTick, {"h0", "h1", "h2"});
  AdvanceTo(last_beat);
  Beat("h1");  // between two ticks, and never again
  RunUntil(last_beat + kHostTimeout - kTick, {"h0", "h2"});
  AdvanceTo(last_beat + kHostTimeout - kNanosecond);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  AdvanceTo(last_beat + kHostTimeout);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(coordinator_->replacements().front().died, absl::UnixEpoch() + last_beat);
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
}

// A store that records the keys of the coordinator's reads, and can keep no ages (as etcd).
class ReadRecordingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  bool without_ages = false;
  std::vector<std::vector<std::string>> aged_reads;  // each MultiGetWithAges' keys
  std::vector<std::string> listed;                   // each ListKeys' prefix

  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    if (without_ages) return absl::UnimplementedError("no ages here");
    aged_reads.push_back(keys);
    return ForwardingStore::MultiGetWithAges(keys, timeout);
  }
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override {
    listed.emplace_back(prefix);
    return ForwardingStore::ListKeys(prefix, timeout);
  }
};

class JobCoordinatorReadsTest : public JobCoordinatorTest {
 protected:
  void SetUp() override {
    JobCoordinatorTest::SetUp();
    // The same coordinator, on the recording store.
    JobCoordinatorOptions options;
    options.host_id = "h0";
    options.host_timeout = kHostTimeout;
    options.call_timeout = kCall;
    JobCoordinator::Hooks hooks;
    hooks.coordinating = [] { return true; };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.record = [](int, EventKind, const std::string&, JobCoordinator::Attributes) {};
    hooks.fail = [this](const std::string& why) { failed_.push_back(why); };
    hooks.preferred_standbys = [](const std::string&, const std::vector<int>&) {
      return std::vector<std::string>{};
    };
    hooks.standby_starting = [] { return false; };
    hooks.rank_taken = [](int, const std::string&, int64_t) {};
    coordinator_ =
        std::make_unique<JobCoordinator>(&recording_, &clock_, &rendezvous_, &*policy_, &*renewal_,
                                         &failures_, options, std::move(hooks));
    coordinator_->set_world_size(4);
    strategy_ = testing::UseStandbyReplacement(coordinator_.get(), &*policy_, &said_, &failed_);
  }
  size_t Listed(const std::string& prefix) {
    return std::count(recording_.listed.begin(), recording_.listed.end(), prefix);
  }

  ReadRecordingStore recording_{&store_};
};

// With ages a tick reads the joins' and departures' counts and only the hosts due (a quarter of
// the bound since their beat), lists the hosts again only when a count changed, and a turn
// between ticks reads nothing while no host is due.
TEST_F(JobCoordinatorReadsTest, WithAgesATickReadsTheCountsAndOnlyTheHostsDue) {
  const std::string joins = store_keys::kAgentJoins.prefix();
  coordinator_->CoordinateHosts();  // lists the hosts, then reads the new ones
  ASSERT_EQ(recording_.aged_reads.size(), 2u);
  EXPECT_THAT(recording_.aged_reads[0],
              ElementsAre(store_keys::kAgentJoinCount, store_keys::kAgentLeftCount));
  EXPECT_THAT(recording_.aged_reads[1], ElementsAre(store_keys::kAgentHeartbeats.Key("h1"),
                                                    store_keys::kAgentHeartbeats.Key("h2")));
  EXPECT_EQ(Listed(joins), 1u);
  recording_.aged_reads.clear();
  // Until a quarter of the bound: the ticks read the counts alone, the turns between them nothing.
  while (Elapsed() + kTick < kHostTimeout / 4) {
    RunUntil(Elapsed() + kTick, {"h0", "h1", "h2"});
    coordinator_->CoordinateBetweenTicks();
  }
  EXPECT_THAT(recording_.aged_reads, ::testing::Each(::testing::SizeIs(2)));
  EXPECT_EQ(Listed(joins), 1u);
  // Then each host as it comes due.
  recording_.aged_reads.clear();
  RunUntil(kHostTimeout / 4, {"h0", "h1", "h2"});
  ASSERT_EQ(recording_.aged_reads.size(), 1u);
  EXPECT_THAT(recording_.aged_reads[0], ::testing::SizeIs(4));
  // A host joins: listed again at the next tick, and read at once.
  Join("h3", 4, /*standby=*/true);
  Beat("h3");
  recording_.aged_reads.clear();
  RunUntil(kHostTimeout / 4 + kTick, {"h0", "h1", "h2", "h3"});
  EXPECT_EQ(Listed(joins), 2u);
  ASSERT_EQ(recording_.aged_reads.size(), 2u);
  EXPECT_THAT(recording_.aged_reads[1], ElementsAre(store_keys::kAgentHeartbeats.Key("h3")));
}

// Where the store keeps no ages (etcd) the coordinator watches the heartbeats' values, as before:
// a host silent for exactly the timeout from the read that last saw its beat change is dead.
TEST_F(JobCoordinatorReadsTest, WithoutAgesTheHeartbeatsValuesAreWatchedAndTheBoundHolds) {
  recording_.without_ages = true;
  coordinator_->CoordinateHosts();  // h1's last beat is read at 0
  RunUntil(kHostTimeout - kTick, {"h0", "h2"});
  AdvanceTo(kHostTimeout - kNanosecond);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  AdvanceTo(kHostTimeout);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(recording_.aged_reads, IsEmpty());
}

TEST_F(JobCoordinatorTest, AHostThatLeftIsNotDeclaredDeadBetweenTicks) {
  coordinator_->CoordinateHosts();
  Leave("h1");  // its agent left: it beats no more, and is no longer watched
  RunUntil(kHostTimeout, {"h0", "h2"});
  AdvanceTo(2 * kHostTimeout);
  coordinator_->CoordinateBetweenTicks();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_THAT(said_, IsEmpty());
}

TEST_F(JobCoordinatorTest, QuietHostsAreThoseWhoseBeatStoodStillForTheQuietTime) {
  const absl::Duration quiet = kHostTimeout / 3;
  coordinator_->CoordinateHosts();  // every beat first read at 0
  RunUntil(quiet - kTick, {"h0", "h2"});
  AdvanceTo(quiet - kNanosecond);
  EXPECT_THAT(coordinator_->QuietHosts(quiet, clock_.Now()), IsEmpty());
  AdvanceTo(quiet);
  EXPECT_THAT(coordinator_->QuietHosts(quiet, clock_.Now()), ElementsAre("h1"));
  // It beats again: read at the next tick, it is no longer quiet.
  RunUntil(quiet + kTick, {"h0", "h1", "h2"});
  EXPECT_THAT(coordinator_->QuietHosts(quiet, clock_.Now()), IsEmpty());
}

// A host declared dead is no longer watched, and its ranks may still be the current generation's
// until the replacement is published: it stays among the quiet hosts, whose stale ranks are left
// to the declaration.
TEST_F(JobCoordinatorTest, AHostDeclaredDeadStaysQuietThoughNoLongerWatched) {
  const absl::Duration quiet = kHostTimeout / 3;
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2"});
  ASSERT_TRUE(Value(store_keys::kAgentsDead.Key("h1")).has_value());
  RunUntil(kHostTimeout + 2 * kTick, {"h0", "h2"});
  EXPECT_THAT(coordinator_->QuietHosts(quiet, clock_.Now()), ElementsAre("h1"));
}

TEST_F(JobCoordinatorTest, TheCoordinatorsOwnHostIsNeverDeclaredDead) {
  coordinator_->CoordinateHosts();
  RunUntil(3 * kHostTimeout, {"h1", "h2"});  // h0's beat is not the coordinator's business
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h0")), std::nullopt);
  EXPECT_THAT(said_, IsEmpty());
}

TEST_F(JobCoordinatorTest, ADeathReportIsTakenOnceAndItsCauseRecorded) {
  const std::string member = RankMember("h1", 200, 2);
  ReportDeath(member, 2, "exited with status 1", "RuntimeError: CUDA error: illegal memory access");
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h1", "h2"});  // the report stays in the store

  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  const PendingReplacement& rank = coordinator_->replacements().front();
  EXPECT_EQ(rank.rank, 2);
  EXPECT_EQ(rank.host, "h1");
  EXPECT_EQ(rank.how, "exited with status 1");
  EXPECT_EQ(rank.not_before, absl::UnixEpoch());  // a first death is replaced at once
  EXPECT_THAT(said_, ElementsAre("rank 2 (h1:200:rank2) exited with status 1: replacing it; its "
                                 "error: RuntimeError: CUDA error: illegal memory access"));
  EXPECT_EQ(failures_.deaths(), 1);
  ASSERT_TRUE(failures_.first().has_value());
  EXPECT_EQ(failures_.first()->who, "rank 2 (h1:200:rank2)");
  EXPECT_EQ(failures_.first()->cause, "RuntimeError: CUDA error: illegal memory access");
  EXPECT_EQ(policy_->history(2).deaths, 1);
  EXPECT_TRUE(coordinator_->DeathTaken(member));
}

TEST_F(JobCoordinatorTest, AParkedStandbysDeathReportForgetsTheStandbyAndQueuesNothing) {
  const std::string standby = StandbyMember("h2", 300, 0);
  ReportDeath(standby, 0, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::RdzvStandby(standby)), std::nullopt);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_EQ(failures_.deaths(), 1);
}

TEST_F(JobCoordinatorTest, AHostsEntryReplacesItsRanksQueuedAlready) {
  coordinator_->CoordinateHosts();
  ReportDeath(RankMember("h1", 200, 3), 3, "killed by signal 9 (Killed)", "");
  RunUntil(kHostTimeout, {"h0", "h2"});
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(coordinator_->replacements().front().rank, -1);
  EXPECT_THAT(coordinator_->replacements().front().ranks, ElementsAre(2, 3));
}

TEST_F(JobCoordinatorTest, ARankThatFinishedBeforeItsHostDiedIsNotReplaced) {
  Finish(2, RankMember("h1", 200, 2));
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2"});
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_THAT(coordinator_->replacements().front().ranks, ElementsAre(3));
  EXPECT_THAT(said_, ElementsAre("host h1 is dead (no heartbeat for 3s): replacing its ranks 3 at "
                                 "once"));
}

TEST_F(JobCoordinatorTest, AFencedHostThatComesBackAndLeavesCountsOnce) {
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2"});
  ASSERT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  // Back from its partition, h1's agent reads its fence: it kills its ranks, reports their deaths,
  // beats on a while, and leaves the job.
  ReportDeath(RankMember("h1", 200, 2), 2, "killed by signal 9 (Killed)", "fenced out");
  ReportDeath(RankMember("h1", 200, 3), 3, "killed by signal 9 (Killed)", "fenced out");
  RunUntil(2 * kHostTimeout, {"h0", "h1", "h2"});
  Leave("h1");
  RunUntil(4 * kHostTimeout, {"h0", "h2"});

  EXPECT_EQ(Said("host h1 is dead (no heartbeat for 3s): replacing its ranks 2,3 at once"), 1);
  EXPECT_EQ(said_.size(), 1u);
  EXPECT_EQ(failures_.deaths(), 1);  // the host's; its ranks' deaths were taken with it
  EXPECT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(recorded_.size(), 1u);
}

TEST_F(JobCoordinatorTest, AHostThatLeftTheJobIsNotDeclaredDeadForItsSilence) {
  coordinator_->CoordinateHosts();
  Leave("h2");  // its job ended: it beats no more
  RunUntil(3 * kHostTimeout, {"h0", "h1"});
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_THAT(said_, IsEmpty());
}

TEST_F(JobCoordinatorTest, JobDoneIsPublishedOnceWhenEveryRankFinished) {
  Finish(0, RankMember("h0", 100, 0));
  Finish(1, RankMember("h0", 100, 1));
  Finish(2, RankMember("h1", 200, 2));
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::kJobDone), std::nullopt);
  EXPECT_FALSE(coordinator_->done_published());

  Finish(3, RankMember("h1", 200, 3));
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::kJobDone), "every rank finished");
  EXPECT_TRUE(coordinator_->done_published());

  // Once published, nothing is written again, and the hosts, leaving one by one, are not watched.
  ASSERT_TRUE(store_.Delete(store_keys::kJobDone, kCall).ok());
  RunUntil(3 * kHostTimeout, {});
  EXPECT_EQ(Value(store_keys::kJobDone), std::nullopt);
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_THAT(said_, IsEmpty());
}

TEST_F(JobCoordinatorTest, ADeposedCoordinatorWritesNothing) {
  gate_opens_ = 0;
  ReportDeath(RankMember("h1", 200, 3), 3, "exited with status 1", "");
  for (int r = 0; r < 4; ++r) Finish(r, RankMember(r < 2 ? "h0" : "h1", r < 2 ? 100 : 200, r));
  coordinator_->CoordinateHosts();
  RunUntil(3 * kHostTimeout, {"h0"});  // h1 and h2 silent

  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), std::nullopt);
  EXPECT_EQ(Value(store_keys::kJobDone), std::nullopt);
  EXPECT_NE(Value(store_keys::RdzvStandby(StandbyMember("h2", 300, 0))), std::nullopt);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(recorded_, IsEmpty());
  EXPECT_EQ(failures_.deaths(), 0);
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_F(JobCoordinatorTest,
       AGateThatClosesRightBeforeTheFenceWritesNoneAndTheNextTickFencesTheHost) {
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout - kTick, {"h0", "h2"});
  clock_.Advance(kTick);
  Beat("h0");
  Beat("h2");
  gate_opens_ = 1;  // open for the heartbeats' read, closed at the fence
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), std::nullopt);
  EXPECT_THAT(said_, IsEmpty());

  gate_opens_ = std::numeric_limits<int>::max();  // its lease renewed in time after all
  RunUntil(kHostTimeout + kTick, {"h0", "h2"});
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3.25s");
  EXPECT_EQ(coordinator_->replacements().size(), 1u);
}

TEST_F(JobCoordinatorTest, AfterATakeoverTheHostsTheStoreNamesDeadAreNotDeclaredAgain) {
  ASSERT_TRUE(store_.Set(store_keys::kAgentsDead.Key("h1"), "no heartbeat for 3s", kCall).ok());
  coordinator_->TakeOver(kCall);
  EXPECT_THAT(coordinator_->dead_hosts(), ElementsAre("h1"));
  coordinator_->CoordinateHosts();
  RunUntil(3 * kHostTimeout, {"h0", "h2"});
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
}

// ---- What the recovery strategy makes of the faults ----

TEST_F(JobCoordinatorTest, WithStandbyReplacementAReportedDeathIsQueuedAndNoRoundRestarts) {
  ReportDeath(RankMember("h1", 200, 2), 2, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(coordinator_->replacements().front().rank, 2);
  EXPECT_EQ(Value(store_keys::kAgentRestart), std::nullopt);
  EXPECT_THAT(failed_, IsEmpty());
}

// RestartAllHostDeathTest (restart_all_test.cc) has the round's plan.
TEST_F(JobCoordinatorTest, WithRestartAllADeadTrainingHostIsFencedAndEveryRankRestarts) {
  Start(/*restart_all=*/true);
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2"});
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h1")), "no heartbeat for 3s");
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  ASSERT_TRUE(restart_all_->restart_pending());
  EXPECT_TRUE(rounds_.empty()) << "carried out at the loop's turn, not inside the death";

  restart_all_->Coordinate(clock_.Now());
  EXPECT_THAT(rounds_, ElementsAre(1));
  EXPECT_EQ(Value(store_keys::kAgentRestart), "1 host h1 is dead (no heartbeat for 3s)");
  // The restart's recovery runs from the host's last heartbeat.
  ASSERT_EQ(coordinator_->recoveries().size(), 1u);
  EXPECT_EQ(coordinator_->recoveries()[0].died, absl::UnixEpoch());
  EXPECT_EQ(coordinator_->recoveries()[0].host, "h1");
  EXPECT_THAT(failed_, IsEmpty());
}

TEST_F(JobCoordinatorTest, WithRestartAllADeadStandbyHostIsFencedAndRestartsNothing) {
  Start(/*restart_all=*/true);
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h1"});
  EXPECT_EQ(Value(store_keys::kAgentsDead.Key("h2")), "no heartbeat for 3s");
  EXPECT_THAT(said_, ElementsAre("host h2 is dead (no heartbeat for 3s); it held no rank"));
  EXPECT_FALSE(restart_all_->restart_pending());
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
}

TEST_F(JobCoordinatorTest, WithRestartAllARanksDeathOfThisRoundRestartsAndOneOfAnEarlierIsIgnored) {
  Start(/*restart_all=*/true);
  ReportDeath(RankMember("h1", 200, 2), 2, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  restart_all_->Coordinate(clock_.Now());
  ASSERT_THAT(rounds_, ElementsAre(1));

  // Round 0's rank 3 dies of the restart; a report under an id that names no process of any round.
  ReportDeath(RankMember("h1", 200, 3), 3, "killed by signal 9 (Killed)", "");
  ReportDeath("h1:200", 3, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  EXPECT_FALSE(restart_all_->restart_pending());
  EXPECT_EQ(Said("ignoring a death report: member id \"h1:200\": the id is not "
                 "\"<host>:<pid>[:round<K>]:rank<R>|standby<N>\""),
            1);

  ReportDeath(RankMember("h1", 200, 3, /*round=*/1), 3, "exited with status 1", "");
  coordinator_->CoordinateHosts();
  ASSERT_TRUE(restart_all_->restart_pending());
  restart_all_->Coordinate(clock_.Now());
  EXPECT_THAT(rounds_, ElementsAre(1, 2));
  EXPECT_EQ(Value(store_keys::kAgentRestart),
            "2 rank 3 (h1:200:round1:rank3) exited with status 1");
  EXPECT_EQ(failures_.deaths(), 4);  // every report recorded, once each
  coordinator_->CoordinateHosts();
  EXPECT_FALSE(restart_all_->restart_pending());
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_THAT(failed_, IsEmpty());
}

// ---- Replacements (TryReplacements) ----

TEST_F(JobCoordinatorTest, ACrashLoopBacksOffAndEndsAtMaxReplacementsNamingTheDeaths) {
  Start(/*restart_all=*/false, /*max_replacements=*/2);
  // Rank 2's first death: replaced at once, by the standby host's standby.
  ReportDeath(RankMember("h1", 200, 2), 2, "exited with status 1", "RuntimeError: bad input batch");
  coordinator_->CoordinateHosts();
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 1);
  ASSERT_EQ(taken_.size(), 1u);
  EXPECT_EQ(taken_[0].rank, 2);
  EXPECT_EQ(taken_[0].member, StandbyMember("h2", 300, 0));
  EXPECT_EQ(taken_[0].generation, 1);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());

  // Its replacement dies 1 s after taking the rank (h2's agent parked another standby meanwhile):
  // the second death in a row within the healthy run waits out the backoff.
  Park(StandbyMember("h2", 300, 1));
  clock_.Advance(absl::Seconds(1));
  ReportDeath(StandbyMember("h2", 300, 0), 2, "exited with status 1",
              "RuntimeError: bad input batch");
  coordinator_->CoordinateHosts();
  EXPECT_EQ(Said("rank 2 (h2:300:standby0) exited with status 1: replacing it in 1s; its error: "
                 "RuntimeError: bad input batch"),
            1);
  const absl::Time not_before = clock_.Now() + kBackoff;
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(coordinator_->replacements().front().not_before, not_before);
  AdvanceTo(not_before - kNanosecond - absl::UnixEpoch());
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_EQ(Value(store_keys::RdzvStandby(StandbyMember("h2", 300, 1))), "parked");
  EXPECT_EQ(coordinator_->replacements().size(), 1u);

  AdvanceTo(not_before - absl::UnixEpoch());
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 2);
  EXPECT_EQ(rendezvous_.current().members[2], StandbyMember("h2", 300, 1));
  EXPECT_EQ(policy_->replacements(), 2);

  // The third death in a row: --max-replacements=2 spent, the job fails, naming the rank's deaths
  // and the first one's cause.
  Park(StandbyMember("h2", 300, 2));
  clock_.Advance(absl::Seconds(1));
  ReportDeath(StandbyMember("h2", 300, 1), 2, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_EQ(failed_[0],
            "rank 2 died 3 time(s) (last: killed by signal 9 (Killed)); --max-replacements=2 "
            "reached");
  EXPECT_EQ(failures_.FinalMessage(failed_[0]),
            "rank 2 died 3 time(s) (last: killed by signal 9 (Killed)); --max-replacements=2 "
            "reached; first failure: rank 2 (h1:200:rank2) exited with status 1: RuntimeError: "
            "bad input batch");
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 2);
  EXPECT_EQ(taken_.size(), 2u);
  // Each replacement's recovery runs from its death.
  ASSERT_EQ(coordinator_->recoveries().size(), 2u);
  EXPECT_EQ(coordinator_->recoveries()[0].generation, 1);
  EXPECT_EQ(coordinator_->recoveries()[0].died, absl::UnixEpoch());
  EXPECT_EQ(coordinator_->recoveries()[1].generation, 2);
  EXPECT_EQ(coordinator_->recoveries()[1].died, absl::UnixEpoch() + absl::Seconds(1));
}

TEST_F(JobCoordinatorTest, ADeadHostsRanksAreAllTakenByOneStandbyHostsStandbysInOneGeneration) {
  // Two standby hosts: h3 parks one standby, h2 two (enough for h1's ranks).
  Join("h3", 4, /*standby=*/true);
  Park(StandbyMember("h2", 300, 1));
  Park(StandbyMember("h3", 400, 0));
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2", "h3"});
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  coordinator_->TryReplacements(clock_.Now());

  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_THAT(rendezvous_.current().members,
              ElementsAre(RankMember("h0", 100, 0), RankMember("h0", 100, 1),
                          StandbyMember("h2", 300, 0), StandbyMember("h2", 300, 1)));
  EXPECT_EQ(Value(store_keys::RdzvStandby(StandbyMember("h3", 400, 0))), "parked");
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  const std::string taken =
      "generation 1: host h1's ranks taken by 2<-h2:300:standby0, 3<-h2:300:standby1";
  EXPECT_EQ(Said(taken), 1);
  ASSERT_EQ(recorded_.size(), 2u);  // host_lost, then host_replaced
  EXPECT_EQ(recorded_[1].kind, EventKind::kHostReplaced);
  EXPECT_EQ(recorded_[1].message, taken);
  EXPECT_THAT(recorded_[1].attributes, ElementsAre(Pair("host", "h1"), Pair("ranks", "2,3")));
  EXPECT_EQ(policy_->replacements(), 2);
  EXPECT_THAT(taken_, IsEmpty());  // the standbys' own agent relabels them
  // The recovery runs from the host's last heartbeat.
  ASSERT_EQ(coordinator_->recoveries().size(), 1u);
  EXPECT_EQ(coordinator_->recoveries()[0].rank, -1);
  EXPECT_EQ(coordinator_->recoveries()[0].generation, 1);
  EXPECT_EQ(coordinator_->recoveries()[0].died, absl::UnixEpoch());
  EXPECT_EQ(coordinator_->recoveries()[0].host, "h1");
  EXPECT_THAT(failed_, IsEmpty());
}

// A host that held one rank (its other rank finished) is lost: with no standby preferred (no
// peer backups to keep away from, none on its own host), any parked standby takes that rank, as
// it would take a single rank that died; a host's ranks are never spread, but one rank cannot be.
TEST_F(JobCoordinatorTest, ADeadHostsOnlyRankIsTakenByAnyParkedStandby) {
  Finish(2, RankMember("h1", 200, 2));
  coordinator_->CoordinateHosts();
  RunUntil(kHostTimeout, {"h0", "h2"});
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  ASSERT_THAT(coordinator_->replacements().front().ranks, ElementsAre(3));
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_THAT(failed_, IsEmpty());
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_EQ(rendezvous_.current().members[3], StandbyMember("h2", 300, 0));
  EXPECT_EQ(Said("generation 1: host h1's ranks taken by 3<-h2:300:standby0"), 1);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
}

TEST_F(JobCoordinatorTest,
       WithNoStandbyParkedAndOneStartingItWaitsUntilGiveUpThenFailsNamingTheCause) {
  ASSERT_TRUE(rendezvous_.ForgetStandby(StandbyMember("h2", 300, 0), kCall).ok());
  standby_starting_ = true;  // h2's agent is starting another one
  ReportDeath(RankMember("h1", 200, 2), 2, "exited with status 1",
              "RuntimeError: CUDA out of memory");
  coordinator_->CoordinateHosts();
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  const absl::Time give_up = clock_.Now() + kStandbyWait;
  EXPECT_EQ(coordinator_->replacements().front().give_up, give_up);

  coordinator_->TryReplacements(clock_.Now());
  AdvanceTo(give_up - kNanosecond - absl::UnixEpoch());
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_THAT(failed_, IsEmpty());
  EXPECT_EQ(coordinator_->replacements().size(), 1u);
  EXPECT_EQ(rendezvous_.generation(), 0);

  AdvanceTo(give_up - absl::UnixEpoch());
  coordinator_->TryReplacements(clock_.Now());
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_EQ(failed_[0],
            "rank 2 died (exited with status 1) and no standby is available: no standby is parked "
            "to replace rank 2 of generation 0");
  EXPECT_EQ(failures_.FinalMessage(failed_[0]),
            absl::StrCat(failed_[0],
                         "; first failure: rank 2 (h1:200:rank2) exited with status 1: "
                         "RuntimeError: CUDA out of memory"));
  EXPECT_EQ(rendezvous_.generation(), 0);
}

TEST_F(JobCoordinatorTest, WithNoStandbyParkedAndNoneStartingTheJobFailsAtOnce) {
  ASSERT_TRUE(rendezvous_.ForgetStandby(StandbyMember("h2", 300, 0), kCall).ok());
  ReportDeath(RankMember("h1", 200, 3), 3, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_THAT(failed_, ElementsAre("rank 3 died (killed by signal 9 (Killed)) and no standby is "
                                   "available: no standby is parked to replace rank 3 of "
                                   "generation 0"));
}

TEST_F(JobCoordinatorTest, AStandbyThatParksBeforeGiveUpTakesTheRank) {
  ASSERT_TRUE(rendezvous_.ForgetStandby(StandbyMember("h2", 300, 0), kCall).ok());
  standby_starting_ = true;
  ReportDeath(RankMember("h1", 200, 2), 2, "exited with status 1", "");
  coordinator_->CoordinateHosts();
  coordinator_->TryReplacements(clock_.Now());
  AdvanceTo(kStandbyWait - kNanosecond);
  Park(StandbyMember("h2", 300, 1));
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_THAT(failed_, IsEmpty());
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_EQ(rendezvous_.current().members[2], StandbyMember("h2", 300, 1));
}

TEST_F(JobCoordinatorTest, ADeposedCoordinatorReplacesNothing) {
  ReportDeath(RankMember("h1", 200, 2), 2, "exited with status 1", "");
  coordinator_->CoordinateHosts();
  ASSERT_EQ(coordinator_->replacements().size(), 1u);
  const size_t said = said_.size();

  gate_opens_ = 0;
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_EQ(Value(store_keys::RdzvStandby(StandbyMember("h2", 300, 0))), "parked");
  EXPECT_EQ(coordinator_->replacements().size(), 1u);  // still its to act on if the lease renews
  EXPECT_EQ(said_.size(), said);
  EXPECT_THAT(taken_, IsEmpty());
  EXPECT_THAT(failed_, IsEmpty());
  EXPECT_EQ(policy_->replacements(), 0);

  // Deposed for good: its queue is its successor's to decide again.
  coordinator_->Depose();
  gate_opens_ = std::numeric_limits<int>::max();
  coordinator_->TryReplacements(clock_.Now());
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_THAT(coordinator_->replacements(), IsEmpty());
  EXPECT_THAT(coordinator_->recoveries(), IsEmpty());
}

// ---- Renewals (RenewGenerationWhenAsked) ----

constexpr char kReset[] = "gloo: connection reset by peer";

TEST_F(JobCoordinatorTest, AGenerationIsRenewedWhenEveryRankAskedAndNotBefore) {
  for (int rank : {1, 2, 3}) Ask(rank, kReset);
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_THAT(said_, ElementsAre(absl::StrCat("rank 1 asks for a new generation: ", kReset)));
  clock_.Advance(absl::Seconds(1));
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_THAT(recorded_, IsEmpty());

  Ask(0, kReset);  // the last one
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_THAT(rendezvous_.current().members,
              ElementsAre(RankMember("h0", 100, 0), RankMember("h0", 100, 1),
                          RankMember("h1", 200, 2), RankMember("h1", 200, 3)));
  EXPECT_EQ(Said("generation 1 renewed with the same ranks (asked by 0,1,2,3)"), 1);
  ASSERT_EQ(recorded_.size(), 1u);
  EXPECT_EQ(recorded_[0].kind, EventKind::kGenerationRenewed);
  EXPECT_THAT(recorded_[0].attributes, ElementsAre(Pair("asked_by", "0,1,2,3")));
  // The recovery runs from the first request.
  ASSERT_EQ(coordinator_->recoveries().size(), 1u);
  EXPECT_EQ(coordinator_->recoveries()[0].rank, -1);
  EXPECT_EQ(coordinator_->recoveries()[0].generation, 1);
  EXPECT_EQ(coordinator_->recoveries()[0].died, absl::UnixEpoch());

  // Generation 1's ranks have asked for nothing yet.
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 1);
}

TEST_F(JobCoordinatorTest, WithoutEveryRankTheGenerationIsRenewedExactlyTheGraceAfterTheFirstAsk) {
  for (int rank : {1, 2, 3}) Ask(rank, kReset);
  coordinator_->RenewGenerationWhenAsked({});
  const absl::Duration grace = kHostTimeout + absl::Seconds(1);  // several hosts
  AdvanceTo(grace - kNanosecond);
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 0);

  AdvanceTo(grace);
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 1);
  EXPECT_EQ(Said("generation 1 renewed with the same ranks (asked by 1,2,3)"), 1);
}

TEST_F(JobCoordinatorTest, NoRenewalWhileAReplacementIsQueuedAHangIsDecidedOrAKilledRankRuns) {
  for (int rank : {0, 1, 2, 3}) Ask(rank, kReset);
  coordinator_->RenewGenerationWhenAsked({.hang_pending = true});
  coordinator_->RenewGenerationWhenAsked({.killed_rank_unreaped = true});
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_THAT(said_, IsEmpty());  // not even seen

  ReportDeath(RankMember("h1", 200, 2), 2, "killed by signal 9 (Killed)", "");
  coordinator_->CoordinateHosts();  // rank 2 queued: its replacement answers the requests
  said_.clear();
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_THAT(said_, IsEmpty());
}

TEST_F(JobCoordinatorTest, ADeposedCoordinatorRenewsNothing) {
  for (int rank : {0, 1, 2, 3}) Ask(rank, kReset);
  gate_opens_ = 0;
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 0);
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(recorded_, IsEmpty());
  EXPECT_THAT(coordinator_->recoveries(), IsEmpty());
}

TEST_F(JobCoordinatorTest, WithRestartAllEveryRanksRequestRestartsEveryRankInsteadOfRenewing) {
  Start(/*restart_all=*/true);
  for (int rank : {0, 1, 2, 3}) Ask(rank, kReset);
  coordinator_->RenewGenerationWhenAsked({});
  EXPECT_EQ(rendezvous_.generation(), 0);
  ASSERT_TRUE(restart_all_->restart_pending());
  restart_all_->Coordinate(clock_.Now());
  EXPECT_THAT(rounds_, ElementsAre(1));
  EXPECT_EQ(Value(store_keys::kAgentRestart),
            absl::StrCat("1 rank 0 asks for a new generation: ", kReset));
}

}  // namespace
}  // namespace trainguard
