// StoreState, the TcpStore server's data and parked Waits, driven directly: requests in, responses
// and completions out, time passed in.
#include "sdk/rendezvous/store_state.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr char kJob[] = "job";
constexpr uint64_t kSession = 7;
const absl::Time kStart = absl::FromUnixSeconds(1000);

class StoreStateTest : public ::testing::Test {
 protected:
  proto::StoreResponse Set(const std::string& key) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    request.mutable_set()->set_key(key);
    request.mutable_set()->set_value("v");
    return *state_.Execute(kSession, kJob, request, kStart);
  }
  proto::StoreResponse Set(const std::string& key, const std::string& value) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    request.mutable_set()->set_key(key);
    request.mutable_set()->set_value(value);
    return *state_.Execute(kSession, kJob, request, kStart);
  }
  proto::StoreResponse Delete(const std::string& key) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    request.mutable_delete_key()->set_key(key);
    return *state_.Execute(kSession, kJob, request, kStart);
  }
  // Parks a Wait on `keys` (nullopt from Execute), or returns its immediate answer.
  std::optional<proto::StoreResponse> Wait(const std::vector<std::string>& keys,
                                           absl::Duration timeout) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    for (const std::string& key : keys) request.mutable_wait()->add_keys(key);
    request.mutable_wait()->set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    return state_.Execute(kSession, kJob, request, kStart);
  }
  // A WaitAndRead: a Wait on `keys` that reads `read` once they exist.
  std::optional<proto::StoreResponse> WaitAndRead(const std::vector<std::string>& keys,
                                                  const std::vector<std::string>& read,
                                                  absl::Duration timeout) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    for (const std::string& key : keys) request.mutable_wait()->add_keys(key);
    for (const std::string& key : read) request.mutable_wait()->add_read_keys(key);
    request.mutable_wait()->set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    return state_.Execute(kSession, kJob, request, kStart);
  }

  StoreState state_{64 << 20};
  uint64_t next_id_ = 1;
};

std::vector<std::string> Keys(int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(absl::StrCat("rdzv/join/", i));
  return keys;
}

TEST_F(StoreStateTest, AWaitOnKeysWrittenOneByOneCostsLookupsLinearInItsKeys) {
  constexpr int kKeys = 2000;
  const std::vector<std::string> keys = Keys(kKeys);
  ASSERT_EQ(Wait(keys, absl::Seconds(60)), std::nullopt);
  for (int i = 0; i + 1 < kKeys; ++i) {
    ASSERT_TRUE(Set(keys[i]).code() == 0);
    ASSERT_THAT(state_.TakeCompletions(), IsEmpty()) << "answered before key " << i + 1;
  }
  ASSERT_TRUE(Set(keys.back()).code() == 0);
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  EXPECT_EQ(done[0].response.code(), 0) << done[0].response.message();
  // Each write resumes the scan where the last one stopped; the last write checks every key once
  // more. Rescanning from the first key at each write would cost kKeys^2 / 2.
  EXPECT_LE(state_.parked_wait_lookups(), 3u * kKeys);
  EXPECT_EQ(state_.parked_waits(), 0u);
}

TEST_F(StoreStateTest, AWaitIsAnsweredOnlyOnceEveryKeyExistsAtOnce) {
  const std::vector<std::string> keys = Keys(3);
  ASSERT_EQ(Wait(keys, absl::Seconds(60)), std::nullopt);
  Set(keys[0]);
  Set(keys[1]);
  // The scan passed key 0; a Delete takes it away before the last key appears.
  Delete(keys[0]);
  Set(keys[2]);
  EXPECT_THAT(state_.TakeCompletions(), IsEmpty());
  EXPECT_EQ(state_.parked_waits(), 1u);
  Set(keys[0]);
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  EXPECT_EQ(done[0].response.code(), 0) << done[0].response.message();
}

TEST_F(StoreStateTest, AWaitRunningOutNamesAFewMissingKeysAndCountsTheRest) {
  const std::vector<std::string> keys = Keys(100);
  Set(keys[0]);
  ASSERT_EQ(Wait(keys, absl::Seconds(1)), std::nullopt);
  state_.ExpireWaits(kStart + absl::Seconds(1));
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  const std::string message = done[0].response.message();
  EXPECT_EQ(done[0].response.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(message, HasSubstr("waited 1s for store keys; still missing: rdzv/join/1, "));
  EXPECT_THAT(message, HasSubstr("rdzv/join/8 and 91 more (99 of 100 keys)"));
  EXPECT_THAT(message, Not(HasSubstr("rdzv/join/9,")));
}

TEST_F(StoreStateTest, AWaitOnAFewKeysNamesEveryMissingOne) {
  std::optional<proto::StoreResponse> answer = Wait({"a", "b"}, absl::ZeroDuration());
  ASSERT_NE(answer, std::nullopt);
  EXPECT_EQ(answer->message(), "waited 0 for store keys; still missing: a, b");
}

// The values of a response's `values`, "-" for an absent key.
std::vector<std::string> ValuesOf(const proto::StoreResponse& response) {
  std::vector<std::string> values;
  for (const proto::OptionalValue& value : response.values()) {
    values.push_back(value.present() ? value.value() : "-");
  }
  return values;
}

TEST_F(StoreStateTest, ASetAndAddWhoseAddFailsWritesNeitherKey) {
  Set("count", "not a number");
  proto::StoreRequest request;
  request.set_request_id(next_id_++);
  request.mutable_set()->set_key("progress/3");
  request.mutable_set()->set_value("100");
  request.mutable_set()->set_add_key("count");
  request.mutable_set()->set_add_delta(1);
  ASSERT_TRUE(ValidateStoreRequest(request).ok());
  proto::StoreResponse response = *state_.Execute(kSession, kJob, request, kStart);
  EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(response.message(), HasSubstr("store key count holds a non-integer value"));
  proto::StoreRequest get;
  get.set_request_id(next_id_++);
  get.mutable_get()->set_key("progress/3");
  EXPECT_EQ(state_.Execute(kSession, kJob, get, kStart)->code(),
            static_cast<int>(absl::StatusCode::kNotFound));
}

TEST_F(StoreStateTest, ASetAndAddAnswersAWaitOnEitherKey) {
  ASSERT_EQ(WaitAndRead({"progress/0", "count"}, {"count"}, absl::Seconds(60)), std::nullopt);
  proto::StoreRequest request;
  request.set_request_id(next_id_++);
  request.mutable_set()->set_key("progress/0");
  request.mutable_set()->set_value("5");
  request.mutable_set()->set_add_key("count");
  request.mutable_set()->set_add_delta(1);
  proto::StoreResponse response = *state_.Execute(kSession, kJob, request, kStart);
  EXPECT_EQ(response.code(), 0) << response.message();
  EXPECT_TRUE(response.flag());
  EXPECT_EQ(response.number(), 1);
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  EXPECT_THAT(ValuesOf(done[0].response), ::testing::ElementsAre("1"));
}

TEST_F(StoreStateTest, ACreateAndAddWritesNeitherKeyWhenTheKeyExistsOrTheAddFails) {
  auto create_and_add = [&](const std::string& key) {
    proto::StoreRequest request;
    request.set_request_id(next_id_++);
    request.mutable_set()->set_key(key);
    request.mutable_set()->set_value("100");
    request.mutable_set()->set_add_key("count");
    request.mutable_set()->set_add_delta(1);
    request.mutable_set()->set_only_if_absent(true);
    EXPECT_TRUE(ValidateStoreRequest(request).ok());
    return *state_.Execute(kSession, kJob, request, kStart);
  };
  proto::StoreResponse first = create_and_add("resumed/0");
  EXPECT_EQ(first.code(), 0) << first.message();
  EXPECT_TRUE(first.flag());
  EXPECT_EQ(first.number(), 1);
  proto::StoreResponse again = create_and_add("resumed/0");
  EXPECT_EQ(again.code(), 0) << again.message();
  EXPECT_FALSE(again.flag());
  Set("count", "not a number");
  proto::StoreResponse failed = create_and_add("resumed/1");
  EXPECT_EQ(failed.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  proto::StoreRequest get;
  get.set_request_id(next_id_++);
  get.mutable_get()->set_key("resumed/1");
  EXPECT_EQ(state_.Execute(kSession, kJob, get, kStart)->code(),
            static_cast<int>(absl::StatusCode::kNotFound));
}

TEST_F(StoreStateTest, ASetThatAddsToNoKeyIsRefused) {
  proto::StoreRequest request;
  request.set_request_id(1);
  request.mutable_set()->set_key("k");
  request.mutable_set()->set_add_delta(1);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateStoreRequest(request)));
}

// A WriteBatch request of `writes` (a BatchWriteOp each).
proto::StoreRequest BatchRequest(uint64_t id, const std::vector<proto::BatchWriteOp>& writes) {
  proto::StoreRequest request;
  request.set_request_id(id);
  for (const proto::BatchWriteOp& write : writes)
    *request.mutable_write_batch()->add_writes() = write;
  return request;
}
proto::BatchWriteOp SetWrite(const std::string& key, const std::string& value) {
  proto::BatchWriteOp write;
  write.mutable_set()->set_key(key);
  write.mutable_set()->set_value(value);
  return write;
}

TEST_F(StoreStateTest, AWaitWokenByABatchsFirstKeyIsAnsweredAfterItsLastWrite) {
  // Parked on the first key of the batch, reading the last: answered with both, never between.
  ASSERT_EQ(WaitAndRead({"gen/1/table"}, {"gen/1/changes", "current"}, absl::Seconds(60)),
            std::nullopt);
  ASSERT_EQ(Wait({"current"}, absl::Seconds(60)), std::nullopt);
  proto::BatchWriteOp fence;
  fence.mutable_raise_fence()->set_generation(1);
  proto::StoreRequest batch =
      BatchRequest(next_id_++, {SetWrite("gen/1/table", "t"), SetWrite("gen/1/changes", "c"), fence,
                                SetWrite("current", "1")});
  ASSERT_TRUE(ValidateStoreRequest(batch).ok());
  proto::StoreResponse response = *state_.Execute(kSession, kJob, batch, kStart);
  EXPECT_EQ(response.code(), 0) << response.message();
  EXPECT_THAT(response.flags(), ::testing::ElementsAre(true, true, true, true));
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(2));
  EXPECT_THAT(ValuesOf(done[0].response), ::testing::ElementsAre("c", "1"));
  EXPECT_EQ(done[1].response.code(), 0);
  EXPECT_EQ(state_.parked_waits(), 0u);
}

TEST_F(StoreStateTest, AMalformedBatchIsRefusedBeforeAnythingIsWritten) {
  proto::BatchWriteOp adds = SetWrite("count", "1");
  adds.mutable_set()->set_add_key("other");
  adds.mutable_set()->set_add_delta(1);
  const std::vector<std::vector<proto::BatchWriteOp>> malformed = {
      {SetWrite("a", "1"), SetWrite("", "2")},
      {SetWrite("a", "1"), SetWrite("a", "2")},
      {SetWrite("a", "1"), adds},
      {SetWrite("a", "1"), proto::BatchWriteOp()},
  };
  for (const std::vector<proto::BatchWriteOp>& writes : malformed) {
    absl::Status valid = ValidateStoreRequest(BatchRequest(next_id_++, writes));
    EXPECT_TRUE(absl::IsInvalidArgument(valid)) << valid;
    EXPECT_THAT(valid.message(), HasSubstr("write 1 of a store batch"));
  }
}

TEST_F(StoreStateTest, AParkedWaitAndReadIsAnsweredWithTheValuesReadWhenItsKeysAppeared) {
  Set("plan/old", "1");
  ASSERT_EQ(WaitAndRead({"plan/g1"}, {"plan/g1", "plan/absent", "plan/old"}, absl::Seconds(60)),
            std::nullopt);
  Set("plan/g1", "resume at 100");
  const std::vector<StoreState::Completion> done = state_.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  EXPECT_EQ(done[0].response.code(), 0) << done[0].response.message();
  EXPECT_THAT(ValuesOf(done[0].response), ::testing::ElementsAre("resume at 100", "-", "1"));
}

TEST_F(StoreStateTest, AWaitAndReadOfKeysPresentIsAnsweredWithTheValuesAtOnce) {
  Set("a", "x");
  std::optional<proto::StoreResponse> answer = WaitAndRead({"a"}, {"a", "b"}, absl::Seconds(60));
  ASSERT_NE(answer, std::nullopt);
  EXPECT_EQ(answer->code(), 0) << answer->message();
  EXPECT_THAT(ValuesOf(*answer), ::testing::ElementsAre("x", "-"));
  EXPECT_EQ(state_.parked_waits(), 0u);
}

TEST_F(StoreStateTest, APlainWaitIsAnsweredWithoutValues) {
  Set("a", "x");
  std::optional<proto::StoreResponse> answer = Wait({"a"}, absl::Seconds(60));
  ASSERT_NE(answer, std::nullopt);
  EXPECT_THAT(answer->values(), IsEmpty());
}

TEST_F(StoreStateTest, AParkedWaitAndReadWhoseValuesExceedTheFrameLimitIsResourceExhausted) {
  StoreState small(1024);
  proto::StoreRequest wait;
  wait.set_request_id(1);
  wait.mutable_wait()->add_keys("big");
  wait.mutable_wait()->add_read_keys("big");
  wait.mutable_wait()->set_timeout_ms(60'000);
  ASSERT_EQ(small.Execute(kSession, kJob, wait, kStart), std::nullopt);
  proto::StoreRequest set;
  set.set_request_id(2);
  set.mutable_set()->set_key("big");
  set.mutable_set()->set_value(std::string(4096, 'v'));
  ASSERT_EQ(small.Execute(kSession, kJob, set, kStart)->code(), 0);
  const std::vector<StoreState::Completion> done = small.TakeCompletions();
  ASSERT_THAT(done, SizeIs(1));
  EXPECT_EQ(done[0].response.request_id(), 1u);
  EXPECT_EQ(done[0].response.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(done[0].response.message(), HasSubstr("exceeds the frame limit of 1024 bytes"));
}

// A MultiGet with_ages answers, per key, the time from the request that last wrote it to the
// read's own instant, on the server's clock (the instants Execute is given).
TEST_F(StoreStateTest, AMultiGetWithAgesAnswersTheTimeSinceEachKeysLastWrite) {
  auto execute = [&](proto::StoreRequest request, absl::Time now) {
    request.set_request_id(next_id_++);
    return *state_.Execute(kSession, kJob, request, now);
  };
  proto::StoreRequest set;
  set.mutable_set()->set_key("hb/a");
  set.mutable_set()->set_value("1");
  execute(set, kStart);
  proto::StoreRequest add;
  add.mutable_add()->set_key("hb/b");
  add.mutable_add()->set_delta(1);
  execute(add, kStart + absl::Seconds(1));
  // A swap that does not happen writes nothing.
  proto::StoreRequest cas;
  cas.mutable_compare_and_set()->set_key("hb/a");
  cas.mutable_compare_and_set()->set_expected_present(true);
  cas.mutable_compare_and_set()->set_expected("other");
  cas.mutable_compare_and_set()->set_desired("x");
  EXPECT_FALSE(execute(cas, kStart + absl::Seconds(2)).flag());
  proto::StoreRequest read;
  for (const char* key : {"hb/a", "hb/b", "hb/none"}) read.mutable_multi_get()->add_keys(key);
  read.mutable_multi_get()->set_with_ages(true);
  proto::StoreResponse aged = execute(read, kStart + absl::Milliseconds(2500));
  ASSERT_EQ(aged.code(), 0) << aged.message();
  ASSERT_THAT(aged.values(), SizeIs(3));
  EXPECT_EQ(aged.values(0).value(), "1");
  EXPECT_FALSE(aged.values(2).present());
  EXPECT_THAT(aged.ages_ns(), ::testing::ElementsAre(2'500'000'000, 1'500'000'000, 0));

  // A batch's write and a rewrite count; a Delete forgets the key; a plain MultiGet has no ages.
  proto::StoreRequest batch;
  proto::BatchWriteOp* write = batch.mutable_write_batch()->add_writes();
  write->mutable_set()->set_key("hb/b");
  write->mutable_set()->set_value("1");
  execute(batch, kStart + absl::Seconds(3));
  proto::StoreRequest del;
  del.mutable_delete_key()->set_key("hb/a");
  execute(del, kStart + absl::Seconds(3));
  execute(set, kStart + absl::Seconds(4));  // hb/a again
  aged = execute(read, kStart + absl::Seconds(5));
  EXPECT_THAT(aged.ages_ns(), ::testing::ElementsAre(1'000'000'000, 2'000'000'000, 0));
  read.mutable_multi_get()->set_with_ages(false);
  EXPECT_THAT(execute(read, kStart + absl::Seconds(5)).ages_ns(), IsEmpty());
}

}  // namespace
}  // namespace trainguard
