#include "sdk/runtime/generation_watcher.h"

#include <utility>

#include "absl/status/statusor.h"

namespace trainguard {

GenerationWatcher::GenerationWatcher(RendezvousMember* member, absl::Duration wait,
                                     std::function<void(int64_t)> on_superseded)
    : member_(member), wait_(wait), on_superseded_(std::move(on_superseded)) {
  thread_ = std::thread([this] { Run(); });
}

GenerationWatcher::~GenerationWatcher() {
  Stop();
  thread_.join();
}

void GenerationWatcher::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
}

void GenerationWatcher::Run() {
  int64_t announced = -1;  // the last generation on_superseded_ was called for
  while (true) {
    const int64_t held = member_->generation();
    absl::StatusOr<bool> superseded = member_->AwaitNewerGeneration(wait_);
    if (superseded.ok() && *superseded && held != announced &&
        member_->superseded_generation() == held) {
      announced = held;
      on_superseded_(held);
    }
    // Nothing to wait for in the store while superseded (until the training thread adopts the
    // next generation) or while the store fails: look again shortly, without a request.
    const bool idle = !superseded.ok() || *superseded;
    MutexLock lock(&mu_);
    if (idle) {
      mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; },
                           absl::Milliseconds(20));
    }
    if (stop_) return;
  }
}

}  // namespace trainguard
