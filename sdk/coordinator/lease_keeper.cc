#include "sdk/coordinator/lease_keeper.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainguard {

LeaseKeeper::LeaseKeeper(CoordinatorLease* lease, absl::Duration call_timeout, Hooks hooks)
    : lease_(lease), call_timeout_(call_timeout), hooks_(std::move(hooks)) {}

bool LeaseKeeper::Coordinating() {
  if (lease_ == nullptr) return true;
  if (lease_->held()) return true;
  // Claimed but not renewed by the acting deadline: nobody may have taken it yet, but someone may
  // soon. What was decided stays queued: it is still this agent's to act on if its next renewal
  // succeeds (nobody took the lease meanwhile), and dropped if it is deposed.
  if (said_coordinating_ && lease_->claimed()) {
    hooks_.say(absl::StrFormat("no longer coordinating (lease term %d was not renewed in time: %s)",
                               lease_->term(), lease_->CheckHeld().message()));
  }
  said_coordinating_ = false;
  return false;
}

void LeaseKeeper::Update() {
  if (lease_ == nullptr) return;
  const bool was = lease_->claimed();
  (void)lease_->Update(call_timeout_);  // an unreachable store: held until the acting deadline
  if (lease_->claimed() == was) {
    if (was && !said_coordinating_ && lease_->held()) {
      // Renewed after its deadline passed, and nobody took it meanwhile: nothing was decided by
      // another coordinator, so what this one had queued still holds.
      said_coordinating_ = true;
      hooks_.say(
          absl::StrFormat("coordinating the job again (lease term %d renewed; generation %d)",
                          lease_->term(), hooks_.generation()));
    }
    return;
  }
  if (!lease_->claimed()) {
    const std::string& holder = lease_->last_holder();
    if (said_coordinating_) {
      hooks_.say(
          absl::StrFormat("no longer coordinating (%s)",
                          holder.empty() || holder == CoordinatorLease::kReleasedHolder
                              ? std::string("the lease is released")
                          : holder == lease_->holder_id()
                              ? absl::StrFormat("lease term %d expired unrenewed", lease_->term())
                              : absl::StrCat("the lease is ", holder, "'s now")));
    }
    said_coordinating_ = false;
    hooks_.deposed();
    return;
  }
  said_coordinating_ = true;
  // Taking over: the membership and every fact the old coordinator acted on are in the store.
  const absl::Status resumed = hooks_.resume();
  hooks_.say(absl::StrFormat("coordinating the job (lease term %d; generation %d)", lease_->term(),
                             hooks_.generation()));
  if (!resumed.ok() && !absl::IsNotFound(resumed)) hooks_.say(resumed.ToString());
  hooks_.took_over();
}

}  // namespace trainguard
