#include "sdk/rendezvous/store_state.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sdk/rendezvous/store_frame.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

absl::Status CheckKey(const std::string& key, std::string_view op) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("store key must not be empty (in a %s request)", op));
  }
  return absl::OkStatus();
}

absl::Status CheckKeys(const google::protobuf::RepeatedPtrField<std::string>& keys,
                       std::string_view op) {
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key, op); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The writes of `op` as Store::WriteBatch takes them; InvalidArgument naming a write that is
// malformed (no operation, a Set that adds).
absl::StatusOr<std::vector<BatchWrite>> BatchWrites(const proto::WriteBatchOp& op) {
  std::vector<BatchWrite> writes;
  writes.reserve(op.writes_size());
  for (int i = 0; i < op.writes_size(); ++i) {
    const proto::BatchWriteOp& write = op.writes(i);
    switch (write.write_case()) {
      case proto::BatchWriteOp::kSet:
        if (!write.set().add_key().empty() || write.set().add_delta() != 0 ||
            write.set().only_if_absent()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("write %d of a store batch is a Set that adds (not in a batch)", i));
        }
        writes.push_back(BatchWrite::Set(write.set().key(), write.set().value()));
        break;
      case proto::BatchWriteOp::kCompareAndSet: {
        const proto::CompareAndSetOp& cas = write.compare_and_set();
        writes.push_back(BatchWrite::CompareAndSet(
            cas.key(),
            cas.expected_present() ? std::optional<std::string>(cas.expected()) : std::nullopt,
            cas.desired()));
        break;
      }
      case proto::BatchWriteOp::kRaiseFence:
        writes.push_back(BatchWrite::RaiseFence(write.raise_fence().generation()));
        break;
      case proto::BatchWriteOp::WRITE_NOT_SET:
        return absl::InvalidArgumentError(
            absl::StrFormat("write %d of a store batch has no operation this server knows", i));
    }
  }
  if (absl::Status s = CheckBatch(writes); !s.ok()) return s;
  return writes;
}

// A compare-and-set on `data`: writes `desired` when `key` holds `expected` (nullopt: when it is
// absent) and says whether it did; `current` gets what the key holds after it (nothing when it
// is absent).
template <typename Data>
bool CompareAndSetIn(Data& data, const std::string& key, const std::optional<std::string>& expected,
                     const std::string& desired, proto::OptionalValue* current) {
  auto it = data.find(key);
  const bool matches =
      expected.has_value() ? (it != data.end() && it->second == *expected) : it == data.end();
  if (matches) {
    data.insert_or_assign(key, desired);
    current->set_present(true);
    current->set_value(desired);
  } else if (it != data.end()) {
    current->set_present(true);
    current->set_value(it->second);
  }
  return matches;
}

}  // namespace

absl::Status ValidateStoreRequest(const proto::StoreRequest& request) {
  if (request.request_id() == 0) {
    return absl::InvalidArgumentError("store request has request id 0 (reserved)");
  }
  switch (request.op_case()) {
    case proto::StoreRequest::kSet:
      if (request.set().add_key().empty() &&
          (request.set().add_delta() != 0 || request.set().only_if_absent())) {
        return absl::InvalidArgumentError("a Set request adds to no store key");
      }
      return CheckKey(request.set().key(), "Set");
    case proto::StoreRequest::kGet:
      return CheckKey(request.get().key(), "Get");
    case proto::StoreRequest::kAdd:
      return CheckKey(request.add().key(), "Add");
    case proto::StoreRequest::kCompareAndSet:
      return CheckKey(request.compare_and_set().key(), "CompareAndSet");
    case proto::StoreRequest::kDeleteKey:
      return CheckKey(request.delete_key().key(), "Delete");
    case proto::StoreRequest::kMultiGet:
      return CheckKeys(request.multi_get().keys(), "MultiGet");
    case proto::StoreRequest::kWait:
      if (absl::Status s = CheckKeys(request.wait().keys(), "Wait"); !s.ok()) return s;
      return CheckKeys(request.wait().read_keys(), "Wait");
    case proto::StoreRequest::kWaitAny:
      if (request.wait_any().keys().empty()) {
        return absl::InvalidArgumentError("a WaitAny request names no store key");
      }
      if (absl::Status s = CheckKeys(request.wait_any().keys(), "WaitAny"); !s.ok()) return s;
      return CheckKeys(request.wait_any().read_keys(), "WaitAny");
    case proto::StoreRequest::kWriteBatch:
      return BatchWrites(request.write_batch()).status();
    case proto::StoreRequest::kListKeys:
    case proto::StoreRequest::kRaiseFence:
      return absl::OkStatus();
    case proto::StoreRequest::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("store request %d has no operation this server knows (protocol version %d)",
                      request.request_id(), store_wire::kProtocolVersion));
}

proto::StoreResponse StatusResponse(uint64_t request_id, const absl::Status& status) {
  proto::StoreResponse response;
  response.set_request_id(request_id);
  response.set_code(static_cast<int32_t>(status.code()));
  response.set_message(std::string(status.message()));
  return response;
}

absl::Status StoreState::CheckFence(const Job& job, int64_t writer) const {
  if (writer == -1 || writer >= job.fence) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("stale generation ", writer, " < fence ", job.fence, ": write rejected"));
}

std::optional<proto::StoreResponse> StoreState::Execute(uint64_t session_id, const std::string& job,
                                                        const proto::StoreRequest& request,
                                                        absl::Time now) {
  Job& state = jobs_[job];
  bool parked = false;
  proto::StoreResponse response = Apply(session_id, state, request, now, &parked);
  if (parked) return std::nullopt;
  response.set_request_id(request.request_id());
  return WithinFrameLimit(std::move(response));
}

proto::StoreResponse StoreState::WithinFrameLimit(proto::StoreResponse response) const {
  const size_t bytes = response.ByteSizeLong();
  if (bytes <= max_response_bytes_) return response;
  return StatusResponse(
      response.request_id(),
      absl::ResourceExhaustedError(absl::StrFormat(
          "the response of %d bytes to store request %d exceeds the frame limit of %d bytes", bytes,
          response.request_id(), max_response_bytes_)));
}

absl::StatusOr<int64_t> StoreState::SumOf(const Job& job, const std::string& key, int64_t delta) {
  auto it = job.data.find(key);
  return SumOf(it == job.data.end() ? std::string() : it->second, key, delta);
}

absl::StatusOr<int64_t> StoreState::SumOf(const std::string& value, const std::string& key,
                                          int64_t delta) {
  int64_t current = 0;
  if (!value.empty() && !absl::SimpleAtoi(value, &current)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("store key %s holds a non-integer value; Add needs a decimal int64", key));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::OutOfRangeError(
        absl::StrFormat("Add(%s, %d) overflows int64 (the key holds %d)", key, delta, current));
  }
  return sum;
}

template <typename Keys>
void StoreState::AddValues(const Job& job, const Keys& keys, proto::StoreResponse* response) {
  for (const std::string& key : keys) {
    proto::OptionalValue* value = response->add_values();
    auto it = job.data.find(key);
    if (it != job.data.end()) {
      value->set_present(true);
      value->set_value(it->second);
    }
  }
}

proto::StoreResponse StoreState::Apply(uint64_t session_id, Job& job,
                                       const proto::StoreRequest& request, absl::Time now,
                                       bool* parked) {
  const uint64_t id = request.request_id();
  const int64_t writer = request.writer_generation();
  switch (request.op_case()) {
    case proto::StoreRequest::kSet: {
      if (absl::Status s = CheckFence(job, writer); !s.ok()) return StatusResponse(id, s);
      const proto::SetOp& op = request.set();
      if (op.add_key().empty()) {
        job.data.insert_or_assign(op.key(), op.value());
        KeyWritten(job, op.key(), now);
        return StatusResponse(id, absl::OkStatus());
      }
      // CreateAndAdd: nothing when the key exists.
      if (op.only_if_absent() && job.data.contains(op.key())) {
        return StatusResponse(id, absl::OkStatus());
      }
      // SetAndAdd: the sum is checked before either write, so that both happen or neither. It is
      // taken after the Set, as the two calls would: the keys may be the same.
      absl::StatusOr<int64_t> sum = op.add_key() == op.key()
                                        ? SumOf(op.value(), op.add_key(), op.add_delta())
                                        : SumOf(job, op.add_key(), op.add_delta());
      if (!sum.ok()) return StatusResponse(id, sum.status());
      job.data.insert_or_assign(op.key(), op.value());
      job.data.insert_or_assign(op.add_key(), absl::StrCat(*sum));
      KeyWritten(job, op.key(), now);
      KeyWritten(job, op.add_key(), now);
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      response.set_number(*sum);
      response.set_flag(true);
      return response;
    }
    case proto::StoreRequest::kGet: {
      auto it = job.data.find(request.get().key());
      if (it == job.data.end()) {
        return StatusResponse(id, absl::NotFoundError(absl::StrFormat("store key %s not found",
                                                                      request.get().key())));
      }
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      response.set_value(it->second);
      return response;
    }
    case proto::StoreRequest::kAdd: {
      if (absl::Status s = CheckFence(job, writer); !s.ok()) return StatusResponse(id, s);
      const std::string& key = request.add().key();
      absl::StatusOr<int64_t> sum = SumOf(job, key, request.add().delta());
      if (!sum.ok()) return StatusResponse(id, sum.status());
      job.data.insert_or_assign(key, absl::StrCat(*sum));
      KeyWritten(job, key, now);
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      response.set_number(*sum);
      return response;
    }
    case proto::StoreRequest::kCompareAndSet: {
      if (absl::Status s = CheckFence(job, writer); !s.ok()) return StatusResponse(id, s);
      const proto::CompareAndSetOp& op = request.compare_and_set();
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      const bool matches = CompareAndSetIn(
          job.data, op.key(),
          op.expected_present() ? std::optional<std::string>(op.expected()) : std::nullopt,
          op.desired(), response.add_values());
      response.set_flag(matches);
      if (matches) KeyWritten(job, op.key(), now);
      return response;
    }
    case proto::StoreRequest::kDeleteKey: {
      if (absl::Status s = CheckFence(job, writer); !s.ok()) return StatusResponse(id, s);
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      response.set_flag(job.data.erase(request.delete_key().key()) > 0);
      job.written.erase(request.delete_key().key());
      return response;
    }
    case proto::StoreRequest::kMultiGet: {
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      AddValues(job, request.multi_get().keys(), &response);
      if (request.multi_get().with_ages()) AddAges(job, request.multi_get().keys(), now, &response);
      return response;
    }
    case proto::StoreRequest::kListKeys: {
      const std::string& prefix = request.list_keys().prefix();
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      for (auto it = job.data.lower_bound(prefix);
           it != job.data.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        response.add_keys(it->first);
      }
      return response;
    }
    case proto::StoreRequest::kWait: {
      const proto::WaitOp& op = request.wait();
      std::vector<std::string> keys(op.keys().begin(), op.keys().end());
      uint64_t lookups = 0;
      const size_t missing = FirstMissing(job, keys, 0, &lookups);
      if (missing == keys.size()) {
        proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
        AddValues(job, op.read_keys(), &response);
        return response;
      }
      if (op.timeout_ms() <= 0) return StatusResponse(id, MissingKeys(job, keys, "0"));
      auto of_session = waiters_of_session_.find(session_id);
      if (of_session != waiters_of_session_.end() &&
          of_session->second.size() >= kMaxParkedWaitsPerSession) {
        return StatusResponse(
            id, absl::ResourceExhaustedError(absl::StrFormat(
                    "this connection already has %d Waits parked on the store server (the limit)",
                    of_session->second.size())));
      }
      Park(session_id, job, std::move(keys), request, missing, now);
      *parked = true;
      return proto::StoreResponse();
    }
    case proto::StoreRequest::kWaitAny:
      return ApplyWaitAny(session_id, job, request, now, parked);
    case proto::StoreRequest::kRaiseFence:
      job.fence = std::max(job.fence, request.raise_fence().generation());
      return StatusResponse(id, absl::OkStatus());
    case proto::StoreRequest::kWriteBatch:
      return ApplyBatch(job, request, now);
    case proto::StoreRequest::OP_NOT_SET:
      break;
  }
  return StatusResponse(id, ValidateStoreRequest(request));
}

proto::StoreResponse StoreState::ApplyBatch(Job& job, const proto::StoreRequest& request,
                                            absl::Time now) {
  const uint64_t id = request.request_id();
  if (absl::Status s = CheckFence(job, request.writer_generation()); !s.ok()) {
    return StatusResponse(id, s);
  }
  // Validated already (ValidateStoreRequest: BatchWrites), so the writes are applied as sent.
  proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
  std::vector<const std::string*> written;
  written.reserve(request.write_batch().writes_size());
  for (const proto::BatchWriteOp& write : request.write_batch().writes()) {
    proto::OptionalValue* after = response.add_values();
    bool wrote = false;
    switch (write.write_case()) {
      case proto::BatchWriteOp::kSet:
        job.data.insert_or_assign(write.set().key(), write.set().value());
        after->set_present(true);
        after->set_value(write.set().value());
        written.push_back(&write.set().key());
        wrote = true;
        break;
      case proto::BatchWriteOp::kCompareAndSet: {
        const proto::CompareAndSetOp& cas = write.compare_and_set();
        wrote = CompareAndSetIn(
            job.data, cas.key(),
            cas.expected_present() ? std::optional<std::string>(cas.expected()) : std::nullopt,
            cas.desired(), after);
        if (wrote) written.push_back(&cas.key());
        break;
      }
      case proto::BatchWriteOp::kRaiseFence:
        job.fence = std::max(job.fence, write.raise_fence().generation());
        wrote = true;
        break;
      case proto::BatchWriteOp::WRITE_NOT_SET:
        break;
    }
    response.add_flags(wrote);
  }
  // The parked Waits only now: one woken by the batch's first key reads its last.
  for (const std::string* key : written) KeyWritten(job, *key, now);
  return response;
}

size_t StoreState::FirstMissing(const Job& job, const std::vector<std::string>& keys, size_t from,
                                uint64_t* lookups) {
  for (; from < keys.size(); ++from) {
    ++*lookups;
    if (!job.data.contains(keys[from])) break;
  }
  return from;
}

absl::Status StoreState::MissingKeys(const Job& job, const std::vector<std::string>& keys,
                                     absl::string_view waited) {
  std::vector<absl::string_view> named;
  size_t absent = 0;
  for (const std::string& key : keys) {
    if (job.data.contains(key)) continue;
    if (++absent <= kNamedMissingKeys) named.push_back(key);
  }
  std::string text = absl::StrCat("waited ", waited,
                                  " for store keys; still missing: ", absl::StrJoin(named, ", "));
  if (absent > named.size()) {
    absl::StrAppend(&text, " and ", absent - named.size(), " more (", absent, " of ", keys.size(),
                    " keys)");
  }
  return absl::DeadlineExceededError(text);
}

void StoreState::Park(uint64_t session_id, Job& job, std::vector<std::string> keys,
                      const proto::StoreRequest& request, size_t missing, absl::Time now) {
  const uint64_t waiter_id = next_waiter_id_++;
  // Clamped so that the deadline arithmetic cannot overflow (about 292 years).
  const absl::Duration timeout =
      absl::Milliseconds(std::min<int64_t>(request.wait().timeout_ms(), int64_t{1} << 53));
  auto index = job.waiting_on.emplace(keys[missing], waiter_id);
  Waiter waiter{
      .session_id = session_id,
      .request_id = request.request_id(),
      .job = &job,
      .keys = std::move(keys),
      .read_keys = {request.wait().read_keys().begin(), request.wait().read_keys().end()},
      .present = missing,
      .timeout = timeout,
      .deadline = now + timeout,
      .index = index,
  };
  deadlines_.emplace(waiter.deadline, waiter_id);
  waiters_of_session_[session_id].push_back(waiter_id);
  waiters_.emplace(waiter_id, std::move(waiter));
}

void StoreState::AddAges(const Job& job,
                         const google::protobuf::RepeatedPtrField<std::string>& keys,
                         absl::Time now, proto::StoreResponse* response) {
  response->mutable_ages_ns()->Reserve(keys.size());
  for (const std::string& key : keys) {
    auto it = job.written.find(key);
    response->add_ages_ns(it == job.written.end()
                              ? 0
                              : std::max<int64_t>(0, absl::ToInt64Nanoseconds(now - it->second)));
  }
}

void StoreState::KeyWritten(Job& job, const std::string& key, absl::Time now) {
  job.written.insert_or_assign(key, now);
  WakeAnyWaiters(job, key);
  auto [begin, end] = job.waiting_on.equal_range(key);
  if (begin == end) return;
  std::vector<uint64_t> ids;
  for (auto it = begin; it != end; ++it) ids.push_back(it->second);
  job.waiting_on.erase(begin, end);
  for (uint64_t waiter_id : ids) {
    Waiter& waiter = waiters_.at(waiter_id);
    // The keys before waiter.present were present when the scan passed them; only at the end are
    // they all checked again, since a Delete may have taken one away since.
    waiter.present = FirstMissing(job, waiter.keys, waiter.present, &parked_wait_lookups_);
    if (waiter.present == waiter.keys.size()) {
      waiter.present = FirstMissing(job, waiter.keys, 0, &parked_wait_lookups_);
    }
    if (waiter.present < waiter.keys.size()) {
      waiter.index = job.waiting_on.emplace(waiter.keys[waiter.present], waiter_id);
    } else {
      waiter.index = job.waiting_on.end();
      proto::StoreResponse response = StatusResponse(waiter.request_id, absl::OkStatus());
      AddValues(job, waiter.read_keys, &response);
      Finish(waiter_id, WithinFrameLimit(std::move(response)));
    }
  }
}

void StoreState::Finish(uint64_t waiter_id, proto::StoreResponse response) {
  auto it = waiters_.find(waiter_id);
  if (it == waiters_.end()) return;
  Waiter& waiter = it->second;
  if (waiter.index != waiter.job->waiting_on.end()) waiter.job->waiting_on.erase(waiter.index);
  deadlines_.erase({waiter.deadline, waiter_id});
  auto of_session = waiters_of_session_.find(waiter.session_id);
  if (of_session != waiters_of_session_.end()) {
    std::erase(of_session->second, waiter_id);
    if (of_session->second.empty()) waiters_of_session_.erase(of_session);
  }
  completions_.push_back(Completion{waiter.session_id, std::move(response)});
  waiters_.erase(it);
}

void StoreState::ExpireWaits(absl::Time now) {
  ExpireAnyWaits(now);
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const uint64_t waiter_id = deadlines_.begin()->second;
    const Waiter& waiter = waiters_.at(waiter_id);
    Finish(waiter_id,
           StatusResponse(waiter.request_id, MissingKeys(*waiter.job, waiter.keys,
                                                         absl::FormatDuration(waiter.timeout))));
  }
}

std::vector<StoreState::Completion> StoreState::TakeCompletions() {
  std::vector<Completion> taken;
  taken.swap(completions_);
  return taken;
}

std::optional<absl::Time> StoreState::NextWaitDeadline() const {
  std::optional<absl::Time> next;
  if (!deadlines_.empty()) next = deadlines_.begin()->first;
  if (!any_deadlines_.empty() && (!next.has_value() || any_deadlines_.begin()->first < *next)) {
    next = any_deadlines_.begin()->first;
  }
  return next;
}

void StoreState::CancelWaits(uint64_t session_id) {
  CancelAnyWaits(session_id);
  auto of_session = waiters_of_session_.find(session_id);
  if (of_session == waiters_of_session_.end()) return;
  const std::vector<uint64_t> ids = std::move(of_session->second);
  waiters_of_session_.erase(of_session);
  for (uint64_t waiter_id : ids) {
    auto it = waiters_.find(waiter_id);
    if (it == waiters_.end()) continue;
    Waiter& waiter = it->second;
    if (waiter.index != waiter.job->waiting_on.end()) waiter.job->waiting_on.erase(waiter.index);
    deadlines_.erase({waiter.deadline, waiter_id});
    waiters_.erase(it);
  }
}

// --- WaitAny: parked under each of its keys until one is written or its deadline passes.

proto::StoreResponse StoreState::ApplyWaitAny(uint64_t session_id, Job& job,
                                              const proto::StoreRequest& request, absl::Time now,
                                              bool* parked) {
  const uint64_t id = request.request_id();
  const proto::WaitAnyOp& op = request.wait_any();
  for (int i = 0; i < op.keys_size(); ++i) {
    if (job.data.contains(op.keys(i))) {
      proto::StoreResponse response = StatusResponse(id, absl::OkStatus());
      response.set_number(i);
      AddValues(job, op.read_keys(), &response);
      return response;
    }
  }
  if (op.timeout_ms() <= 0) {
    return StatusResponse(
        id, absl::DeadlineExceededError(absl::StrCat("waited 0 for any of the store keys ",
                                                     absl::StrJoin(op.keys(), ", "))));
  }
  std::vector<uint64_t>& of_session = any_waiters_of_session_[session_id];
  if (of_session.size() >= kMaxParkedWaitsPerSession) {
    return StatusResponse(
        id, absl::ResourceExhaustedError(absl::StrFormat(
                "this connection already has %d WaitAnys parked on the store server (the limit)",
                of_session.size())));
  }
  const uint64_t waiter_id = next_waiter_id_++;
  // Clamped so that the deadline arithmetic cannot overflow (about 292 years).
  const absl::Duration timeout =
      absl::Milliseconds(std::min<int64_t>(op.timeout_ms(), int64_t{1} << 53));
  AnyWaiter waiter{.session_id = session_id,
                   .request_id = id,
                   .job = &job,
                   .keys = std::vector<std::string>(op.keys().begin(), op.keys().end()),
                   .read_keys = {op.read_keys().begin(), op.read_keys().end()},
                   .timeout = timeout,
                   .deadline = now + timeout,
                   .index = {}};
  for (const std::string& key : waiter.keys) {
    waiter.index.push_back(job.any_waiting_on.emplace(key, waiter_id));
  }
  any_deadlines_.emplace(waiter.deadline, waiter_id);
  of_session.push_back(waiter_id);
  any_waiters_.emplace(waiter_id, std::move(waiter));
  *parked = true;
  return proto::StoreResponse();
}

void StoreState::WakeAnyWaiters(Job& job, const std::string& key) {
  auto [begin, end] = job.any_waiting_on.equal_range(key);
  if (begin == end) return;
  std::vector<uint64_t> ids;
  for (auto it = begin; it != end; ++it) ids.push_back(it->second);
  for (uint64_t waiter_id : ids) {
    const AnyWaiter& waiter = any_waiters_.at(waiter_id);
    // The first of its keys that exists: the one written, or an earlier one written with it.
    size_t found = 0;
    while (found < waiter.keys.size() && !job.data.contains(waiter.keys[found])) ++found;
    proto::StoreResponse response = StatusResponse(waiter.request_id, absl::OkStatus());
    response.set_number(static_cast<int64_t>(found));
    AddValues(job, waiter.read_keys, &response);
    FinishAny(waiter_id, WithinFrameLimit(std::move(response)));
  }
}

void StoreState::FinishAny(uint64_t waiter_id, proto::StoreResponse response) {
  auto it = any_waiters_.find(waiter_id);
  if (it == any_waiters_.end()) return;
  AnyWaiter& waiter = it->second;
  for (auto& entry : waiter.index) waiter.job->any_waiting_on.erase(entry);
  any_deadlines_.erase({waiter.deadline, waiter_id});
  auto of_session = any_waiters_of_session_.find(waiter.session_id);
  if (of_session != any_waiters_of_session_.end()) {
    std::erase(of_session->second, waiter_id);
    if (of_session->second.empty()) any_waiters_of_session_.erase(of_session);
  }
  completions_.push_back(Completion{waiter.session_id, std::move(response)});
  any_waiters_.erase(it);
}

void StoreState::ExpireAnyWaits(absl::Time now) {
  while (!any_deadlines_.empty() && any_deadlines_.begin()->first <= now) {
    const uint64_t waiter_id = any_deadlines_.begin()->second;
    const AnyWaiter& waiter = any_waiters_.at(waiter_id);
    FinishAny(waiter_id,
              StatusResponse(waiter.request_id, absl::DeadlineExceededError(absl::StrCat(
                                                    "waited ", absl::FormatDuration(waiter.timeout),
                                                    " for any of the store keys ",
                                                    absl::StrJoin(waiter.keys, ", ")))));
  }
}

void StoreState::CancelAnyWaits(uint64_t session_id) {
  auto of_session = any_waiters_of_session_.find(session_id);
  if (of_session == any_waiters_of_session_.end()) return;
  const std::vector<uint64_t> ids = std::move(of_session->second);
  any_waiters_of_session_.erase(of_session);
  for (uint64_t waiter_id : ids) {
    auto it = any_waiters_.find(waiter_id);
    if (it == any_waiters_.end()) continue;
    for (auto& entry : it->second.index) it->second.job->any_waiting_on.erase(entry);
    any_deadlines_.erase({it->second.deadline, waiter_id});
    any_waiters_.erase(it);
  }
}

}  // namespace trainguard
