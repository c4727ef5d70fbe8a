#include "sdk/runtime/generation_watcher.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "sdk/core/store_keys.h"

namespace trainguard {
namespace {

// Tells the watchers of one member apart (a process may create several Runtimes in turn, under
// one member id), also across processes that reuse a member id: a wake key left behind by one
// never wakes another.
uint64_t WakeNonce() {
  static std::atomic<uint64_t> counter{0};
  return static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) + counter.fetch_add(1);
}

// Bounds Stop()'s write of the wake key and the destructor's delete of it.
constexpr absl::Duration kWakeCallTimeout = absl::Seconds(1);
// How often an idle watcher (its generation superseded, or its store failing) looks again.
constexpr absl::Duration kIdleLook = absl::Milliseconds(20);
// The longest parked wait after a failed one, until a wait ends normally again: while the store
// cannot be reached, Stop()'s wake key cannot reach it either, and the destructor waits for the
// wait in progress to end by itself.
constexpr absl::Duration kParkWhileFailing = absl::Milliseconds(250);

}  // namespace

GenerationWatcher::GenerationWatcher(GenerationWatcherOptions options)
    : options_(std::move(options)),
      wake_key_(store_keys::RdzvWake(options_.member->member_id(), WakeNonce())) {
  thread_ = std::thread([this] { Run(); });
}

GenerationWatcher::~GenerationWatcher() {
  Stop();
  thread_.join();
  bool woken = false;
  {
    MutexLock lock(&mu_);
    woken = woken_;
  }
  // Best effort: a key left behind is a few bytes that wake no one.
  if (woken) (void)options_.store->Delete(wake_key_, kWakeCallTimeout);
}

void GenerationWatcher::Stop() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  // Ends the parked wait now rather than at its deadline.
  const bool written = options_.store->Set(wake_key_, "stop", kWakeCallTimeout).ok();
  MutexLock lock(&mu_);
  woken_ = written;
}

bool GenerationWatcher::stopping() {
  MutexLock lock(&mu_);
  return stop_;
}

void GenerationWatcher::Idle(absl::Duration timeout) {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; }, timeout);
}

bool GenerationWatcher::ReadHangKey(int64_t generation) {
  const absl::Time asked = absl::Now();
  const absl::StatusOr<std::string> who =
      options_.store->Get(store_keys::Hang(generation), absl::Seconds(2));
  options_.on_hang_key(generation, who, asked);
  return who.ok();
}

void GenerationWatcher::Run() {
  RendezvousMember& member = *options_.member;
  const bool watch_hangs = static_cast<bool>(options_.on_hang_key);
  int64_t announced = -1;      // the last generation on_superseded was called for
  int64_t hang_standing = -1;  // the generation whose hang key was last read present
  // Per notice: the last of its keys seen (and handled).
  std::vector<std::string> noticed(options_.notices.size());
  bool failing = false;  // the last wait failed
  while (!stopping()) {
    const int64_t held = member.generation();
    // Nothing to wait for in the store while superseded, until the training thread adopts the
    // next generation: look again shortly, without a request.
    if (member.superseded_generation() == held) {
      if (held != announced) {
        announced = held;
        options_.on_superseded(held);
      }
      Idle(kIdleLook);
      continue;
    }
    // What keys[i] is: the wake key, the hang key, or a notice (its index in options_.notices).
    constexpr size_t kWake = std::numeric_limits<size_t>::max();
    constexpr size_t kHang = kWake - 1;
    std::vector<std::string> keys = {wake_key_};
    std::vector<size_t> awaited = {kWake};
    const bool hang_stands = watch_hangs && hang_standing == held;
    if (watch_hangs && !hang_stands) {
      keys.push_back(store_keys::Hang(held));
      awaited.push_back(kHang);
    }
    for (size_t n = 0; n < options_.notices.size(); ++n) {
      std::string key = options_.notices[n].key(held);
      if (key == noticed[n]) continue;
      keys.push_back(std::move(key));
      awaited.push_back(n);
    }
    absl::Duration park = hang_stands ? options_.hang_recheck : options_.park;
    if (failing) park = std::min(park, kParkWhileFailing);
    absl::StatusOr<RendezvousMember::NewerGenerationOrKey> seen =
        member.AwaitNewerGenerationOr(keys, park);
    failing = !seen.ok();
    if (failing) {
      Idle(kIdleLook);
      continue;
    }
    if (seen->superseded) continue;  // announced at the top of the loop, if still held
    const size_t what = seen->key.has_value() ? awaited[*seen->key] : kHang;
    if (what == kWake) continue;  // Stop() was called
    if (what != kHang) {
      noticed[what] = keys[*seen->key];
      options_.notices[what].on_seen(held);
      continue;
    }
    // The hang key appeared, or a standing hang is due for another read (it may be withdrawn).
    if (seen->key.has_value() || hang_stands) {
      hang_standing = ReadHangKey(held) ? held : -1;
    }
  }
}

}  // namespace trainguard
