// LeaseKeeper: the coordinator lease renewed on a thread of its own (sdk/coordinator/
// lease_keeper.h). A slow turn of the holder's loop keeps the lease while its renewals go on; a
// holder whose process is stopped, whose store does not answer, or whose loop is wedged past its
// bound stops acting before another agent can take the lease over; a renewal that finds the lease
// taken deposes the holder at once, and the loop says so. Two agents of one job on an in-memory
// store, each with its ManualClock and its connection (AgentConnection); RenewOnce stands in for
// the renewal thread, except in the tests that start the thread itself.
#include "sdk/coordinator/lease_keeper.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/forwarding_store.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/coordinator_lease.h"
#include "tests/support/agent_connection.h"
#include "trainguard/clock.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kExpiry = absl::Seconds(2);  // --host-timeout
constexpr absl::Duration kCall = absl::Milliseconds(500);
constexpr absl::Duration kTick =
    absl::Milliseconds(250);  // kExpiry / 8:  // the renewal thread's interval
constexpr absl::Duration kLoopStallBound = absl::Seconds(20);

// Counts the compare-and-sets that reach the store (the renewals and takes) and notifies once
// `wanted` of them did: what a test of the real renewal thread waits for.
class RenewalCountingStore final : public ForwardingStore {
 public:
  RenewalCountingStore(Store* base, int wanted) : ForwardingStore(base), wanted_(wanted) {}

  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override {
    absl::StatusOr<CompareAndSetResult> result =
        ForwardingStore::CompareAndSet(key, expected, desired, timeout);
    MutexLock lock(&mu_);
    if (++calls_ == wanted_) reached_.Notify();
    return result;
  }
  int calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  Notification& reached() { return reached_; }

 private:
  const int wanted_;
  mutable Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  Notification reached_;
};

// One host's agent as far as the lease goes: its clock, its connection, its lease and keeper, and
// what the keeper said and called.
struct Agent {
  Agent(const std::string& id, Store* store)
      : link(store, &clock), lease(&link, id, kExpiry, &clock) {
    LeaseKeeper::Hooks hooks;
    hooks.say = [this](const std::string& line) { said.push_back(line); };
    hooks.resume = [] { return absl::NotFoundError("no generation yet"); };
    hooks.generation = [] { return int64_t{-1}; };
    hooks.took_over = [this] { ++takeovers; };
    hooks.deposed = [this] { ++depositions; };
    keeper = std::make_unique<LeaseKeeper>(&lease, kCall, std::move(hooks), kLoopStallBound);
  }

  ManualClock clock;
  testing::AgentConnection link;
  CoordinatorLease lease;
  std::unique_ptr<LeaseKeeper> keeper;
  std::vector<std::string> said;
  int takeovers = 0;
  int depositions = 0;
};

class LeaseKeeperTest : public ::testing::Test {
 protected:
  // Both agents' clocks move on by `d`: real time passes for both, whatever each does.
  void Advance(absl::Duration d) {
    a_.clock.Advance(d);
    b_.clock.Advance(d);
  }
  std::string LeaseValue() { return store_.Get(CoordinatorLease::kKey, kCall).value_or(""); }

  InMemoryStore store_;
  Agent a_{"hostA", &store_};
  Agent b_{"hostB", &store_};
};

// The fault of issue 37: the holder's turn blocked for longer than the lease lasts (a slow store
// call, a loaded machine). Its renewal thread renews meanwhile: it acts throughout, the watcher
// never takes the lease, and nothing is said when the turn comes back.
TEST_F(LeaseKeeperTest, ATurnBlockedPastTheExpiryKeepsTheLeaseWhileItsRenewalsGoOn) {
  a_.keeper->Update();  // takes the lease
  b_.keeper->Update();  // watches it
  ASSERT_TRUE(a_.keeper->Coordinating());
  for (int i = 0; i < 40; ++i) {  // 5 expiries without a turn of hostA's loop
    Advance(kTick);
    a_.keeper->RenewOnce();
    b_.keeper->Update();
    EXPECT_TRUE(a_.keeper->Coordinating()) << "after " << (i + 1) * kTick;
    EXPECT_FALSE(b_.lease.claimed()) << "after " << (i + 1) * kTick;
  }
  a_.keeper->Update();  // the turn comes back
  EXPECT_TRUE(a_.keeper->Coordinating());
  EXPECT_EQ(a_.lease.term(), 1);
  EXPECT_EQ(a_.takeovers, 1);
  EXPECT_EQ(a_.depositions, 0);
  EXPECT_THAT(a_.said, ElementsAre("coordinating the job (lease term 1; generation -1)"));
  EXPECT_THAT(b_.said, IsEmpty());
}

// A holder whose process is stopped (SIGSTOP) or killed runs neither its loop nor its renewal
// thread: it stops acting at its acting deadline, and the watcher takes the lease at the expiry,
// not a nanosecond before. The stopped holder, resumed, is deposed by its first renewal, before its
// loop turns; the loop then says so and drops what it had queued.
TEST_F(LeaseKeeperTest, AStoppedHolderLosesTheLeaseWithinTheExpiryAndIsDeposedWhenItResumes) {
  a_.keeper->Update();
  b_.keeper->Update();
  Advance(kExpiry - a_.lease.acting_margin());
  EXPECT_FALSE(a_.keeper->Coordinating());  // the gate closed, though nobody took the lease yet
  Advance(a_.lease.acting_margin() - absl::Nanoseconds(1));
  b_.keeper->Update();
  EXPECT_FALSE(b_.lease.claimed());
  Advance(absl::Nanoseconds(1));
  b_.keeper->Update();
  ASSERT_TRUE(b_.keeper->Coordinating());
  EXPECT_EQ(b_.lease.term(), 2);

  a_.keeper->RenewOnce();  // hostA resumes: its renewal thread runs first
  EXPECT_FALSE(a_.lease.claimed());
  EXPECT_FALSE(a_.keeper->Coordinating());
  EXPECT_EQ(a_.lease.latest_term(), 2);  // its kill requests, if any, are ignored from now on
  a_.keeper->Update();
  EXPECT_EQ(a_.depositions, 1);
  EXPECT_FALSE(a_.keeper->Coordinating());
  EXPECT_THAT(a_.said,
              ElementsAre("coordinating the job (lease term 1; generation -1)",
                          HasSubstr("no longer coordinating (lease term 1 was not renewed in time: "
                                    "hostA no longer acts under coordinator lease term 1")));
}

// The loop found the gate open at its last turn, and the renewal thread, the first to run after
// the process resumed, finds the lease taken: the gate closes at once, whatever the loop does, and
// the loop's next turn says who holds the lease now.
TEST_F(LeaseKeeperTest, ARenewalThatFindsTheLeaseTakenDeposesTheHolderBeforeItsLoopTurns) {
  a_.keeper->Update();
  b_.keeper->Update();
  ASSERT_TRUE(a_.keeper->Coordinating());
  Advance(kExpiry);  // hostA stopped all this time
  b_.keeper->Update();
  ASSERT_TRUE(b_.keeper->Coordinating());
  a_.keeper->RenewOnce();
  EXPECT_FALSE(a_.keeper->Coordinating());
  EXPECT_EQ(a_.depositions, 0);  // the hooks are the loop's
  a_.keeper->Update();
  EXPECT_EQ(a_.depositions, 1);
  EXPECT_THAT(a_.said, ElementsAre("coordinating the job (lease term 1; generation -1)",
                                   "no longer coordinating (the lease is hostB's now)"));
}

// Fencing under a renewal that fails: at every instant, at most one of the two agents passes the
// gate, the holder's gate closes at least the acting margin before the watcher can take the lease,
// and the holder never acts again once the lease passed (a term is acted on by one agent only).
TEST_F(LeaseKeeperTest, ARenewalThatFailsClosesTheGateBeforeAnotherAgentCanTakeOver) {
  a_.keeper->Update();
  b_.keeper->Update();
  a_.link.cut_off = true;  // hostA's renewals fail from now on; its loop turns on
  absl::Duration a_stopped = absl::InfiniteDuration();
  absl::Duration b_started = absl::InfiniteDuration();
  for (absl::Duration t = absl::ZeroDuration(); t <= 2 * kExpiry; t += absl::Milliseconds(50)) {
    a_.keeper->RenewOnce();
    a_.keeper->Update();
    b_.keeper->Update();
    const bool a_acts = a_.keeper->Coordinating();
    const bool b_acts = b_.keeper->Coordinating();
    EXPECT_FALSE(a_acts && b_acts) << "at " << t;
    if (!a_acts && a_stopped == absl::InfiniteDuration()) a_stopped = t;
    if (b_acts && b_started == absl::InfiniteDuration()) b_started = t;
    Advance(absl::Milliseconds(50));
  }
  ASSERT_NE(b_started, absl::InfiniteDuration());
  EXPECT_GE(b_started - a_stopped, a_.lease.acting_margin());
  EXPECT_EQ(b_.lease.term(), 2);
  EXPECT_EQ(a_.depositions, 1);  // its claim dropped once nobody could have waited out the expiry
}

// A loop wedged past its bound (its turn never comes back) coordinates nothing: the renewal
// thread stops renewing, the lease passes at its expiry, and the agent is deposed when its loop
// turns again.
TEST_F(LeaseKeeperTest, AHolderWhoseLoopIsWedgedPastItsBoundRenewsNoMore) {
  a_.keeper->Update();
  b_.keeper->Update();
  for (absl::Duration t; t < kLoopStallBound; t += kTick) {
    Advance(kTick);
    a_.keeper->RenewOnce();
    b_.keeper->Update();
  }
  ASSERT_TRUE(a_.keeper->Coordinating());  // the bound itself: renewed still
  ASSERT_FALSE(b_.lease.claimed());
  const std::string renewed = LeaseValue();
  for (absl::Duration t; t < kExpiry; t += kTick) {
    Advance(kTick);
    a_.keeper->RenewOnce();  // past the bound: nothing written
    EXPECT_EQ(LeaseValue(), renewed);
    b_.keeper->Update();
  }
  EXPECT_TRUE(b_.lease.claimed());
  a_.keeper->Update();  // the wedged turn comes back
  a_.keeper->RenewOnce();
  a_.keeper->Update();
  EXPECT_FALSE(a_.keeper->Coordinating());
  EXPECT_EQ(a_.depositions, 1);
}

// Only the loop watches and takes the lease (it runs the takeover: the state read back from the
// store); a renewal thread of an agent that holds nothing writes nothing.
TEST_F(LeaseKeeperTest, TheRenewalThreadNeverTakesALease) {
  a_.keeper->Update();
  b_.keeper->Update();
  Advance(2 * kExpiry);  // hostA stopped
  b_.keeper->RenewOnce();
  EXPECT_FALSE(b_.lease.claimed());
  EXPECT_THAT(LeaseValue(), HasSubstr("hostA"));
  b_.keeper->Update();
  EXPECT_TRUE(b_.keeper->Coordinating());
  EXPECT_EQ(b_.takeovers, 1);
}

// The renewal thread itself: it renews with no turn of the loop at all, concurrently with the
// loop's calls, and stops cleanly (joined; nothing renewed after StopRenewing returned). Its
// interval is a millisecond of real time; what the test waits for is the renewals, bounded.
TEST_F(LeaseKeeperTest, TheRenewalThreadRenewsWithoutAnyTurnAndStopsWhenAsked) {
  RenewalCountingStore counting(&store_, /*wanted=*/5);
  ManualClock clock;
  CoordinatorLease lease(&counting, "hostC", kExpiry, &clock);
  LeaseKeeper::Hooks hooks;
  std::vector<std::string> said;
  hooks.say = [&said](const std::string& line) { said.push_back(line); };
  hooks.resume = [] { return absl::NotFoundError("no generation yet"); };
  hooks.generation = [] { return int64_t{-1}; };
  hooks.took_over = [] {};
  hooks.deposed = [] {};
  LeaseKeeper keeper(&lease, kCall, std::move(hooks), kLoopStallBound);
  keeper.Update();  // takes the lease: the first compare-and-set
  keeper.StartRenewing(absl::Milliseconds(1));
  for (int i = 0; i < 100 && !counting.reached().HasBeenNotified(); ++i) {
    keeper.Update();  // the loop's turns, beside the thread: they leave the renewals to it
    EXPECT_TRUE(keeper.Coordinating());
  }
  ASSERT_TRUE(counting.reached().WaitForNotificationWithTimeout(absl::Seconds(60)));
  keeper.StopRenewing();
  const int calls = counting.calls();
  const std::string value = store_.Get(CoordinatorLease::kKey, kCall).value_or("");
  EXPECT_THAT(value, HasSubstr("hostC"));
  EXPECT_NE(value, store_keys::EncodeLeaseRecord({1, "hostC", 0}));  // renewed since the take
  keeper.Update();  // no thread: the loop renews again
  EXPECT_EQ(counting.calls(), calls + 1);
  EXPECT_THAT(said, ElementsAre("coordinating the job (lease term 1; generation -1)"));
}

// Leaving: the renewal thread stops first, then the lease is released for a successor to take at
// its next turn, without waiting for the expiry.
TEST_F(LeaseKeeperTest, AReleaseStopsTheRenewalsAndHandsTheLeaseOverAtOnce) {
  a_.keeper->Update();
  b_.keeper->Update();
  a_.keeper->StartRenewing(absl::Milliseconds(1));
  a_.keeper->Release(kCall);
  EXPECT_FALSE(a_.keeper->Coordinating());
  b_.keeper->Update();
  EXPECT_TRUE(b_.keeper->Coordinating());
  EXPECT_EQ(b_.lease.term(), 2);
  EXPECT_EQ(b_.lease.taken_from(), CoordinatorLease::kReleasedHolder);
}

}  // namespace
}  // namespace trainguard
