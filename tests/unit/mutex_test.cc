// Mutex (sdk/core/mutex.h): waiters re-check their conditions whenever the mutex is released,
// by Unlock or by another thread beginning a wait of its own.
#include "sdk/core/mutex.h"

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

// Far longer than the test: a waiter that wakes only at its own timeout fails the bounded wait
// below instead.
constexpr absl::Duration kLongWait = absl::Hours(1);
constexpr absl::Duration kBound = absl::Seconds(60);

TEST(MutexTest, AWaitWokenByUnlock) {
  Mutex mu;
  bool ready = false;
  Notification seen;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ready; }, kLongWait);
    seen.Notify();
  });
  {
    MutexLock lock(&mu);
    ready = true;
  }
  EXPECT_TRUE(seen.WaitForNotificationWithTimeout(kBound));
  waiter.join();
}

// The shape of a fetch's threads (backup_client.cc): one changes the state another waits for,
// then waits itself without unlocking. Its wait must wake the other, or the other sleeps until
// its own timeout.
TEST(MutexTest, AWaitThatBeginsWakesTheOtherWaiters) {
  Mutex mu;
  bool first_done = false;     // set by the second thread, awaited by the first
  bool second_done = false;    // set by the first thread, awaited by the second
  bool first_waiting = false;  // set by the first thread just before its wait
  Notification first_saw;
  std::thread first([&] {
    MutexLock lock(&mu);
    first_waiting = true;
    mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return first_done; }, kLongWait);
    first_saw.Notify();
    second_done = true;
  });
  // The first thread holds the mutex from setting first_waiting until its wait releases it: seen
  // set under the mutex, it is waiting (bounded polling, not a notification: that is under test).
  const absl::Time deadline = absl::Now() + kBound;
  for (bool waiting = false; !waiting && absl::Now() < deadline;) {
    {
      MutexLock lock(&mu);
      waiting = first_waiting;
    }
    if (!waiting) absl::SleepFor(absl::Milliseconds(1));
  }
  std::thread second([&] {
    MutexLock lock(&mu);
    first_done = true;
    mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return second_done; }, kLongWait);
  });
  const bool woken = first_saw.WaitForNotificationWithTimeout(kBound);
  EXPECT_TRUE(woken) << "the first waiter was not woken when the second began to wait";
  if (!woken) {
    MutexLock lock(&mu);  // its Unlock wakes the first, which lets the second go
  }
  first.join();
  second.join();
  EXPECT_TRUE(first_done);
  EXPECT_TRUE(second_done);
}

}  // namespace
}  // namespace trainguard
