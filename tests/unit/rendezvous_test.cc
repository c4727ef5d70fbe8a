#include "sdk/rendezvous/rendezvous.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "tests/support/counting_store.h"
#include "tests/support/forwarding_store.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(20);

// A store client that records every key read through it (Get, MultiGet, Wait), so that a test
// can say which keys a rank never reads.
class ReadRecordingStore final : public testing::ForwardingStore {
 public:
  explicit ReadRecordingStore(std::unique_ptr<Store> base) : ForwardingStore(std::move(base)) {}

  // Whether a key starting with `prefix` and ending with `suffix` was read.
  bool Read(absl::string_view prefix, absl::string_view suffix) {
    MutexLock lock(&mu_);
    for (const std::string& key : read_) {
      if (absl::StartsWith(key, prefix) && absl::EndsWith(key, suffix)) return true;
    }
    return false;
  }
  // The number of keys read so far.
  size_t keys_read() {
    MutexLock lock(&mu_);
    return read_.size();
  }

  // The next `n` Waits fail with Unavailable, as when the store does not answer in time.
  void FailNextWaits(int n) {
    MutexLock lock(&mu_);
    failing_waits_ = n;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    Record(keys);
    {
      MutexLock lock(&mu_);
      if (failing_waits_ > 0) {
        --failing_waits_;
        return absl::UnavailableError("store server unreachable (injected)");
      }
    }
    return base()->Wait(keys, timeout);
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    Record(keys);
    return base()->WaitAny(keys, timeout);
  }
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override {
    Record(awaited);
    Record(read);
    return base()->WaitAnyAndRead(awaited, read, timeout);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    Record({std::string(key)});
    return base()->Get(key, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    Record(keys);
    return base()->MultiGet(keys, timeout);
  }

 private:
  void Record(const std::vector<std::string>& keys) {
    MutexLock lock(&mu_);
    read_.insert(read_.end(), keys.begin(), keys.end());
  }

  Mutex mu_;
  std::vector<std::string> read_ ABSL_GUARDED_BY(mu_);
  int failing_waits_ ABSL_GUARDED_BY(mu_) = 0;
};

// One process of the job: its own store connection and rendezvous member.
struct Process {
  Process(InMemoryStore& shared, std::string id)
      : store(std::make_unique<ReadRecordingStore>(shared.NewClient())),
        member(store.get(), std::move(id), kHeartbeat) {}
  std::unique_ptr<ReadRecordingStore> store;
  RendezvousMember member;
};

class Rendezvous : public ::testing::Test {
 protected:
  // Forms generation 0 of `world` ranks, one thread per rank.
  void FormGenerationZero(int world) {
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(std::make_unique<Process>(shared_, absl::StrCat("host:rank", r)));
    }
    std::vector<std::thread> joins;
    std::vector<absl::StatusOr<Membership>> joined(world);
    for (int r = 0; r < world; ++r) {
      joins.emplace_back([&, r] { joined[r] = ranks_[r]->member.JoinInitial(r, world, kTimeout); });
    }
    absl::StatusOr<Membership> formed = coordinator_.FormInitialGeneration(world, kTimeout);
    for (std::thread& t : joins) t.join();
    ASSERT_TRUE(formed.ok()) << formed.status();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(joined[r].ok()) << joined[r].status();
      EXPECT_EQ(joined[r]->rank, r);
      EXPECT_EQ(joined[r]->generation, 0);
    }
  }

  // Forms generation 0 with `member` as its only rank.
  void FormGenerationZeroOf(RendezvousMember& member) {
    absl::StatusOr<Membership> joined = absl::UnknownError("not joined");
    std::thread join([&] { joined = member.JoinInitial(0, 1, kTimeout); });
    ASSERT_TRUE(coordinator_.FormInitialGeneration(1, kTimeout).ok());
    join.join();
    ASSERT_TRUE(joined.ok()) << joined.status();
  }

  // `member`, woken by generation 1 (a renewal of the generation 0 it held alone), takes its place
  // without a request through `store`, its client.
  static void ExpectTheFirstRenewalTakenWithoutARequest(RendezvousMember& member,
                                                        testing::CountingStore& store) {
    store.Reset();
    absl::StatusOr<Membership> place = member.AwaitGeneration(0, kTimeout);
    ASSERT_TRUE(place.ok()) << place.status();
    EXPECT_EQ(place->generation, 1);
    EXPECT_EQ(place->rank, 0);
    EXPECT_THAT(store.counts(), IsEmpty());
  }

  // Bounded polling until `n` standbys are parked (the launcher learns of them the same way).
  void AwaitParkedStandbys(size_t n) {
    for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end;) {
      if (coordinator_.ParkedStandbys(kTimeout)->size() >= n) return;
      absl::SleepFor(absl::Milliseconds(1));
    }
    FAIL() << "fewer than " << n << " standbys parked in time";
  }

  // `standby` parks and the coordinator gives it `rank` (ReplaceRank); returns once it holds its
  // assignment.
  void ReplaceByParkedStandby(Process& standby, int rank) {
    std::thread parked([&] { ASSERT_TRUE(standby.member.ParkAsStandby(kTimeout).ok()); });
    AwaitParkedStandbys(1);
    const absl::StatusOr<Membership> next = coordinator_.ReplaceRank(rank, kTimeout);
    parked.join();
    ASSERT_TRUE(next.ok()) << next.status();
  }

  // Rank `rank`'s place in generation 0 of `world` ranks, as JoinInitial returns it.
  static Membership PlaceInGenerationZero(int world, int rank) {
    Membership m;
    m.generation = 0;
    m.world_size = world;
    m.rank = rank;
    return m;
  }

  // Every rank r of generation 0 (one per entry of `next_steps`) agrees on the resume step with
  // next_steps[r], each on a thread of its own, as the ranks' processes do; their plans in rank
  // order.
  std::vector<absl::StatusOr<RecoveryPlan>> AgreeInGenerationZero(
      const std::vector<int64_t>& next_steps) {
    const int world = static_cast<int>(next_steps.size());
    std::vector<absl::StatusOr<RecoveryPlan>> plans(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        plans[r] = ranks_[r]->member.AgreeOnResume(PlaceInGenerationZero(world, r), next_steps[r],
                                                   kTimeout);
      });
    }
    for (std::thread& t : ranks) t.join();
    return plans;
  }

  // Bounded polling until the store holds `value` at `key` (a count the ranks advance).
  void AwaitValue(const std::string& key, std::string_view value) {
    for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end;) {
      absl::StatusOr<std::string> held = coordinator_store_->Get(key, kTimeout);
      if (held.ok() && *held == value) return;
      absl::SleepFor(absl::Milliseconds(1));
    }
    FAIL() << "store key " << key << " did not reach " << value << " in time";
  }

  InMemoryStore shared_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get()};
  std::vector<std::unique_ptr<Process>> ranks_;
};

// The store takes about 4,096 rank heartbeats a second at any size: a rank beats every second up
// to 4,096 ranks, then less often as the job grows, never less than every 5 s.
TEST(RankHeartbeatIntervalTest, OneSecondUpTo4096RanksThenGrowingWithTheJobUpToFiveSeconds) {
  EXPECT_EQ(RankHeartbeatInterval(1), absl::Seconds(1));
  EXPECT_EQ(RankHeartbeatInterval(4096), absl::Seconds(1));
  EXPECT_EQ(RankHeartbeatInterval(8192), absl::Seconds(2));
  EXPECT_EQ(RankHeartbeatInterval(16384), absl::Seconds(4));
  EXPECT_EQ(RankHeartbeatInterval(20480), absl::Seconds(5));
  EXPECT_EQ(RankHeartbeatInterval(1 << 20), absl::Seconds(5));
}

TEST_F(Rendezvous, TheInitialRanksFormGenerationZeroInRankOrder) {
  FormGenerationZero(4);
  EXPECT_EQ(coordinator_.generation(), 0);
  for (const auto& p : ranks_) EXPECT_EQ(p->member.generation(), 0);
}

TEST_F(Rendezvous, AParkedStandbyTakesTheDeadRanksIdInTheNextGeneration) {
  FormGenerationZero(4);
  Process standby(shared_, "host:standby0");
  absl::StatusOr<Membership> assigned;
  std::thread parked([&] { assigned = standby.member.ParkAsStandby(kTimeout); });
  AwaitParkedStandbys(1);
  absl::StatusOr<Membership> next = coordinator_.ReplaceRank(2, kTimeout);
  parked.join();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->generation, 1);
  EXPECT_EQ(assigned->rank, 2);
  EXPECT_THAT(next->members,
              ElementsAre("host:rank0", "host:rank1", "host:standby0", "host:rank3"));

  // Survivors meet the standby in generation 1 with their old ranks, and pass a barrier together.
  std::vector<std::thread> survivors;
  std::vector<absl::Status> barrier(4);
  for (int r : {0, 1, 3}) {
    survivors.emplace_back([&, r] {
      absl::StatusOr<Membership> m = ranks_[r]->member.AwaitGeneration(0, kTimeout);
      if (!m.ok()) {
        barrier[r] = m.status();
        return;
      }
      EXPECT_EQ(m->rank, r);
      barrier[r] = ranks_[r]->member.Barrier(*m, "rebuilt", kTimeout);
    });
  }
  barrier[2] = standby.member.Barrier(*assigned, "rebuilt", kTimeout);
  for (std::thread& t : survivors) t.join();
  for (const absl::Status& s : barrier) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(Rendezvous, TheReplacedMemberIsFencedOutOfTheStore) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  ReplaceByParkedStandby(standby, 1);

  // Rank 1 was declared dead but is still running (a zombie): its writes are rejected...
  Process& zombie = *ranks_[1];
  absl::Status write = zombie.store->Set("ckpt/commit/7", "rank1", kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(write)) << write;
  EXPECT_THAT(std::string(write.message()), HasSubstr("stale generation 0"));
  // ...it learns that it was replaced when it tries to rejoin...
  absl::StatusOr<Membership> rejoin = zombie.member.AwaitGeneration(0, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(rejoin.status())) << rejoin.status();
  EXPECT_THAT(std::string(rejoin.status().message()), HasSubstr("was replaced"));
  // ...and its heartbeat tells it a newer generation exists, as it tells a survivor that has not
  // rejoined yet; the survivor's flag clears when it adopts the new generation.
  for (absl::Time end = absl::Now() + kTimeout;
       absl::Now() < end && !(zombie.member.superseded() && ranks_[0]->member.superseded());) {
    absl::SleepFor(kHeartbeat);
  }
  EXPECT_TRUE(zombie.member.superseded());
  EXPECT_TRUE(ranks_[0]->member.superseded());
  ASSERT_TRUE(ranks_[0]->member.AwaitGeneration(0, kTimeout).ok());
  EXPECT_FALSE(ranks_[0]->member.superseded());
}

// A member that waits for the next generation's table (the Runtime's generation watcher does) is
// marked superseded when it is published, without a heartbeat's refusal: this one beats once an
// hour.
TEST_F(Rendezvous, AMemberWaitingForTheNextGenerationIsMarkedSupersededWhenItIsPublished) {
  std::unique_ptr<Store> store = shared_.NewClient();
  RendezvousMember member(store.get(), "host:rank0", absl::Hours(1));
  absl::StatusOr<bool> before_joining = member.AwaitNewerGeneration(absl::Milliseconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(before_joining.status())) << before_joining.status();
  ASSERT_NO_FATAL_FAILURE(FormGenerationZeroOf(member));
  absl::StatusOr<bool> nothing_newer = member.AwaitNewerGeneration(absl::Milliseconds(10));
  ASSERT_TRUE(nothing_newer.ok()) << nothing_newer.status();
  EXPECT_FALSE(*nothing_newer);
  EXPECT_FALSE(member.superseded());

  absl::StatusOr<bool> newer = absl::UnknownError("not waited");
  std::thread wait([&] { newer = member.AwaitNewerGeneration(kTimeout); });
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  wait.join();
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_TRUE(*newer);
  EXPECT_EQ(member.superseded_generation(), 0);
  absl::StatusOr<bool> again = member.AwaitNewerGeneration(absl::Milliseconds(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);  // still superseded: it has not adopted generation 1

  ASSERT_TRUE(member.AwaitGeneration(0, kTimeout).ok());
  EXPECT_FALSE(member.superseded());
  absl::StatusOr<bool> adopted = member.AwaitNewerGeneration(absl::Milliseconds(10));
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_FALSE(*adopted);  // generation 1 is its own now
  EXPECT_FALSE(member.superseded());
}

// The same wait, parked together with other keys (the watcher's hang key and wake key): it says
// which came first, and the next generation's table wins when both exist.
TEST_F(Rendezvous, AMemberWaitingForTheNextGenerationOrOtherKeysLearnsWhichCameFirst) {
  std::unique_ptr<Store> store = shared_.NewClient();
  RendezvousMember member(store.get(), "host:rank0", absl::Hours(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      member.AwaitNewerGenerationOr({"k/a"}, absl::Milliseconds(1)).status()));
  ASSERT_NO_FATAL_FAILURE(FormGenerationZeroOf(member));

  absl::StatusOr<RendezvousMember::NewerGenerationOrKey> nothing =
      member.AwaitNewerGenerationOr({"k/a", "k/b"}, absl::Milliseconds(10));
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_FALSE(nothing->superseded);
  EXPECT_EQ(nothing->key, std::nullopt);

  absl::StatusOr<RendezvousMember::NewerGenerationOrKey> key_b = absl::UnknownError("not waited");
  std::thread wait([&] { key_b = member.AwaitNewerGenerationOr({"k/a", "k/b"}, kTimeout); });
  ASSERT_TRUE(coordinator_store_->Set("k/b", "1", kTimeout).ok());
  wait.join();
  ASSERT_TRUE(key_b.ok()) << key_b.status();
  EXPECT_FALSE(key_b->superseded);
  EXPECT_EQ(key_b->key, 1u);
  EXPECT_FALSE(member.superseded());

  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  absl::StatusOr<RendezvousMember::NewerGenerationOrKey> both =
      member.AwaitNewerGenerationOr({"k/a", "k/b"}, kTimeout);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(both->superseded) << "k/b exists too, but the table wins";
  EXPECT_EQ(member.superseded_generation(), 0);
}

TEST_F(Rendezvous, TwoFailuresInARowLandASlowSurvivorInTheNewestGeneration) {
  FormGenerationZero(4);
  Process standby_a(shared_, "host:standbyA");
  Process standby_b(shared_, "host:standbyB");
  absl::StatusOr<Membership> a, b;
  std::thread park_a([&] { a = standby_a.member.ParkAsStandby(kTimeout); });
  std::thread park_b([&] { b = standby_b.member.ParkAsStandby(kTimeout); });
  AwaitParkedStandbys(2);
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  absl::StatusOr<Membership> second = coordinator_.ReplaceRank(3, kTimeout);
  park_a.join();
  park_b.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->generation, 2);
  EXPECT_EQ(a->rank, 1);
  EXPECT_EQ(b->rank, 3);
  absl::StatusOr<Membership> slow = ranks_[0]->member.AwaitGeneration(0, kTimeout);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->generation, 2);
  EXPECT_EQ(slow->rank, 0);
  absl::StatusOr<Membership> table = ranks_[0]->member.ReadRankTable(2, kTimeout);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rank, 0);
  EXPECT_THAT(table->members,
              ElementsAre("host:rank0", "host:standbyA", "host:rank2", "host:standbyB"));
}

// The ranks learn their place in each generation from a few bytes: an initial rank from its own
// registration, a standby from its assignment, a survivor from the generation's changes. None
// reads a rank table (O(world size) bytes each, O(world size^2) for the job).
TEST_F(Rendezvous, RanksLearnTheirPlaceWithoutReadingTheRankTable) {
  FormGenerationZero(4);
  Process standby(shared_, "host:standby0");
  absl::StatusOr<Membership> assigned;
  std::thread parked([&] { assigned = standby.member.ParkAsStandby(kTimeout); });
  AwaitParkedStandbys(1);
  ASSERT_TRUE(coordinator_.ReplaceRank(2, kTimeout).ok());
  parked.join();
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->rank, 2);
  EXPECT_EQ(assigned->world_size, 4);
  EXPECT_THAT(assigned->members, IsEmpty());
  for (int r : {0, 1, 3}) {
    absl::StatusOr<Membership> m = ranks_[r]->member.AwaitGeneration(0, kTimeout);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->generation, 1);
    EXPECT_EQ(m->rank, r);
    EXPECT_EQ(m->world_size, 4);
  }
  for (Process* p : {ranks_[0].get(), ranks_[1].get(), ranks_[3].get(), &standby}) {
    EXPECT_FALSE(p->store->Read("rdzv/gen/", "/table")) << p->member.member_id();
    EXPECT_FALSE(p->store->Read("rdzv/join/", "")) << p->member.member_id();
  }
}

TEST_F(Rendezvous, AReplacedMemberLearnsItFromTheChangesNamingWhoTookItsRank) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  ReplaceByParkedStandby(standby, 1);
  // A generation that changes nothing for it comes after, and the zombie catches up with both.
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  absl::StatusOr<Membership> rejoin = ranks_[1]->member.AwaitGeneration(0, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(rejoin.status())) << rejoin.status();
  EXPECT_THAT(std::string(rejoin.status().message()),
              HasSubstr("was replaced (rank 1 is held by host:standby0 since generation 1)"));
  EXPECT_FALSE(ranks_[1]->store->Read("rdzv/gen/", "/table"));
  // A survivor two generations behind keeps its rank.
  absl::StatusOr<Membership> survivor = ranks_[2]->member.AwaitGeneration(0, kTimeout);
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  EXPECT_EQ(survivor->generation, 2);
  EXPECT_EQ(survivor->rank, 2);
}

TEST_F(Rendezvous, AGenerationsChangesNameOnlyTheRanksItGaveToOtherMembers) {
  FormGenerationZero(4);
  auto changes = [&](int64_t g) {
    absl::StatusOr<std::string> value =
        coordinator_store_->Get(store_keys::RdzvChanges(g), kTimeout);
    EXPECT_TRUE(value.ok()) << value.status();
    absl::StatusOr<store_keys::GenerationChanges> decoded =
        store_keys::DecodeGenerationChanges(value.value_or(""));
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.value_or(store_keys::GenerationChanges{});
  };
  EXPECT_EQ(changes(0).world_size, 4);
  EXPECT_THAT(changes(0).taken, IsEmpty());  // generation 0 is the registrations
  Process a(shared_, "host:standbyA");
  Process b(shared_, "host:standbyB");
  std::thread park_a([&] { ASSERT_TRUE(a.member.ParkAsStandby(kTimeout).ok()); });
  std::thread park_b([&] { ASSERT_TRUE(b.member.ParkAsStandby(kTimeout).ok()); });
  AwaitParkedStandbys(2);
  ASSERT_TRUE(coordinator_
                  .ReplaceRanks({3, 1}, {"host:standbyA", "host:standbyB"},
                                /*any_standby=*/false, kTimeout)
                  .ok());
  park_a.join();
  park_b.join();
  using Taken = std::pair<int, std::string>;
  EXPECT_THAT(changes(1).taken, ElementsAre(Taken{1, "host:standbyB"}, Taken{3, "host:standbyA"}));
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  EXPECT_EQ(changes(2).generation, 2);
  EXPECT_THAT(changes(2).taken, IsEmpty());
}

TEST_F(Rendezvous, RanksAgreeToResumeFromTheFurthestSurvivor) {
  FormGenerationZero(4);
  // Rank 2 is a replacement without state; rank 3 finished one more step than ranks 0 and 1.
  const std::vector<absl::StatusOr<RecoveryPlan>> plans = AgreeInGenerationZero({17, 17, -1, 18});
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(plans[r].ok()) << plans[r].status();
    EXPECT_EQ(plans[r]->resume_step, 18);
    EXPECT_EQ(plans[r]->state_source_rank, 3);
    EXPECT_THAT(plans[r]->new_ranks, ElementsAre(2));
  }
}

// One rank computes the plan from every rank's progress and publishes it; the others read it (a
// few bytes) instead of every rank reading every rank's progress.
TEST_F(Rendezvous, TheRankThatCompletesTheCountPublishesThePlanTheOthersRead) {
  FormGenerationZero(4);
  const std::vector<absl::StatusOr<RecoveryPlan>> plans = AgreeInGenerationZero({-1, 30, 31, -1});
  absl::StatusOr<std::string> published =
      coordinator_store_->Get(store_keys::RdzvPlan(0), kTimeout);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(*published, "0 31 2 0,3");
  EXPECT_EQ(*coordinator_store_->Get(store_keys::RdzvAgreed(0), kTimeout), "4");
  int read_every_progress = 0;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(plans[r].ok()) << plans[r].status();
    EXPECT_EQ(plans[r]->resume_step, 31);
    EXPECT_EQ(plans[r]->state_source_rank, 2);
    EXPECT_THAT(plans[r]->new_ranks, ElementsAre(0, 3));
    if (ranks_[r]->store->Read("rdzv/gen/0/progress/", "")) ++read_every_progress;
  }
  EXPECT_EQ(read_every_progress, 1);
  // A newer generation leaves an agreed plan as it is.
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  EXPECT_EQ(*coordinator_store_->Get(store_keys::RdzvPlan(0), kTimeout), "0 31 2 0,3");
}

// The rank whose progress completed the count dies before it publishes the plan: the others do
// not wait out their timeout, they leave for the generation that replaces it.
TEST_F(Rendezvous, RanksWaitingForAPlanThatNeverComesLeaveForTheNewerGeneration) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  std::thread parked([&] { ASSERT_TRUE(standby.member.ParkAsStandby(kTimeout).ok()); });
  AwaitParkedStandbys(1);
  std::vector<absl::StatusOr<RecoveryPlan>> plans(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const Membership m = PlaceInGenerationZero(3, r);
      plans[r] = ranks_[r]->member.AgreeOnResume(m, 10, kTimeout);
    });
  }
  // Rank 2 writes its progress and completes the count, as AgreeOnResume does, and dies there.
  Store& rank2 = *ranks_[2]->store;
  ASSERT_TRUE(rank2.Set(absl::StrCat(store_keys::RdzvProgressPrefix(0), 2), "10", kTimeout).ok());
  AwaitValue(store_keys::RdzvAgreed(0), "2");
  ASSERT_EQ(*rank2.Add(store_keys::RdzvAgreed(0), 1, kTimeout), 3);
  ASSERT_TRUE(coordinator_.ReplaceRank(2, kTimeout).ok());
  for (std::thread& t : ranks) t.join();
  parked.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsAborted(plans[r].status())) << plans[r].status();
    EXPECT_THAT(std::string(plans[r].status().message()), HasSubstr("generation 0 was superseded"));
  }
  // The coordinator marked the plan superseded as it published generation 1: that ended the waits.
  EXPECT_EQ(*coordinator_store_->Get(store_keys::RdzvPlan(0), kTimeout), "superseded by 1");
}

// A store that does not answer a rank's wait for the plan in time (overloaded) does not end the
// agreement: the rank waits again, within its deadline.
TEST_F(Rendezvous, ARankWhoseWaitForThePlanGoesUnansweredWaitsAgain) {
  FormGenerationZero(2);
  const Membership g0 = PlaceInGenerationZero(2, 0);
  ranks_[0]->store->FailNextWaits(1);
  absl::StatusOr<RecoveryPlan> first;
  std::thread waiting([&] { first = ranks_[0]->member.AgreeOnResume(g0, 7, kTimeout); });
  // Bounded polling until rank 0 counted itself: rank 1 then completes the count.
  for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end;) {
    absl::StatusOr<std::string> count =
        coordinator_store_->Get(store_keys::RdzvAgreed(0), kTimeout);
    if (count.ok() && *count == "1") break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  const Membership mine = PlaceInGenerationZero(2, 1);
  absl::StatusOr<RecoveryPlan> second = ranks_[1]->member.AgreeOnResume(mine, 7, kTimeout);
  waiting.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->resume_step, 7);
  EXPECT_EQ(first->state_source_rank, 0);
  EXPECT_EQ(second->state_source_rank, 0);
}

TEST_F(Rendezvous, ABarrierPassesOnlyOnceEveryRankArrived) {
  FormGenerationZero(3);
  std::vector<absl::Status> passed(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const Membership m = PlaceInGenerationZero(3, r);
      passed[r] = ranks_[r]->member.Barrier(m, "ready", kTimeout);
    });
  }
  // Bounded polling until both arrived: the barrier must still be closed.
  AwaitValue(store_keys::RdzvBarrierArrived(0, "ready"), "2");
  EXPECT_TRUE(absl::IsNotFound(
      coordinator_store_->Get(store_keys::RdzvBarrierPassed(0, "ready"), kTimeout).status()));
  const Membership last = PlaceInGenerationZero(3, 2);
  passed[2] = ranks_[2]->member.Barrier(last, "ready", kTimeout);
  for (std::thread& t : ranks) t.join();
  for (const absl::Status& s : passed) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(Rendezvous, ABarrierThatNotEveryRankReachesTimesOutSayingHowManyArrived) {
  FormGenerationZero(2);
  const Membership g0 = PlaceInGenerationZero(2, 1);
  absl::Status alone = ranks_[1]->member.Barrier(g0, "ready", absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone)) << alone;
  EXPECT_THAT(std::string(alone.message()),
              HasSubstr("rank 1 at barrier ready of generation 0 (1 of 2 ranks arrived"));
}

// A member without a heartbeat thread (a simulator's) is beaten by its owner; a beat the fence
// refuses marks it superseded, as the thread's would.
TEST_F(Rendezvous, AMemberWithoutAHeartbeatThreadBeatsWhenItsOwnerSays) {
  FormGenerationZero(2);
  InMemoryStore& shared = shared_;
  std::unique_ptr<Store> store = shared.NewClient();
  RendezvousMember quiet(store.get(), "host:quiet", absl::InfiniteDuration());
  const std::string key = store_keys::RdzvHeartbeat("host:quiet");
  EXPECT_TRUE(absl::IsNotFound(coordinator_store_->Get(key, kTimeout).status()));
  ASSERT_TRUE(quiet.Beat(kTimeout).ok());
  ASSERT_TRUE(quiet.Beat(kTimeout).ok());
  EXPECT_EQ(*coordinator_store_->Get(key, kTimeout), "2");

  // A rank's beat refused by the fence of a newer generation marks it superseded.
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  absl::Status refused = ranks_[0]->member.Beat(kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_EQ(ranks_[0]->member.superseded_generation(), 0);
}

TEST_F(Rendezvous, AnAgreementIsAbandonedWhenANewerGenerationIsPublished) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  std::thread parked([&] { ASSERT_TRUE(standby.member.ParkAsStandby(kTimeout).ok()); });
  AwaitParkedStandbys(1);
  // Rank 0 starts agreeing in generation 0; rank 2 dies instead of taking part, and is replaced.
  const Membership g0 = PlaceInGenerationZero(3, 0);
  absl::StatusOr<RecoveryPlan> plan;
  std::thread agreeing([&] { plan = ranks_[0]->member.AgreeOnResume(g0, 5, kTimeout); });
  ASSERT_TRUE(coordinator_.ReplaceRank(2, kTimeout).ok());
  agreeing.join();
  parked.join();
  EXPECT_TRUE(absl::IsAborted(plan.status())) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("generation 0 was superseded"));
}

// Every rank alive, its communicators broken (a dropped connection): the ranks ask, the
// coordinator renews the generation with the same members, and they agree to resume together.
TEST_F(Rendezvous, RanksWhoseCommunicatorsBrokeMeetAgainInARenewedGenerationOfTheSameMembers) {
  FormGenerationZero(3);
  EXPECT_TRUE(coordinator_.NewGenerationRequests(kTimeout)->empty());
  std::vector<absl::StatusOr<RecoveryPlan>> plans(3);
  std::vector<std::thread> ranks;
  const int64_t next_steps[] = {40, 41, 40};
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      const Membership mine = PlaceInGenerationZero(3, r);
      absl::Status asked = ranks_[r]->member.RequestNewGeneration(
          mine, absl::StrCat("rank ", r, " lost a peer"), kTimeout);
      if (!asked.ok()) {
        plans[r] = asked;
        return;
      }
      absl::StatusOr<Membership> m = ranks_[r]->member.AwaitGeneration(0, kTimeout);
      if (!m.ok()) {
        plans[r] = m.status();
        return;
      }
      plans[r] = ranks_[r]->member.AgreeOnResume(*m, next_steps[r], kTimeout);
    });
  }
  // Bounded polling: the coordinator sees the requests as the launcher does.
  absl::StatusOr<std::map<int, std::string>> requests;
  for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end;) {
    requests = coordinator_.NewGenerationRequests(kTimeout);
    if (requests.ok() && requests->size() == 3) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ(requests->at(1), "rank 1 lost a peer");
  absl::StatusOr<Membership> renewed = coordinator_.RenewGeneration(kTimeout);
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->generation, 1);
  EXPECT_THAT(renewed->members, ElementsAre("host:rank0", "host:rank1", "host:rank2"));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(plans[r].ok()) << "rank " << r << ": " << plans[r].status();
    EXPECT_EQ(plans[r]->generation, 1);
    EXPECT_EQ(plans[r]->resume_step, 41);
    EXPECT_EQ(plans[r]->state_source_rank, 1);
    EXPECT_TRUE(plans[r]->new_ranks.empty());
  }
  // The requests were for generation 0: generation 1 starts with none.
  EXPECT_TRUE(coordinator_.NewGenerationRequests(kTimeout)->empty());
}

// A rank that learns of the failure late asks in a generation already renewed: the newer
// generation answers it.
TEST_F(Rendezvous, AskingForANewGenerationWhenANewerOneExistsJoinsIt) {
  FormGenerationZero(2);
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  const Membership g0 = PlaceInGenerationZero(2, 1);
  EXPECT_TRUE(ranks_[1]->member.RequestNewGeneration(g0, "late", kTimeout).ok());
  absl::StatusOr<Membership> m = ranks_[1]->member.AwaitGeneration(0, kTimeout);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->generation, 1);
  EXPECT_EQ(m->rank, 1);
  EXPECT_TRUE(coordinator_.NewGenerationRequests(kTimeout)->empty());
}

TEST_F(Rendezvous, RenewingBeforeGenerationZeroIsRefused) {
  EXPECT_TRUE(absl::IsFailedPrecondition(coordinator_.RenewGeneration(kTimeout).status()));
}

TEST_F(Rendezvous, ARankWhoseHeartbeatStopsIsReportedStale) {
  FormGenerationZero(3);
  // The first look records every member's counter; nobody is stale yet.
  EXPECT_TRUE(coordinator_.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout)->empty());
  // Rank 1 stops (its process is killed: the member and its heartbeat thread are gone). Destroying
  // the member marks it "left", as a process whose Runtime closed; a killed process never does,
  // so its counter is put back, as it stood when the heartbeat stopped.
  ranks_[1].reset();
  ASSERT_TRUE(shared_.Set("rdzv/hb/host:rank1", "1", kTimeout).ok());
  // Bounded polling until exactly rank 1 is stale. A live rank's heartbeat thread starved past the
  // 300 ms by a loaded machine may be reported for a look or two; it is not once it beats again,
  // while rank 1 stays stale.
  std::vector<int> stale;
  for (absl::Time end = absl::Now() + kTimeout; absl::Now() < end && stale != std::vector{1};) {
    stale = *coordinator_.RanksWithStaleHeartbeats(absl::Milliseconds(300), kTimeout);
    absl::SleepFor(kHeartbeat);
  }
  EXPECT_THAT(stale, ElementsAre(1));
}

// Liveness on the coordinator's clock, deterministically: a ManualClock, and members whose own
// heartbeat threads are paced at an hour, so a counter moves only when the test beats for it.
struct ManualClockJob {
  static constexpr int kWorld = 3;
  void FormGenerationZero() {
    for (int r = 0; r < kWorld; ++r) {
      stores.push_back(shared.NewClient());
      members.push_back(std::make_unique<RendezvousMember>(
          stores.back().get(), absl::StrCat("host:rank", r), absl::Hours(1)));
    }
    std::vector<std::thread> joins;
    for (int r = 0; r < kWorld; ++r) {
      joins.emplace_back(
          [&, r] { ASSERT_TRUE(members[r]->JoinInitial(r, kWorld, kTimeout).ok()); });
    }
    ASSERT_TRUE(coordinator.FormInitialGeneration(kWorld, kTimeout).ok());
    for (std::thread& t : joins) t.join();
  }
  ManualClock clock;
  InMemoryStore shared{&clock};  // its keys' ages on the coordinator's clock
  std::unique_ptr<Store> coordinator_store = shared.NewClient();
  testing::CountingStore counted{coordinator_store.get()};  // the coordinator's requests
  RendezvousCoordinator coordinator{&counted, &clock};
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<std::unique_ptr<RendezvousMember>> members;
};

TEST(RendezvousLiveness,
     ARankIsStaleExactlyWhenItsCounterStoodStillForTheTimeoutOnTheCoordinatorsClock) {
  ManualClockJob job;
  ASSERT_NO_FATAL_FAILURE(job.FormGenerationZero());
  InMemoryStore& shared = job.shared;
  ManualClock& clock = job.clock;
  RendezvousCoordinator& coordinator = job.coordinator;
  auto beat = [&](int r) {
    ASSERT_TRUE(shared.Add(absl::StrCat("rdzv/hb/host:rank", r), 1, kTimeout).ok());
  };
  auto stale = [&] { return *coordinator.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout); };

  EXPECT_THAT(stale(), IsEmpty());  // the first look starts every member's clock
  clock.Advance(absl::Milliseconds(999));
  beat(0);
  beat(2);
  EXPECT_THAT(stale(), IsEmpty());  // rank 1 has stood still for 999 ms: not yet
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(stale(), ElementsAre(1));  // 1 s exactly
  beat(1);
  EXPECT_THAT(stale(), IsEmpty());  // a beat clears it
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(stale(), ElementsAre(0, 1, 2));
}

// The coordinator reads every rank's heartbeat twice a second and keeps, per generation, the keys
// it reads: after a replacement the rank is judged by its new holder's counter, not its dead one's.
TEST(RendezvousLiveness, AReplacedRankIsJudgedByItsNewHoldersHeartbeat) {
  ManualClockJob job;
  ASSERT_NO_FATAL_FAILURE(job.FormGenerationZero());
  InMemoryStore& shared = job.shared;
  ManualClock& clock = job.clock;
  RendezvousCoordinator& coordinator = job.coordinator;
  auto stale = [&] { return *coordinator.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout); };
  EXPECT_THAT(stale(), IsEmpty());  // generation 0's keys read once

  std::unique_ptr<Store> standby_store = shared.NewClient();
  RendezvousMember standby(standby_store.get(), "host:standby0", absl::Hours(1));
  std::thread parked([&] { ASSERT_TRUE(standby.ParkAsStandby(kTimeout).ok()); });
  while (coordinator.ParkedStandbys(kTimeout)->empty()) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(coordinator.ReplaceRank(1, kTimeout).ok());
  parked.join();
  for (int r : {0, 2}) {
    ASSERT_TRUE(job.members[r]->AwaitGeneration(0, kTimeout).ok());
  }

  EXPECT_THAT(stale(), IsEmpty());  // generation 1: every rank's clock starts afresh
  clock.Advance(absl::Milliseconds(999));
  for (RendezvousMember* m : {job.members[0].get(), job.members[2].get(), &standby}) {
    ASSERT_TRUE(m->Beat(kTimeout).ok()) << m->member_id();
  }
  EXPECT_THAT(stale(), IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(stale(), IsEmpty()) << "rank 1 was judged by the replaced member's silent counter";
  clock.Advance(absl::Milliseconds(998));  // the standby's counter stood still for 999 ms
  ASSERT_TRUE(job.members[0]->Beat(kTimeout).ok());
  ASSERT_TRUE(job.members[2]->Beat(kTimeout).ok());
  EXPECT_THAT(stale(), IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(stale(), ElementsAre(1));  // its new holder stood still for the timeout
}

// With the store's ages a rank's heartbeat is read only once it is a quarter of the timeout old,
// and a new generation is not met by a read of every rank: at 16,384 ranks the coordinator no
// longer reads the whole job twice a second, nor while the members take their places.
TEST(RendezvousLiveness, WithTheStoresAgesARankIsReadOnlyOnceItsBeatIsAQuarterOfTheTimeoutOld) {
  ManualClockJob job;
  ASSERT_NO_FATAL_FAILURE(job.FormGenerationZero());
  testing::CountingStore& counted = job.counted;
  counted.Reset();
  RendezvousCoordinator& coordinator = job.coordinator;
  auto stale = [&] { return *coordinator.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout); };
  auto reads = [&] {
    int64_t n = 0;
    for (const auto& [what, count] : counted.counts()) n += count;
    counted.Reset();
    return n;
  };
  EXPECT_THAT(stale(), IsEmpty());  // the first call reads every rank: does the store have ages?
  EXPECT_EQ(reads(), 1);
  EXPECT_THAT(stale(), IsEmpty());
  job.clock.Advance(absl::Milliseconds(249));
  EXPECT_THAT(stale(), IsEmpty());
  EXPECT_EQ(reads(), 0);  // nobody's beat is a quarter of the timeout old
  job.clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(stale(), IsEmpty());
  EXPECT_EQ(reads(), 1);
  ASSERT_TRUE(job.members[0]->Beat(kTimeout).ok());
  job.clock.Advance(absl::Milliseconds(750));
  EXPECT_THAT(stale(), ElementsAre(1, 2));  // 1 s since generation 0's writes; rank 0 beat
  EXPECT_EQ(reads(), 1);
  // A new generation: every rank's bound starts afresh, and nobody is read for a quarter of it.
  ASSERT_TRUE(coordinator.RenewGeneration(kTimeout).ok());
  counted.Reset();
  EXPECT_THAT(stale(), IsEmpty());
  job.clock.Advance(absl::Milliseconds(249));
  EXPECT_THAT(stale(), IsEmpty());
  EXPECT_EQ(reads(), 0);
}

// On a store that keeps no write instants (etcd: MultiGetWithAges is Unimplemented) every rank's
// value is read at every call and a rank's silence counts from the read that saw it change: the
// same verdicts, a request per call.
TEST(RendezvousLiveness, WithoutTheStoresAgesARankIsJudgedByItsValueReadAtEveryCall) {
  ManualClock clock;
  InMemoryStore shared{&clock};
  std::unique_ptr<Store> client = shared.NewClient();
  struct NoAges final : testing::ForwardingStore {
    using ForwardingStore::ForwardingStore;
    int multi_gets = 0;
    absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
        const std::vector<std::string>&, absl::Duration) override {
      return absl::UnimplementedError("this store does not say when its keys were written");
    }
    absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
        const std::vector<std::string>& keys, absl::Duration timeout) override {
      ++multi_gets;
      return ForwardingStore::MultiGet(keys, timeout);
    }
  } store(client.get());
  RendezvousCoordinator coordinator(&store, &clock);
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<std::unique_ptr<RendezvousMember>> members;
  std::vector<std::thread> joins;
  for (int r = 0; r < 2; ++r) {
    stores.push_back(shared.NewClient());
    members.push_back(std::make_unique<RendezvousMember>(
        stores.back().get(), absl::StrCat("host:rank", r), absl::Hours(1)));
  }
  for (int r = 0; r < 2; ++r) {
    joins.emplace_back([&, r] { ASSERT_TRUE(members[r]->JoinInitial(r, 2, kTimeout).ok()); });
  }
  ASSERT_TRUE(coordinator.FormInitialGeneration(2, kTimeout).ok());
  for (std::thread& t : joins) t.join();
  auto stale = [&] { return *coordinator.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout); };

  const int before = store.multi_gets;
  EXPECT_THAT(stale(), IsEmpty());  // the first look starts every member's clock
  EXPECT_THAT(stale(), IsEmpty());  // read again at once: no ages to skip it by
  EXPECT_EQ(store.multi_gets, before + 2);
  clock.Advance(absl::Milliseconds(999));
  ASSERT_TRUE(members[0]->Beat(kTimeout).ok());
  EXPECT_THAT(stale(), IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(stale(), ElementsAre(1));  // its value stood still for 1 s of the coordinator's reads
}

// A member destroyed (its Runtime closed: the process is exiting) is marked "left" and has
// max(10 x timeout, kLeftGrace) to exit before it counts as stale, not the heartbeat timeout.
TEST(RendezvousLiveness, AMemberThatLeftIsGivenTheExitGraceNotTheHeartbeatTimeout) {
  ManualClockJob job;
  ASSERT_NO_FATAL_FAILURE(job.FormGenerationZero());
  InMemoryStore& shared = job.shared;
  ManualClock& clock = job.clock;
  RendezvousCoordinator& coordinator = job.coordinator;
  std::vector<std::unique_ptr<RendezvousMember>>& members = job.members;
  auto beat_others = [&] {
    for (int r : {0, 2}) {
      ASSERT_TRUE(shared.Add(absl::StrCat("rdzv/hb/host:rank", r), 1, kTimeout).ok());
    }
  };
  auto stale = [&] { return *coordinator.RanksWithStaleHeartbeats(absl::Seconds(1), kTimeout); };

  EXPECT_THAT(stale(), IsEmpty());
  members[1].reset();  // its Runtime closed
  EXPECT_EQ(shared.Get("rdzv/hb/host:rank1", kTimeout).value_or("?"), kLeftHeartbeat);
  EXPECT_THAT(stale(), IsEmpty());  // this look sees "left": rank 1's grace starts
  clock.Advance(kLeftGrace - absl::Milliseconds(1));
  beat_others();
  EXPECT_THAT(stale(), IsEmpty()) << "a member that left was reported after the heartbeat timeout";
  clock.Advance(absl::Milliseconds(1));
  beat_others();
  EXPECT_THAT(stale(), ElementsAre(1));  // still there after the grace: hung in its exit
}

TEST_F(Rendezvous, SurvivorsFencedOutUntilTheyRejoinAreNotReportedStale) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  std::thread parked([&] { ASSERT_TRUE(standby.member.ParkAsStandby(kTimeout).ok()); });
  AwaitParkedStandbys(1);
  ASSERT_TRUE(coordinator_.RanksWithStaleHeartbeats(absl::Milliseconds(200), kTimeout).ok());
  ASSERT_TRUE(coordinator_.ReplaceRank(1, kTimeout).ok());
  parked.join();
  // Ranks 0 and 2 have not adopted generation 1 yet: their beats are rejected by the fence. The
  // clock restarted at the new generation, so a look right away finds nobody stale.
  EXPECT_TRUE(coordinator_.RanksWithStaleHeartbeats(absl::Milliseconds(200), kTimeout)->empty());
}

TEST_F(Rendezvous, AClaimedStandbyNeverParksAgainNorIsPickedTwice) {
  FormGenerationZero(3);
  Process standby(shared_, "host:standby0");
  ReplaceByParkedStandby(standby, 1);
  // Parking again (as after a timed-out wait) returns the same assignment and leaves the standby
  // unavailable to a second replacement.
  absl::StatusOr<Membership> again = standby.member.ParkAsStandby(kTimeout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank, 1);
  EXPECT_TRUE(coordinator_.ParkedStandbys(kTimeout)->empty());
  EXPECT_TRUE(absl::IsFailedPrecondition(coordinator_.ReplaceRank(2, kTimeout).status()));
}

TEST_F(Rendezvous, ReplacingWithoutAParkedStandbyFailsNamingTheRank) {
  FormGenerationZero(2);
  absl::StatusOr<Membership> next = coordinator_.ReplaceRank(1, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(next.status()));
  EXPECT_THAT(std::string(next.status().message()),
              HasSubstr("no standby is parked to replace rank 1"));
  EXPECT_EQ(coordinator_.generation(), 0);
}

TEST_F(Rendezvous, AStandbyThatDiedWhileParkedIsNeverPicked) {
  FormGenerationZero(2);
  // "host:a" parks and dies (its process is gone; only its key remains), "host:b" parks and waits.
  ASSERT_TRUE(coordinator_store_->Set("rdzv/standby/host:a", "parked", kTimeout).ok());
  Process b(shared_, "host:b");
  absl::StatusOr<Membership> assigned;
  std::thread parked([&] { assigned = b.member.ParkAsStandby(kTimeout); });
  AwaitParkedStandbys(2);
  ASSERT_TRUE(coordinator_.ForgetStandby("host:a", kTimeout).ok());
  absl::StatusOr<Membership> next = coordinator_.ReplaceRank(0, kTimeout);
  parked.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->members[0], "host:b");
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->rank, 0);
}

TEST_F(Rendezvous, ARankClaimedByAnotherMemberIsRejected) {
  ASSERT_TRUE(coordinator_store_->Set("rdzv/join/0", "host:first", kTimeout).ok());
  Process second(shared_, "host:second");
  // The refusal comes at once; the long timeout only keeps a loaded machine from turning it into a
  // DeadlineExceeded.
  absl::StatusOr<Membership> dup = second.member.JoinInitial(0, 1, kTimeout);
  EXPECT_TRUE(absl::IsAlreadyExists(dup.status())) << dup.status();
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("host:first"));
}

TEST_F(Rendezvous, JoiningWithoutACoordinatorTimesOutNamingTheRank) {
  Process p(shared_, "host:p");
  absl::StatusOr<Membership> m = p.member.JoinInitial(0, 2, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("rank 0 waiting for generation 0"));
}

// The same for a rank's watcher, parked on the table among other keys (AwaitNewerGenerationOr):
// woken by the table, it holds what AwaitGeneration reads; woken by another key, nothing is kept.
TEST_F(Rendezvous, AWatcherWokenByTheNextGenerationAmongOtherKeysTakesItsPlaceWithoutARequest) {
  std::unique_ptr<Store> client = shared_.NewClient();
  testing::CountingStore store(client.get());
  RendezvousMember member(&store, "host:rank0", absl::InfiniteDuration());
  ASSERT_NO_FATAL_FAILURE(FormGenerationZeroOf(member));
  // Another key first: it is reported, the member is not superseded.
  ASSERT_TRUE(client->Set("watch/other", "x", kTimeout).ok());
  absl::StatusOr<RendezvousMember::NewerGenerationOrKey> seen =
      member.AwaitNewerGenerationOr({"watch/shutdown", "watch/other"}, kTimeout);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_FALSE(seen->superseded);
  EXPECT_EQ(seen->key, std::optional<size_t>(1));
  std::thread wait([&] { seen = member.AwaitNewerGenerationOr({"watch/shutdown"}, kTimeout); });
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  wait.join();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(seen->superseded);
  ASSERT_NO_FATAL_FAILURE(ExpectTheFirstRenewalTakenWithoutARequest(member, store));
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// A whole host's ranks are replaced at once, by the standbys the caller prefers (a standby host's),
// in one generation, in the order given (local rank i of the dead host -> standby i).
TEST_F(Rendezvous, AWholeHostsRanksAreReplacedInOneGenerationByThePreferredStandbys) {
  FormGenerationZero(4);
  std::vector<std::unique_ptr<Process>> standbys;
  std::vector<std::thread> parked;
  std::vector<absl::StatusOr<Membership>> assigned(3);
  for (const char* id : {"hostC:standby0", "hostD:standby0", "hostD:standby1"}) {
    standbys.push_back(std::make_unique<Process>(shared_, id));
  }
  for (size_t i = 0; i < standbys.size(); ++i) {
    parked.emplace_back([&, i] { assigned[i] = standbys[i]->member.ParkAsStandby(kTimeout); });
  }
  AwaitParkedStandbys(3);
  absl::StatusOr<Membership> next = coordinator_.ReplaceRanks(
      {2, 3}, {"hostD:standby0", "hostD:standby1"}, /*any_standby=*/false, kTimeout);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->generation, 1);
  EXPECT_THAT(next->members,
              ElementsAre("host:rank0", "host:rank1", "hostD:standby0", "hostD:standby1"));
  parked[1].join();
  parked[2].join();
  ASSERT_TRUE(assigned[1].ok()) << assigned[1].status();
  EXPECT_EQ(assigned[1]->rank, 2);
  EXPECT_EQ(assigned[2]->rank, 3);
  // hostC's standby is still parked for a later fault.
  EXPECT_THAT(*coordinator_.ParkedStandbys(kTimeout), ElementsAre("hostC:standby0"));
  ASSERT_TRUE(coordinator_.ReplaceRank(0, kTimeout).ok());
  parked[0].join();
  EXPECT_EQ(assigned[0]->rank, 0);
}

// The parked standbys are read only when the preferred ones (the caller's own read, for the
// launcher's backup placement) run out: a death is replaced with one read fewer on its path.
TEST(RendezvousCoordinatorCost, TheParkedStandbysAreReadOnlyWhenThePreferredOnesRunOut) {
  InMemoryStore shared;
  testing::CountingStore store(&shared);
  RendezvousCoordinator coordinator(&store, Clock::Real(), "h0");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(store.Set(store_keys::RdzvJoin(r), absl::StrCat("host:rank", r), kTimeout).ok());
  }
  ASSERT_TRUE(coordinator.FormInitialGeneration(4, kTimeout).ok());
  for (const char* standby : {"hostC:standby0", "hostD:standby0", "hostD:standby1"}) {
    ASSERT_TRUE(store.Set(store_keys::RdzvStandby(standby), "parked", kTimeout).ok());
  }
  auto parked_reads = [&store] {
    int64_t n = 0;
    for (const auto& [verb_family, count] : store.counts()) {
      if (verb_family.first == "ListKeys") n += count;
    }
    return n;
  };
  store.Reset();
  // The preferred standby is parked: it takes the rank, and the others are not read.
  absl::StatusOr<Membership> next =
      coordinator.ReplaceRanks({2}, {"hostD:standby0"}, /*any_standby=*/true, kTimeout);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->members[2], "hostD:standby0");
  EXPECT_EQ(parked_reads(), 0);
  // The preferred standby was taken meanwhile: the others are read, once, and the first parked of
  // them (member-id order) takes the rank.
  next = coordinator.ReplaceRanks({3}, {"hostD:standby0"}, /*any_standby=*/true, kTimeout);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->members[3], "hostC:standby0");
  EXPECT_EQ(parked_reads(), 1);
  // Not `any_standby`: never read, and too few preferred ones replace nothing and park the claimed
  // one again.
  next = coordinator.ReplaceRanks({0, 1}, {"hostD:standby1", "hostD:standby0"},
                                  /*any_standby=*/false, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  EXPECT_EQ(parked_reads(), 1);
  EXPECT_EQ(coordinator.generation(), 2);
  EXPECT_EQ(store.Get(store_keys::RdzvStandby("hostD:standby1"), kTimeout).value_or(""), "parked");
}

TEST_F(Rendezvous, TooFewStandbysForAHostReplaceNoneAndStayParked) {
  FormGenerationZero(4);
  Process standby(shared_, "hostC:standby0");
  absl::StatusOr<Membership> assigned;
  std::thread parked([&] { assigned = standby.member.ParkAsStandby(kTimeout); });
  AwaitParkedStandbys(1);
  absl::StatusOr<Membership> next = coordinator_.ReplaceRanks({2, 3}, {}, true, kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(next.status())) << next.status();
  EXPECT_THAT(next.status().message(), HasSubstr("ranks 2,3"));
  EXPECT_EQ(coordinator_.generation(), 0);
  EXPECT_THAT(*coordinator_.ParkedStandbys(kTimeout), ElementsAre("hostC:standby0"));
  ASSERT_TRUE(coordinator_.ReplaceRank(3, kTimeout).ok());
  parked.join();
  EXPECT_EQ(assigned->rank, 3);
}

// A coordinator that takes over loads the current generation from the store; the one it replaced,
// still acting on its old view, cannot publish a generation its successor already published.
TEST_F(Rendezvous, ASuccessorCoordinatorResumesAndADeposedOneCannotPublishOverIt) {
  FormGenerationZero(3);
  std::unique_ptr<Store> successor_store = shared_.NewClient();
  RendezvousCoordinator successor(successor_store.get(), Clock::Real(), "hostB");
  ASSERT_TRUE(successor.Resume(kTimeout).ok());
  EXPECT_EQ(successor.current().generation, 0);
  EXPECT_EQ(successor.current().members, coordinator_.current().members);

  ASSERT_TRUE(successor.RenewGeneration(kTimeout).ok());
  absl::StatusOr<Membership> stale = coordinator_.RenewGeneration(kTimeout);
  EXPECT_TRUE(absl::IsAborted(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("published by hostB"));
  // The deposed one reloaded: a later act of it builds on the successor's generation.
  EXPECT_EQ(coordinator_.generation(), 1);
}

// An agent that holds a generation follows the next ones through their changes, O(ranks changed),
// not their tables, and holds the same table as the coordinator that published them.
TEST_F(Rendezvous, AFollowerHoldingAGenerationReadsOnlyTheChangesOfTheNextOnes) {
  FormGenerationZero(4);
  ReadRecordingStore follower_store(shared_.NewClient());
  RendezvousCoordinator follower(&follower_store, Clock::Real(), "hostB");
  ASSERT_TRUE(follower.Resume(kTimeout).ok());
  EXPECT_TRUE(follower_store.Read("rdzv/gen/0/table", ""));  // it held none: the table
  Process standby(shared_, "host:standby0");
  ReplaceByParkedStandby(standby, 2);
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());

  ASSERT_TRUE(follower.Resume(kTimeout).ok());
  EXPECT_EQ(follower.current().generation, 2);
  EXPECT_EQ(follower.current().members, coordinator_.current().members);
  EXPECT_EQ(follower.current().members[2], "host:standby0");
  EXPECT_FALSE(follower_store.Read("rdzv/gen/1/table", ""));
  EXPECT_FALSE(follower_store.Read("rdzv/gen/2/table", ""));
  EXPECT_TRUE(follower_store.Read("rdzv/gen/1/changes", ""));
}

// A generation whose changes are missing (a coordinator that writes none) is followed from its
// table; malformed changes are an error naming their key, never a guess.
TEST_F(Rendezvous, AFollowerReadsTheTableWithoutChangesAndRefusesMalformedOnes) {
  FormGenerationZero(3);
  ReadRecordingStore recording(shared_.NewClient());
  RendezvousCoordinator reader(&recording, Clock::Real(), "hostC");
  ASSERT_TRUE(reader.Resume(kTimeout).ok());
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(coordinator_store_->Delete(store_keys::RdzvChanges(1), kTimeout).ok());
  ASSERT_TRUE(reader.Resume(kTimeout).ok());
  EXPECT_EQ(reader.current().generation, 1);
  EXPECT_EQ(reader.current().members, coordinator_.current().members);
  EXPECT_TRUE(recording.Read("rdzv/gen/1/table", ""));

  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(
      coordinator_store_->Set(store_keys::RdzvChanges(2), "2\n3\nnot a change", kTimeout).ok());
  absl::Status malformed = reader.Resume(kTimeout);
  EXPECT_TRUE(absl::IsDataLoss(malformed)) << malformed;
  EXPECT_THAT(malformed.message(), HasSubstr(store_keys::RdzvChanges(2)));
  EXPECT_EQ(reader.current().generation, 1);
}

// A host's agent follows the generations from its own ranks' registrations and the changes, never
// the table: it learns that a rank of its own was taken, and by whom, and which rank its standby
// took.
TEST_F(Rendezvous, AnAgentFollowsItsOwnRanksWithoutTheTable) {
  FormGenerationZero(4);
  ReadRecordingStore agent_store(shared_.NewClient());
  GenerationFollower follower(&agent_store);
  ASSERT_TRUE(follower.Follow({2, 3}, kTimeout).ok());
  EXPECT_EQ(follower.current().generation, 0);
  EXPECT_EQ(follower.current().world_size, 4);
  EXPECT_THAT(follower.current().members, ElementsAre("", "", "host:rank2", "host:rank3"));

  Process standby(shared_, "host:standby0");
  ReplaceByParkedStandby(standby, 2);
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(follower.Follow({2, 3}, kTimeout).ok());
  EXPECT_EQ(follower.current().generation, 2);
  EXPECT_THAT(follower.current().members, ElementsAre("", "", "host:standby0", "host:rank3"));
  EXPECT_FALSE(agent_store.Read("rdzv/gen/", "/table"));
}

// Without a generation's changes (a coordinator that writes none), or with registrations that are
// not the ones the agent expects, it reads the newest table; malformed changes are an error.
TEST_F(Rendezvous, AnAgentFollowsFromTheTableWhereTheChangesDoNotSayAndRefusesMalformedOnes) {
  FormGenerationZero(3);
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(coordinator_store_->Delete(store_keys::RdzvChanges(1), kTimeout).ok());
  ReadRecordingStore agent_store(shared_.NewClient());
  GenerationFollower follower(&agent_store);
  ASSERT_TRUE(follower.Follow({0}, kTimeout).ok());
  EXPECT_EQ(follower.current().generation, 1);
  EXPECT_EQ(follower.current().members, coordinator_.current().members);
  EXPECT_TRUE(agent_store.Read("rdzv/gen/1/table", ""));

  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(
      coordinator_store_->Set(store_keys::RdzvChanges(2), "2\n3\nnot a change", kTimeout).ok());
  absl::Status malformed = follower.Follow({0}, kTimeout);
  EXPECT_TRUE(absl::IsDataLoss(malformed)) << malformed;
  EXPECT_THAT(malformed.message(), HasSubstr(store_keys::RdzvChanges(2)));
  EXPECT_EQ(follower.current().generation, 1);
}

TEST_F(Rendezvous, AnAgentFollowingBeforeGenerationZeroIsNotFound) {
  GenerationFollower follower(coordinator_store_.get());
  EXPECT_TRUE(absl::IsNotFound(follower.Follow({0}, kTimeout)));
  EXPECT_EQ(follower.current().generation, -1);
}

// A rank's first step of a generation is counted once, however often it says so.
TEST_F(Rendezvous, AResumedRankIsCountedOnceWhateverItsRetries) {
  ASSERT_TRUE(PublishResumed(coordinator_store_.get(), 3, 1, 40, kTimeout).ok());
  ASSERT_TRUE(PublishResumed(coordinator_store_.get(), 3, 1, 41, kTimeout).ok());
  ASSERT_TRUE(PublishResumed(coordinator_store_.get(), 3, 0, 40, kTimeout).ok());
  EXPECT_EQ(*coordinator_store_->Get(store_keys::ResumedCount(3), kTimeout), "2");
  EXPECT_EQ(*coordinator_store_->Get(store_keys::Resumed(3, 1), kTimeout), "40");
}

TEST_F(Rendezvous, ResumingBeforeGenerationZeroIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(coordinator_.Resume(kTimeout)));
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// A publication that claimed its generation and then ran out of time is retried by the same
// coordinator: its own claim does not stop it.
TEST_F(Rendezvous, ACoordinatorRetryingAPublicationItAlreadyClaimedCompletesIt) {
  FormGenerationZero(2);
  ASSERT_TRUE(coordinator_store_->CompareAndSet("rdzv/claim/1", std::nullopt, "coordinator", kTimeout)
                  ->swapped);
  absl::StatusOr<Membership> renewed = coordinator_.RenewGeneration(kTimeout);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->generation, 1);
}

// A publication after its claim is one store batch: each standby's assignment, the table, the
// changes, the fence, the previous plan's mark and the announcement, applied as one.
TEST(RendezvousCoordinatorCost, APublicationIsItsClaimAndOneBatch) {
  InMemoryStore shared;
  testing::CountingStore store(&shared);
  RendezvousCoordinator coordinator(&store, Clock::Real(), "h0");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(store.Set(store_keys::RdzvJoin(r), absl::StrCat("host:rank", r), kTimeout).ok());
  }
  ASSERT_TRUE(store.Set(store_keys::RdzvStandby("hostS:standby0"), "parked", kTimeout).ok());
  store.Reset();
  ASSERT_TRUE(coordinator.FormInitialGeneration(4, kTimeout).ok());
  absl::StatusOr<Membership> next =
      coordinator.ReplaceRanks({2}, {"hostS:standby0"}, /*any_standby=*/false, kTimeout);
  ASSERT_TRUE(next.ok()) << next.status();
  std::map<std::string, int64_t> by_verb;
  for (const auto& [verb_family, count] : store.counts()) by_verb[verb_family.first] += count;
  // Generation 0: the registrations' wait, the claim, the batch. Generation 1: the standby's
  // claim, the generation's claim, the batch.
  EXPECT_THAT(by_verb, ::testing::UnorderedElementsAre(::testing::Pair("WaitAndRead", 1),
                                                       ::testing::Pair("CompareAndSet", 3),
                                                       ::testing::Pair("WriteBatch", 2)));
  EXPECT_EQ(*store.Get(store_keys::RdzvAssign("hostS:standby0"), kTimeout), "1 2");
  EXPECT_EQ(*store.Get("rdzv/current", kTimeout), "1");
}

// The store wakes the waits on a batch's keys in the batch's order: the standbys' assignments come
// first, so that a standby's read of the generation's changes, once woken, is not queued behind the
// wake-ups of every rank waiting on the table.
TEST(RendezvousCoordinatorCost, APublicationWritesTheStandbysAssignmentsAheadOfItsTable) {
  class BatchRecorder final : public testing::ForwardingStore {
   public:
    using ForwardingStore::ForwardingStore;
    absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(
        const std::vector<BatchWrite>& writes, absl::Duration timeout) override {
      keys.clear();
      for (const BatchWrite& write : writes) keys.push_back(write.key);
      return base()->WriteBatch(writes, timeout);
    }
    std::vector<std::string> keys;  // the last batch's, in order ("" for the fence)
  };
  InMemoryStore shared;
  BatchRecorder store(&shared);
  RendezvousCoordinator coordinator(&store, Clock::Real(), "h0");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(store.Set(store_keys::RdzvJoin(r), absl::StrCat("host:rank", r), kTimeout).ok());
  }
  for (const char* standby : {"hostS:standby0", "hostS:standby1"}) {
    ASSERT_TRUE(store.Set(store_keys::RdzvStandby(standby), "parked", kTimeout).ok());
  }
  ASSERT_TRUE(coordinator.FormInitialGeneration(4, kTimeout).ok());
  ASSERT_TRUE(coordinator
                  .ReplaceRanks({1, 2}, {"hostS:standby0", "hostS:standby1"},
                                /*any_standby=*/false, kTimeout)
                  .ok());
  ASSERT_GE(store.keys.size(), 4u);
  EXPECT_THAT(std::vector<std::string>(store.keys.begin(), store.keys.begin() + 3),
              ::testing::ElementsAre(store_keys::RdzvAssign("hostS:standby0"),
                                     store_keys::RdzvAssign("hostS:standby1"), "rdzv/gen/1/table"));
  EXPECT_EQ(store.keys.back(), "rdzv/current") << "the announcement stays last";
}

// The store refuses (or loses) the coordinator's publication batch: nothing of the generation is
// written but its claim (no member wakes to half a generation, the fence stays), and the same
// coordinator's next attempt, finding its own claim, completes it.
TEST(RendezvousCoordinatorCost, APublicationThatFailsLeavesOnlyItsClaimAndIsCompletedByTheRetry) {
  class FirstBatchFails final : public testing::ForwardingStore {
   public:
    using ForwardingStore::ForwardingStore;
    absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(
        const std::vector<BatchWrite>& writes, absl::Duration timeout) override {
      if (fail_next) {
        fail_next = false;
        return absl::UnavailableError("store server unreachable (injected)");
      }
      return base()->WriteBatch(writes, timeout);
    }
    bool fail_next = false;
  };
  InMemoryStore shared;
  FirstBatchFails store(&shared);
  RendezvousCoordinator coordinator(&store, Clock::Real(), "h0");
  ASSERT_TRUE(store.Set(store_keys::RdzvJoin(0), "host:rank0", kTimeout).ok());
  ASSERT_TRUE(coordinator.FormInitialGeneration(1, kTimeout).ok());
  store.fail_next = true;
  absl::StatusOr<Membership> failed = coordinator.RenewGeneration(kTimeout);
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  absl::StatusOr<std::vector<std::optional<std::string>>> left = shared.MultiGet(
      {"rdzv/claim/1", "rdzv/gen/1/table", "rdzv/gen/1/changes", "rdzv/current"}, kTimeout);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_THAT(*left, ::testing::ElementsAre(std::optional<std::string>("h0"), std::nullopt,
                                            std::nullopt, std::optional<std::string>("0")));
  std::unique_ptr<Store> rank = shared.NewClient();
  rank->SetWriterGeneration(0);
  EXPECT_TRUE(rank->Set("rdzv/hb/host:rank0", "1", kTimeout).ok()) << "the fence stayed at 0";

  absl::StatusOr<Membership> renewed = coordinator.RenewGeneration(kTimeout);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->generation, 1);
  EXPECT_EQ(*shared.Get("rdzv/current", kTimeout), "1");
  EXPECT_TRUE(absl::IsFailedPrecondition(rank->Set("rdzv/hb/host:rank0", "2", kTimeout)));
}

// More standbys assigned at once than one batch holds: the first assignments go ahead in batches
// of their own, and a standby woken by one waits for its generation's changes.
TEST(RendezvousCoordinatorCost, MoreAssignmentsThanOneBatchHoldsStillPlaceEveryStandby) {
  constexpr int kWorld = 140;
  InMemoryStore shared;
  testing::CountingStore store(&shared);
  RendezvousCoordinator coordinator(&store, Clock::Real(), "h0");
  std::vector<int> dead;
  std::vector<std::string> standbys;
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(store.Set(store_keys::RdzvJoin(r), absl::StrCat("host:rank", r), kTimeout).ok());
    dead.push_back(r);
    standbys.push_back(absl::StrCat("hostS:standby", r));
    ASSERT_TRUE(store.Set(store_keys::RdzvStandby(standbys.back()), "parked", kTimeout).ok());
  }
  ASSERT_TRUE(coordinator.FormInitialGeneration(kWorld, kTimeout).ok());
  store.Reset();
  absl::StatusOr<Membership> next =
      coordinator.ReplaceRanks(dead, standbys, /*any_standby=*/false, kTimeout);
  ASSERT_TRUE(next.ok()) << next.status();
  int64_t batches = 0;
  for (const auto& [verb_family, count] : store.counts()) {
    if (verb_family.first == "WriteBatch") batches += count;
  }
  EXPECT_EQ(batches, 2);
  for (int r : {0, 70, kWorld - 1}) {
    std::unique_ptr<Store> own = shared.NewClient();
    RendezvousMember standby(own.get(), standbys[r], absl::InfiniteDuration());
    absl::StatusOr<Membership> placed = standby.ParkAsStandby(kTimeout);
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->generation, 1);
    EXPECT_EQ(placed->rank, r);
    EXPECT_EQ(placed->world_size, kWorld);
  }
}

// A member woken by the next generation's table (AwaitNewerGeneration) read, in that round trip,
// what it needs to take its place: AwaitGeneration then asks the store nothing.
TEST_F(Rendezvous, AMemberWokenByTheNextGenerationTakesItsPlaceWithoutAnotherRequest) {
  std::unique_ptr<Store> client = shared_.NewClient();
  testing::CountingStore store(client.get());
  RendezvousMember member(&store, "host:rank0", absl::InfiniteDuration());
  ASSERT_NO_FATAL_FAILURE(FormGenerationZeroOf(member));
  absl::StatusOr<bool> newer = absl::UnknownError("not waited");
  std::thread wait([&] { newer = member.AwaitNewerGeneration(kTimeout); });
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  wait.join();
  ASSERT_TRUE(newer.ok() && *newer) << newer.status();
  ASSERT_NO_FATAL_FAILURE(ExpectTheFirstRenewalTakenWithoutARequest(member, store));
  // Not kept past its use: the next generation is waited for and read again.
  std::thread next_wait([&] { newer = member.AwaitNewerGeneration(kTimeout); });
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  next_wait.join();
  absl::StatusOr<Membership> place = member.AwaitGeneration(1, kTimeout);
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->generation, 2);
}

}  // namespace
}  // namespace trainguard
