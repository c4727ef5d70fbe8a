#include "sdk/runtime/generation_watcher.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainguard {

NewerGenerationWait::NewerGenerationWait(RendezvousMember* member, absl::Duration slice)
    : member_(member), slice_(slice) {}

void NewerGenerationWait::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
}

bool NewerGenerationWait::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

absl::StatusOr<bool> NewerGenerationWait::Await(absl::Duration timeout) {
  // Real time: the deadline of store waits, which take real time whatever clock the rank uses.
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat("the wait of member ", member_->member_id(),
                                               " for a generation after ", member_->generation(),
                                               " was cancelled (its watcher is stopping)"));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::StatusOr<bool> superseded = member_->AwaitNewerGeneration(std::min(left, slice_));
    if (!superseded.ok() || *superseded) return superseded;
  }
}

GenerationWatcher::GenerationWatcher(RendezvousMember* member, absl::Duration slice,
                                     std::function<void(int64_t)> on_superseded)
    : member_(member), on_superseded_(std::move(on_superseded)), wait_(member, slice) {
  thread_ = std::thread([this] { Run(); });
}

GenerationWatcher::~GenerationWatcher() {
  Stop();
  thread_.join();
}

void GenerationWatcher::Stop() {
  wait_.Cancel();
  MutexLock lock(&mu_);
  stop_ = true;
}

void GenerationWatcher::Run() {
  int64_t announced = -1;  // the last generation on_superseded_ was called for
  while (true) {
    const int64_t held = member_->generation();
    // No deadline of its own: the watcher waits until the generation is superseded or it stops.
    absl::StatusOr<bool> superseded = wait_.Await(absl::InfiniteDuration());
    if (absl::IsCancelled(superseded.status())) return;
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
