// ConnectionPool: the cap on the connections a store client's short requests hold, their wait in
// arrival order for the first to come free, its timeout, and the parked waits outside the cap.
#include "sdk/rendezvous/connection_pool.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using Use = ConnectionPool<int>::Use;

// A pool of ints, each a connection numbered in the order the pool opened it.
class CountingPool {
 public:
  explicit CountingPool(int cap)
      : pool_(cap, [this] { return std::make_unique<int>(opened_.fetch_add(1)); }) {}
  ConnectionPool<int>& operator*() { return pool_; }
  ConnectionPool<int>* operator->() { return &pool_; }
  int opened() const { return opened_.load(); }

 private:
  std::atomic<int> opened_{0};
  ConnectionPool<int> pool_;
};

constexpr absl::Duration kLong = absl::Seconds(30);

// Bounded polling: true once `condition` holds within kLong.
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + kLong;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(ConnectionPoolTest, ShortRequestsBeyondTheCapWaitAndGetTheFirstConnectionFreed) {
  CountingPool pool(2);
  std::unique_ptr<int> a = pool->Take(Use::kShort, kLong);
  std::unique_ptr<int> b = pool->Take(Use::kShort, kLong);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const int* freed = a.get();
  const int* got = nullptr;
  std::thread third([&] {
    std::unique_ptr<int> c = pool->Take(Use::kShort, kLong);
    got = c.get();
    pool->Give(std::move(c), Use::kShort);
  });
  ASSERT_TRUE(Eventually([&] { return pool->waiting() == 1; }));
  EXPECT_EQ(pool->short_in_use(), 2u);
  pool->Give(std::move(a), Use::kShort);
  third.join();
  EXPECT_EQ(got, freed) << "the waiting request takes the connection given back";
  EXPECT_EQ(pool.opened(), 2) << "no connection beyond the cap";
  pool->Give(std::move(b), Use::kShort);
  EXPECT_EQ(pool->idle(), 2u);
  EXPECT_EQ(pool->short_in_use(), 0u);
}

TEST(ConnectionPoolTest, WaitingRequestsAreServedInArrivalOrder) {
  CountingPool pool(1);
  std::unique_ptr<int> held = pool->Take(Use::kShort, kLong);
  std::atomic<int> served{0};
  std::atomic<int> first_served_by{-1};
  auto waiter = [&](int who) {
    std::unique_ptr<int> c = pool->Take(Use::kShort, kLong);
    int expected = -1;
    first_served_by.compare_exchange_strong(expected, who);
    ++served;
    pool->Give(std::move(c), Use::kShort);
  };
  std::thread first(waiter, 1);
  ASSERT_TRUE(Eventually([&] { return pool->waiting() == 1; }));
  std::thread second(waiter, 2);
  ASSERT_TRUE(Eventually([&] { return pool->waiting() == 2; }));
  pool->Give(std::move(held), Use::kShort);
  first.join();
  second.join();
  EXPECT_EQ(served.load(), 2);
  EXPECT_EQ(first_served_by.load(), 1);
  EXPECT_EQ(pool.opened(), 1);
}

TEST(ConnectionPoolTest, ARequestThatFindsNoSlotWithinItsTimeoutGetsNothingAndLeavesTheQueue) {
  CountingPool pool(1);
  std::unique_ptr<int> held = pool->Take(Use::kShort, kLong);
  EXPECT_EQ(pool->Take(Use::kShort, absl::Milliseconds(20)), nullptr);
  EXPECT_EQ(pool->Take(Use::kShort, absl::ZeroDuration()), nullptr);
  EXPECT_EQ(pool->waiting(), 0u);
  // A request queued behind one that runs out is served once a connection comes free.
  std::atomic<bool> later_served{false};
  std::thread gives_up([&] { EXPECT_EQ(pool->Take(Use::kShort, absl::Seconds(1)), nullptr); });
  ASSERT_TRUE(Eventually([&] { return pool->waiting() == 1; }));
  std::thread later([&] {
    std::unique_ptr<int> c = pool->Take(Use::kShort, kLong);
    later_served = c != nullptr;
    pool->Give(std::move(c), Use::kShort);
  });
  gives_up.join();
  ASSERT_TRUE(Eventually([&] { return pool->waiting() == 1; }));
  pool->Give(std::move(held), Use::kShort);
  later.join();
  EXPECT_TRUE(later_served.load());
  EXPECT_EQ(pool.opened(), 1);
}

TEST(ConnectionPoolTest, ParkedRequestsTakeNoSlotAndIdleConnectionsStayWithinTheCap) {
  CountingPool pool(1);
  std::unique_ptr<int> short_request = pool->Take(Use::kShort, kLong);
  std::unique_ptr<int> parked[3];
  for (auto& p : parked) {
    p = pool->Take(Use::kParked, absl::ZeroDuration());
    ASSERT_NE(p, nullptr) << "a parked wait never waits for a slot";
  }
  EXPECT_EQ(pool.opened(), 4);
  for (auto& p : parked) pool->Give(std::move(p), Use::kParked);
  EXPECT_EQ(pool->idle(), 0u) << "the short request's connection fills the cap";
  pool->Give(std::move(short_request), Use::kShort);
  EXPECT_EQ(pool->idle(), 1u);
  // The next parked wait reuses the idle connection; a short request then opens one.
  std::unique_ptr<int> reused = pool->Take(Use::kParked, absl::ZeroDuration());
  std::unique_ptr<int> opened = pool->Take(Use::kShort, absl::ZeroDuration());
  ASSERT_NE(opened, nullptr);
  EXPECT_EQ(pool.opened(), 5);
  pool->Give(std::move(opened), Use::kShort);
  pool->Give(std::move(reused), Use::kParked);
  EXPECT_EQ(pool->idle(), 1u);
}

}  // namespace
}  // namespace trainguard
