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
#include "trainguard/store.h"

namespace trainguard {
namespace {

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

}  // namespace
}  // namespace trainguard
