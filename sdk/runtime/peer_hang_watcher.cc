#include "sdk/runtime/peer_hang_watcher.h"

#include <utility>

#include "absl/time/clock.h"
#include "sdk/core/store_keys.h"

namespace trainguard {

PeerHangWatcher::PeerHangWatcher(PeerHangWatcherOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

PeerHangWatcher::~PeerHangWatcher() {
  Stop();
  thread_.join();
}

void PeerHangWatcher::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
}

void PeerHangWatcher::Run() {
  absl::Time next_hang_check = absl::InfinitePast();
  while (true) {
    {
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; }, options_.period);
      if (stop_) return;
    }
    options_.duties();
    if (options_.store == nullptr || absl::Now() < next_hang_check) continue;
    next_hang_check = absl::Now() + options_.hang_check_period;
    const int64_t generation = options_.generation();
    const absl::Time asked = absl::Now();
    const absl::StatusOr<std::string> who =
        options_.store->Get(store_keys::Hang(generation), absl::Seconds(2));
    options_.on_hang_key(generation, who, asked);
  }
}

}  // namespace trainguard
