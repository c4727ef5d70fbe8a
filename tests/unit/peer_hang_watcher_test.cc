// PeerHangWatcher (sdk/runtime/peer_hang_watcher.h): the rank's watcher thread, its duties and its
// reads of the hang key, on an in-memory store.
#include "sdk/runtime/peer_hang_watcher.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

// What the watcher's thread reported, and bounded waits for it.
class Reports {
 public:
  struct HangKey {
    int64_t generation;
    absl::StatusOr<std::string> declared_by;
  };

  PeerHangWatcherOptions Options(Store* store, absl::Duration period) {
    PeerHangWatcherOptions o;
    o.period = period;
    o.hang_check_period = period;
    o.store = store;
    o.generation = [this] { return generation.load(); };
    o.duties = [this] {
      MutexLock lock(&mu_);
      ++duties_;
    };
    o.on_hang_key = [this](int64_t g, const absl::StatusOr<std::string>& who, absl::Time) {
      MutexLock lock(&mu_);
      keys_.push_back({g, who});
    };
    return o;
  }
  bool AwaitDuties(int n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return duties_ >= n; },
                                kTimeout);
  }
  // The first report of a hang key whose read succeeded, within kTimeout.
  std::optional<HangKey> AwaitDeclaration() {
    MutexLock lock(&mu_);
    std::optional<HangKey> found;
    mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          for (const HangKey& k : keys_) {
            if (k.declared_by.ok()) found = k;
          }
          return found.has_value();
        },
        kTimeout);
    return found;
  }
  std::vector<HangKey> keys() {
    MutexLock lock(&mu_);
    return keys_;
  }

  std::atomic<int64_t> generation{0};

 private:
  Mutex mu_;
  int duties_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<HangKey> keys_ ABSL_GUARDED_BY(mu_);
};

TEST(PeerHangWatcher, RunsTheDutiesEveryPeriodAndReportsNoHangWhileTheKeyIsAbsent) {
  InMemoryStore store;
  Reports reports;
  {
    PeerHangWatcher watcher(reports.Options(&store, absl::Milliseconds(5)));
    ASSERT_TRUE(reports.AwaitDuties(3));
  }
  const std::vector<Reports::HangKey> keys = reports.keys();
  ASSERT_FALSE(keys.empty());
  for (const Reports::HangKey& k : keys) {
    EXPECT_EQ(k.generation, 0);
    EXPECT_TRUE(absl::IsNotFound(k.declared_by.status())) << k.declared_by.status();
  }
}

TEST(PeerHangWatcher, ReportsThePeersDeclarationInTheRanksCurrentGeneration) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set(store_keys::Hang(0), "rank 1: an old hang", kTimeout).ok());
  ASSERT_TRUE(store.Set(store_keys::Hang(2), "rank 3: all_reduce #7", kTimeout).ok());
  Reports reports;
  reports.generation = 2;
  PeerHangWatcher watcher(reports.Options(&store, absl::Milliseconds(5)));
  const std::optional<Reports::HangKey> declared = reports.AwaitDeclaration();
  ASSERT_TRUE(declared.has_value());
  EXPECT_EQ(declared->generation, 2);
  EXPECT_EQ(*declared->declared_by, "rank 3: all_reduce #7");
}

TEST(PeerHangWatcher, WithoutAStoreRunsTheDutiesAndReadsNoKey) {
  Reports reports;
  {
    PeerHangWatcher watcher(reports.Options(nullptr, absl::Milliseconds(5)));
    ASSERT_TRUE(reports.AwaitDuties(3));
  }
  EXPECT_TRUE(reports.keys().empty());
}

TEST(PeerHangWatcher, StopsAtOnceOnDestructionWhateverItsPeriod) {
  InMemoryStore store;
  Reports reports;
  auto watcher = std::make_unique<PeerHangWatcher>(reports.Options(&store, absl::Hours(1)));
  absl::SleepFor(absl::Milliseconds(20));  // asleep for its period
  const absl::Time begin = absl::Now();
  watcher.reset();
  EXPECT_LT(absl::Now() - begin, absl::Seconds(1));
  EXPECT_TRUE(reports.keys().empty());
}

}  // namespace
}  // namespace trainguard
