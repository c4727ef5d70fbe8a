// GenerationWatcher and its NewerGenerationWait (sdk/runtime/generation_watcher.h): a rank's thread
// that learns its generation was superseded, on an in-memory store with a real coordinator
// publishing the generations. How a watcher stops is shown without timing it: every store wait it
// sends lasts one slice at most (a store that records them), a cancelled wait ends Cancelled, and a
// watcher whose slice is an hour is destroyed while it sends no store wait.
#include "sdk/runtime/generation_watcher.h"

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
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// A client of an in-memory store that records the timeout of every Wait it is sent.
class WaitRecordingStore final : public Store {
 public:
  explicit WaitRecordingStore(std::unique_ptr<Store> base) : base_(std::move(base)) {}

  std::vector<absl::Duration> waits() {
    MutexLock lock(&mu_);
    return waits_;
  }
  // Forgets the waits recorded so far (the rendezvous's own).
  void Clear() {
    MutexLock lock(&mu_);
    waits_.clear();
  }
  // Bounded: false when fewer than `n` waits were sent within kTimeout.
  bool AwaitWaits(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return waits_.size() >= n; },
                                kTimeout);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    {
      MutexLock lock(&mu_);
      waits_.push_back(timeout);
    }
    return base_->Wait(keys, timeout);
  }
  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override {
    return base_->Set(key, value, timeout);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    return base_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta,
                              absl::Duration timeout) override {
    return base_->Add(key, delta, timeout);
  }
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override {
    return base_->CompareAndSet(key, expected, desired, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override {
    return base_->Delete(key, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_->MultiGet(keys, timeout);
  }
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override {
    return base_->ListKeys(prefix, timeout);
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    return base_->WaitAny(keys, timeout);
  }
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override {
    return base_->RaiseFence(generation, timeout);
  }
  void SetWriterGeneration(int64_t generation) override { base_->SetWriterGeneration(generation); }

 private:
  const std::unique_ptr<Store> base_;
  Mutex mu_;
  std::vector<absl::Duration> waits_ ABSL_GUARDED_BY(mu_);
};

// The superseded handler's calls, as the watcher's thread makes them.
class Calls {
 public:
  std::function<void(int64_t)> Handler() {
    return [this](int64_t generation) {
      MutexLock lock(&mu_);
      generations_.push_back(generation);
    };
  }
  std::vector<int64_t> generations() {
    MutexLock lock(&mu_);
    return generations_;
  }
  // Bounded: false when fewer than `n` calls came within kTimeout.
  bool AwaitAtLeast(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generations_.size() >= n; }, kTimeout);
  }

 private:
  Mutex mu_;
  std::vector<int64_t> generations_ ABSL_GUARDED_BY(mu_);
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

  InMemoryStore shared_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get()};
  WaitRecordingStore rank_store_{shared_.NewClient()};
  RendezvousMember member_{&rank_store_, "host:rank0", absl::Hours(1)};
};

TEST_F(GenerationWatcherTest, CallsTheHandlerOnceForTheGenerationANewerOneSupersedes) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  GenerationWatcher watcher(&member_, absl::Milliseconds(50), calls.Handler());
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls.AwaitAtLeast(1));
  EXPECT_TRUE(member_.superseded());
  // Still superseded (the rank has not adopted generation 1): the watcher looks again and again,
  // and says nothing more.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_THAT(calls.generations(), ElementsAre(0));
}

TEST_F(GenerationWatcherTest, CallsTheHandlerAgainOnceTheAdoptedGenerationIsSupersededToo) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  GenerationWatcher watcher(&member_, absl::Milliseconds(50), calls.Handler());
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls.AwaitAtLeast(1));
  ASSERT_TRUE(member_.AwaitGeneration(0, kTimeout).ok());  // the training thread adopts 1
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls.AwaitAtLeast(2));
  EXPECT_THAT(calls.generations(), ElementsAre(0, 1));
}

TEST_F(GenerationWatcherTest, CallsNothingWhileTheGenerationIsCurrent) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  {
    GenerationWatcher watcher(&member_, absl::Milliseconds(20), calls.Handler());
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_THAT(calls.generations(), IsEmpty());
  EXPECT_FALSE(member_.superseded());
}

TEST_F(GenerationWatcherTest, SendsStoreWaitsOfOneSliceAtMostSoThatItsDestructorWaitsNoLonger) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  const absl::Duration slice = absl::Milliseconds(30);
  auto watcher = std::make_unique<GenerationWatcher>(&member_, slice, calls.Handler());
  ASSERT_TRUE(rank_store_.AwaitWaits(3));  // its thread waits, slice after slice
  watcher.reset();  // Stop() is seen at the end of the store wait in progress
  for (absl::Duration wait : rank_store_.waits()) EXPECT_LE(wait, slice);
  EXPECT_THAT(calls.generations(), IsEmpty());
}

TEST_F(GenerationWatcherTest, SendsNoStoreWaitWhileTheGenerationIsSuperseded) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  // A slice of an hour: a store wait sent once superseded would hold the destructor for an hour
  // (and the test past ctest's timeout).
  auto watcher = std::make_unique<GenerationWatcher>(&member_, absl::Hours(1), calls.Handler());
  ASSERT_TRUE(rank_store_.AwaitWaits(1));
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());  // ends the wait in progress
  ASSERT_TRUE(calls.AwaitAtLeast(1));
  watcher.reset();
  EXPECT_EQ(rank_store_.waits().size(), 1u);
  EXPECT_THAT(calls.generations(), ElementsAre(0));
}

TEST_F(GenerationWatcherTest, AMemberWithoutAGenerationIsWatchedWithoutStoreWaitsOrCalls) {
  // Not joined: every wait fails (FailedPrecondition) before it reaches the store; the watcher
  // looks again shortly, and a slice of an hour never holds its destructor.
  Calls calls;
  auto watcher = std::make_unique<GenerationWatcher>(&member_, absl::Hours(1), calls.Handler());
  absl::SleepFor(absl::Milliseconds(100));
  watcher.reset();
  EXPECT_THAT(rank_store_.waits(), IsEmpty());
  EXPECT_THAT(calls.generations(), IsEmpty());
}

TEST_F(GenerationWatcherTest, ACancelledWaitEndsCancelledAtTheEndOfItsSlice) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  const absl::Duration slice = absl::Milliseconds(30);
  NewerGenerationWait wait(&member_, slice);
  absl::StatusOr<bool> result = false;
  // An hour: only the cancel ends it.
  std::thread waiter([&] { result = wait.Await(absl::Hours(1)); });
  ASSERT_TRUE(rank_store_.AwaitWaits(1));  // a store wait is in progress
  wait.Cancel();
  waiter.join();
  EXPECT_TRUE(absl::IsCancelled(result.status())) << result.status();
  for (absl::Duration w : rank_store_.waits()) EXPECT_LE(w, slice);
  EXPECT_FALSE(member_.superseded());
}

TEST_F(GenerationWatcherTest, AWaitCancelledBeforehandSendsNoStoreWait) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  NewerGenerationWait wait(&member_, absl::Hours(1));
  wait.Cancel();
  EXPECT_TRUE(absl::IsCancelled(wait.Await(absl::Hours(1)).status()));
  EXPECT_THAT(rank_store_.waits(), IsEmpty());
}

TEST_F(GenerationWatcherTest, AWaitSeesTheNewerGenerationAndRunsOutWithoutOne) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  NewerGenerationWait wait(&member_, absl::Milliseconds(20));
  absl::StatusOr<bool> ran_out = wait.Await(absl::Milliseconds(70));
  ASSERT_TRUE(ran_out.ok()) << ran_out.status();
  EXPECT_FALSE(*ran_out);
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  absl::StatusOr<bool> superseded = wait.Await(kTimeout);
  ASSERT_TRUE(superseded.ok()) << superseded.status();
  EXPECT_TRUE(*superseded);
  EXPECT_EQ(member_.superseded_generation(), 0);
}

}  // namespace
}  // namespace trainguard
