// HostAgent (sdk/host_agent/host_agent.h): a host's own agent duties, on an in-memory store shared
// by two hosts' agents (each through a link that a test can cut), a ManualClock and a
// FakeProcessSupervisor per host whose workers are not processes: no processes, no sleeps. The
// coordinator's side (kill requests, the fence, the generations, the job's end) is written into
// the store with store_keys' codecs, or handed over as a Membership, as the coordinator publishes
// it.
#include "sdk/host_agent/host_agent.h"

#include <signal.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/agent/host_liveness.h"
#include "sdk/agent/process_supervisor.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/forwarding_store.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "tests/support/agent_connection.h"
#include "tests/support/agent_fixtures.h"
#include "tests/support/fake_process_supervisor.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/membership.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::RankMember;
using testing::StandbyMember;

constexpr absl::Duration kCall = absl::Seconds(1);
constexpr absl::Duration kStoreLossBound = absl::Seconds(30);
constexpr int kFailed = 1;

// One agent's connection to the shared store, cut off at will.
using AgentLink = testing::AgentConnection;

// One host's agent and its workers, as the launcher would hold them.
struct Host {
  struct Recorded {
    int rank;
    EventKind kind;
    std::string message;
  };

  Host(const std::string& id, int64_t agent_pid, Store* store, Clock* clock)
      : id(id), agent_pid(agent_pid), link(store) {
    const HostAgentOptions options =
        testing::TestHostAgentOptions(id, kCall, kFailed, kStoreLossBound);
    HostAgent::Hooks hooks;
    hooks.workers = testing::WorkersIn(&workers);
    hooks.say = [this](const std::string& line) { said.push_back(line); };
    hooks.record = [this](int rank, EventKind kind, const std::string& message,
                          HostAgent::Attributes) {
      recorded.push_back({rank, kind, message});
    };
    hooks.latest_term = [this] { return latest_term; };
    hooks.pid_file = [this](int rank) { return PidFile(rank); };
    hooks.rank_taken = [this](HostWorker& w) { taken.push_back(w.member_id); };
    agent = std::make_unique<HostAgent>(&link, clock, &supervisor, options, std::move(hooks));
  }
  std::string PidFile(int rank) const { return absl::StrCat("/run/job/pids/", id, "/rank-", rank); }

  // Starts a rank (rank >= 0) or a standby (index) as the launcher does.
  HostWorker& Start(int rank, int standby_index = -1) {
    return testing::StartHostWorker(
        supervisor, workers, rank,
        rank >= 0 ? RankMember(id, agent_pid, rank) : StandbyMember(id, agent_pid, standby_index),
        standby_index);
  }
  // What the launcher does with the supervisor's events: the output feeds the death's cause, an
  // exit marks the worker gone.
  void Drain() {
    for (const WorkerEvent& e : supervisor.Poll(absl::ZeroDuration())) {
      for (auto& w : workers) {
        if (w->worker != e.worker) continue;
        if (e.kind == WorkerEvent::Kind::kOutput) w->printed_cause.Observe(e.line);
        if (e.kind == WorkerEvent::Kind::kExited) w->running = false;
      }
    }
  }
  std::vector<int> SignalsTo(const HostWorker& w) const {
    std::vector<int> sent;
    for (const auto& s : supervisor.signals()) {
      if (s.worker == w.worker) sent.push_back(s.signal);
    }
    return sent;
  }

  std::string id;
  int64_t agent_pid = 0;
  AgentLink link;
  testing::FakeProcessSupervisor supervisor;
  std::vector<std::unique_ptr<HostWorker>> workers;
  std::vector<std::string> said;
  std::vector<Recorded> recorded;
  int64_t latest_term = 1;
  std::vector<std::string> taken;  // the members Hooks::rank_taken was told of
  std::unique_ptr<HostAgent> agent;
};

class HostAgentTest : public ::testing::Test {
 protected:
  // A kill request of lease term `term`, written as JobCoordinator's holder writes it.
  void RequestKill(const std::string& host, const std::string& member, int64_t term, EventKind what,
                   const std::string& why) {
    ASSERT_TRUE(trainguard::RequestKill(&store_, host, member,
                                        {term, std::string(EventKindName(what)), why}, kCall)
                    .ok());
  }
  bool Has(const std::string& key) { return store_.Get(key, kCall).ok(); }

  ManualClock clock_;
  InMemoryStore store_{&clock_};  // its keys' ages by the same clock
  Host h0_{"h0", 100, &store_, &clock_};
  Host h1_{"h1", 200, &store_, &clock_};
};

TEST_F(HostAgentTest, AKillRequestIsCarriedOutByTheOwningAgentOnly) {
  HostWorker& h0_rank1 = h0_.Start(1);
  h1_.Start(2);
  HostWorker& h1_rank3 = h1_.Start(3);
  h0_.latest_term = h1_.latest_term = 4;
  RequestKill("h1", h1_rank3.member_id, 4, EventKind::kHangSuspect, "rank 3 is the hang's suspect");

  // h0's agent reads only the requests addressed to h0: h1's stays for h1.
  h0_.agent->ExecuteKillRequests();
  EXPECT_THAT(h0_.supervisor.signals(), IsEmpty());
  EXPECT_FALSE(h0_rank1.killed_for_liveness);
  EXPECT_TRUE(Has(store_keys::AgentKill("h1", h1_rank3.member_id)));

  h1_.agent->ExecuteKillRequests();
  ASSERT_EQ(h1_.supervisor.signals().size(), 1u);
  EXPECT_EQ(h1_.supervisor.signals()[0].worker, h1_rank3.worker);
  EXPECT_EQ(h1_.supervisor.signals()[0].signal, SIGKILL);
  EXPECT_TRUE(h1_rank3.killed_for_liveness);
  EXPECT_EQ(h1_rank3.Cause(),
            "the launcher killed it for the coordinator: rank 3 is the hang's "
            "suspect");
  EXPECT_THAT(h1_.said, ElementsAre(absl::StrFormat(
                            "rank 3 (pid %d): killing it for the coordinator: rank 3 is the "
                            "hang's suspect",
                            h1_rank3.pid)));
  ASSERT_EQ(h1_.recorded.size(), 1u);
  EXPECT_EQ(h1_.recorded[0].rank, 3);
  EXPECT_EQ(h1_.recorded[0].kind, EventKind::kHangSuspect);
  // Carried out once: the request is gone, and a second pass sends nothing more.
  EXPECT_FALSE(Has(store_keys::AgentKill("h1", h1_rank3.member_id)));
  RequestKill("h1", h1_rank3.member_id, 4, EventKind::kHangSuspect, "again");
  h1_.agent->ExecuteKillRequests();
  EXPECT_EQ(h1_.supervisor.signals().size(), 1u);
}

TEST_F(HostAgentTest, AKillRequestOfAnOlderLeaseTermIsIgnored) {
  HostWorker& rank2 = h1_.Start(2);
  h1_.latest_term = 5;  // a coordinator took the lease over since term 4's asked
  RequestKill("h1", rank2.member_id, 4, EventKind::kRankUnresponsive, "rank 2 sends no heartbeat");

  h1_.agent->ExecuteKillRequests();
  EXPECT_THAT(h1_.supervisor.signals(), IsEmpty());
  EXPECT_FALSE(rank2.killed_for_liveness);
  EXPECT_THAT(h1_.said, ElementsAre(absl::StrCat(
                            "ignoring the kill request of ", rank2.member_id,
                            " from lease term 4: the lease is at term 5 (rank 2 sends no "
                            "heartbeat)")));
  EXPECT_FALSE(Has(store_keys::AgentKill("h1", rank2.member_id)));  // read, so dropped

  // The current term's request is carried out.
  RequestKill("h1", rank2.member_id, 5, EventKind::kRankUnresponsive, "rank 2 sends no heartbeat");
  h1_.agent->ExecuteKillRequests();
  ASSERT_EQ(h1_.supervisor.signals().size(), 1u);
  EXPECT_EQ(h1_.supervisor.signals()[0].worker, rank2.worker);
}

TEST_F(HostAgentTest, AMalformedKillRequestIsIgnoredAndDropped) {
  HostWorker& rank2 = h1_.Start(2);
  const std::string key = store_keys::AgentKill("h1", rank2.member_id);
  ASSERT_TRUE(store_.Set(key, "4 no_such_kind why", kCall).ok());
  ASSERT_TRUE(store_.Add(store_keys::AgentKillCount("h1"), 1, kCall).ok());
  h1_.agent->ExecuteKillRequests();
  EXPECT_THAT(h1_.supervisor.signals(), IsEmpty());
  ASSERT_EQ(h1_.said.size(), 1u);
  EXPECT_THAT(h1_.said[0], HasSubstr("ignoring a malformed kill request of " + rank2.member_id));
  EXPECT_FALSE(Has(key));
}

TEST_F(HostAgentTest, AWorkersDeathIsReportedOnceWithItsCause) {
  HostWorker& rank2 = h1_.Start(2);
  h1_.supervisor.Print(rank2.worker, "RuntimeError: CUDA error: an illegal memory access");
  h1_.supervisor.Print(rank2.worker, "exiting");
  h1_.supervisor.Exit(rank2.worker, WorkerExit::Exited(1));
  h1_.Drain();

  h1_.agent->ReportDeath(rank2, "exited with status 1");
  const std::string key = store_keys::kAgentDeaths.Key(rank2.member_id);
  absl::StatusOr<std::string> value = store_.Get(key, kCall);
  ASSERT_TRUE(value.ok()) << value.status();
  absl::StatusOr<store_keys::DeathReport> report = store_keys::DecodeDeathReport(key, *value);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->member, rank2.member_id);
  EXPECT_EQ(report->rank, 2);
  EXPECT_EQ(report->how, "exited with status 1");
  EXPECT_EQ(report->cause, "RuntimeError: CUDA error: an illegal memory access");

  // Once: the key is cleared here to see whether a second report of the same death writes it again.
  ASSERT_TRUE(store_.Delete(key, kCall).ok());
  h1_.agent->ReportDeath(rank2, "exited with status 1");
  EXPECT_FALSE(Has(key));
}

TEST_F(HostAgentTest, AKilledWorkersDeathNamesWhyItsAgentKilledIt) {
  HostWorker& rank3 = h1_.Start(3);
  h1_.latest_term = 2;
  RequestKill("h1", rank3.member_id, 2, EventKind::kRankUnresponsive, "stopped for 3s");
  h1_.agent->ExecuteKillRequests();
  h1_.supervisor.Exit(rank3.worker, WorkerExit::Killed(SIGKILL));
  h1_.Drain();
  h1_.agent->ReportDeath(rank3, "killed by SIGKILL");
  const std::string key = store_keys::kAgentDeaths.Key(rank3.member_id);
  absl::StatusOr<store_keys::DeathReport> report =
      store_keys::DecodeDeathReport(key, store_.Get(key, kCall).value_or(""));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->cause, "the launcher killed it for the coordinator: stopped for 3s");
}

TEST_F(HostAgentTest, StoppedRanksAreReportedUntilTheyRunAgain) {
  HostWorker& rank2 = h1_.Start(2);
  HostWorker& standby = h1_.Start(-1, 0);
  const std::string key = store_keys::kAgentStopped.Key(rank2.member_id);
  h1_.agent->ReportStoppedWorkers();
  EXPECT_FALSE(Has(key));

  h1_.supervisor.Stop(rank2.worker);
  h1_.supervisor.Stop(standby.worker);  // a standby holds no rank that anyone waits for
  h1_.agent->ReportStoppedWorkers();
  EXPECT_EQ(store_.Get(key, kCall).value_or(""), "h1");
  EXPECT_FALSE(Has(store_keys::kAgentStopped.Key(standby.member_id)));

  h1_.supervisor.Continue(rank2.worker);
  h1_.agent->ReportStoppedWorkers();
  EXPECT_FALSE(Has(key));
}

TEST_F(HostAgentTest, AFencedHostsAgentStopsItsWorkersAndLeaves) {
  HostWorker& rank2 = h1_.Start(2);
  HostWorker& rank3 = h1_.Start(3);
  HostWorker& standby = h1_.Start(-1, 0);
  h1_.supervisor.Exit(rank3.worker, WorkerExit::Exited(1));
  h1_.Drain();
  // Not fenced: nothing happens.
  EXPECT_EQ(h1_.agent->CheckFenced(), std::nullopt);
  EXPECT_THAT(h1_.supervisor.signals(), IsEmpty());

  ASSERT_TRUE(store_.Set(store_keys::kAgentsDead.Key("h1"), "no heartbeat for 3s", kCall).ok());
  EXPECT_EQ(h0_.agent->CheckFenced(), std::nullopt);  // another host's fence is not h0's

  const std::optional<AgentExit> exit = h1_.agent->CheckFenced();
  const std::string why =
      "this host (h1) was declared dead by the coordinator (no heartbeat for 3s); its ranks were "
      "given to others: stopping them";
  EXPECT_EQ(exit, (AgentExit{kFailed, why}));
  EXPECT_THAT(h1_.said, ElementsAre("fenced out: " + why));
  // Every running worker is told to stop; the one that exited is not signalled.
  EXPECT_THAT(h1_.SignalsTo(rank2), ElementsAre(SIGTERM));
  EXPECT_THAT(h1_.SignalsTo(standby), ElementsAre(SIGTERM));
  EXPECT_THAT(h1_.SignalsTo(rank3), IsEmpty());
  // The launcher's stop that follows does not signal them twice.
  h1_.agent->SignalStop();
  EXPECT_EQ(h1_.supervisor.signals().size(), 2u);
  // Nothing is published for the other hosts: the job goes on without h1.
  EXPECT_FALSE(Has(store_keys::kJobFailed));
}

TEST_F(HostAgentTest, TheJobsEndEndsTheAgent) {
  EXPECT_EQ(h1_.agent->WatchJobEnd(), std::nullopt);

  ASSERT_TRUE(store_.Set(store_keys::kJobDone, "", kCall).ok());
  EXPECT_EQ(h1_.agent->WatchJobEnd(), (AgentExit{0, ""}));
  EXPECT_THAT(h1_.said, IsEmpty());

  // A failure published (by an agent that failed the job) wins over job/done.
  const std::string failure = "rank 4 died (killed by SIGKILL) and no standby is available";
  ASSERT_TRUE(store_.Set(store_keys::kJobFailed, failure, kCall).ok());
  EXPECT_EQ(h1_.agent->WatchJobEnd(), (AgentExit{kFailed, failure}));
  EXPECT_THAT(h1_.said, ElementsAre("job failed: " + failure));
}

TEST_F(HostAgentTest, TheJobsFailureEndsTheAgentWithItsText) {
  const std::string failure = "host h2 has not reached the job's store for 30s";
  ASSERT_TRUE(store_.Set(store_keys::kJobFailed, failure, kCall).ok());
  EXPECT_EQ(h0_.agent->WatchJobEnd(), (AgentExit{kFailed, failure}));
  EXPECT_THAT(h0_.said, ElementsAre("job failed: " + failure));
}

TEST_F(HostAgentTest, EachHeartbeatTheStoreTakesCountsOne) {
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  EXPECT_EQ(store_.Get(store_keys::kAgentHeartbeats.Key("h1"), kCall).value_or(""), "2");
  EXPECT_EQ(h1_.agent->beats(), 2);
  EXPECT_FALSE(Has(store_keys::kAgentHeartbeats.Key("h0")));

  // A beat the store did not take is not counted: the next one it takes is the third.
  h1_.link.cut_off = true;
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  h1_.link.cut_off = false;
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  EXPECT_EQ(store_.Get(store_keys::kAgentHeartbeats.Key("h1"), kCall).value_or(""), "3");
}

TEST_F(HostAgentTest, AHostCutOffFromTheStoreGivesUpPastTheBoundAndNotBefore) {
  ASSERT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  h1_.link.cut_off = true;
  clock_.Advance(kStoreLossBound);
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);  // exactly the bound: a partition that heals
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(h1_.agent->Heartbeat(),
            "host h1 has not reached the job's store (tcp://10.0.0.1:29400) for 30.000000001s: "
            "UNAVAILABLE: cut off from the store");
}

TEST_F(HostAgentTest, AHeartbeatTakenWithinTheBoundStartsItAfresh) {
  ASSERT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  h1_.link.cut_off = true;
  clock_.Advance(kStoreLossBound - absl::Seconds(1));
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  h1_.link.cut_off = false;
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);  // the partition healed
  h1_.link.cut_off = true;
  clock_.Advance(kStoreLossBound);
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);
}

// The coordinator's rule for hosts (HostLiveness, as JobCoordinator reads it every turn): a host
// whose heartbeat stood still for --host-timeout is declared dead, fenced out and its ranks given
// to others. Its agent beats on a thread of its own (StartBeating; BeatOnce is its step), so that a
// live host whose turns are slow (a loaded machine, a slow store: issue 37) is not declared, while
// a host killed or stopped whole, or whose agent is wedged past its bound, still is.
constexpr absl::Duration kHostTimeout = absl::Seconds(3);
constexpr absl::Duration kBeatInterval = absl::Milliseconds(250);  // kHostTimeout / 12

class HostHeartbeatTest : public HostAgentTest {
 protected:
  // The coordinator's read of h1's heartbeat now: whether it declares h1 dead.
  bool Declared() {
    const std::map<std::string, std::string> beats = {
        {"h1", store_.Get(store_keys::kAgentHeartbeats.Key("h1"), kCall).value_or("")}};
    return !liveness_.Observe(beats, clock_.Now()).empty();
  }

  HostLiveness liveness_{kHostTimeout};
};

TEST_F(HostHeartbeatTest, AHostWhoseTurnsAreSlowButWhoseProcessIsAliveIsNotDeclaredDead) {
  ASSERT_EQ(h1_.agent->Heartbeat(), std::nullopt);  // a turn
  ASSERT_FALSE(Declared());
  // The next turn takes four host timeouts; the heartbeat thread beats on meanwhile.
  for (absl::Duration t; t < 4 * kHostTimeout; t += kBeatInterval) {
    clock_.Advance(kBeatInterval);
    EXPECT_TRUE(h1_.agent->BeatOnce().ok());
    EXPECT_FALSE(Declared()) << "after " << t + kBeatInterval;
  }
  EXPECT_EQ(h1_.agent->Heartbeat(), std::nullopt);  // the turn comes back: nothing lost
}

TEST_F(HostHeartbeatTest, AHostKilledOrStoppedWholeIsDeclaredDeadAtTheHostTimeout) {
  ASSERT_EQ(h1_.agent->Heartbeat(), std::nullopt);
  ASSERT_TRUE(h1_.agent->BeatOnce().ok());
  ASSERT_FALSE(Declared());
  // SIGKILL or SIGSTOP of the host's agent: neither its loop nor its heartbeat thread runs.
  absl::Duration declared_after = absl::InfiniteDuration();
  for (absl::Duration t = kBeatInterval; t <= 2 * kHostTimeout; t += kBeatInterval) {
    clock_.Advance(kBeatInterval);
    if (Declared()) {
      declared_after = t;
      break;
    }
  }
  EXPECT_EQ(declared_after, kHostTimeout);
}

TEST_F(HostHeartbeatTest, AnAgentWedgedPastItsStallBoundBeatsNoMoreAndIsDeclaredDead) {
  const absl::Duration bound = h1_.agent->options().loop_stall_bound;
  ASSERT_EQ(h1_.agent->Heartbeat(), std::nullopt);  // the loop's last turn
  ASSERT_FALSE(Declared());
  absl::Duration declared_after = absl::InfiniteDuration();
  for (absl::Duration t = kBeatInterval; t <= bound + 2 * kHostTimeout; t += kBeatInterval) {
    clock_.Advance(kBeatInterval);
    const absl::Status beat = h1_.agent->BeatOnce();
    EXPECT_EQ(beat.ok(), t <= bound) << "after " << t << ": " << beat;
    if (!beat.ok()) {
      EXPECT_THAT(beat.message(), HasSubstr("host h1's agent has not turned for"));
    }
    if (Declared()) {
      declared_after = t;
      break;
    }
  }
  EXPECT_EQ(declared_after, bound + kHostTimeout);  // a host timeout after its last beat
}

// Counts the heartbeats that reach the store and notifies once `wanted` of them did: what a test
// of the real heartbeat thread waits for.
class BeatCountingStore final : public ForwardingStore {
 public:
  BeatCountingStore(Store* base, int wanted) : ForwardingStore(base), wanted_(wanted) {}

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override {
    absl::Status set = ForwardingStore::Set(key, value, timeout);
    if (key.starts_with(store_keys::kAgentHeartbeats.prefix())) {
      MutexLock lock(&mu_);
      if (++beats_ == wanted_) reached_.Notify();
    }
    return set;
  }
  int beats() const {
    MutexLock lock(&mu_);
    return beats_;
  }
  Notification& reached() { return reached_; }

 private:
  const int wanted_;
  mutable Mutex mu_;
  int beats_ ABSL_GUARDED_BY(mu_) = 0;
  Notification reached_;
};

// The heartbeat thread itself: it beats with no turn of the loop at all, beside the loop's turns
// (which leave the beats to it), and stops cleanly (joined: the count the agent keeps is the
// store's). Its interval is a millisecond of real time; what the test waits for is the beats,
// bounded.
TEST_F(HostHeartbeatTest, TheHeartbeatThreadBeatsWithoutAnyTurnAndStopsWhenAsked) {
  BeatCountingStore counting(&store_, /*wanted=*/5);
  Host h2("h2", 300, &counting, &clock_);
  h2.agent->StartBeating(absl::Milliseconds(1));
  for (int i = 0; i < 100 && !counting.reached().HasBeenNotified(); ++i) {
    EXPECT_EQ(h2.agent->Heartbeat(), std::nullopt);
  }
  ASSERT_TRUE(counting.reached().WaitForNotificationWithTimeout(absl::Seconds(60)));
  h2.agent->StopBeating();
  const int beats = counting.beats();
  EXPECT_EQ(h2.agent->beats(), beats);
  EXPECT_EQ(store_.Get(store_keys::kAgentHeartbeats.Key("h2"), kCall).value_or(""),
            absl::StrCat(beats));
  EXPECT_EQ(h2.agent->Heartbeat(), std::nullopt);  // no thread: the turn beats again
  EXPECT_EQ(counting.beats(), beats + 1);
}

// Generation 4 of a job of h0 (ranks 0, 1) and h1 (ranks 2, 3): h1's rank 3 lost its rank, given
// to h1's standby 0.
Membership GenerationFour(const Host& h0, const Host& h1, const std::string& rank3) {
  Membership m;
  m.generation = 4;
  m.world_size = 4;
  m.members = {RankMember(h0.id, h0.agent_pid, 0), RankMember(h0.id, h0.agent_pid, 1),
               RankMember(h1.id, h1.agent_pid, 2), rank3};
  return m;
}

TEST_F(HostAgentTest, AStandbyNamedForARankTakesItAndARankThatLostItsIsKilled) {
  HostWorker& rank2 = h1_.Start(2);
  HostWorker& rank3 = h1_.Start(3);
  HostWorker& standby = h1_.Start(-1, 0);

  h1_.agent->FollowMembership(GenerationFour(h0_, h1_, standby.member_id));
  EXPECT_EQ(standby.rank, 3);
  EXPECT_EQ(standby.rank_generation, 4);
  EXPECT_EQ(h1_.supervisor.pid_files().at(h1_.PidFile(3)), standby.pid);
  EXPECT_THAT(h1_.taken, ElementsAre(standby.member_id));
  EXPECT_THAT(h1_.SignalsTo(rank3), ElementsAre(SIGKILL));
  EXPECT_EQ(rank3.Cause(), "the launcher killed it: it no longer holds its rank in generation 4");
  EXPECT_THAT(h1_.SignalsTo(rank2), IsEmpty());
  EXPECT_THAT(h1_.SignalsTo(standby), IsEmpty());
  EXPECT_THAT(
      h1_.said,
      ElementsAre(
          absl::StrFormat("rank 3 (pid %d) no longer holds its rank in generation 4: killing it",
                          rank3.pid),
          absl::StrFormat("standby 0 (pid %d) takes rank 3 in generation 4", standby.pid)));

  // The same generation followed again changes nothing: no second kill, no second take.
  h1_.agent->FollowMembership(GenerationFour(h0_, h1_, standby.member_id));
  EXPECT_EQ(h1_.supervisor.signals().size(), 1u);
  EXPECT_EQ(h1_.taken.size(), 1u);
}

// A standby learns its assignment from the store at once, its agent only at its next turn: a
// standby that took a rank and died before its agent followed died as that rank, and its death is
// reported with the rank (the coordinator replaces it); a standby never assigned died parked.
TEST_F(HostAgentTest, AStandbyThatDiedAfterItsAssignmentDiesAsTheRankItTook) {
  HostWorker& assigned = h1_.Start(-1, 0);
  HostWorker& parked = h1_.Start(-1, 1);
  ASSERT_TRUE(store_
                  .Set(store_keys::RdzvAssign(assigned.member_id),
                       store_keys::EncodeAssignment({2, 3}), kCall)
                  .ok());
  h1_.supervisor.Exit(assigned.worker, WorkerExit::Exited(1));
  h1_.supervisor.Exit(parked.worker, WorkerExit::Exited(1));
  h1_.Drain();

  EXPECT_TRUE(h1_.agent->TakeAssignedRank(assigned, &store_));
  EXPECT_EQ(assigned.rank, 3);
  EXPECT_EQ(assigned.rank_generation, 2);
  EXPECT_FALSE(h1_.agent->TakeAssignedRank(parked, &store_));
  EXPECT_EQ(parked.rank, -1);
  h1_.agent->ReportDeath(assigned, "exited with status 1");
  absl::StatusOr<std::string> report =
      store_.Get(store_keys::kAgentDeaths.Key(assigned.member_id), kCall);
  ASSERT_TRUE(report.ok()) << report.status();
  absl::StatusOr<store_keys::DeathReport> death =
      store_keys::DecodeDeathReport(store_keys::kAgentDeaths.Key(assigned.member_id), *report);
  ASSERT_TRUE(death.ok()) << death.status();
  EXPECT_EQ(death->rank, 3);
}

TEST_F(HostAgentTest, AKillRequestForARankThatLostItsRankIsCarriedOutFirstWithItsReason) {
  HostWorker& rank3 = h1_.Start(3);
  HostWorker& standby = h1_.Start(-1, 0);
  h1_.latest_term = 2;
  RequestKill("h1", rank3.member_id, 2, EventKind::kRankUnresponsive,
              "rank 3 stopped for 3s while generation 4 formed");

  h1_.agent->FollowMembership(GenerationFour(h0_, h1_, standby.member_id));
  EXPECT_THAT(h1_.SignalsTo(rank3), ElementsAre(SIGKILL));  // once
  EXPECT_EQ(rank3.Cause(),
            "the launcher killed it for the coordinator: rank 3 stopped for 3s "
            "while generation 4 formed");
  ASSERT_EQ(h1_.recorded.size(), 1u);
  EXPECT_EQ(h1_.recorded[0].kind, EventKind::kRankUnresponsive);
}

TEST_F(HostAgentTest, ARankStoppedForTheBoundIsKilledAndNotOneNanosecondBefore) {
  constexpr absl::Duration kBound = absl::Seconds(10);  // --heartbeat-timeout
  HostWorker& rank2 = h1_.Start(2);
  HostWorker& rank3 = h1_.Start(3);
  HostWorker& standby = h1_.Start(-1, 0);
  h1_.supervisor.Stop(rank2.worker);
  h1_.supervisor.Stop(standby.worker);  // a standby holds no rank the round waits for
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");  // first seen stopped
  clock_.Advance(kBound - absl::Nanoseconds(1));
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  EXPECT_THAT(h1_.supervisor.signals(), IsEmpty());

  clock_.Advance(absl::Nanoseconds(1));
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  EXPECT_THAT(h1_.SignalsTo(rank2), ElementsAre(SIGKILL));
  EXPECT_THAT(h1_.SignalsTo(rank3), IsEmpty());
  EXPECT_THAT(h1_.SignalsTo(standby), IsEmpty());
  EXPECT_EQ(rank2.Cause(), "the launcher killed it: stopped for 10s before restart round 1 formed");
  ASSERT_EQ(h1_.recorded.size(), 1u);
  EXPECT_EQ(h1_.recorded[0].kind, EventKind::kRankUnresponsive);
  // Killed once.
  clock_.Advance(kBound);
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  EXPECT_EQ(h1_.supervisor.signals().size(), 1u);
}

TEST_F(HostAgentTest, ARankThatRunsAgainStartsItsStoppedTimeAfresh) {
  constexpr absl::Duration kBound = absl::Seconds(10);
  HostWorker& rank2 = h1_.Start(2);
  h1_.supervisor.Stop(rank2.worker);
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  clock_.Advance(absl::Seconds(6));
  h1_.supervisor.Continue(rank2.worker);
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  h1_.supervisor.Stop(rank2.worker);
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  clock_.Advance(absl::Seconds(6));  // 12 s since first stopped, 6 s since stopped again
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  EXPECT_THAT(h1_.supervisor.signals(), IsEmpty());
  clock_.Advance(absl::Seconds(4));
  h1_.agent->KillRanksStoppedFor(kBound, "before restart round 1 formed");
  EXPECT_THAT(h1_.SignalsTo(rank2), ElementsAre(SIGKILL));
}

// The hosts h0, h1 (this agent's, which serves the store) and h2 joined.
void JoinThree(Store* store) {
  for (const auto& [host, seq] : {std::pair<std::string, int64_t>{"h0", 1}, {"h1", 2}, {"h2", 3}}) {
    ASSERT_TRUE(store
                    ->Set(store_keys::kAgentJoins.Key(host),
                          store_keys::EncodeJoinRecord({host, seq, false, "10.0.0.1", 29500}),
                          kCall)
                    .ok());
  }
}

TEST_F(HostAgentTest, TheStoresHostWaitsUntilEveryOtherHostLeftAFencedOneCountedOnce) {
  JoinThree(&store_);
  h1_.agent->Leave(0);
  EXPECT_EQ(store_.Get(store_keys::kAgentsLeft.Key("h1"), kCall).value_or(""), "0");
  // h2 was fenced out, came back and left; h0 left.
  ASSERT_TRUE(store_.Set(store_keys::kAgentsDead.Key("h2"), "no heartbeat for 3s", kCall).ok());
  Host h2("h2", 300, &store_, &clock_);
  h2.agent->Leave(kFailed);
  h0_.agent->Leave(0);

  const absl::Time start = clock_.Now();
  EXPECT_TRUE(h1_.agent->WaitForOthersToLeave(absl::Seconds(11)));
  EXPECT_EQ(clock_.Now(), start);  // no wait at all
  EXPECT_THAT(h1_.said, IsEmpty());
}

TEST_F(HostAgentTest, TheStoresHostStopsWaitingAtTheBoundNamingWhoIsStillInTheJob) {
  JoinThree(&store_);
  h1_.agent->Leave(0);
  h0_.agent->Leave(0);
  const absl::Time start = clock_.Now();
  EXPECT_FALSE(h1_.agent->WaitForOthersToLeave(absl::Seconds(11)));
  EXPECT_GE(clock_.Now(), start + absl::Seconds(11));
  EXPECT_LT(clock_.Now(), start + absl::Seconds(11) + absl::Milliseconds(50));
  EXPECT_THAT(h1_.said, ElementsAre("stopping the store before every host left (still in the job: "
                                    "h2; they may report the store lost)"));
}

TEST_F(HostAgentTest, AStoreThatNeverAnswersEndsTheWaitAtTheBoundWithTheHostsUnknown) {
  JoinThree(&store_);
  h1_.link.cut_off = true;
  EXPECT_FALSE(h1_.agent->WaitForOthersToLeave(absl::Seconds(1)));
  EXPECT_THAT(h1_.said, ElementsAre("stopping the store before every host left (still in the job: "
                                    "unknown; they may report the store lost)"));
}

}  // namespace
}  // namespace trainguard
