// The coordinator lease over a Store: see coordinator_lease.h.
#include "sdk/rendezvous/coordinator_lease.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace trainguard {
namespace {

constexpr const char* kReleased = CoordinatorLease::kReleasedHolder;

using LeaseValue = store_keys::LeaseRecord;

// A value that does not decode counts as term 0 held by nobody, so it is taken over like an
// expired one.
LeaseValue Parse(const std::string& value) {
  absl::StatusOr<LeaseValue> lease = store_keys::DecodeLeaseRecord(value);
  return lease.ok() ? *std::move(lease) : LeaseValue{};
}

}  // namespace

CoordinatorLease::CoordinatorLease(Store* store, std::string holder_id, absl::Duration expiry,
                                   Clock* clock, std::optional<absl::Duration> acting_margin)
    : store_(store),
      holder_id_(std::move(holder_id)),
      expiry_(expiry),
      clock_(clock),
      acting_margin_(acting_margin.value_or(DefaultActingMargin(expiry))) {}

std::string CoordinatorLease::Value(int64_t term, int64_t beat) const {
  return store_keys::EncodeLeaseRecord({term, holder_id_, beat});
}

absl::Status CoordinatorLease::CheckHeld() const {
  const int64_t now_ns = clock_->MonotonicNanos();
  const int64_t deadline_ns = acting_deadline_ns();
  if (now_ns < deadline_ns) return absl::OkStatus();
  if (deadline_ns == kNotHeld) {
    return absl::AbortedError(absl::StrFormat(
        "%s does not hold the coordinator lease (key %s; the newest term it held: %d)",
        holder_id_, kKey, term()));
  }
  return absl::AbortedError(absl::StrFormat(
      "%s no longer acts under coordinator lease term %d (key %s): its acting deadline, %s before "
      "the expiry of its last renewal, passed %s ago",
      holder_id_, term(), kKey, absl::FormatDuration(acting_margin_),
      absl::FormatDuration(absl::Nanoseconds(now_ns - deadline_ns))));
}

void CoordinatorLease::Renewed(int64_t started_ns) {
  renewed_ns_ = started_ns;
  renewal_attempt_ns_.reset();
  acting_deadline_ns_.store(
      started_ns + absl::ToInt64Nanoseconds(expiry_ - acting_margin_), std::memory_order_release);
}

void CoordinatorLease::StopHolding() {
  // The gate first: once the claim is seen dropped, no act can pass it any more.
  acting_deadline_ns_.store(kNotHeld, std::memory_order_release);
  claimed_.store(false, std::memory_order_release);
  renewal_attempt_ns_.reset();
}

void CoordinatorLease::SawTerm(int64_t term) {
  int64_t seen = latest_term_.load(std::memory_order_relaxed);
  while (seen < term &&
         !latest_term_.compare_exchange_weak(seen, term, std::memory_order_acq_rel)) {
  }
}

void CoordinatorLease::SetLastHolder(std::string holder) {
  MutexLock lock(&names_mu_);
  last_holder_ = std::move(holder);
}

bool CoordinatorLease::TryTake(const std::optional<std::string>& expected, int64_t term,
                               absl::Duration timeout) {
  const std::string value = Value(term, 0);
  // Timed from before the write: a watcher may see the value as soon as it is applied.
  const int64_t started_ns = clock_->MonotonicNanos();
  absl::StatusOr<CompareAndSetResult> taken =
      store_->CompareAndSet(kKey, expected, value, timeout);
  if (!taken.ok() || !taken->swapped) return false;
  {
    MutexLock lock(&names_mu_);
    taken_from_ = expected.has_value() ? Parse(*expected).holder : "";
    last_holder_ = holder_id_;
  }
  term_.store(term, std::memory_order_release);
  SawTerm(term);
  beat_ = 0;
  written_ = value;
  Renewed(started_ns);
  claimed_.store(true, std::memory_order_release);
  return held();
}

absl::StatusOr<bool> CoordinatorLease::Update(absl::Duration timeout) {
  MutexLock lock(&update_mu_);
  return claimed() ? RenewLocked(timeout) : WatchLocked(timeout);
}

absl::StatusOr<bool> CoordinatorLease::Renew(absl::Duration timeout) {
  MutexLock lock(&update_mu_);
  if (!claimed()) return false;
  return RenewLocked(timeout);
}

absl::StatusOr<bool> CoordinatorLease::RenewLocked(absl::Duration timeout) {
  const int64_t now_ns = clock_->MonotonicNanos();
  const int64_t term = this->term();
  const std::string next = Value(term, beat_ + 1);
  if (!renewal_attempt_ns_.has_value()) renewal_attempt_ns_ = now_ns;
  absl::StatusOr<CompareAndSetResult> renewed =
      store_->CompareAndSet(kKey, written_, next, timeout);
  if (!renewed.ok()) {
    // Unreachable store: the claim stands until nobody could have waited out the expiry (the
    // gate, HeldAt, closed earlier, at the acting deadline).
    if (absl::Nanoseconds(clock_->MonotonicNanos() - renewed_ns_) >= expiry_) StopHolding();
    return renewed.status();
  }
  if (!renewed->swapped && renewed->current.has_value()) {
    // A renewal of ours that timed out yet was applied: the value is still our term's. It dates
    // from the first attempt to write it, or from before the last confirmed one when this agent
    // never tried to (not a value of this process's making: the oldest time that is safe).
    const LeaseValue current = Parse(*renewed->current);
    if (current.holder == holder_id_ && current.term == term) {
      const int64_t written_ns = *renewed->current == next ? *renewal_attempt_ns_ : renewed_ns_;
      beat_ = current.beat;
      written_ = *renewed->current;
      Renewed(written_ns);
      return held();
    }
  }
  if (!renewed->swapped) {  // another agent took the lease: deposed
    StopHolding();
    observed_ = renewed->current;
    observed_since_ns_ = clock_->MonotonicNanos();
    const LeaseValue current =
        renewed->current.has_value() ? Parse(*renewed->current) : LeaseValue{};
    SetLastHolder(current.holder);
    SawTerm(current.term);
    return false;
  }
  const int64_t attempt_ns = *renewal_attempt_ns_;
  ++beat_;
  written_ = next;
  // From the first attempt of this value (an earlier one may have been applied and seen).
  Renewed(attempt_ns);
  return held();
}

absl::StatusOr<bool> CoordinatorLease::WatchLocked(absl::Duration timeout) {
  const int64_t now_ns = clock_->MonotonicNanos();
  absl::StatusOr<std::string> value = store_->Get(kKey, timeout);
  if (!value.ok() && !absl::IsNotFound(value.status())) return value.status();
  if (!value.ok()) return TryTake(std::nullopt, 1, timeout);
  const LeaseValue lease = Parse(*value);
  SetLastHolder(lease.holder);
  SawTerm(lease.term);
  if (lease.holder == kReleased) return TryTake(*value, lease.term + 1, timeout);
  if (!observed_.has_value() || *observed_ != *value) {
    // Timed from after the read: the value may have been written while the read was under way,
    // and its writer's acting deadline counts from the start of that write.
    observed_ = *value;
    observed_since_ns_ = clock_->MonotonicNanos();
    return false;
  }
  if (absl::Nanoseconds(now_ns - observed_since_ns_) < expiry_) return false;
  return TryTake(*value, lease.term + 1, timeout);
}

void CoordinatorLease::Release(absl::Duration timeout) {
  MutexLock lock(&update_mu_);
  if (!claimed()) return;
  StopHolding();
  // Compare-and-set, so that a lease taken over meanwhile is left alone; the released value keeps
  // the term, so the next holder's term is still higher than every earlier one.
  (void)store_->CompareAndSet(kKey, written_, store_keys::EncodeLeaseRecord({term(), kReleased, 0}),
                              timeout);
}

}  // namespace trainguard
