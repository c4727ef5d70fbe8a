#include <memory>

#include "tests/support/store_conformance.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard::testing {
namespace {

class InMemoryStoreHarness {
 public:
  std::unique_ptr<Store> NewClient() { return store_.NewClient(); }

 private:
  InMemoryStore store_;
};

// The ages come from the store's Clock: with a ManualClock, exactly the time it was advanced by.
TEST(InMemoryStoreAges, AreTheClocksTimeSinceTheLastWrite) {
  ManualClock clock;
  InMemoryStore store(&clock);
  auto other = store.NewClient();
  PrefixStore prefixed("job", &store);
  ASSERT_TRUE(store.Set("hb/a", "1", kStoreTimeout).ok());
  ASSERT_TRUE(prefixed.Add("hb/b", 1, kStoreTimeout).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(store.Add("hb/a", 1, kStoreTimeout).ok());
  clock.Advance(absl::Seconds(2));
  // Neither a failed swap nor a CreateAndAdd of an existing key writes it.
  ASSERT_FALSE(store.CompareAndSet("hb/a", std::string("9"), "x", kStoreTimeout)->swapped);
  ASSERT_FALSE(*store.CreateAndAdd("hb/a", "y", "count", 1, kStoreTimeout));
  absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> aged =
      other->MultiGetWithAges({"hb/a", "job/hb/b", "hb/none"}, kStoreTimeout);
  ASSERT_TRUE(aged.ok()) << aged.status();
  ASSERT_TRUE((*aged)[0].has_value());
  EXPECT_EQ((*aged)[0]->value, "2");
  EXPECT_EQ((*aged)[0]->age, absl::Seconds(2));
  ASSERT_TRUE((*aged)[1].has_value());
  EXPECT_EQ((*aged)[1]->age, absl::Seconds(5));
  EXPECT_FALSE((*aged)[2].has_value());
  aged = prefixed.MultiGetWithAges({"hb/b"}, kStoreTimeout);
  ASSERT_TRUE(aged.ok()) << aged.status();
  EXPECT_EQ((*aged)[0]->age, absl::Seconds(5));
  // A SetAndAdd that fails (the counter holds text) leaves the key as written before.
  ASSERT_TRUE(store.Set("text", "t", kStoreTimeout).ok());
  clock.Advance(absl::Seconds(1));
  ASSERT_FALSE(store.SetAndAdd("hb/a", "z", "text", 1, kStoreTimeout).ok());
  aged = store.MultiGetWithAges({"hb/a"}, kStoreTimeout);
  EXPECT_EQ((*aged)[0]->value, "2");
  EXPECT_EQ((*aged)[0]->age, absl::Seconds(3));
}

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(InMemoryStore, StoreConformance, InMemoryStoreHarness);

}  // namespace trainguard::testing
