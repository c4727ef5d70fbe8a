#include "sdk/watchdog/recorder_append.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string_view>
#include <thread>

namespace trainguard {
namespace watchdog_internal {
namespace {

// A spin lock rather than trainguard::Mutex: it is held for one 128-byte copy, is almost never
// contended (the monitor appends on a hang or a finished GPU collective), and on the training
// thread's hot path it costs one exchange instead of a pthread lock, unlock and condition-variable
// broadcast (Mutex::Unlock notifies). Built on acquire/release atomics, ThreadSanitizer sees it. A
// waiter yields after a few spins, in case the holder was preempted on an oversubscribed machine.
std::atomic<bool> g_append_locked{false};

void LockAppend() {
  for (int spins = 0; g_append_locked.exchange(true, std::memory_order_acquire); ++spins) {
    if (spins >= 64) std::this_thread::yield();
  }
}

void UnlockAppend() { g_append_locked.store(false, std::memory_order_release); }

}  // namespace

void AppendToRecorder(FlightRecorder* recorder, const FlightRecord& record) {
  if (recorder == nullptr) return;
  LockAppend();
  recorder->Append(record);
  UnlockAppend();
}

void SetRecordName(FlightRecord& record, std::string_view name) {
  const size_t n = std::min(name.size(), sizeof(record.name) - 1);
  std::memcpy(record.name, name.data(), n);
  record.name[n] = '\0';
}

}  // namespace watchdog_internal
}  // namespace trainguard
