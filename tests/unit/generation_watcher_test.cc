// GenerationWatcher (sdk/runtime/generation_watcher.h): a rank's thread that learns its generation
// was superseded, on an in-memory store with a real coordinator publishing the generations.
#include "sdk/runtime/generation_watcher.h"

#include <memory>
#include <thread>
#include <vector>

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
  }

  InMemoryStore shared_;
  std::unique_ptr<Store> coordinator_store_ = shared_.NewClient();
  RendezvousCoordinator coordinator_{coordinator_store_.get()};
  std::unique_ptr<Store> rank_store_ = shared_.NewClient();
  RendezvousMember member_{rank_store_.get(), "host:rank0", absl::Hours(1)};
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

TEST_F(GenerationWatcherTest, StopsWithinOneWaitOnDestruction) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  const absl::Duration wait = absl::Milliseconds(200);
  auto watcher = std::make_unique<GenerationWatcher>(&member_, wait, calls.Handler());
  absl::SleepFor(absl::Milliseconds(50));  // its thread is in a store wait
  const absl::Time begin = absl::Now();
  watcher.reset();
  // One wait at most, and slack for a loaded machine.
  EXPECT_LT(absl::Now() - begin, wait + absl::Seconds(1));
  EXPECT_THAT(calls.generations(), IsEmpty());
}

TEST_F(GenerationWatcherTest, StopsAtOnceWhileTheGenerationIsSuperseded) {
  ASSERT_NO_FATAL_FAILURE(JoinGenerationZero());
  Calls calls;
  // A wait this long would show: once superseded, the watcher sends no request.
  auto watcher =
      std::make_unique<GenerationWatcher>(&member_, absl::Milliseconds(100), calls.Handler());
  ASSERT_TRUE(coordinator_.RenewGeneration(kTimeout).ok());
  ASSERT_TRUE(calls.AwaitAtLeast(1));
  const absl::Time begin = absl::Now();
  watcher.reset();
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
}

TEST_F(GenerationWatcherTest, AMemberWithoutAGenerationIsWatchedWithoutCallsAndStopsPromptly) {
  // Not joined: every wait fails (FailedPrecondition); the watcher looks again shortly.
  Calls calls;
  auto watcher = std::make_unique<GenerationWatcher>(&member_, absl::Hours(1), calls.Handler());
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time begin = absl::Now();
  watcher.reset();
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
  EXPECT_THAT(calls.generations(), IsEmpty());
}

}  // namespace
}  // namespace trainguard
