// EtcdStore against a real etcd on loopback: the Store conformance suite, then what only etcd has
// (leases, several jobs in one etcd, endpoints) and what happens when etcd dies and comes back.
#include "sdk/rendezvous/etcd_store.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/etcd_process.h"
#include "tests/support/peer_recording_listener.h"
#include "tests/support/store_conformance.h"

namespace trainguard::testing {
namespace {

using ::testing::HasSubstr;

// One etcd for the whole binary (it starts in well under a second); tests keep apart by job id.
// Stopped and its directory removed at exit.
EtcdProcess& SharedEtcd() {
  static EtcdProcess* const etcd = [] {
    absl::StatusOr<std::unique_ptr<EtcdProcess>> started = EtcdProcess::Start();
    if (!started.ok()) throw std::runtime_error(started.status().ToString());
    static std::unique_ptr<EtcdProcess> owner = *std::move(started);
    return owner.get();
  }();
  return *etcd;
}

// A job id no other test (or earlier run against the same etcd) uses.
std::string UniqueJobId(const std::string& tag = "") {
  static std::atomic<int> counter{0};
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = test != nullptr ? test->name() : "no-test";
  return absl::StrReplaceAll(absl::StrCat(name, tag, "-", getpid(), "-", counter++), {{"/", "_"}});
}

EtcdStoreOptions OptionsFor(const std::string& endpoint, const std::string& job_id) {
  EtcdStoreOptions options;
  options.endpoints = {endpoint};
  options.job_id = job_id;
  options.connect_timeout = absl::Seconds(5);
  return options;
}

std::unique_ptr<EtcdStore> ConnectOrThrow(const EtcdStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
  if (!store.ok()) throw std::runtime_error(store.status().ToString());
  return *std::move(store);
}

// A loopback port that was free a moment ago, so nothing listens there.
std::string DeadEndpoint() {
  absl::StatusOr<int> port = FreeTcpPort("127.0.0.1");
  if (!port.ok()) throw std::runtime_error(port.status().ToString());
  return absl::StrCat("http://127.0.0.1:", *port);
}

class EtcdStoreHarness {
 public:
  EtcdStoreHarness() : etcd_(SharedEtcd()), job_id_(UniqueJobId()) {}
  std::unique_ptr<Store> NewClient() {
    return ConnectOrThrow(OptionsFor(etcd_.endpoint(), job_id_));
  }

 private:
  EtcdProcess& etcd_;
  const std::string job_id_;
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(EtcdStore, StoreConformance, EtcdStoreHarness);

namespace {

class EtcdStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<EtcdStore> Connect(const std::string& job_id) {
    return ConnectOrThrow(OptionsFor(SharedEtcd().endpoint(), job_id));
  }
};

TEST_F(EtcdStoreTest, TwoJobIdsInOneEtcdSeeNeitherTheOthersKeysNorItsFence) {
  auto job_a = Connect(UniqueJobId("-a"));
  auto job_b = Connect(UniqueJobId("-b"));
  ASSERT_TRUE(job_a->Set("rank/0", "a", kStoreTimeout).ok());
  ASSERT_TRUE(job_b->Set("rank/0", "b", kStoreTimeout).ok());
  ASSERT_TRUE(job_b->Set("only/in/b", "b", kStoreTimeout).ok());
  EXPECT_EQ(*job_a->Get("rank/0", kStoreTimeout), "a");
  EXPECT_EQ(*job_b->Get("rank/0", kStoreTimeout), "b");
  EXPECT_THAT(*job_a->ListKeys("", kStoreTimeout), ::testing::ElementsAre("rank/0"));

  ASSERT_TRUE(job_a->RaiseFence(7, kStoreTimeout).ok());
  job_a->SetWriterGeneration(3);
  job_b->SetWriterGeneration(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(job_a->Set("rank/0", "stale", kStoreTimeout)));
  EXPECT_TRUE(job_b->Set("rank/0", "fine", kStoreTimeout).ok()) << "job b has no fence of 7";
}

// The gateway leaves empty bytes out of its JSON; an empty value must still read as present.
TEST_F(EtcdStoreTest, AnEmptyValueIsPresentNotAbsent) {
  auto store = Connect(UniqueJobId());
  auto created = store->CompareAndSet("empty", std::nullopt, "", kStoreTimeout);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->swapped);
  EXPECT_EQ(*store->Get("empty", kStoreTimeout), "");
  auto not_absent = store->CompareAndSet("empty", std::nullopt, "x", kStoreTimeout);
  EXPECT_FALSE(not_absent->swapped);
  EXPECT_EQ(not_absent->current, std::optional<std::string>(""));
  EXPECT_TRUE(store->CompareAndSet("empty", std::string(""), "y", kStoreTimeout)->swapped);
  EXPECT_FALSE(store->CompareAndSet("absent", std::string(""), "y", kStoreTimeout)->swapped);
  EXPECT_TRUE(store->Wait({"empty"}, kStoreTimeout).ok());
  ASSERT_TRUE(store->Set("counter", "", kStoreTimeout).ok());
  EXPECT_EQ(*store->Add("counter", 2, kStoreTimeout), 2) << "an empty value counts as 0";
}

TEST_F(EtcdStoreTest, TheStaleGenerationErrorNamesTheFenceTheKeyAndTheJob) {
  const std::string job = UniqueJobId();
  auto current = Connect(job);
  auto zombie = Connect(job);
  ASSERT_TRUE(current->RaiseFence(12, kStoreTimeout).ok());
  zombie->SetWriterGeneration(11);
  absl::Status set = zombie->Set("ckpt/commit", "x", kStoreTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(set)) << set;
  EXPECT_THAT(std::string(set.message()), HasSubstr("stale generation 11 < fence 12"));
  EXPECT_THAT(std::string(set.message()), HasSubstr("ckpt/commit"));
  EXPECT_THAT(std::string(set.message()), HasSubstr(job));
  zombie->SetWriterGeneration(12);
  EXPECT_TRUE(zombie->Set("ckpt/commit", "x", kStoreTimeout).ok()) << "generation == fence passes";
}

TEST_F(EtcdStoreTest, AKeySetWithALeaseDisappearsWhenTheLeaseExpires) {
  auto store = Connect(UniqueJobId());
  absl::StatusOr<EtcdLease> lease = store->GrantLease(absl::Seconds(1), kStoreTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store->SetWithLease("alive/rank3", "1", lease->id, kStoreTimeout).ok());
  EXPECT_EQ(*store->Get("alive/rank3", kStoreTimeout), "1");

  // Nobody keeps the lease alive: etcd deletes the key within the TTL plus its expiry sweep.
  const absl::Time deadline = absl::Now() + lease->ttl + absl::Seconds(10);
  absl::StatusOr<std::string> got = store->Get("alive/rank3", kStoreTimeout);
  while (got.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    got = store->Get("alive/rank3", kStoreTimeout);
  }
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  absl::StatusOr<absl::Duration> renewed = store->KeepAliveOnce(lease->id, kStoreTimeout);
  EXPECT_TRUE(absl::IsNotFound(renewed.status())) << renewed.status();
}

TEST_F(EtcdStoreTest, KeepAliveHoldsALeasePastItsTtlAndRevokeDeletesItsKeys) {
  auto store = Connect(UniqueJobId());
  absl::StatusOr<EtcdLease> lease = store->GrantLease(absl::Seconds(2), kStoreTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store->SetWithLease("alive/rank0", "1", lease->id, kStoreTimeout).ok());
  const absl::Time until = absl::Now() + lease->ttl + absl::Seconds(1);
  while (absl::Now() < until) {
    absl::StatusOr<absl::Duration> ttl = store->KeepAliveOnce(lease->id, kStoreTimeout);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, lease->ttl);
    absl::SleepFor(lease->ttl / 4);
  }
  EXPECT_EQ(*store->Get("alive/rank0", kStoreTimeout), "1") << "kept alive past its TTL";

  ASSERT_TRUE(store->RevokeLease(lease->id, kStoreTimeout).ok());
  EXPECT_TRUE(absl::IsNotFound(store->Get("alive/rank0", kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsNotFound(store->RevokeLease(lease->id, kStoreTimeout)));
  EXPECT_TRUE(absl::IsNotFound(store->KeepAliveOnce(lease->id, kStoreTimeout).status()));
  EXPECT_TRUE(absl::IsNotFound(store->SetWithLease("alive/rank0", "1", lease->id, kStoreTimeout)));
}

TEST_F(EtcdStoreTest, MultiGetOfMoreKeysThanOneTransactionHoldsKeepsTheOrder) {
  auto store = Connect(UniqueJobId());
  std::vector<std::string> keys;
  std::vector<std::optional<std::string>> expected;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(absl::StrCat("k/", i));
    expected.push_back(i % 7 == 0 ? std::optional<std::string>(absl::StrCat(i)) : std::nullopt);
    if (expected.back()) {
      ASSERT_TRUE(store->Set(keys.back(), *expected.back(), kStoreTimeout).ok());
    }
  }
  auto values = store->MultiGet(keys, kStoreTimeout);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, expected);
}

TEST_F(EtcdStoreTest, WaitOnMoreKeysThanOneTransactionHoldsSeesTheLastOneArrive) {
  const std::string job = UniqueJobId();
  auto waiter = Connect(job);
  auto writer = Connect(job);
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) {
    keys.push_back(absl::StrCat("rank/", i));
    if (i == 150) continue;
    ASSERT_TRUE(writer->Set(keys.back(), "here", kStoreTimeout).ok());
  }
  absl::Status timed_out = waiter->Wait(keys, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out)) << timed_out;
  EXPECT_THAT(std::string(timed_out.message()), ::testing::EndsWith("still missing: rank/150"));
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(writer->Set("rank/150", "here", kStoreTimeout).ok());
  });
  absl::Status s = waiter->Wait(keys, kStoreTimeout);
  late.join();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(EtcdStoreTest, AValueOverEtcdsRequestLimitIsRejectedWithEtcdsReason) {
  auto store = Connect(UniqueJobId());
  // Over etcd's default --max-request-bytes (1.5 MiB), under its gRPC message limit (2 MiB).
  absl::Status set = store->Set("huge", std::string(1792 << 10, 'x'), kStoreTimeout);
  EXPECT_TRUE(absl::IsInvalidArgument(set)) << set;
  EXPECT_THAT(std::string(set.message()), HasSubstr("request is too large"));
  EXPECT_THAT(std::string(set.message()), HasSubstr(SharedEtcd().endpoint()));
  // Over the gRPC limit, the gateway refuses it before etcd sees it.
  set = store->Set("huge", std::string(2 << 20, 'x'), kStoreTimeout);
  EXPECT_TRUE(absl::IsResourceExhausted(set)) << set;
  EXPECT_TRUE(absl::IsNotFound(store->Get("huge", kStoreTimeout).status()));
}

TEST_F(EtcdStoreTest, AReplyOverTheSizeBoundIsAnErrorNamingTheBound) {
  EtcdStoreOptions options = OptionsFor(SharedEtcd().endpoint(), UniqueJobId());
  options.max_response_bytes = 4096;
  auto store = ConnectOrThrow(options);
  ASSERT_TRUE(store->Set("big", std::string(64 << 10, 'v'), kStoreTimeout).ok());
  absl::StatusOr<std::string> got = store->Get("big", kStoreTimeout);
  EXPECT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("max_response_bytes"));
}

TEST_F(EtcdStoreTest, ConnectToAPortWithNoEtcdIsUnavailableNamingTheEndpoint) {
  const std::string dead = DeadEndpoint();
  EtcdStoreOptions options = OptionsFor(dead, UniqueJobId());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(dead));
  EXPECT_LT(absl::Now() - start, options.connect_timeout);
}

TEST_F(EtcdStoreTest, AnEndpointThatRefusesConnectionsIsSkippedForTheNext) {
  EtcdStoreOptions options = OptionsFor(DeadEndpoint(), UniqueJobId());
  options.endpoints.push_back(SharedEtcd().endpoint());
  auto store = ConnectOrThrow(options);
  ASSERT_TRUE(store->Set("k", "v", kStoreTimeout).ok());
  EXPECT_EQ(*store->Get("k", kStoreTimeout), "v");
}

TEST_F(EtcdStoreTest, AStoreWithASourceAddressConnectsFromThatAddress) {
  absl::StatusOr<std::unique_ptr<PeerRecordingListener>> listener = PeerRecordingListener::Start();
  ASSERT_TRUE(listener.ok()) << listener.status();
  EtcdStoreOptions options =
      OptionsFor(absl::StrCat("http://127.0.0.1:", (*listener)->port()), UniqueJobId());
  options.source_address = "127.0.0.5";
  options.connect_timeout = absl::Seconds(2);
  absl::Status connected;
  std::thread client([&] { connected = EtcdStore::Connect(options).status(); });
  absl::StatusOr<std::string> peer = (*listener)->AcceptOnePeer(kStoreTimeout);
  client.join();
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(*peer, "127.0.0.5");
  EXPECT_FALSE(connected.ok()) << "the listener speaks no HTTP";
}

TEST_F(EtcdStoreTest, ASourceAddressThatIsNotNumericIsInvalidArgumentNamingIt) {
  EtcdStoreOptions options = OptionsFor(SharedEtcd().endpoint(), UniqueJobId());
  options.source_address = "host-3";
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("source address 'host-3'"));
}

TEST_F(EtcdStoreTest, ASourceAddressNotOfThisHostIsUnavailableNamingIt) {
  EtcdStoreOptions options = OptionsFor(SharedEtcd().endpoint(), UniqueJobId());
  options.source_address = "192.0.2.1";  // TEST-NET-1: never an address of this host
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("cannot bind the source address 192.0.2.1"));
}

TEST_F(EtcdStoreTest, BadOptionsAreInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      EtcdStore::Connect(OptionsFor(SharedEtcd().endpoint(), "a/b")).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      EtcdStore::Connect(OptionsFor(SharedEtcd().endpoint(), "")).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(EtcdStore::Connect(OptionsFor("127.0.0.1:2379", "job")).status()));
  EtcdStoreOptions none = OptionsFor("", "job");
  none.endpoints.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdStore::Connect(none).status()));
}

// The fault: etcd is SIGKILLed under a live client (one call blocked in a watch), then restarted on
// the same data directory and port. Its own etcd, so that no other test sees the outage.
TEST(EtcdStoreFaultTest, EtcdKilledGivesUnavailableNamingTheEndpointAndTheClientWorksAfterRestart) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string endpoint = (*etcd)->endpoint();
  auto store = ConnectOrThrow(OptionsFor(endpoint, UniqueJobId()));
  ASSERT_TRUE(store->Set("durable", "before the crash", kStoreTimeout).ok());

  absl::Status blocked_wait;
  std::thread waiter([&] { blocked_wait = store->Wait({"never/written"}, kStoreTimeout); });
  absl::SleepFor(absl::Milliseconds(200));  // the waiter is (very likely) in its watch by now
  const absl::Time killed_at = absl::Now();
  (*etcd)->Kill();
  waiter.join();
  EXPECT_TRUE(absl::IsUnavailable(blocked_wait)) << blocked_wait;
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(5)) << "noticed the broken watch at once";

  constexpr absl::Duration kShort = absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = store->Get("durable", kShort);
  absl::Status set = store->Set("after", "x", kShort);
  absl::StatusOr<int64_t> added = store->Add("n", 1, kShort);
  EXPECT_LT(absl::Now() - start, 3 * kShort);
  for (const absl::Status& s : {got.status(), set, added.status()}) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(endpoint));
  }

  ASSERT_TRUE((*etcd)->Restart().ok());
  got = store->Get("durable", kStoreTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "before the crash");
  EXPECT_TRUE(store->Set("after", "x", kStoreTimeout).ok());
  EXPECT_TRUE(store->Wait({"durable", "after"}, kStoreTimeout).ok());
}

// The other fault: etcd hangs (SIGSTOP) with its connections open. Every call ends at its own
// deadline with DeadlineExceeded naming the key and the timeout; the client recovers on SIGCONT.
TEST(EtcdStoreFaultTest, AHungEtcdGivesDeadlineExceededNamingTheKeyWithinTheTimeout) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto store = ConnectOrThrow(OptionsFor((*etcd)->endpoint(), UniqueJobId()));
  ASSERT_TRUE(store->Set("before", "1", kStoreTimeout).ok());

  (*etcd)->Pause();
  constexpr absl::Duration kShort = absl::Milliseconds(300);
  for (const char* key : {"before", "some/other/key"}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> got = store->Get(key, kShort);
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(key));
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("300ms"));
    // Bounded, not timed: the call returns instead of hanging with etcd.
    EXPECT_LT(took, kShort + absl::Seconds(10));
  }
  const absl::Time start = absl::Now();
  absl::Status wait = store->Wait({"before", "never"}, kShort);
  EXPECT_TRUE(absl::IsDeadlineExceeded(wait)) << wait;
  EXPECT_LT(absl::Now() - start, kShort + absl::Seconds(10));

  (*etcd)->Resume();
  absl::StatusOr<std::string> got = store->Get("before", kStoreTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "1");
}

}  // namespace
}  // namespace trainguard::testing
