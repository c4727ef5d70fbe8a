#include "sdk/host_agent/turn_read_store.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/agent_connection.h"
#include "tests/support/counting_store.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::Optional;

constexpr absl::Duration kCall = absl::Seconds(1);

class TurnReadStoreTest : public ::testing::Test {
 protected:
  int64_t Requests() {
    int64_t n = 0;
    for (const auto& [what, count] : counted_.counts()) n += count;
    return n;
  }

  InMemoryStore store_;
  testing::AgentConnection link_{&store_};
  testing::CountingStore counted_{&link_};
  TurnReadStore turn_{&counted_};
};

// A turn's Gets of its keys cost the store the turn's one MultiGet, absent keys included, and
// answer as of the turn's start: a write by another client is seen at the next turn.
TEST_F(TurnReadStoreTest, ATurnsReadsAreAnsweredFromItsOneRequest) {
  ASSERT_TRUE(store_.Set("job/done", "yes", kCall).ok());
  ASSERT_TRUE(turn_.BeginTurn({"job/done", "job/failed"}, kCall).ok());
  ASSERT_TRUE(store_.Set("job/failed", "rank 3 died", kCall).ok());  // another agent, meanwhile
  EXPECT_EQ(*turn_.Get("job/done", kCall), "yes");
  absl::StatusOr<std::string> failed = turn_.Get("job/failed", kCall);
  EXPECT_TRUE(absl::IsNotFound(failed.status())) << failed.status();
  EXPECT_THAT(*turn_.MultiGet({"job/failed", "job/done"}, kCall),
              ElementsAre(std::nullopt, Optional(std::string("yes"))));
  EXPECT_EQ(Requests(), 1);
  EXPECT_EQ(turn_.reads_answered(), 3);

  turn_.EndTurn();
  EXPECT_EQ(*turn_.Get("job/failed", kCall), "rank 3 died");
  EXPECT_EQ(Requests(), 2);
}

// A key outside the turn, or a MultiGet naming one, goes to the store; a write through this store
// drops the key written, so its writer reads what it wrote.
TEST_F(TurnReadStoreTest, OtherKeysGoToTheStoreAndAWriteIsReadBack) {
  ASSERT_TRUE(turn_.BeginTurn({"coord/lease", "rdzv/current"}, kCall).ok());
  EXPECT_TRUE(absl::IsNotFound(turn_.Get("agents/plan", kCall).status()));
  EXPECT_THAT(*turn_.MultiGet({"coord/lease", "agents/plan"}, kCall),
              ElementsAre(std::nullopt, std::nullopt));
  EXPECT_EQ(Requests(), 3);

  ASSERT_TRUE(turn_.Set("rdzv/current", "4", kCall).ok());
  EXPECT_EQ(*turn_.Get("rdzv/current", kCall), "4");
  absl::StatusOr<CompareAndSetResult> taken =
      turn_.CompareAndSet("coord/lease", std::nullopt, "1 h1 0", kCall);
  ASSERT_TRUE(taken.ok() && taken->swapped);
  EXPECT_EQ(*turn_.Get("coord/lease", kCall), "1 h1 0");
  ASSERT_TRUE(turn_.BeginTurn({"n"}, kCall).ok());
  ASSERT_EQ(*turn_.Add("n", 2, kCall), 2);
  EXPECT_EQ(*turn_.Get("n", kCall), "2");
  ASSERT_TRUE(*turn_.Delete("n", kCall));
  EXPECT_TRUE(absl::IsNotFound(turn_.Get("n", kCall).status()));
  ASSERT_TRUE(turn_.BeginTurn({"v", "count"}, kCall).ok());
  ASSERT_EQ(*turn_.SetAndAdd("v", "x", "count", 1, kCall), 1);
  EXPECT_EQ(*turn_.Get("v", kCall), "x");
  EXPECT_EQ(*turn_.Get("count", kCall), "1");
}

// A turn whose read fails holds nothing: every Get goes to the store, and fails or not there.
TEST_F(TurnReadStoreTest, ATurnWhoseReadFailedHoldsNothing) {
  ASSERT_TRUE(store_.Set("job/done", "yes", kCall).ok());
  ASSERT_TRUE(turn_.BeginTurn({"job/done"}, kCall).ok());
  link_.cut_off = true;
  EXPECT_FALSE(turn_.BeginTurn({"job/done"}, kCall).ok());
  EXPECT_TRUE(absl::IsUnavailable(turn_.Get("job/done", kCall).status()));
  link_.cut_off = false;
  EXPECT_EQ(*turn_.Get("job/done", kCall), "yes");
  EXPECT_EQ(turn_.reads_answered(), 0);
}

}  // namespace
}  // namespace trainguard
