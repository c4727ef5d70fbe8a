// Tracked gloo collectives (gloo_collectives.h): the tracker sees them, and a hang in one is
// detected by the watchdog and unblocked by closing the gloo context. Ranks are threads of this
// process, each with its own gloo context over a shared in-memory trainguard store.
#include "trainguard/gloo_collectives.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/gloo_store.h"
#include "trainguard/store.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

constexpr uint64_t kDp = 1;

std::shared_ptr<gloo::rendezvous::Context> Connect(InMemoryStore& shared, int rank, int world) {
  std::unique_ptr<Store> client = shared.NewClient();
  PrefixStore scoped("gloo", client.get());
  GlooStore gloo_store(&scoped, absl::Seconds(30));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
  context->connectFullMesh(gloo_store, device);
  return context;
}

std::unique_ptr<CollectiveTracker> MakeTracker() {
  auto tracker = CollectiveTracker::Create(CollectiveTrackerOptions{});
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

TEST(GlooCollectives, TrackedAllreduceSumsAndIsRecordedPerCommunicator) {
  InMemoryStore shared;
  std::vector<std::vector<float>> data = {{1, 2}, {10, 20}};
  std::vector<std::unique_ptr<CollectiveTracker>> trackers;
  trackers.push_back(MakeTracker());
  trackers.push_back(MakeTracker());
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto context = Connect(shared, r, 2);
      ASSERT_TRUE(RegisterGlooContext(*trackers[r], kDp, "dp", context).ok());
      TrackedAllreduce(*trackers[r], kDp, context, data[r].data(), data[r].size(),
                       absl::Seconds(30));
      TrackedBroadcast(*trackers[r], kDp, context, data[r].data(), data[r].size(), /*root=*/1,
                       absl::Seconds(30));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(data[r], ::testing::ElementsAre(11, 22));
    EXPECT_EQ(trackers[r]->usage_errors(), 0);
    std::vector<CommunicatorProgress> progress = trackers[r]->Progress();
    ASSERT_EQ(progress.size(), 1u);
    EXPECT_EQ(progress[0].begun, 2);
    EXPECT_EQ(progress[0].completed, 2);
  }
}

// The collective's gloo timeout (60 s) is far beyond its learned bound (the 200 ms warm-up bound):
// the watchdog reports it while it is still blocked, then aborts the context, which wakes it with
// the abort's reason (not gloo's timeout, which the test would otherwise wait out). The peer that
// never entered sees its connection to rank 0 fail.
TEST(GlooCollectives, AHungAllreduceIsReportedWhileBlockedAndTheContextIsAborted) {
  InMemoryStore shared;
  std::shared_ptr<gloo::rendezvous::Context> peer_context;
  Notification peer_connected, test_done;
  // Rank 1 connects and then never enters the collective.
  std::thread peer([&] {
    peer_context = Connect(shared, 1, 2);
    peer_connected.Notify();
    test_done.WaitForNotificationWithTimeout(absl::Seconds(120));
  });
  auto context = Connect(shared, 0, 2);
  ASSERT_TRUE(peer_connected.WaitForNotificationWithTimeout(absl::Seconds(60)));

  CollectiveTrackerOptions tracker_options;
  tracker_options.bound.warmup_bound = absl::Milliseconds(200);
  auto tracker = CollectiveTracker::Create(tracker_options);
  ASSERT_TRUE(tracker.ok());
  ASSERT_TRUE(RegisterGlooContext(**tracker, kDp, "dp", context).ok());
  // Outlive the watchdog's monitor thread, which the handler and hook below run on.
  std::atomic<int> aborted{0};
  std::atomic<int64_t> completed_when_reported{-1};
  WatchdogOptions options;
  options.poll_period = absl::Milliseconds(10);
  options.tracker = tracker->get();
  auto wd = Watchdog::Create(options);
  ASSERT_TRUE(wd.ok());
  (*wd)->AddHangHandler(
      [&](const HangReport&) { completed_when_reported = (*tracker)->Progress()[0].completed; });
  (*wd)->AddAbortHook("count", [&] { ++aborted; });

  std::vector<float> data = {1, 2, 3};
  std::string error;
  try {
    ScopedPhase phase(wd->get(), "train");
    TrackedAllreduce(**tracker, kDp, context, data.data(), data.size(), absl::Seconds(60));
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_FALSE(error.empty()) << "the allreduce returned although its peer never joined";
  EXPECT_THAT(error, ::testing::HasSubstr("communicator 1 aborted after a hang"));
  std::optional<HangReport> hang = (*wd)->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(completed_when_reported.load(), 0) << "reported while the allreduce was blocked";
  EXPECT_EQ(aborted.load(), 1);
  EXPECT_EQ(hang->cause, HangReport::Cause::kCollective);
  EXPECT_EQ(hang->phase, "train");
  ASSERT_TRUE(hang->collective.has_value());
  EXPECT_EQ(hang->collective->op, "all_reduce");
  EXPECT_EQ(hang->collective->comm_name, "dp");
  EXPECT_EQ(hang->collective->comm_seq, 0);
  EXPECT_EQ(hang->collective->bytes, 3 * sizeof(float));
  EXPECT_EQ((*tracker)->Progress()[0].completed, 1) << "ended by RAII although gloo threw";
  test_done.Notify();
  peer.join();
}

}  // namespace
}  // namespace trainguard
