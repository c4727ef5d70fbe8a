// EtcdStore against a real three-member etcd cluster on loopback (tests/support/etcd_cluster.h):
// losing any one member, the one the client talks to (a follower), the leader, or the one holding
// a blocked Wait's watch, leaves every verb working; losing two leaves no quorum and calls fail,
// bounded, naming an endpoint. Each test has its own cluster and kills members for real (SIGKILL).
// A test server's ports are drawn free below the ephemeral range, and a cluster whose port another
// process took first starts again on new ones.
#include "tests/support/etcd_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/rendezvous/etcd_store.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"
#include "trainguard/store.h"

namespace trainguard::testing {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Bounds every call: enough for an election and for etcd's own request timeout (7 s by default)
// on a proposal that a dead leader swallowed, after which the call is sent again.
constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int kMembers = 3;

std::unique_ptr<EtcdCluster> StartClusterOrDie(std::vector<std::string> addresses = {}) {
  absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster =
      EtcdCluster::Start(kMembers, std::move(addresses));
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return nullptr;
  }
  return *std::move(cluster);
}

std::unique_ptr<EtcdStore> ConnectOrDie(std::vector<std::string> endpoints,
                                        const std::string& job_id) {
  EtcdStoreOptions options;
  options.endpoints = std::move(endpoints);
  options.job_id = job_id;
  options.connect_timeout = kTimeout;
  absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return nullptr;
  }
  return *std::move(store);
}

// Every verb once, asserting its outcome; keys under "<round>/". Set goes first: it is idempotent,
// so it rides out an election by itself, and the verbs that are sent at most once (CompareAndSet,
// Add) then find a member with a leader. `generation` must grow from one call to the next.
void ExpectEveryVerbWorks(EtcdStore& store, const std::string& round, int64_t generation) {
  const std::string key = absl::StrCat(round, "/key");
  const std::string counter = absl::StrCat(round, "/counter");
  const absl::Status set = store.Set(key, "v1", kTimeout);
  ASSERT_TRUE(set.ok()) << set;

  absl::StatusOr<std::string> got = store.Get(key, kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v1");

  absl::StatusOr<CompareAndSetResult> swapped =
      store.CompareAndSet(key, std::string("v1"), "v2", kTimeout);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(swapped->swapped);
  absl::StatusOr<CompareAndSetResult> lost =
      store.CompareAndSet(key, std::string("v1"), "v3", kTimeout);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(lost->swapped);
  EXPECT_EQ(lost->current, "v2");

  absl::StatusOr<int64_t> added = store.Add(counter, 2, kTimeout);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 2);
  added = store.Add(counter, 3, kTimeout);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 5);

  const absl::Status raised = store.RaiseFence(generation, kTimeout);
  ASSERT_TRUE(raised.ok()) << raised;
  store.SetWriterGeneration(generation);
  const absl::Status current = store.Set(key, "fenced", kTimeout);
  EXPECT_TRUE(current.ok()) << current;
  store.SetWriterGeneration(generation - 1);
  const absl::Status stale = store.Set(key, "stale", kTimeout);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  store.SetWriterGeneration(Store::kUnfenced);

  absl::StatusOr<std::vector<std::string>> keys =
      store.ListKeys(absl::StrCat(round, "/"), kTimeout);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(*keys, ElementsAre(counter, key));

  const absl::Status waited = store.Wait({key, counter}, kTimeout);
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(EtcdClusterTest, LosingTheMemberTheClientTalksToLeavesEveryVerbWorking) {
  std::unique_ptr<EtcdCluster> cluster = StartClusterOrDie();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<EtcdStore> store = ConnectOrDie(cluster->endpoints(), "member-loss");
  ASSERT_NE(store, nullptr);
  ExpectEveryVerbWorks(*store, "before", 1);

  // Three rounds: each kills the member the client talks to now, a follower, then brings it back.
  // A follower every time: when the member the client talks to leads, the leadership is handed to
  // another member first. Losing the leader is the next test's; here it would only add etcd's
  // request timeout (7 s: 5 s + 2 election timeouts) of a proposal a follower forwarded to the
  // killed leader before it noticed the loss, as often as the chance of the rounds had it.
  for (int round = 0; round < kMembers; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const int talking_to = cluster->MemberAt(store->current_endpoint());
    ASSERT_GE(talking_to, 0) << store->current_endpoint();
    absl::StatusOr<int> leader = cluster->Leader(kTimeout);
    ASSERT_TRUE(leader.ok()) << leader.status();
    if (*leader == talking_to) {
      const absl::Status moved = cluster->MoveLeader(talking_to, (talking_to + 1) % kMembers,
                                                     kTimeout);
      ASSERT_TRUE(moved.ok()) << moved;
    }
    cluster->Kill(talking_to);
    ExpectEveryVerbWorks(*store, absl::StrCat("round", round), round + 2);
    EXPECT_NE(store->current_endpoint(), cluster->endpoint(talking_to));
    const absl::Status restarted = cluster->Restart(talking_to);
    ASSERT_TRUE(restarted.ok()) << restarted;
  }
}

TEST(EtcdClusterTest, KillingTheLeaderTheClientTalksToLeavesEveryVerbWorking) {
  std::unique_ptr<EtcdCluster> cluster = StartClusterOrDie();
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<int> leader = cluster->Leader(kTimeout);
  ASSERT_TRUE(leader.ok()) << leader.status();
  // The leader's endpoint first, so that the client talks to the leader.
  std::vector<std::string> endpoints = {cluster->endpoint(*leader)};
  for (int i = 0; i < kMembers; ++i) {
    if (i != *leader) endpoints.push_back(cluster->endpoint(i));
  }
  std::unique_ptr<EtcdStore> store = ConnectOrDie(endpoints, "leader-loss");
  ASSERT_NE(store, nullptr);
  ExpectEveryVerbWorks(*store, "before", 1);
  ASSERT_EQ(store->current_endpoint(), cluster->endpoint(*leader));

  cluster->Kill(*leader);
  ExpectEveryVerbWorks(*store, "after", 2);

  absl::StatusOr<int> new_leader = cluster->Leader(kTimeout);
  ASSERT_TRUE(new_leader.ok()) << new_leader.status();
  EXPECT_NE(*new_leader, *leader);
  absl::StatusOr<std::string> kept = store->Get("before/key", kTimeout);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "fenced") << "what the old leader committed survives it";
}

TEST(EtcdClusterTest, AWaitBlockedAcrossTheKillOfItsWatchsMemberSeesTheKeyWrittenAfterTheKill) {
  std::unique_ptr<EtcdCluster> cluster = StartClusterOrDie();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<EtcdStore> store = ConnectOrDie(cluster->endpoints(), "watch-loss");
  ASSERT_NE(store, nullptr);

  std::atomic<bool> returned{false};
  absl::Status waited;
  std::thread waiter([&] {
    waited = store->Wait({"late"}, kTimeout);
    returned = true;
  });
  // Bounded polling: the member whose watcher count shows the Wait's watch.
  int watching = -1;
  for (const absl::Time end = absl::Now() + kTimeout; watching < 0 && absl::Now() < end;) {
    for (int i = 0; i < kMembers && watching < 0; ++i) {
      absl::StatusOr<int64_t> watchers = cluster->WatcherCount(i);
      if (watchers.ok() && *watchers > 0) watching = i;
    }
    if (watching < 0) absl::SleepFor(absl::Milliseconds(10));
  }
  if (watching < 0) {
    ADD_FAILURE() << "no member reported the Wait's watch";
    ASSERT_TRUE(store->Set("late", "unblock", kTimeout).ok());
    waiter.join();
    return;
  }
  cluster->Kill(watching);
  const bool returned_before_the_write = returned.load();
  const absl::Status set = store->Set("late", "written after the kill", kTimeout);
  waiter.join();

  EXPECT_FALSE(returned_before_the_write) << waited;
  EXPECT_TRUE(set.ok()) << set;
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_NE(store->current_endpoint(), cluster->endpoint(watching));
}

TEST(EtcdClusterTest, LosingTwoMembersOfThreeFailsCallsBoundedNamingAnEndpointUntilOneReturns) {
  std::unique_ptr<EtcdCluster> cluster = StartClusterOrDie();
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<EtcdStore> store = ConnectOrDie(cluster->endpoints(), "quorum-loss");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("k", "before", kTimeout).ok());

  cluster->Kill(0);
  cluster->Kill(1);
  constexpr absl::Duration kShort = absl::Seconds(3);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = store->Get("k", kShort);
  const absl::Status set = store->Set("k", "during", kShort);
  // Bounded, not timed: the calls return instead of hanging without a quorum.
  EXPECT_LT(absl::Now() - start, 2 * kShort + absl::Seconds(20));
  for (const absl::Status& s : {got.status(), set}) {
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                AnyOf(HasSubstr(cluster->endpoint(0)), HasSubstr(cluster->endpoint(1)),
                      HasSubstr(cluster->endpoint(2))));
  }

  const absl::Status restarted = cluster->Restart(1);
  ASSERT_TRUE(restarted.ok()) << restarted;
  got = store->Get("k", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  // The Set without a quorum may or may not have been applied once the quorum returned.
  EXPECT_THAT(*got, AnyOf("before", "during"));
  EXPECT_TRUE(store->Set("k", "after", kTimeout).ok());
}

// The test servers' ports (FreeTcpPorts) are distinct, below the ephemeral range that binds to
// port 0 and outgoing connections draw from, and free; and a port another process took first makes
// etcd exit with the message on which Start draws new ports (IsAddressInUse), here with its real
// log.
TEST(EtcdClusterTest, APortTakenBeforeEtcdBindsItIsRecognizedAndFreshPortsAreDistinct) {
  absl::StatusOr<std::vector<int>> ports = FreeTcpPorts("127.0.1.201", 6);
  ASSERT_TRUE(ports.ok()) << ports.status();
  std::vector<int> sorted = *ports;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  int ephemeral_low = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  ASSERT_GT(ephemeral_low, 0);
  for (int port : *ports) EXPECT_LT(port, ephemeral_low);

  // A listener on the port etcd is told to use.
  const int taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>((*ports)[0]));
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << std::strerror(errno);
  ASSERT_EQ(listen(taken, 1), 0) << std::strerror(errno);
  TempDir dir;
  const std::string client_url = absl::StrCat("http://127.0.0.1:", (*ports)[0]);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", (*ports)[1]);
  absl::StatusOr<pid_t> pid =
      SpawnEtcd({kEtcdBinary, "--name", "taken", "--data-dir", dir.File("data"),
                 "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", absl::StrCat("taken=", peer_url)},
                dir.File("etcd.log"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  pid_t reaped = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(60); reaped == 0 && absl::Now() < end;) {
    reaped = waitpid(*pid, &status, WNOHANG);
    if (reaped == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  if (reaped == 0) {  // still serving somehow: stop it, and fail below
    ASSERT_TRUE(SignalOwnProcess(*pid, SIGKILL).ok());
    waitpid(*pid, &status, 0);
  }
  close(taken);
  ASSERT_EQ(reaped, *pid) << "etcd served on a port another socket listened on";
  const std::string log = FileTail(dir.File("etcd.log"));
  EXPECT_TRUE(IsAddressInUse(absl::InternalError(log))) << log;
  EXPECT_FALSE(IsAddressInUse(absl::InternalError("etcd member 0 did not serve within 60s")));
}

TEST(EtcdClusterTest, MembersOnTheirOwnHostAddressesServeAClientFromAnotherHostsAddress) {
  std::unique_ptr<EtcdCluster> cluster =
      StartClusterOrDie({"127.0.1.201", "127.0.1.202", "127.0.1.203"});
  ASSERT_NE(cluster, nullptr);
  EXPECT_EQ(cluster->endpoint(1).rfind("http://127.0.1.202:", 0), 0u) << cluster->endpoint(1);
  OpenStoreOptions options;
  options.source_address = "127.0.1.1";
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(cluster->StoreUrl(), "own-addresses", "", kTimeout, options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v", kTimeout).ok());
  absl::StatusOr<std::string> got = (*store)->Get("k", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

}  // namespace
}  // namespace trainguard::testing
