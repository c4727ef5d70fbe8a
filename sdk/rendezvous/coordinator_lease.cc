// The coordinator lease over a Store: see coordinator_lease.h.
#include "sdk/rendezvous/coordinator_lease.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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
                                   Clock* clock)
    : store_(store), holder_id_(std::move(holder_id)), expiry_(expiry), clock_(clock) {}

std::string CoordinatorLease::Value(int64_t term, int64_t beat) const {
  return store_keys::EncodeLeaseRecord({term, holder_id_, beat});
}

bool CoordinatorLease::TryTake(const std::optional<std::string>& expected, int64_t term,
                               absl::Duration timeout) {
  const std::string value = Value(term, 0);
  absl::StatusOr<CompareAndSetResult> taken =
      store_->CompareAndSet(kKey, expected, value, timeout);
  if (!taken.ok() || !taken->swapped) return false;
  held_ = true;
  taken_from_ = expected.has_value() ? Parse(*expected).holder : "";
  term_ = term;
  latest_term_ = std::max(latest_term_, term);
  beat_ = 0;
  written_ = value;
  renewed_ns_ = clock_->MonotonicNanos();
  last_holder_ = holder_id_;
  return true;
}

absl::StatusOr<bool> CoordinatorLease::Update(absl::Duration timeout) {
  const int64_t now_ns = clock_->MonotonicNanos();
  if (held_) {
    const std::string next = Value(term_, beat_ + 1);
    absl::StatusOr<CompareAndSetResult> renewed =
        store_->CompareAndSet(kKey, written_, next, timeout);
    if (!renewed.ok()) {
      // Unreachable store: still the holder until nobody could have waited out the expiry.
      if (absl::Nanoseconds(now_ns - renewed_ns_) >= expiry_) held_ = false;
      return renewed.status();
    }
    if (!renewed->swapped && renewed->current.has_value()) {
      // A renewal of ours that timed out yet was applied: the value is still our term's.
      const LeaseValue current = Parse(*renewed->current);
      if (current.holder == holder_id_ && current.term == term_) {
        beat_ = current.beat;
        written_ = *renewed->current;
        renewed_ns_ = now_ns;
        return true;
      }
    }
    if (!renewed->swapped) {  // another agent took the lease: deposed
      held_ = false;
      observed_ = renewed->current;
      observed_since_ns_ = now_ns;
      const LeaseValue current =
          renewed->current.has_value() ? Parse(*renewed->current) : LeaseValue{};
      last_holder_ = current.holder;
      latest_term_ = std::max(latest_term_, current.term);
      return false;
    }
    ++beat_;
    written_ = next;
    renewed_ns_ = now_ns;
    return true;
  }
  absl::StatusOr<std::string> value = store_->Get(kKey, timeout);
  if (!value.ok() && !absl::IsNotFound(value.status())) return value.status();
  if (!value.ok()) return TryTake(std::nullopt, 1, timeout);
  const LeaseValue lease = Parse(*value);
  last_holder_ = lease.holder;
  latest_term_ = std::max(latest_term_, lease.term);
  if (lease.holder == kReleased) return TryTake(*value, lease.term + 1, timeout);
  if (!observed_.has_value() || *observed_ != *value) {
    observed_ = *value;
    observed_since_ns_ = now_ns;
    return false;
  }
  if (absl::Nanoseconds(now_ns - observed_since_ns_) < expiry_) return false;
  return TryTake(*value, lease.term + 1, timeout);
}

void CoordinatorLease::Release(absl::Duration timeout) {
  if (!held_) return;
  held_ = false;
  // Compare-and-set, so that a lease taken over meanwhile is left alone; the released value keeps
  // the term, so the next holder's term is still higher than every earlier one.
  (void)store_->CompareAndSet(kKey, written_, store_keys::EncodeLeaseRecord({term_, kReleased, 0}),
                              timeout);
}

}  // namespace trainguard
