#include "sdk/coordinator/lease_keeper.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainguard {

LeaseKeeper::LeaseKeeper(CoordinatorLease* lease, absl::Duration call_timeout, Hooks hooks,
                         absl::Duration loop_stall_bound)
    : lease_(lease),
      call_timeout_(call_timeout),
      hooks_(std::move(hooks)),
      loop_stall_bound_(loop_stall_bound),
      loop_turned_ns_(lease != nullptr ? lease->clock()->MonotonicNanos() : 0) {}

LeaseKeeper::~LeaseKeeper() { StopRenewing(); }

void LeaseKeeper::StartRenewing(absl::Duration interval) {
  if (lease_ == nullptr || renewer_ != nullptr) return;
  DutyThreadOptions options;
  options.period = interval;
  options.duties = [this] { RenewOnce(); };  // bounded by call_timeout_
  renewer_ = std::make_unique<DutyThread>(std::move(options));
}

void LeaseKeeper::StopRenewing() { renewer_.reset(); }

void LeaseKeeper::RenewOnce() {
  if (lease_ == nullptr) return;
  // A loop wedged past its bound coordinates nothing: the lease lapses, and another agent takes it.
  const int64_t now_ns = lease_->clock()->MonotonicNanos();
  if (absl::Nanoseconds(now_ns - loop_turned_ns_.load(std::memory_order_acquire)) >
      loop_stall_bound_) {
    return;
  }
  (void)lease_->Renew(call_timeout_);  // an unreachable store: held until the acting deadline
}

bool LeaseKeeper::Coordinating() {
  if (lease_ == nullptr) return true;
  // Only a term whose takeover Update ran: the coordinator's state is read back from the store.
  if (claimed_seen_ && lease_->term() == term_seen_ && lease_->held()) return true;
  // Claimed but not renewed by the acting deadline: nobody may have taken it yet, but someone may
  // soon. What was decided stays queued: it is still this agent's to act on if its next renewal
  // succeeds (nobody took the lease meanwhile), and dropped if it is deposed. A lease lost
  // outright (the renewal thread found it taken) is said by the next Update, with its taker.
  if (said_coordinating_ && lease_->claimed() && lease_->term() == term_seen_) {
    hooks_.say(absl::StrFormat("no longer coordinating (lease term %d was not renewed in time: %s)",
                               lease_->term(), lease_->CheckHeld().message()));
    said_coordinating_ = false;
  }
  return false;
}

void LeaseKeeper::SayDeposed() {
  if (said_coordinating_) {
    const std::string holder = lease_->last_holder();
    hooks_.say(absl::StrFormat("no longer coordinating (%s)",
                               holder.empty() || holder == CoordinatorLease::kReleasedHolder
                                   ? std::string("the lease is released")
                               : holder == lease_->holder_id()
                                   ? absl::StrFormat("lease term %d expired unrenewed", term_seen_)
                                   : absl::StrCat("the lease is ", holder, "'s now")));
  }
  said_coordinating_ = false;
  hooks_.deposed();
}

void LeaseKeeper::TakeOver() {
  said_coordinating_ = true;
  // Taking over: the membership and every fact the old coordinator acted on are in the store.
  const absl::Status resumed = hooks_.resume();
  hooks_.say(absl::StrFormat("coordinating the job (lease term %d; generation %d)", term_seen_,
                             hooks_.generation()));
  if (!resumed.ok() && !absl::IsNotFound(resumed)) hooks_.say(resumed.ToString());
  hooks_.took_over();
}

void LeaseKeeper::Update() {
  if (lease_ == nullptr) return;
  loop_turned_ns_.store(lease_->clock()->MonotonicNanos(), std::memory_order_release);
  // A claimed lease is the renewal thread's to renew; the loop watches and takes it (and renews it
  // where no thread runs). Only this thread takes the lease, so a lease seen unclaimed here stays
  // so until this Update.
  if (renewer_ == nullptr || !lease_->claimed()) {
    (void)lease_->Update(call_timeout_);  // an unreachable store: held until the acting deadline
  }
  const bool claimed = lease_->claimed();
  const int64_t term = lease_->term();
  if (claimed_seen_ && (!claimed || term != term_seen_)) {
    SayDeposed();  // by this Update, or by the renewal thread since the last one
    claimed_seen_ = false;
  }
  if (claimed && !claimed_seen_) {
    claimed_seen_ = true;
    term_seen_ = term;
    TakeOver();
    return;
  }
  if (claimed && !said_coordinating_ && lease_->held()) {
    // Renewed after its deadline passed, and nobody took it meanwhile: nothing was decided by
    // another coordinator, so what this one had queued still holds.
    said_coordinating_ = true;
    hooks_.say(absl::StrFormat("coordinating the job again (lease term %d renewed; generation %d)",
                               term, hooks_.generation()));
  }
}

void LeaseKeeper::Release(absl::Duration timeout) {
  if (lease_ == nullptr) return;
  StopRenewing();
  lease_->Release(timeout);
}

}  // namespace trainguard
