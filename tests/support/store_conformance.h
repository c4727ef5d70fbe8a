// The behaviour every Store implementation must have, as a typed test suite. An implementation's
// test binary defines a harness and instantiates the suite once:
//
//   class MyStoreHarness {
//    public:
//     MyStoreHarness();                        // start the service (a server, a real etcd, ...)
//     std::unique_ptr<Store> NewClient();      // a new, independent client connection
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(MyStore, StoreConformance, MyStoreHarness);
//
// Include this header in exactly one translation unit per binary.
#ifndef TRAINGUARD_TESTS_SUPPORT_STORE_CONFORMANCE_H_
#define TRAINGUARD_TESTS_SUPPORT_STORE_CONFORMANCE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard::testing {

inline constexpr absl::Duration kStoreTimeout = absl::Seconds(10);

template <typename Harness>
class StoreConformance : public ::testing::Test {
 protected:
  Harness harness_;
};

TYPED_TEST_SUITE_P(StoreConformance);

TYPED_TEST_P(StoreConformance, SetThenGetReturnsTheExactBytes) {
  auto store = this->harness_.NewClient();
  const std::string value("binary\0value\xff", 13);
  ASSERT_TRUE(store->Set("a/key", value, kStoreTimeout).ok());
  auto got = store->Get("a/key", kStoreTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(store->Set("a/key", "overwritten", kStoreTimeout).ok());
  EXPECT_EQ(*store->Get("a/key", kStoreTimeout), "overwritten");
}

TYPED_TEST_P(StoreConformance, AnotherClientSeesTheWrite) {
  auto writer = this->harness_.NewClient();
  auto reader = this->harness_.NewClient();
  ASSERT_TRUE(writer->Set("shared", "v", kStoreTimeout).ok());
  EXPECT_EQ(*reader->Get("shared", kStoreTimeout), "v");
}

TYPED_TEST_P(StoreConformance, GetOfAnAbsentKeyIsNotFoundNamingTheKey) {
  auto store = this->harness_.NewClient();
  auto got = store->Get("no/such/key", kStoreTimeout);
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("no/such/key"));
}

TYPED_TEST_P(StoreConformance, AnEmptyKeyIsRejected) {
  auto store = this->harness_.NewClient();
  EXPECT_TRUE(absl::IsInvalidArgument(store->Set("", "v", kStoreTimeout)));
}

TYPED_TEST_P(StoreConformance, AddStartsFromZeroAndAccumulates) {
  auto store = this->harness_.NewClient();
  EXPECT_EQ(*store->Add("counter", 5, kStoreTimeout), 5);
  EXPECT_EQ(*store->Add("counter", -2, kStoreTimeout), 3);
  EXPECT_EQ(*store->Get("counter", kStoreTimeout), "3");
}

TYPED_TEST_P(StoreConformance, AddOnANonIntegerIsFailedPrecondition) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("text", "hello", kStoreTimeout).ok());
  auto added = store->Add("text", 1, kStoreTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(added.status())) << added.status();
  EXPECT_EQ(*store->Get("text", kStoreTimeout), "hello");
}

TYPED_TEST_P(StoreConformance, ConcurrentAddsFromManyClientsSumExactly) {
  constexpr int kClients = 8;
  constexpr int kAddsEach = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      auto store = this->harness_.NewClient();
      for (int i = 0; i < kAddsEach; ++i) {
        if (!store->Add("sum", 1, kStoreTimeout).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*this->harness_.NewClient()->Add("sum", 0, kStoreTimeout), kClients * kAddsEach);
}

TYPED_TEST_P(StoreConformance, SetAndAddSetsTheValueThenReturnsTheCount) {
  auto store = this->harness_.NewClient();
  auto other = this->harness_.NewClient();
  absl::StatusOr<int64_t> count =
      store->SetAndAdd("sa/progress/0", "100", "sa/count", 1, kStoreTimeout);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 1);
  count = other->SetAndAdd("sa/progress/1", "-1", "sa/count", 1, kStoreTimeout);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 2);
  EXPECT_EQ(*store->Get("sa/progress/0", kStoreTimeout), "100");
  EXPECT_EQ(*store->Get("sa/progress/1", kStoreTimeout), "-1");
  EXPECT_EQ(*store->Get("sa/count", kStoreTimeout), "2");
  // The Add follows the Set: on the same key it adds to the value just set.
  count = store->SetAndAdd("sa/same", "40", "sa/same", 2, kStoreTimeout);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 42);
}

TYPED_TEST_P(StoreConformance, SetAndAddOfAStaleGenerationWritesNothing) {
  auto zombie = this->harness_.NewClient();
  auto current = this->harness_.NewClient();
  zombie->SetWriterGeneration(1);
  ASSERT_TRUE(current->RaiseFence(2, kStoreTimeout).ok());
  absl::StatusOr<int64_t> count =
      zombie->SetAndAdd("sz/progress", "7", "sz/count", 1, kStoreTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(count.status())) << count.status();
  EXPECT_TRUE(absl::IsNotFound(current->Get("sz/progress", kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsNotFound(current->Get("sz/count", kStoreTimeout).status()));
}

TYPED_TEST_P(StoreConformance, CompareAndSetSwapsOnlyOnAMatch) {
  auto store = this->harness_.NewClient();
  auto created = store->CompareAndSet("cas", std::nullopt, "one", kStoreTimeout);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->swapped);
  auto mismatch = store->CompareAndSet("cas", std::string("zero"), "two", kStoreTimeout);
  ASSERT_TRUE(mismatch.ok());
  EXPECT_FALSE(mismatch->swapped);
  EXPECT_EQ(mismatch->current, "one");
  auto absent_expected = store->CompareAndSet("cas", std::nullopt, "two", kStoreTimeout);
  EXPECT_FALSE(absent_expected->swapped);
  auto match = store->CompareAndSet("cas", std::string("one"), "two", kStoreTimeout);
  EXPECT_TRUE(match->swapped);
  EXPECT_EQ(match->current, "two");
  EXPECT_EQ(*store->Get("cas", kStoreTimeout), "two");
  auto on_absent = store->CompareAndSet("cas-absent", std::string("x"), "y", kStoreTimeout);
  EXPECT_FALSE(on_absent->swapped);
  EXPECT_EQ(on_absent->current, std::nullopt);
}

TYPED_TEST_P(StoreConformance, ARaceOfCompareAndSetsHasExactlyOneWinner) {
  constexpr int kClients = 8;
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto store = this->harness_.NewClient();
      auto r = store->CompareAndSet("leader", std::nullopt, absl::StrCat("rank", c), kStoreTimeout);
      if (r.ok() && r->swapped) ++winners;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TYPED_TEST_P(StoreConformance, DeleteSaysWhetherTheKeyExisted) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("doomed", "v", kStoreTimeout).ok());
  EXPECT_TRUE(*store->Delete("doomed", kStoreTimeout));
  EXPECT_FALSE(*store->Delete("doomed", kStoreTimeout));
  EXPECT_TRUE(absl::IsNotFound(store->Get("doomed", kStoreTimeout).status()));
}

TYPED_TEST_P(StoreConformance, MultiGetReturnsValuesInOrderWithGaps) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("m/a", "1", kStoreTimeout).ok());
  ASSERT_TRUE(store->Set("m/c", "3", kStoreTimeout).ok());
  auto values = store->MultiGet({"m/c", "m/b", "m/a"}, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::optional<std::string>("3"), std::nullopt,
                                              std::optional<std::string>("1")));
}

TYPED_TEST_P(StoreConformance, ListKeysReturnsTheSortedKeysWithThePrefix) {
  auto store = this->harness_.NewClient();
  for (const char* key : {"list/b", "list/a", "list/c/d", "listing", "other/a"}) {
    ASSERT_TRUE(store->Set(key, "v", kStoreTimeout).ok());
  }
  auto keys = store->ListKeys("list/", kStoreTimeout);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(*keys, ::testing::ElementsAre("list/a", "list/b", "list/c/d"));
}

TYPED_TEST_P(StoreConformance, WaitReturnsOnceEveryKeyExists) {
  auto waiter = this->harness_.NewClient();
  auto writer = this->harness_.NewClient();
  ASSERT_TRUE(writer->Set("w/first", "1", kStoreTimeout).ok());
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));  // the waiter is (very likely) blocked by now
    ASSERT_TRUE(writer->Set("w/second", "2", kStoreTimeout).ok());
  });
  absl::Status s = waiter->Wait({"w/first", "w/second"}, kStoreTimeout);
  later.join();
  EXPECT_TRUE(s.ok()) << s;
}

TYPED_TEST_P(StoreConformance, WaitTimesOutNamingTheMissingKeys) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("t/present", "1", kStoreTimeout).ok());
  absl::Status s = store->Wait({"t/present", "t/missing"}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("t/missing"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("t/present")));
}

TYPED_TEST_P(StoreConformance, WaitAnyReturnsTheIndexOfTheKeyThatAppears) {
  auto waiter = this->harness_.NewClient();
  auto writer = this->harness_.NewClient();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));  // the waiter is (very likely) blocked by now
    ASSERT_TRUE(writer->Set("any/second", "2", kStoreTimeout).ok());
  });
  absl::StatusOr<size_t> found =
      waiter->WaitAny({"any/first", "any/second", "any/third"}, kStoreTimeout);
  later.join();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 1u);
}

TYPED_TEST_P(StoreConformance, WaitAnyOfKeysAlreadyPresentReturnsTheFirstOfThemAtOnce) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("now/c", "3", kStoreTimeout).ok());
  ASSERT_TRUE(store->Set("now/b", "2", kStoreTimeout).ok());
  absl::StatusOr<size_t> found = store->WaitAny({"now/a", "now/b", "now/c"}, kStoreTimeout);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 1u);
}

TYPED_TEST_P(StoreConformance, WaitAnyTimesOutNamingTheKeys) {
  auto store = this->harness_.NewClient();
  absl::StatusOr<size_t> found = store->WaitAny({"none/one", "none/two"}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(found.status())) << found.status();
  EXPECT_THAT(std::string(found.status().message()), ::testing::HasSubstr("none/one"));
  EXPECT_THAT(std::string(found.status().message()), ::testing::HasSubstr("none/two"));
}

TYPED_TEST_P(StoreConformance, WaitAnyOfNoKeyOrAnEmptyKeyIsRejected) {
  auto store = this->harness_.NewClient();
  EXPECT_TRUE(absl::IsInvalidArgument(store->WaitAny({}, kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->WaitAny({"k", ""}, kStoreTimeout).status()));
}

TYPED_TEST_P(StoreConformance, WaitAndReadReturnsTheReadValuesOnceEveryAwaitedKeyExists) {
  auto waiter = this->harness_.NewClient();
  auto writer = this->harness_.NewClient();
  ASSERT_TRUE(writer->Set("wr/first", "1", kStoreTimeout).ok());
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));  // the waiter is (very likely) blocked by now
    ASSERT_TRUE(writer->Set("wr/second", "2", kStoreTimeout).ok());
  });
  absl::StatusOr<std::vector<std::optional<std::string>>> values = waiter->WaitAndRead(
      {"wr/first", "wr/second"}, {"wr/second", "wr/absent", "wr/first"}, kStoreTimeout);
  later.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::optional<std::string>("2"), std::nullopt,
                                              std::optional<std::string>("1")));
  // Keys present already: answered at once, with what they hold now.
  ASSERT_TRUE(writer->Set("wr/second", "22", kStoreTimeout).ok());
  values = waiter->WaitAndRead({"wr/second"}, {"wr/second"}, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::optional<std::string>("22")));
}

TYPED_TEST_P(StoreConformance, WaitAndReadTimesOutNamingTheMissingKeys) {
  auto store = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("wrt/present", "1", kStoreTimeout).ok());
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store->WaitAndRead({"wrt/present", "wrt/missing"}, {"wrt/present"}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(values.status())) << values.status();
  EXPECT_THAT(std::string(values.status().message()), ::testing::HasSubstr("wrt/missing"));
}

TYPED_TEST_P(StoreConformance, WaitAnyAndReadReturnsTheKeyFoundAndTheValuesReadWithIt) {
  auto waiter = this->harness_.NewClient();
  auto writer = this->harness_.NewClient();
  // Written as one batch, so whether the waiter parks before or after it, a key found present
  // comes with the whole batch read.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));  // the waiter is (very likely) parked by now
    ASSERT_TRUE(
        writer
            ->WriteBatch({BatchWrite::Set("war/second", "2"), BatchWrite::Set("war/value", "v")},
                         kStoreTimeout)
            .ok());
  });
  absl::StatusOr<AnyKeyAndValues> found = waiter->WaitAnyAndRead(
      {"war/first", "war/second"}, {"war/value", "war/absent"}, kStoreTimeout);
  later.join();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->index, 1u);
  EXPECT_THAT(found->values, ::testing::ElementsAre(std::optional<std::string>("v"), std::nullopt));
  // A key present already: answered at once, the lowest index present, with what it reads now.
  ASSERT_TRUE(writer->Set("war/first", "1", kStoreTimeout).ok());
  ASSERT_TRUE(writer->Set("war/value", "w", kStoreTimeout).ok());
  found = waiter->WaitAnyAndRead({"war/second", "war/first"}, {"war/value"}, kStoreTimeout);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->index, 0u);
  EXPECT_THAT(found->values, ::testing::ElementsAre(std::optional<std::string>("w")));
  // Nothing to read: the index alone.
  found = waiter->WaitAnyAndRead({"war/none", "war/first"}, {}, kStoreTimeout);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->index, 1u);
  EXPECT_TRUE(found->values.empty());
}

TYPED_TEST_P(StoreConformance, WaitAnyAndReadTimesOutNamingTheKeysAndRefusesNoKey) {
  auto store = this->harness_.NewClient();
  absl::StatusOr<AnyKeyAndValues> found =
      store->WaitAnyAndRead({"wart/one", "wart/two"}, {"wart/one"}, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(found.status())) << found.status();
  EXPECT_THAT(std::string(found.status().message()), ::testing::HasSubstr("wart/two"));
  EXPECT_TRUE(absl::IsInvalidArgument(store->WaitAnyAndRead({}, {"k"}, kStoreTimeout).status()));
}

TYPED_TEST_P(StoreConformance, AFenceRejectsEveryWriteOfAStaleGeneration) {
  auto zombie = this->harness_.NewClient();
  auto current = this->harness_.NewClient();
  auto launcher = this->harness_.NewClient();  // unfenced
  zombie->SetWriterGeneration(1);
  current->SetWriterGeneration(2);
  ASSERT_TRUE(zombie->Set("state", "gen1", kStoreTimeout).ok());
  ASSERT_TRUE(current->RaiseFence(2, kStoreTimeout).ok());

  absl::Status set = zombie->Set("state", "zombie", kStoreTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(set)) << set;
  EXPECT_THAT(std::string(set.message()), ::testing::HasSubstr("stale generation 1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(zombie->Add("n", 1, kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      zombie->CompareAndSet("state", std::string("gen1"), "z", kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(zombie->Delete("state", kStoreTimeout).status()));
  EXPECT_EQ(*zombie->Get("state", kStoreTimeout), "gen1") << "reads stay allowed";

  EXPECT_TRUE(current->Set("state", "gen2", kStoreTimeout).ok());
  EXPECT_TRUE(launcher->Set("launcher/key", "ok", kStoreTimeout).ok());
  ASSERT_TRUE(current->RaiseFence(1, kStoreTimeout).ok());  // never lowers
  EXPECT_TRUE(absl::IsFailedPrecondition(zombie->Set("state", "again", kStoreTimeout)));
  EXPECT_EQ(*launcher->Get("state", kStoreTimeout), "gen2");
}

TYPED_TEST_P(StoreConformance, CreateAndAddCountsOnlyTheCallThatCreatesTheKey) {
  auto store = this->harness_.NewClient();
  auto stale = this->harness_.NewClient();
  absl::StatusOr<bool> created =
      store->CreateAndAdd("ca/rank/1", "40", "ca/count", 1, kStoreTimeout);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  created = store->CreateAndAdd("ca/rank/1", "41", "ca/count", 1, kStoreTimeout);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(*created);
  ASSERT_TRUE(store->CreateAndAdd("ca/rank/0", "40", "ca/count", 1, kStoreTimeout).ok());
  EXPECT_EQ(*store->Get("ca/rank/1", kStoreTimeout), "40");
  EXPECT_EQ(*store->Get("ca/count", kStoreTimeout), "2");
  ASSERT_TRUE(store->RaiseFence(3, kStoreTimeout).ok());
  stale->SetWriterGeneration(2);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      stale->CreateAndAdd("ca/rank/2", "40", "ca/count", 1, kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsNotFound(store->Get("ca/rank/2", kStoreTimeout).status()));
  EXPECT_EQ(*store->Get("ca/count", kStoreTimeout), "2");
}

TYPED_TEST_P(StoreConformance, WriteBatchAppliesItsWritesInOrderAndAnswersEach) {
  auto store = this->harness_.NewClient();
  auto stale = this->harness_.NewClient();
  ASSERT_TRUE(store->Set("wb/held", "yes", kStoreTimeout).ok());
  absl::StatusOr<std::vector<CompareAndSetResult>> results =
      store->WriteBatch({BatchWrite::Set("wb/table", "t"),
                         BatchWrite::CompareAndSet("wb/claim", std::nullopt, "mine"),
                         BatchWrite::CompareAndSet("wb/held", std::string("no"), "overwritten"),
                         BatchWrite::RaiseFence(3), BatchWrite::Set("wb/current", "3")},
                        kStoreTimeout);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 5u);
  EXPECT_TRUE((*results)[0].swapped);
  EXPECT_EQ((*results)[0].current, "t");
  EXPECT_TRUE((*results)[1].swapped);
  EXPECT_EQ((*results)[1].current, "mine");
  // A compare-and-set that does not match is skipped, with what its key holds; the rest applies.
  EXPECT_FALSE((*results)[2].swapped);
  EXPECT_EQ((*results)[2].current, "yes");
  EXPECT_TRUE((*results)[3].swapped);
  EXPECT_TRUE((*results)[4].swapped);
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store->MultiGet({"wb/table", "wb/claim", "wb/held", "wb/current"}, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre("t", "mine", "yes", "3"));
  // The fence the batch raised holds for every later write.
  stale->SetWriterGeneration(2);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale->Set("wb/table", "zombie", kStoreTimeout)));
  // A compare-and-set of an absent key that is present now is skipped too.
  results = store->WriteBatch({BatchWrite::CompareAndSet("wb/claim", std::nullopt, "theirs")},
                              kStoreTimeout);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_FALSE((*results)[0].swapped);
  EXPECT_EQ((*results)[0].current, "mine");
  // An empty batch writes nothing.
  results = store->WriteBatch({}, kStoreTimeout);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(results->empty());
}

TYPED_TEST_P(StoreConformance, AWaiterWokenByABatchsFirstKeyReadsItsLast) {
  auto waiter = this->harness_.NewClient();
  auto writer = this->harness_.NewClient();
  absl::StatusOr<std::vector<std::optional<std::string>>> values;
  std::thread waiting([&] {
    values = waiter->WaitAndRead({"wba/table"}, {"wba/table", "wba/changes", "wba/current"},
                                 kStoreTimeout);
  });
  ASSERT_TRUE(
      writer
          ->WriteBatch({BatchWrite::Set("wba/table", "t"), BatchWrite::Set("wba/changes", "c"),
                        BatchWrite::Set("wba/current", "1")},
                       kStoreTimeout)
          .ok());
  waiting.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre("t", "c", "1"));
}

TYPED_TEST_P(StoreConformance, AMalformedOrStaleBatchWritesNothing) {
  auto store = this->harness_.NewClient();
  auto stale = this->harness_.NewClient();
  const std::vector<std::vector<BatchWrite>> malformed = {
      {BatchWrite::Set("wbm/a", "1"), BatchWrite::Set("", "2")},
      {BatchWrite::Set("wbm/a", "1"), BatchWrite::CompareAndSet("wbm/a", std::nullopt, "2")},
      {BatchWrite::Set("wbm/a", "1"), BatchWrite::RaiseFence(1), BatchWrite::RaiseFence(2)},
      std::vector<BatchWrite>(Store::kMaxBatchWrites + 1, BatchWrite::RaiseFence(1)),
  };
  for (const std::vector<BatchWrite>& batch : malformed) {
    absl::StatusOr<std::vector<CompareAndSetResult>> refused =
        store->WriteBatch(batch, kStoreTimeout);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("batch"));
  }
  EXPECT_TRUE(absl::IsNotFound(store->Get("wbm/a", kStoreTimeout).status()));
  // A writer below the fence: refused whole, its fence raise included.
  ASSERT_TRUE(store->RaiseFence(5, kStoreTimeout).ok());
  stale->SetWriterGeneration(4);
  absl::StatusOr<std::vector<CompareAndSetResult>> refused = stale->WriteBatch(
      {BatchWrite::Set("wbm/b", "1"), BatchWrite::CompareAndSet("wbm/c", std::nullopt, "1"),
       BatchWrite::RaiseFence(9)},
      kStoreTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("stale generation 4"));
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store->MultiGet({"wbm/b", "wbm/c"}, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::nullopt, std::nullopt));
  auto generation_six = this->harness_.NewClient();
  generation_six->SetWriterGeneration(6);
  EXPECT_TRUE(generation_six->Set("wbm/b", "6", kStoreTimeout).ok()) << "the fence stayed at 5";
  // The fence is checked once, before the batch: a batch raising it above its own writer's
  // generation still writes what follows the raise.
  absl::StatusOr<std::vector<CompareAndSetResult>> raised = generation_six->WriteBatch(
      {BatchWrite::RaiseFence(7), BatchWrite::Set("wbm/after", "1")}, kStoreTimeout);
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(*store->Get("wbm/after", kStoreTimeout), "1");
  EXPECT_TRUE(absl::IsFailedPrecondition(generation_six->Set("wbm/b", "x", kStoreTimeout)));
}

TYPED_TEST_P(StoreConformance, PrefixStoresAreIsolatedNamespaces) {
  auto base = this->harness_.NewClient();
  PrefixStore job_a("jobA", base.get());
  PrefixStore job_b("jobB", base.get());
  ASSERT_TRUE(job_a.Set("rank/0", "a", kStoreTimeout).ok());
  ASSERT_TRUE(job_b.Set("rank/0", "b", kStoreTimeout).ok());
  EXPECT_EQ(*job_a.Get("rank/0", kStoreTimeout), "a");
  EXPECT_EQ(*base->Get("jobB/rank/0", kStoreTimeout), "b");
  EXPECT_THAT(*job_a.ListKeys("rank/", kStoreTimeout), ::testing::ElementsAre("rank/0"));
  EXPECT_TRUE(job_b.Wait({"rank/0"}, kStoreTimeout).ok());
  absl::StatusOr<size_t> found = job_b.WaitAny({"rank/1", "rank/0"}, kStoreTimeout);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, 1u);
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      job_b.WaitAndRead({"rank/0"}, {"rank/0", "rank/1"}, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ::testing::ElementsAre(std::optional<std::string>("b"), std::nullopt));
  absl::StatusOr<std::vector<CompareAndSetResult>> batch =
      job_a.WriteBatch({BatchWrite::Set("rank/1", "a1"),
                        BatchWrite::CompareAndSet("rank/0", std::string("a"), "a0")},
                       kStoreTimeout);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE((*batch)[1].swapped);
  EXPECT_EQ(*base->Get("jobA/rank/1", kStoreTimeout), "a1");
  EXPECT_EQ(*base->Get("jobA/rank/0", kStoreTimeout), "a0");
  EXPECT_EQ(*base->Get("jobB/rank/0", kStoreTimeout), "b");
}

TYPED_TEST_P(StoreConformance, AOneMebibyteValueRoundTrips) {
  auto store = this->harness_.NewClient();
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  ASSERT_TRUE(store->Set("big", big, kStoreTimeout).ok());
  EXPECT_EQ(*store->Get("big", kStoreTimeout), big);
}

// The ages are bounded by what the test itself saw of the time (the store's clock is this
// machine's monotonic clock here, as the test's): never longer than since just before the write,
// never shorter than from the write's return to the read's call. A store that keeps no write
// instants says Unimplemented, and the callers fall back to watching values change.
TYPED_TEST_P(StoreConformance, MultiGetWithAgesSaysHowLongAgoEachKeyWasLastWritten) {
  auto store = this->harness_.NewClient();
  auto other = this->harness_.NewClient();
  Clock* clock = Clock::Real();
  const int64_t before_set = clock->MonotonicNanos();
  ASSERT_TRUE(store->Set("aged/set", "v", kStoreTimeout).ok());
  ASSERT_TRUE(store->Add("aged/added", 1, kStoreTimeout).ok());
  const int64_t written = clock->MonotonicNanos();
  // A swap that does not happen is no write.
  ASSERT_FALSE(store->CompareAndSet("aged/set", std::string("other"), "w", kStoreTimeout)->swapped);
  const int64_t before_read = clock->MonotonicNanos();
  absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> aged =
      other->MultiGetWithAges({"aged/set", "aged/absent", "aged/added"}, kStoreTimeout);
  const int64_t after_read = clock->MonotonicNanos();
  // A store that keeps no write instants (etcd) says so; its callers then watch values change.
  if (absl::IsUnimplemented(aged.status())) {
    EXPECT_THAT(std::string(aged.status().message()), ::testing::HasSubstr("when its keys"));
    return;
  }
  ASSERT_TRUE(aged.ok()) << aged.status();
  ASSERT_EQ(aged->size(), 3u);
  ASSERT_TRUE((*aged)[0].has_value());
  EXPECT_EQ((*aged)[0]->value, "v");
  EXPECT_LE((*aged)[0]->age, absl::Nanoseconds(after_read - before_set));
  EXPECT_GE((*aged)[0]->age, absl::Nanoseconds(before_read - written));
  EXPECT_FALSE((*aged)[1].has_value());
  ASSERT_TRUE((*aged)[2].has_value());
  EXPECT_EQ((*aged)[2]->value, "1");
  EXPECT_GE((*aged)[2]->age, absl::ZeroDuration());

  // A rewrite of the same value starts the age afresh; a Delete forgets the key.
  const int64_t before_rewrite = clock->MonotonicNanos();
  ASSERT_TRUE(store->WriteBatch({BatchWrite::Set("aged/added", "1")}, kStoreTimeout).ok());
  ASSERT_TRUE(*store->Delete("aged/set", kStoreTimeout));
  aged = other->MultiGetWithAges({"aged/set", "aged/added"}, kStoreTimeout);
  const int64_t after_reread = clock->MonotonicNanos();
  ASSERT_TRUE(aged.ok()) << aged.status();
  EXPECT_FALSE((*aged)[0].has_value());
  ASSERT_TRUE((*aged)[1].has_value());
  EXPECT_LE((*aged)[1]->age, absl::Nanoseconds(after_reread - before_rewrite));

  // Through a PrefixStore: the same keys' ages, under the prefix.
  PrefixStore prefixed("aged", store.get());
  aged = prefixed.MultiGetWithAges({"added", "set"}, kStoreTimeout);
  ASSERT_TRUE(aged.ok()) << aged.status();
  ASSERT_TRUE((*aged)[0].has_value());
  EXPECT_EQ((*aged)[0]->value, "1");
  EXPECT_FALSE((*aged)[1].has_value());
}

REGISTER_TYPED_TEST_SUITE_P(
    StoreConformance, SetThenGetReturnsTheExactBytes, AnotherClientSeesTheWrite,
    GetOfAnAbsentKeyIsNotFoundNamingTheKey, AnEmptyKeyIsRejected, AddStartsFromZeroAndAccumulates,
    AddOnANonIntegerIsFailedPrecondition, ConcurrentAddsFromManyClientsSumExactly,
    SetAndAddSetsTheValueThenReturnsTheCount, SetAndAddOfAStaleGenerationWritesNothing,
    CompareAndSetSwapsOnlyOnAMatch, ARaceOfCompareAndSetsHasExactlyOneWinner,
    DeleteSaysWhetherTheKeyExisted, MultiGetReturnsValuesInOrderWithGaps,
    ListKeysReturnsTheSortedKeysWithThePrefix, WaitReturnsOnceEveryKeyExists,
    WaitTimesOutNamingTheMissingKeys, WaitAnyReturnsTheIndexOfTheKeyThatAppears,
    WaitAnyOfKeysAlreadyPresentReturnsTheFirstOfThemAtOnce, WaitAnyTimesOutNamingTheKeys,
    WaitAnyOfNoKeyOrAnEmptyKeyIsRejected, WaitAndReadReturnsTheReadValuesOnceEveryAwaitedKeyExists,
    WaitAndReadTimesOutNamingTheMissingKeys, WaitAnyAndReadReturnsTheKeyFoundAndTheValuesReadWithIt,
    WaitAnyAndReadTimesOutNamingTheKeysAndRefusesNoKey, AFenceRejectsEveryWriteOfAStaleGeneration,
    CreateAndAddCountsOnlyTheCallThatCreatesTheKey, WriteBatchAppliesItsWritesInOrderAndAnswersEach,
    AWaiterWokenByABatchsFirstKeyReadsItsLast, AMalformedOrStaleBatchWritesNothing,
    PrefixStoresAreIsolatedNamespaces, AOneMebibyteValueRoundTrips,
    MultiGetWithAgesSaysHowLongAgoEachKeyWasLastWritten);

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_STORE_CONFORMANCE_H_
