// GenerationWatcher (sdk/runtime/generation_watcher.h): a rank's thread that learns its generation
// was superseded, or that a peer declared a hang in it, from one parked Store::WaitAny; on an
// in-memory store with a real coordinator publishing the generations. How it waits is shown
// without timing it: a store that records every wait and read it is sent, and watchers whose
// parked wait lasts an hour, which only their wake key (or a table) can end before ctest's timeout.
#include "sdk/runtime/generation_watcher.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "sdk/rendezvous/rendezvous.h"
#include "tests/support/forwarding_store.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// A client of an in-memory store that records every wait (Wait, WaitAny, WaitAnyAndRead) and every
// Get it is sent.
class WaitRecordingStore final : public testing::ForwardingStore {
 public:
  struct Sent {
    std::vector<std::string> keys;
    absl::Duration timeout;
  };

  explicit WaitRecordingStore(std::unique_ptr<Store> base) : ForwardingStore(std::move(base)) {}

  // While set, every WaitAny fails at once with Unavailable (it is still recorded).
  std::atomic<bool> unreachable{false};

  std::vector<Sent> waits() {
    MutexLock lock(&mu_);
    return waits_;
  }
  std::vector<std::string> gets() {
    MutexLock lock(&mu_);
    return gets_;
  }
  // Forgets what was recorded so far (the rendezvous's own).
  void Clear() {
    MutexLock lock(&mu_);
    waits_.clear();
    gets_.clear();
  }
  // Bounded: false when fewer than `n` waits were sent within kTimeout.
  bool AwaitWaits(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return waits_.size() >= n; },
                                kTimeout);
  }
  // Bounded: false when fewer than `n` waits satisfying `pred` were sent within kTimeout.
  bool AwaitWaitsWhere(const std::function<bool(const Sent&)>& pred, size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          size_t matching = 0;
          for (const Sent& sent : waits_) matching += pred(sent) ? 1 : 0;
          return matching >= n;
        },
        kTimeout);
  }
  // Bounded: false when fewer than `n` Gets were sent within kTimeout.
  bool AwaitGets(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return gets_.size() >= n; },
                                kTimeout);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    Record(keys, timeout);
    return base()->Wait(keys, timeout);
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    Record(keys, timeout);
    if (unreachable.load()) return absl::UnavailableError("the store cannot be reached");
    return base()->WaitAny(keys, timeout);
  }
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override {
    Record(awaited, timeout);
    if (unreachable.load()) return absl::UnavailableError("the store cannot be reached");
    return base()->WaitAnyAndRead(awaited, read, timeout);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    {
      MutexLock lock(&mu_);
      gets_.emplace_back(key);
    }
    return base()->Get(key, timeout);
  }

 private:
  void Record(const std::vector<std::string>& keys, absl::Duration timeout) {
    MutexLock lock(&mu_);
    waits_.push_back({keys, timeout});
  }

  Mutex mu_;
  std::vector<Sent> waits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> gets_ ABSL_GUARDED_BY(mu_);
};

// The handlers' calls, as the watcher's thread makes them.
class Calls {
 public:
  struct HangRead {
    int64_t generation;
    absl::StatusOr<std::string> declared_by;
  };

  std::function<void(int64_t)> Handler() {
    return [this](int64_t generation) {
      MutexLock lock(&mu_);
      generations_.push_back(generation);
    };
  }
  std::function<void(int64_t, const absl::StatusOr<std::string>&, absl::Time)> HangHandler() {
    return [this](int64_t generation, const absl::StatusOr<std::string>& who, absl::Time) {
      MutexLock lock(&mu_);
      hang_reads_.push_back({generation, who});
    };
  }
  std::vector<int64_t> generations() {
    MutexLock lock(&mu_);
    return generations_;
  }
  std::vector<HangRead> hang_reads() {
    MutexLock lock(&mu_);
    return hang_reads_;
  }
  // Bounded: false when fewer than `n` calls came within kTimeout.
  bool AwaitAtLeast(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generations_.size() >= n; }, kTimeout);
  }
  // Bounded: false when no read of the hang key satisfying `pred` came within kTimeout.
  bool AwaitHangRead(const std::function<bool(const HangRead&)>& pred) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          for (const HangRead& r : hang_reads_) {
            if (pred(r)) return true;
          }
          return false;
        },
        kTimeout);
  }

 private:
  Mutex mu_;
  std::vector<int64_t> generations_ ABSL_GUARDED_BY(mu_);
  std::vector<HangRead> hang_reads_ ABSL_GUARDED_BY(mu_);
};

class GenerationWatcherTest : public ::testing::Test {
 protected:
  // Rank 0 of a one-rank job joins generation 0. Its heartbeat beats once an hour: only the
  // watcher's wait can find it superseded.
  void JoinGenerationZero() {
    absl::StatusOr<Membership> joined = absl::UnknownError("not joined");
    std::thread join([&] { joined = member_.JoinInitial(0, 1, kTimeout); });
    ASSERT_TRUE(coordinator_.FormInitialGeneration(1, kTimeout).ok());
    join.join();
    ASSERT_TRUE(joined.ok()) << joined.status();
    rank_store_.Clear();
  }

  // A watcher whose parked wait lasts `park`; it watches the hang key when `watch_hangs`.
  std::unique_ptr<GenerationWatcher> Watch(absl::Duration park, bool watch_hangs = false,
                                           absl::Duration hang_recheck = absl::Hours(1)) {
    GenerationWatcherOptions o{.member = &member_,
                               .store = &rank_store_,
                               .park = park,
                               .hang_recheck = hang_recheck,
                               .on_superseded = calls_.Handler(),
                               .on_hang_key = nullptr,
                               .notices = {}};
    if (watch_hangs) o.on_hang_key = calls_.HangHandler();
    return std::make_unique<GenerationWatcher>(std::move(o));
  }

  InMemoryStore shared_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get()};
  WaitRecordingStore rank_store_{shared_.NewClient()};
  RendezvousMember member_{&rank_store_, "host:rank0", absl::Hours(1)};
  Calls calls_;
};

TEST_F(GenerationWatcherTest, CallsTheHandlerOnceForTheGenerationANewerOneSupersedes) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Hours(1));
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());  // ends the hour-long wait
  ASSERT_TRUE(calls_.AwaitAtLeast(1));
  EXPECT_TRUE(member_.superseded());
  // Still superseded (the rank has not adopted generation 1): the watcher looks again and again,
  // and says nothing more.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_THAT(calls_.generations(), ElementsAre(0));
}

TEST_F(GenerationWatcherTest, CallsTheHandlerAgainOnceTheAdoptedGenerationIsSupersededToo) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Hours(1));
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls_.AwaitAtLeast(1));
  ASSERT_TRUE(member_.AwaitGeneration(0, kTimeout).ok());  // the training thread adopts 1
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls_.AwaitAtLeast(2));
  EXPECT_THAT(calls_.generations(), ElementsAre(0, 1));
}

TEST_F(GenerationWatcherTest, WhileNothingHappensItSendsOneParkedWaitOnTheTableAndItsWakeKey) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Hours(1));
  ASSERT_TRUE(rank_store_.AwaitWaits(1));
  const std::string wake_key = watcher->wake_key();
  // An hour-long wait in progress: only the wake key that Stop() writes ends it before ctest's
  // timeout.
  watcher.reset();
  const std::vector<WaitRecordingStore::Sent> waits = rank_store_.waits();
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_THAT(waits[0].keys, ElementsAre(store_keys::RdzvTable(1), wake_key));
  EXPECT_EQ(waits[0].timeout, absl::Hours(1));
  EXPECT_THAT(rank_store_.gets(), IsEmpty());
  EXPECT_THAT(calls_.generations(), IsEmpty());
  EXPECT_FALSE(member_.superseded());
  EXPECT_TRUE(absl::IsNotFound(shared_.Get(wake_key, kTimeout).status()))
      << "the destructor deletes the wake key it wrote";
}

TEST_F(GenerationWatcherTest, AWaitThatRunsOutIsSentAgainWithoutACall) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Milliseconds(10), /*watch_hangs=*/true);
  ASSERT_TRUE(rank_store_.AwaitWaits(3));
  watcher.reset();
  for (const WaitRecordingStore::Sent& wait : rank_store_.waits()) {
    EXPECT_EQ(wait.timeout, absl::Milliseconds(10));
  }
  EXPECT_THAT(rank_store_.gets(), IsEmpty()) << "no hang key was read: none appeared";
  EXPECT_THAT(calls_.generations(), IsEmpty());
  EXPECT_THAT(calls_.hang_reads(), IsEmpty());
}

TEST_F(GenerationWatcherTest, AfterAFailedWaitItParksBrieflyUntilAWaitEndsNormallyAgain) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  rank_store_.unreachable = true;
  auto watcher = Watch(absl::Hours(1));
  ASSERT_TRUE(rank_store_.AwaitWaits(3));
  rank_store_.unreachable = false;
  // The next wait reaches the store and runs out after 250 ms; the one after is an hour long
  // again (the second such, after the first of all), until the wake key ends it.
  ASSERT_TRUE(rank_store_.AwaitWaitsWhere(
      [](const WaitRecordingStore::Sent& sent) { return sent.timeout == absl::Hours(1); }, 2));
  watcher.reset();
  const std::vector<WaitRecordingStore::Sent> waits = rank_store_.waits();
  EXPECT_EQ(waits.front().timeout, absl::Hours(1)) << "the first, before any failure";
  for (size_t i = 1; i + 1 < waits.size(); ++i) {
    EXPECT_EQ(waits[i].timeout, absl::Milliseconds(250)) << "wait " << i;
  }
  EXPECT_EQ(waits.back().timeout, absl::Hours(1));
  EXPECT_THAT(calls_.generations(), IsEmpty());
}

TEST_F(GenerationWatcherTest, SendsNoStoreWaitWhileTheGenerationIsSuperseded) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Hours(1));
  ASSERT_TRUE(rank_store_.AwaitWaits(1));
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());  // ends the wait in progress
  ASSERT_TRUE(calls_.AwaitAtLeast(1));
  absl::SleepFor(absl::Milliseconds(100));  // it looks again, several times, without a request
  watcher.reset();
  EXPECT_EQ(rank_store_.waits().size(), 1u);
  EXPECT_THAT(calls_.generations(), ElementsAre(0));
}

TEST_F(GenerationWatcherTest, AMemberWithoutAGenerationIsWatchedWithoutStoreWaitsOrCalls) {
  // Not joined: every wait fails (FailedPrecondition) before it reaches the store; the watcher
  // looks again shortly, and a park of an hour never holds its destructor.
  auto watcher = Watch(absl::Hours(1), /*watch_hangs=*/true);
  absl::SleepFor(absl::Milliseconds(100));
  watcher.reset();
  EXPECT_THAT(rank_store_.waits(), IsEmpty());
  EXPECT_THAT(calls_.generations(), IsEmpty());
  EXPECT_THAT(calls_.hang_reads(), IsEmpty());
}

TEST_F(GenerationWatcherTest, APeersHangIsReadWhenItsKeyAppearsThenAgainUntilItIsWithdrawn) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher =
      Watch(absl::Hours(1), /*watch_hangs=*/true, /*hang_recheck=*/absl::Milliseconds(5));
  ASSERT_TRUE(rank_store_.AwaitWaits(1));
  EXPECT_THAT(rank_store_.waits()[0].keys,
              ElementsAre(store_keys::RdzvTable(1), watcher->wake_key(), store_keys::Hang(0)));
  // A peer declares a hang: the hour-long wait ends, and the key is read.
  ASSERT_TRUE(coordinator_store_->Set(store_keys::Hang(0), "rank 1: all_reduce #7", kTimeout).ok());
  ASSERT_TRUE(calls_.AwaitHangRead([](const Calls::HangRead& r) {
    return r.generation == 0 && r.declared_by.ok() && *r.declared_by == "rank 1: all_reduce #7";
  }));
  // While it stands the key is read again every recheck; withdrawn (deleted), a read says so.
  ASSERT_TRUE(rank_store_.AwaitGets(3));
  ASSERT_TRUE(*coordinator_store_->Delete(store_keys::Hang(0), kTimeout));
  ASSERT_TRUE(calls_.AwaitHangRead(
      [](const Calls::HangRead& r) { return absl::IsNotFound(r.declared_by.status()); }));
  // Then it parks again on the hang key (a second such wait), until a peer declares one more or it
  // stops.
  EXPECT_TRUE(rank_store_.AwaitWaitsWhere(
      [](const WaitRecordingStore::Sent& sent) {
        return sent.timeout == absl::Hours(1) && sent.keys.back() == store_keys::Hang(0);
      },
      2));
  watcher.reset();
  EXPECT_THAT(calls_.generations(), IsEmpty());
}

TEST_F(GenerationWatcherTest, ANewerGenerationEndsTheRechecksOfAStandingHang) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  auto watcher = Watch(absl::Hours(1), /*watch_hangs=*/true, /*hang_recheck=*/absl::Hours(1));
  ASSERT_TRUE(coordinator_store_->Set(store_keys::Hang(0), "rank 1: broadcast #2", kTimeout).ok());
  ASSERT_TRUE(calls_.AwaitHangRead([](const Calls::HangRead& r) { return r.declared_by.ok(); }));
  // Its hour-long recheck wait is on the table and the wake key: the next generation ends it.
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls_.AwaitAtLeast(1));
  EXPECT_THAT(calls_.generations(), ElementsAre(0));
}

TEST_F(GenerationWatcherTest, ANoticeIsHandledOnceWhenItsKeyAppearsAndThenNoLongerWaitedFor) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Mutex mu;
  std::vector<int64_t> seen;
  GenerationWatcherOptions o{.member = &member_,
                             .store = &rank_store_,
                             .park = absl::Hours(1),
                             .hang_recheck = absl::Hours(1),
                             .on_superseded = calls_.Handler(),
                             .on_hang_key = nullptr,
                             .notices = {{.key = [](int64_t) { return std::string("asks/work"); },
                                          .on_seen =
                                              [&](int64_t generation) {
                                                MutexLock lock(&mu);
                                                seen.push_back(generation);
                                              }}}};
  auto watcher = std::make_unique<GenerationWatcher>(std::move(o));
  ASSERT_TRUE(rank_store_.AwaitWaits(1));
  EXPECT_THAT(rank_store_.waits()[0].keys,
              ElementsAre(store_keys::RdzvTable(1), watcher->wake_key(), "asks/work"));
  ASSERT_TRUE(coordinator_store_->Set("asks/work", "host0", kTimeout).ok());
  // Seen, it is dropped from the next parked wait (which would otherwise end at once, again and
  // again).
  ASSERT_TRUE(rank_store_.AwaitWaits(2));
  watcher.reset();
  const std::vector<WaitRecordingStore::Sent> waits = rank_store_.waits();
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_THAT(waits[1].keys, ElementsAre(store_keys::RdzvTable(1), waits[0].keys[1]));
  MutexLock lock(&mu);
  EXPECT_THAT(seen, ElementsAre(0));
}

}  // namespace
}  // namespace trainguard
