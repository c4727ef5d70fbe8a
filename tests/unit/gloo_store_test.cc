#include "trainguard/gloo_store.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/counting_store.h"
#include "tests/support/forwarding_store.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using testing::CountingStore;
using Counts = CountingStore::Counts;

// A store on which a peer writes `key` while a Wait is in flight: the key is absent until the
// first Wait, then present, without a thread or a sleep.
class PeerWritesDuringWait final : public testing::ForwardingStore {
 public:
  PeerWritesDuringWait(Store* base, std::string key, std::string value)
      : ForwardingStore(base), key_(std::move(key)), value_(std::move(value)) {}

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    if (absl::Status s = base()->Set(key_, value_, timeout); !s.ok()) return s;
    return base()->Wait(keys, timeout);
  }

 private:
  const std::string key_;
  const std::string value_;
};

std::string AsString(const std::vector<char>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// Each rank: a gloo context over its own client of the shared store, then one allreduce.
std::vector<float> RendezvousAndAllreduce(InMemoryStore& shared, int rank, int world) {
  std::unique_ptr<Store> client = shared.NewClient();
  PrefixStore scoped("gloo/gen0", client.get());
  GlooStore gloo_store(&scoped, absl::Seconds(30));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->connectFullMesh(gloo_store, device);
  std::vector<float> data = {float(rank), 1.0f};
  gloo::AllreduceOptions options(context);
  options.setOutput(data.data(), data.size());
  options.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(options);
  return data;
}

TEST(GlooStore, GlooRanksRendezvousThroughATrainguardStore) {
  constexpr int kWorld = 4;
  InMemoryStore shared;
  std::vector<std::vector<float>> results(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] { results[r] = RendezvousAndAllreduce(shared, r, kWorld); });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_THAT(results[r], ::testing::ElementsAre(6.0f, 4.0f));
  auto keys = shared.ListKeys("gloo/gen0/", absl::Seconds(1));
  ASSERT_TRUE(keys.ok());
  EXPECT_FALSE(keys->empty()) << "gloo's addresses went through the trainguard store";
}

TEST(GlooStore, AMissingPeerIsAnIoErrorNamingTheKeyWithinTheTimeout) {
  InMemoryStore shared;
  PrefixStore scoped("gloo/gen0", &shared);
  GlooStore gloo_store(&scoped, absl::Milliseconds(300));
  try {
    gloo_store.get("rank/3/address");
    FAIL() << "get of a key nobody sets returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("rank/3/address"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("DEADLINE_EXCEEDED"));
  }
}

TEST(GlooStore, AGetOfAKeyThatExistsIsOneRead) {
  InMemoryStore shared;
  ASSERT_TRUE(shared.Set("rank_3", "host3", absl::Seconds(1)).ok());
  CountingStore counting(&shared);
  GlooStore gloo_store(&counting, absl::Seconds(1));
  EXPECT_EQ(AsString(gloo_store.get("rank_3")), "host3");
  EXPECT_EQ(counting.counts(), (Counts{{{"Get", "rank_N"}, 1}}));
}

TEST(GlooStore, AWaitForKeysThatExistReadsThemAndTheGetThatFollowsSendsNothing) {
  InMemoryStore shared;
  ASSERT_TRUE(shared.Set("3", "address of 3", absl::Seconds(1)).ok());
  CountingStore counting(&shared);
  GlooStore gloo_store(&counting, absl::Seconds(1));
  gloo_store.wait({"3"}, std::chrono::milliseconds(1000));
  EXPECT_EQ(AsString(gloo_store.get("3")), "address of 3");
  EXPECT_EQ(counting.counts(), (Counts{{{"MultiGet", "N"}, 1}}));
}

TEST(GlooStore, AGetAfterAWaitReturnsTheValueTheWaitSawOnceThenReadsTheStore) {
  InMemoryStore shared;
  ASSERT_TRUE(shared.Set("3", "first", absl::Seconds(1)).ok());
  GlooStore gloo_store(&shared, absl::Seconds(1));
  gloo_store.wait({"3"}, std::chrono::milliseconds(1000));
  ASSERT_TRUE(shared.Set("3", "second", absl::Seconds(1)).ok());
  EXPECT_EQ(AsString(gloo_store.get("3")), "first");
  EXPECT_EQ(AsString(gloo_store.get("3")), "second");
}

TEST(GlooStore, AWaitKeepsOnlyItsOwnKeysValues) {
  InMemoryStore shared;
  ASSERT_TRUE(shared.Set("1", "one", absl::Seconds(1)).ok());
  ASSERT_TRUE(shared.Set("2", "two", absl::Seconds(1)).ok());
  CountingStore counting(&shared);
  GlooStore gloo_store(&counting, absl::Seconds(1));
  gloo_store.wait({"1"}, std::chrono::milliseconds(1000));
  gloo_store.wait({"2"}, std::chrono::milliseconds(1000));
  counting.Reset();
  EXPECT_EQ(AsString(gloo_store.get("1")), "one");  // dropped by the second wait: read again
  EXPECT_EQ(AsString(gloo_store.get("2")), "two");
  EXPECT_EQ(counting.counts(), (Counts{{{"Get", "N"}, 1}}));
}

TEST(GlooStore, AGetOfAKeyWrittenLaterWaitsForItThenReadsIt) {
  InMemoryStore shared;
  PeerWritesDuringWait peer(&shared, "rank_3", "host3");
  CountingStore counting(&peer);
  GlooStore gloo_store(&counting, absl::Seconds(1));
  EXPECT_EQ(AsString(gloo_store.get("rank_3")), "host3");
  EXPECT_EQ(counting.counts(), (Counts{{{"Get", "rank_N"}, 2}, {{"Wait", "rank_N"}, 1}}));
}

TEST(GlooStore, AWaitForAKeyWrittenLaterWaitsAndKeepsNoValue) {
  InMemoryStore shared;
  PeerWritesDuringWait peer(&shared, "3", "address of 3");
  CountingStore counting(&peer);
  GlooStore gloo_store(&counting, absl::Seconds(1));
  gloo_store.wait({"3"}, std::chrono::milliseconds(1000));
  EXPECT_EQ(AsString(gloo_store.get("3")), "address of 3");
  EXPECT_EQ(counting.counts(),
            (Counts{{{"MultiGet", "N"}, 1}, {{"Wait", "N"}, 1}, {{"Get", "N"}, 1}}));
}

TEST(GlooStore, AWaitForAKeyNobodySetsIsAnIoErrorNamingTheKey) {
  InMemoryStore shared;
  GlooStore gloo_store(&shared, absl::Seconds(1));
  try {
    gloo_store.wait({"7"}, std::chrono::milliseconds(50));
    FAIL() << "a wait for a key nobody sets returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("wait 7"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("DEADLINE_EXCEEDED"));
  }
}

}  // namespace
}  // namespace trainguard
