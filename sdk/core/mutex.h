// Mutex and Notification: the locking primitives trainguard uses.
//
// They have absl::Mutex's shape (Lock/Unlock, MutexLock, AwaitWithTimeout, Abseil's thread-safety
// annotations, so clang's -Wthread-safety checks ABSL_GUARDED_BY) but are built on std::mutex and
// std::condition_variable. Reason: Debian's libabsl is not compiled with ThreadSanitizer, so TSan
// cannot see absl::Mutex's synchronisation and reports every critical section as a race; it does
// intercept pthread mutexes, so with these the TSan runs of the test suite mean something.
//
// Thread safety: that is their purpose. Not copyable or movable.
#ifndef TRAINGUARD_SDK_CORE_MUTEX_H_
#define TRAINGUARD_SDK_CORE_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace trainguard {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Waiters re-check their conditions whenever the mutex is released, as with absl::Mutex::Await.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    changed_.notify_all();
  }

  // With the mutex held: waits until `condition()` is true or `timeout` passed; returns
  // condition(). The wait releases the mutex, as Unlock does, and so wakes the other waiters too:
  // the caller may have changed what they wait for before it began to wait itself.
  template <typename Condition>
  bool AwaitWithTimeout(Condition condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    changed_.notify_all();
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool met = changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), condition);
    lock.release();  // the caller still holds the mutex
    return met;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A one-shot event, as absl::Notification.
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  // True when notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return notified_; },
                                timeout);
  }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_MUTEX_H_
