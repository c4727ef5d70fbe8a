// RankWatch (sdk/coordinator/rank_watch.h): what the coordinator watches of the ranks, on an
// in-memory store at instants a ManualClock sets, with a real RendezvousCoordinator on that store:
// no processes, no sleeps. The ranks' side (their heartbeats, their first step of a generation,
// ckpt/protected, a persist failure) is written into the store as the Runtime writes it.
#include "sdk/coordinator/rank_watch.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/membership.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(3);
constexpr absl::Duration kHostTimeout = absl::Seconds(2);
constexpr absl::Duration kCall = absl::Seconds(1);
constexpr int kWorld = 3;

std::string Member(int rank) {
  return store_keys::EncodeMemberId({"h0", 100, 0, store_keys::MemberId::Role::kRank, rank});
}

// A job of three ranks whose generation 0 formed; the watch's coordinator may act unless a test
// closes its gate.
class RankWatchTest : public ::testing::Test {
 protected:
  struct Kill {
    std::string member;
    EventKind what;
    std::string why;
  };
  struct Replaced {
    int rank;
    std::string member;
    EventKind what;
    std::string why;
  };
  struct Recorded {
    int rank;
    EventKind kind;
    std::string message;
    RankWatch::Attributes attributes;
  };

  void SetUp() override {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(store_.Set(store_keys::RdzvJoin(r), Member(r), kCall).ok());
    }
    ASSERT_TRUE(rendezvous_.FormInitialGeneration(kWorld, kCall).ok());
    RankWatchOptions options;
    options.heartbeat_timeout = kHeartbeatTimeout;
    options.host_timeout = kHostTimeout;
    // Every call reads the heartbeats: the test sets the instants.
    options.heartbeat_check_period = absl::ZeroDuration();
    options.store_timeout = kCall;
    options.report_timeout = kCall;
    RankWatch::Hooks hooks;
    hooks.coordinating = [this] { return coordinating_; };
    hooks.say = [this](const std::string& line) { said_.push_back(line); };
    hooks.record = [this](int rank, EventKind kind, const std::string& message,
                          RankWatch::Attributes attributes) {
      recorded_.push_back({rank, kind, message, std::move(attributes)});
    };
    hooks.kill_member = [this](const std::string& member, EventKind what, const std::string& why) {
      kills_.push_back({member, what, why});
    };
    hooks.report_laggards = [this] { ++laggard_reports_; };
    hooks.quiet_hosts = [this] { return quiet_hosts_; };
    hooks.kill_and_replace = [this](int rank, const std::string& member, EventKind what,
                                    const std::string& why) {
      replaced_.push_back({rank, member, what, why});
    };
    watch_ = std::make_unique<RankWatch>(&store_, &store_, &clock_, &rendezvous_, options,
                                         std::move(hooks));
    watch_->set_world_size(kWorld);
  }

  // Rank `rank` beats, as its RendezvousMember's heartbeat thread does.
  void Beat(int rank) {
    ASSERT_TRUE(store_.Add(store_keys::RdzvHeartbeat(Member(rank)), 1, kCall).ok());
  }
  // Rank `rank` completed its first step of `generation`, as the Runtime records it.
  void Resume(int64_t generation, int rank) {
    ASSERT_TRUE(PublishResumed(&store_, generation, rank, 1, kCall).ok());
  }
  absl::Duration Elapsed() { return clock_.Now() - absl::UnixEpoch(); }
  void AdvanceTo(absl::Duration since_start) { clock_.Advance(since_start - Elapsed()); }

  ManualClock clock_{absl::UnixEpoch()};
  InMemoryStore store_{&clock_};  // its keys' ages on the coordinator's clock
  RendezvousCoordinator rendezvous_{&store_, &clock_};
  std::unique_ptr<RankWatch> watch_;
  bool coordinating_ = true;
  std::vector<std::string> said_;
  std::vector<Recorded> recorded_;
  std::vector<Kill> kills_;
  int laggard_reports_ = 0;
  std::vector<Replaced> replaced_;
  std::set<std::string> quiet_hosts_;  // Hooks::quiet_hosts
};

TEST(StaleRanksToKillTest, AStaleRankWhoseHostIsQuietIsLeftToTheHostsDeclaration) {
  Membership current;
  current.generation = 3;
  current.world_size = 4;
  for (const auto& [host, rank] : std::vector<std::pair<std::string, int>>{
           {"h0", 0}, {"h0", 1}, {"h1", 2}, {"h1", 3}}) {
    current.members.push_back(
        store_keys::EncodeMemberId({host, 100, 0, store_keys::MemberId::Role::kRank, rank}));
  }
  // h1's agent is quiet: its stale ranks 2 and 3 are held; h0's stale rank 1 is killed.
  EXPECT_THAT(StaleRanksToKill({1, 2, 3}, current, {"h1"}), ElementsAre(1));
  // No quiet host: every stale rank, in order.
  EXPECT_THAT(StaleRanksToKill({3, 1}, current, {}), ElementsAre(3, 1));
  // Every stale rank's host quiet: none; a rank outside the generation is left out.
  EXPECT_THAT(StaleRanksToKill({0, 2, 7, -1}, current, {"h0", "h1"}), IsEmpty());
  EXPECT_THAT(StaleRanksToKill({0, 7}, current, {"h2"}), ElementsAre(0));
}

TEST_F(RankWatchTest, AStaleRankOfAQuietHostIsNotKilledUntilItsHostBeatsAgain) {
  for (int r = 0; r < kWorld; ++r) Beat(r);
  watch_->KillRanksWithStaleHeartbeats();  // every beat first seen at 0
  // The host h0 goes quiet with its ranks: nobody beats.
  quiet_hosts_ = {"h0"};
  AdvanceTo(kHeartbeatTimeout);
  watch_->KillRanksWithStaleHeartbeats();
  AdvanceTo(2 * kHeartbeatTimeout);
  watch_->KillRanksWithStaleHeartbeats();
  EXPECT_THAT(kills_, IsEmpty());
  EXPECT_EQ(laggard_reports_, 0);  // nobody to name while the host explains the silence

  // Its agent beats again (it was stalled, not dead), its ranks still do not: killed at the next
  // check.
  quiet_hosts_.clear();
  AdvanceTo(2 * kHeartbeatTimeout + absl::Milliseconds(1));
  watch_->KillRanksWithStaleHeartbeats();
  ASSERT_EQ(kills_.size(), 3u);
  EXPECT_EQ(kills_[0].member, Member(0));
  EXPECT_EQ(kills_[2].member, Member(2));
  EXPECT_EQ(laggard_reports_, 1);
}

TEST_F(RankWatchTest, ARankWhoseHeartbeatIsExactlyTheTimeoutOldIsKilledAndNotOneMsBefore) {
  for (int r = 0; r < kWorld; ++r) Beat(r);
  watch_->KillRanksWithStaleHeartbeats();  // every beat first seen at 0
  // Ranks 0 and 2 keep beating; rank 1 (stopped) beats no more.
  for (absl::Duration t = absl::Seconds(1); t < kHeartbeatTimeout; t += absl::Seconds(1)) {
    AdvanceTo(t);
    Beat(0);
    Beat(2);
    watch_->KillRanksWithStaleHeartbeats();
  }
  AdvanceTo(kHeartbeatTimeout - absl::Milliseconds(1));
  watch_->KillRanksWithStaleHeartbeats();
  EXPECT_THAT(kills_, IsEmpty());
  EXPECT_EQ(laggard_reports_, 0);

  AdvanceTo(kHeartbeatTimeout);
  watch_->KillRanksWithStaleHeartbeats();
  ASSERT_EQ(kills_.size(), 1u);
  EXPECT_EQ(kills_[0].member, Member(1));
  EXPECT_EQ(kills_[0].what, EventKind::kRankUnresponsive);
  EXPECT_EQ(kills_[0].why, "rank 1 has not sent a heartbeat for 3s");
  EXPECT_EQ(laggard_reports_, 1);  // who the others wait for, before the kill
}

TEST_F(RankWatchTest, HeartbeatsAreReadAtMostOncePerCheckPeriodAndNotWhileHeld) {
  RankWatchOptions options;
  options.heartbeat_timeout = kHeartbeatTimeout;
  options.heartbeat_check_period = absl::Milliseconds(500);
  RankWatch::Hooks hooks;
  hooks.coordinating = [] { return true; };
  hooks.say = [](const std::string&) {};
  hooks.record = [](int, EventKind, const std::string&, RankWatch::Attributes) {};
  hooks.kill_member = [this](const std::string& member, EventKind what, const std::string& why) {
    kills_.push_back({member, what, why});
  };
  hooks.report_laggards = [] {};
  hooks.quiet_hosts = [] { return std::set<std::string>{}; };
  hooks.kill_and_replace = [](int, const std::string&, EventKind, const std::string&) {};
  RankWatch watch(&store_, &store_, &clock_, &rendezvous_, options, std::move(hooks));
  watch.set_world_size(kWorld);
  // A restart: no heartbeat is judged for a heartbeat timeout.
  watch.HoldHeartbeatChecksUntil(clock_.Now() + kHeartbeatTimeout);
  watch.KillRanksWithStaleHeartbeats();  // held: not read, so no rank's silence starts here
  AdvanceTo(kHeartbeatTimeout);
  watch.KillRanksWithStaleHeartbeats();  // the first read: every rank's bound starts
  AdvanceTo(2 * kHeartbeatTimeout + absl::Milliseconds(100));
  watch.KillRanksWithStaleHeartbeats();  // the last read was 3.1 s ago: read, all stale
  EXPECT_EQ(kills_.size(), 3u);
  kills_.clear();
  AdvanceTo(2 * kHeartbeatTimeout + absl::Milliseconds(599));
  watch.KillRanksWithStaleHeartbeats();  // within the check period of the last read
  EXPECT_THAT(kills_, IsEmpty());
  AdvanceTo(2 * kHeartbeatTimeout + absl::Milliseconds(600));
  watch.KillRanksWithStaleHeartbeats();
  EXPECT_EQ(kills_.size(), 3u);
}

TEST_F(RankWatchTest, ADeposedCoordinatorKillsNoRankForItsHeartbeat) {
  watch_->KillRanksWithStaleHeartbeats();
  AdvanceTo(2 * kHeartbeatTimeout);
  coordinating_ = false;
  watch_->KillRanksWithStaleHeartbeats();
  EXPECT_THAT(kills_, IsEmpty());
  EXPECT_EQ(laggard_reports_, 0);
}

TEST_F(RankWatchTest, ARankStoppedWhileTheGenerationWaitsIsReplacedAtExactlyTheHostTimeout) {
  // Rank 1's agent reports it stopped (SIGSTOP) before it completed a step of generation 0.
  ASSERT_TRUE(store_.Set(store_keys::kAgentStopped.Key(Member(1)), "h0", kCall).ok());
  watch_->KillMembersStoppedInFormation();  // first seen at 0
  AdvanceTo(kHostTimeout - absl::Nanoseconds(1));
  watch_->KillMembersStoppedInFormation();
  EXPECT_THAT(replaced_, IsEmpty());
  AdvanceTo(kHostTimeout);
  watch_->KillMembersStoppedInFormation();
  AdvanceTo(2 * kHostTimeout);
  watch_->KillMembersStoppedInFormation();  // once
  ASSERT_EQ(replaced_.size(), 1u);
  EXPECT_EQ(replaced_[0].rank, 1);
  EXPECT_EQ(replaced_[0].member, Member(1));
  EXPECT_EQ(replaced_[0].what, EventKind::kRankUnresponsive);
  EXPECT_EQ(replaced_[0].why,
            "rank 1 is stopped (its agent says) for 2s while generation 0 waits for it");
}

TEST_F(RankWatchTest, AStopOfARankInTrainingIsLeftToTheHangPathAndARunningOneStartsAfresh) {
  Resume(0, 1);  // rank 1 completed a step of generation 0: its stop is a hang
  ASSERT_TRUE(store_.Set(store_keys::kAgentStopped.Key(Member(1)), "h0", kCall).ok());
  ASSERT_TRUE(store_.Set(store_keys::kAgentStopped.Key(Member(2)), "h0", kCall).ok());
  watch_->KillMembersStoppedInFormation();
  AdvanceTo(kHostTimeout / 2);
  // Rank 2 runs again (its agent deletes the report), then stops again.
  ASSERT_TRUE(store_.Delete(store_keys::kAgentStopped.Key(Member(2)), kCall).ok());
  watch_->KillMembersStoppedInFormation();
  ASSERT_TRUE(store_.Set(store_keys::kAgentStopped.Key(Member(2)), "h0", kCall).ok());
  AdvanceTo(kHostTimeout);
  watch_->KillMembersStoppedInFormation();  // rank 2's second stop first seen here
  AdvanceTo(2 * kHostTimeout - absl::Nanoseconds(1));
  watch_->KillMembersStoppedInFormation();
  EXPECT_THAT(replaced_, IsEmpty());
  AdvanceTo(2 * kHostTimeout);
  coordinating_ = false;  // deposed: nobody killed, and nobody marked killed
  watch_->KillMembersStoppedInFormation();
  EXPECT_THAT(replaced_, IsEmpty());
  coordinating_ = true;
  watch_->KillMembersStoppedInFormation();
  ASSERT_EQ(replaced_.size(), 1u);
  EXPECT_EQ(replaced_[0].rank, 2);
}

TEST_F(RankWatchTest, ARecoveryIsReportedWhenEveryRankResumedTheNewGenerationAndNotBefore) {
  // Rank 1 died at 0; its replacement's generation 1 is published at 1 s.
  std::vector<Recovery> recoveries = {{1, 1, absl::UnixEpoch()}};
  AdvanceTo(absl::Seconds(1));
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  // Every rank completed a step of generation 0: not the new one.
  for (int r = 0; r < kWorld; ++r) Resume(0, r);
  Resume(1, 0);
  Resume(1, 2);
  AdvanceTo(absl::Milliseconds(2500));
  watch_->CheckRecoveries(recoveries);
  EXPECT_EQ(recoveries.size(), 1u);
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(recorded_, IsEmpty());

  Resume(1, 1);  // the replacement's first step
  AdvanceTo(absl::Milliseconds(2750));
  watch_->CheckRecoveries(recoveries);
  EXPECT_THAT(recoveries, IsEmpty());
  EXPECT_THAT(said_, ElementsAre("recovered from the loss of rank 1 in 2.750 s (death seen -> "
                                 "every rank completed its first step of generation 1)"));
  ASSERT_EQ(recorded_.size(), 1u);
  EXPECT_EQ(recorded_[0].rank, 1);
  EXPECT_EQ(recorded_[0].kind, EventKind::kRecovered);
  EXPECT_EQ(recorded_[0].message, "every rank completed its first step of generation 1");
  EXPECT_THAT(recorded_[0].attributes, ElementsAre(Pair("took_ms", "2750")));
}

TEST_F(RankWatchTest, AFaultBeforeEveryRankResumedExtendsTheRecoveryToTheNewerGeneration) {
  // A host's loss (its last heartbeat at 0) recovered in generation 1; a renewal raises it to 2
  // before every rank resumed 1.
  std::vector<Recovery> recoveries = {{-1, 1, absl::UnixEpoch(), "h1"}};
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  ASSERT_TRUE(rendezvous_.RenewGeneration(kCall).ok());
  for (int r = 0; r < kWorld; ++r) Resume(1, r);
  AdvanceTo(absl::Seconds(4));
  watch_->CheckRecoveries(recoveries);
  ASSERT_EQ(recoveries.size(), 1u);
  EXPECT_EQ(recoveries[0].generation, 2);
  for (int r = 0; r < kWorld; ++r) Resume(2, r);
  AdvanceTo(absl::Seconds(5));
  watch_->CheckRecoveries(recoveries);
  EXPECT_THAT(recoveries, IsEmpty());
  EXPECT_THAT(said_, ElementsAre("recovered from the loss of host h1 in 5.000 s (its last "
                                 "heartbeat -> every rank completed its first step of generation "
                                 "2)"));
  ASSERT_EQ(recorded_.size(), 1u);
  EXPECT_THAT(recorded_[0].attributes, ElementsAre(Pair("took_ms", "5000"), Pair("host", "h1")));
}

TEST_F(RankWatchTest, ADeposedCoordinatorReportsNoRecovery) {
  std::vector<Recovery> recoveries = {{-1, 0, absl::UnixEpoch()}};
  for (int r = 0; r < kWorld; ++r) Resume(0, r);
  coordinating_ = false;
  watch_->CheckRecoveries(recoveries);
  EXPECT_EQ(recoveries.size(), 1u);
  EXPECT_THAT(said_, IsEmpty());
  EXPECT_THAT(recorded_, IsEmpty());
  // Its lease renewed in time after all (nobody took it): reported then, timed from the fault.
  coordinating_ = true;
  AdvanceTo(absl::Seconds(2));
  watch_->CheckRecoveries(recoveries);
  EXPECT_THAT(said_, ElementsAre("recovered with the same ranks in 2.000 s (first request for a "
                                 "new generation -> every rank completed its first step of "
                                 "generation 0)"));
}

TEST_F(RankWatchTest, ProtectionIsReportedOncePerChangeOfEpoch) {
  watch_->ReportProtection();  // nothing protected yet
  EXPECT_THAT(said_, IsEmpty());
  ASSERT_TRUE(store_.Set(store_keys::kCkptProtected, "10 e1", kCall).ok());
  watch_->ReportProtection();
  watch_->ReportProtection();
  ASSERT_TRUE(store_.Set(store_keys::kCkptProtected, "20 e1", kCall).ok());  // a later step
  watch_->ReportProtection();
  EXPECT_THAT(said_, ElementsAre("the job is protected: every rank's snapshot of step 10 is in "
                                 "memory with all its backups (epoch e1)"));
  said_.clear();
  ASSERT_TRUE(store_.Set(store_keys::kCkptProtected, "30 e2", kCall).ok());  // after a recovery
  coordinating_ = false;
  watch_->ReportProtection();  // deposed: says nothing
  EXPECT_THAT(said_, IsEmpty());
  coordinating_ = true;
  watch_->ReportProtection();
  watch_->ReportProtection();
  EXPECT_THAT(said_, ElementsAre("the job is protected again: every rank's snapshot of step 30 "
                                 "is in memory with all its backups (epoch e2)"));
}

TEST_F(RankWatchTest, ACheckpointNotPersistedIsSaidOnceForEachRankAndStep) {
  ASSERT_TRUE(
      store_.Set(store_keys::JobPersistFailed(30, 1), "rank 1 step 30: disk full", kCall).ok());
  watch_->ReportPersistFailures();
  watch_->ReportPersistFailures();
  ASSERT_TRUE(
      store_.Set(store_keys::JobPersistFailed(30, 0), "rank 0 step 30: disk full", kCall).ok());
  watch_->ReportPersistFailures();
  EXPECT_THAT(said_, ElementsAre("checkpoint not persisted: rank 1 step 30: disk full",
                                 "checkpoint not persisted: rank 0 step 30: disk full"));
}

}  // namespace
}  // namespace trainguard
