// EtcdStore: Store on etcd v3 through its JSON gateway. Reads are ranges; every write is a
// transaction, guarded by the fence when the client is fenced; Wait is a watch that starts at the
// revision right after its first check, so no write between the check and the watch is missed.
#include "sdk/rendezvous/etcd_store.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "sdk/core/job_id.h"
#include "sdk/proto/etcd_gateway.pb.h"
#include "sdk/rendezvous/etcd_gateway_client.h"

namespace trainguard {
namespace {

namespace pb = ::trainguard::proto::etcd;
using etcd_internal::EtcdGatewayClient;
using Retry = EtcdGatewayClient::Retry;

// etcd's default --max-txn-ops: the most operations one transaction may hold.
constexpr int kMaxTxnOps = 128;
// Creating an absent fence and retrying a fenced write cannot keep failing unless someone keeps
// deleting the fence; give up after this many rounds rather than spin until the deadline.
constexpr int kMaxFenceRounds = 8;
// The pause before Wait watches again after its watch failed: doubles from the first to the second.
constexpr absl::Duration kWatchRetryBackoffInitial = absl::Milliseconds(10);
constexpr absl::Duration kWatchRetryBackoffMax = absl::Milliseconds(500);
// How often WaitAny reads whether any of its keys exists (etcd_store.h says why it polls).
constexpr absl::Duration kWaitAnyPoll = absl::Milliseconds(250);

// The fence as stored: fixed-width decimal, so that etcd's bytewise comparison of values is the
// numeric comparison of generations. 20 digits hold every uint64_t.
std::string FenceValue(uint64_t generation) { return absl::StrFormat("%020d", generation); }

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store key must not be empty");
  return absl::OkStatus();
}

// The smallest key greater than every key that starts with `prefix` (etcd's "prefix + 1").
// REQUIRES: `prefix` holds a byte other than 0xff (EtcdStore's prefixes all start with '/').
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

pb::RequestOp RangeOp(const std::string& key) {
  pb::RequestOp op;
  op.mutable_request_range()->set_key(key);
  return op;
}

pb::RequestOp PutOp(const std::string& key, std::string_view value, int64_t lease_id) {
  pb::RequestOp op;
  pb::PutRequest* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(std::string(value));
  put->set_lease(lease_id);
  return op;
}

void AddValueCompare(pb::TxnRequest& txn, const std::string& key, pb::Compare::CompareResult result,
                     std::string value) {
  pb::Compare* compare = txn.add_compare();
  compare->set_key(key);
  compare->set_target(pb::Compare::VALUE);
  compare->set_result(result);
  compare->set_value(std::move(value));
}

// "`key` is absent" (never created, or deleted since): its create revision is 0. A value compare
// would not do: etcd fails every value compare on an absent key.
void AddAbsentCompare(pb::TxnRequest& txn, const std::string& key) {
  pb::Compare* compare = txn.add_compare();
  compare->set_key(key);
  compare->set_target(pb::Compare::CREATE);
  compare->set_result(pb::Compare::EQUAL);
  compare->set_create_revision(0);
}

// Runs `txn`, checking that the reply holds one response per operation of the branch taken (so that
// callers may index it).
absl::StatusOr<pb::TxnResponse> RunTxn(EtcdGatewayClient& client, const pb::TxnRequest& txn,
                                       absl::Time deadline, Retry retry) {
  pb::TxnResponse response;
  if (absl::Status s = client.Call("/v3/kv/txn", txn, &response, deadline, retry); !s.ok()) {
    return s;
  }
  const int expected = response.succeeded() ? txn.success_size() : txn.failure_size();
  if (response.responses_size() != expected) {
    return absl::InternalError(absl::StrFormat(
        "etcd %s POST /v3/kv/txn: %d responses for the %d operations of the %s branch",
        client.CurrentEndpoint(), response.responses_size(), expected,
        response.succeeded() ? "success" : "failure"));
  }
  return response;
}

absl::StatusOr<int64_t> ParseFence(const std::string& fence_key, const pb::RangeResponse& range) {
  int64_t fence = 0;
  if (range.kvs_size() != 1 || !absl::SimpleAtoi(range.kvs(0).value(), &fence)) {
    return absl::DataLossError(
        absl::StrFormat("fence key %s holds '%s', not a generation", fence_key,
                        absl::CHexEscape(range.kvs_size() == 1 ? range.kvs(0).value() : "")));
  }
  return fence;
}

// Creates the fence at `generation` unless it exists. Returns whether this call created it.
absl::StatusOr<bool> CreateFenceIfAbsent(EtcdGatewayClient& client, const std::string& fence_key,
                                         uint64_t generation, absl::Time deadline) {
  pb::TxnRequest txn;
  AddAbsentCompare(txn, fence_key);
  *txn.add_success() = PutOp(fence_key, FenceValue(generation), 0);
  // Idempotent: a retry of a create that applied sees the fence present and reports false.
  absl::StatusOr<pb::TxnResponse> response = RunTxn(client, txn, deadline, Retry::kIdempotent);
  if (!response.ok()) return response.status();
  return response->succeeded();
}

// Runs `txn` as a write of generation `generation`: unchanged for kUnfenced; otherwise with the
// compare "fence < generation + 1" added, and a read of the fence added to the failure branch. A
// stale generation is FailedPrecondition. On success, or when the caller's own compares failed, the
// reply is that of `txn` as given (the fence read removed).
absl::StatusOr<pb::TxnResponse> FencedTxn(EtcdGatewayClient& client, const std::string& fence_key,
                                          int64_t generation, pb::TxnRequest txn,
                                          absl::Time deadline, Retry retry) {
  if (generation == Store::kUnfenced) return RunTxn(client, txn, deadline, retry);
  if (generation < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "writer generation %d is neither Store::kUnfenced nor a generation (>= 0)", generation));
  }
  AddValueCompare(txn, fence_key, pb::Compare::LESS,
                  FenceValue(static_cast<uint64_t>(generation) + 1));
  *txn.add_failure() = RangeOp(fence_key);
  for (int round = 0; round < kMaxFenceRounds; ++round) {
    absl::StatusOr<pb::TxnResponse> response = RunTxn(client, txn, deadline, retry);
    if (!response.ok() || response->succeeded()) return response;
    const pb::RangeResponse& fence_read =
        response->responses(response->responses_size() - 1).response_range();
    if (fence_read.kvs_size() == 0) {
      // No fence yet (etcd fails a value compare on an absent key): create it at 0, try again.
      if (absl::StatusOr<bool> created = CreateFenceIfAbsent(client, fence_key, 0, deadline);
          !created.ok()) {
        return created.status();
      }
      continue;
    }
    absl::StatusOr<int64_t> fence = ParseFence(fence_key, fence_read);
    if (!fence.ok()) return fence.status();
    if (*fence > generation) {
      return absl::FailedPreconditionError(
          absl::StrFormat("stale generation %d < fence %d: write rejected", generation, *fence));
    }
    response->mutable_responses()->RemoveLast();
    return response;
  }
  return absl::AbortedError(
      absl::StrFormat("fence key %s vanished %d times in a row while writing; something deletes it",
                      fence_key, kMaxFenceRounds));
}

absl::StatusOr<pb::RangeResponse> Range(EtcdGatewayClient& client, const pb::RangeRequest& request,
                                        absl::Time deadline) {
  pb::RangeResponse response;
  if (absl::Status s =
          client.Call("/v3/kv/range", request, &response, deadline, Retry::kIdempotent);
      !s.ok()) {
    return s;
  }
  return response;
}

// The integer an Add finds at a key: absent and empty count as 0.
absl::StatusOr<int64_t> CounterValue(std::string_view key, const pb::RangeResponse& range) {
  if (range.kvs_size() == 0 || range.kvs(0).value().empty()) return 0;
  int64_t value = 0;
  if (!absl::SimpleAtoi(range.kvs(0).value(), &value)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("store key %s holds a non-integer value; Add needs a decimal int64", key));
  }
  return value;
}

// What Wait knows of each awaited key (by etcd key): whether it exists, as of the revision seen.
using KeyPresence = std::map<std::string, bool>;

bool AllPresent(const KeyPresence& present) {
  return std::all_of(present.begin(), present.end(), [](const auto& kv) { return kv.second; });
}

// Reads whether each key exists; returns the revision to watch from, minus one. Over kMaxTxnOps
// keys the reads are several transactions with different revisions: the earliest is returned, and
// the watch's replay of every change after it brings every key up to date.
absl::StatusOr<int64_t> CheckPresence(EtcdGatewayClient& client, KeyPresence& present,
                                      absl::Time deadline) {
  int64_t revision = std::numeric_limits<int64_t>::max();
  for (auto chunk = present.begin(); chunk != present.end();) {
    pb::TxnRequest txn;
    for (auto it = chunk; it != present.end() && txn.success_size() < kMaxTxnOps; ++it) {
      *txn.add_success() = RangeOp(it->first);
      txn.mutable_success()->rbegin()->mutable_request_range()->set_count_only(true);
    }
    absl::StatusOr<pb::TxnResponse> response = RunTxn(client, txn, deadline, Retry::kIdempotent);
    if (!response.ok()) return response.status();
    revision = std::min(revision, response->header().revision());
    for (const pb::ResponseOp& op : response->responses()) {
      chunk->second = op.response_range().count() > 0;
      ++chunk;
    }
  }
  return revision;
}

// Watches every change to the keys of `present` from `start_revision` (inclusive) until all exist.
// Aborted when etcd has compacted `start_revision` away (check again, then watch again).
absl::Status WatchUntilAllPresent(EtcdGatewayClient& client, KeyPresence& present,
                                  int64_t start_revision, absl::Time deadline) {
  pb::WatchRequest watch;
  pb::WatchCreateRequest* create = watch.mutable_create_request();
  create->set_key(present.begin()->first);
  create->set_range_end(present.rbegin()->first + std::string(1, '\0'));  // through the last key
  create->set_start_revision(start_revision);
  return client.Stream(
      "/v3/watch", watch, deadline,
      [&](std::string_view frame) -> absl::StatusOr<EtcdGatewayClient::StreamControl> {
        pb::WatchStreamFrame parsed;
        if (absl::Status s = EtcdGatewayClient::ParseJson(frame, &parsed); !s.ok()) return s;
        if (parsed.has_error()) {
          return EtcdGatewayClient::StatusFromGrpc(parsed.error().grpc_code(),
                                                   parsed.error().message());
        }
        const pb::WatchResponse& result = parsed.result();
        if (result.canceled()) {
          if (result.compact_revision() > 0) {
            return absl::AbortedError("the watch's start revision was compacted");
          }
          return absl::UnavailableError(
              absl::StrCat("etcd canceled the watch: ", result.cancel_reason()));
        }
        for (const pb::Event& event : result.events()) {
          auto it = present.find(event.kv().key());
          if (it != present.end()) it->second = event.type() == pb::Event::PUT;
        }
        return AllPresent(present) ? EtcdGatewayClient::StreamControl::kStop
                                   : EtcdGatewayClient::StreamControl::kContinue;
      });
}

// After the n-th lost compare-and-swap of one Add: sleep a random time below 0.5 ms * 2^min(n, 7)
// (1 ms after the first loss, 64 ms at most), never past the deadline. etcd commits one of the
// contenders' swaps per round, and every losing swap is a raft proposal it must still process;
// without the spread, N ranks adding to one counter at once make each round cost N proposals.
// (Measured with bench_store: 16 clients adding to one counter went from 209 to 880 adds/s.)
void BackOffAfterConflict(int conflicts, absl::Time deadline) {
  thread_local std::minstd_rand random(std::random_device{}());
  const int64_t window_us = int64_t{500} << std::min(conflicts, 7);
  const absl::Duration pause =
      absl::Microseconds(std::uniform_int_distribution<int64_t>(0, window_us - 1)(random));
  absl::SleepFor(std::min(pause, deadline - absl::Now()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Connect(const EtcdStoreOptions& options) {
  if (absl::Status s = ValidateJobId(options.job_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("EtcdStoreOptions: ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<EtcdGatewayClient>> client = EtcdGatewayClient::Create(
      options.endpoints, options.max_response_bytes, options.source_address);
  if (!client.ok()) return client.status();
  std::unique_ptr<EtcdStore> store(new EtcdStore(*std::move(client), options.job_id));

  // One round trip, so that a wrong endpoint shows here rather than at the first write.
  pb::RangeRequest probe;
  probe.set_key(store->fence_key_);
  const absl::Time started = absl::Now();
  absl::StatusOr<pb::RangeResponse> fence =
      Range(*store->client_, probe, started + options.connect_timeout);
  if (!fence.ok()) {
    // The probe may give up before the connect timeout (an error that is not retried): say when.
    return absl::Status(
        fence.status().code(),
        absl::StrFormat("EtcdStore for job %s cannot reach etcd (gave up after %s; connect "
                        "timeout %s): %s",
                        options.job_id,
                        absl::FormatDuration(absl::Trunc(absl::Now() - started,
                                                         absl::Milliseconds(100))),
                        absl::FormatDuration(options.connect_timeout), fence.status().message()));
  }
  return store;
}

EtcdStore::EtcdStore(std::unique_ptr<EtcdGatewayClient> client, std::string job_id)
    : client_(std::move(client)),
      job_id_(std::move(job_id)),
      key_prefix_(absl::StrCat("/trainguard/", job_id_, "/kv/")),
      fence_key_(absl::StrCat("/trainguard/", job_id_, "/fence")) {}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::EtcdKey(std::string_view key) const {
  return absl::StrCat(key_prefix_, absl::string_view(key.data(), key.size()));
}

absl::Status EtcdStore::Annotate(const absl::Status& status, std::string_view what,
                                 absl::Duration timeout) const {
  if (absl::IsDeadlineExceeded(status)) {
    return absl::DeadlineExceededError(
        absl::StrFormat("%s (etcd job %s) did not complete within %s: %s", what, job_id_,
                        absl::FormatDuration(timeout), status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrFormat("%s (etcd job %s): %s", what, job_id_, status.message()));
}

absl::Status EtcdStore::Put(std::string_view key, std::string_view value, int64_t lease_id,
                            absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  pb::TxnRequest txn;
  *txn.add_success() = PutOp(EtcdKey(key), value, lease_id);
  absl::StatusOr<pb::TxnResponse> response =
      FencedTxn(*client_, fence_key_, generation_.load(), std::move(txn), absl::Now() + timeout,
                Retry::kIdempotent);
  if (!response.ok()) {
    return Annotate(
        response.status(),
        absl::StrFormat("%s of store key %s", lease_id == 0 ? "Set" : "SetWithLease", key),
        timeout);
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::Set(std::string_view key, std::string_view value, absl::Duration timeout) {
  return Put(key, value, /*lease_id=*/0, timeout);
}

absl::StatusOr<std::string> EtcdStore::Get(std::string_view key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  pb::RangeRequest request;
  request.set_key(EtcdKey(key));
  absl::StatusOr<pb::RangeResponse> range = Range(*client_, request, absl::Now() + timeout);
  if (!range.ok())
    return Annotate(range.status(), absl::StrFormat("Get of store key %s", key), timeout);
  if (range->kvs_size() == 0) {
    return absl::NotFoundError(
        absl::StrFormat("store key %s not found (etcd job %s)", key, job_id_));
  }
  return std::move(*range->mutable_kvs(0)->mutable_value());
}

absl::StatusOr<int64_t> EtcdStore::Add(std::string_view key, int64_t delta,
                                       absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  const std::string etcd_key = EtcdKey(key);
  pb::RangeRequest read;
  read.set_key(etcd_key);
  absl::StatusOr<pb::RangeResponse> current = Range(*client_, read, deadline);
  if (!current.ok())
    return Annotate(current.status(), absl::StrFormat("Add of store key %s", key), timeout);
  // Compare-and-swap on the key's mod revision until no other writer got in between; each round
  // reads the key back in the failure branch, and every round trip is bounded by the deadline.
  int conflicts = 0;
  for (;;) {
    absl::StatusOr<int64_t> value = CounterValue(key, *current);
    if (!value.ok()) return value.status();
    int64_t sum = 0;
    if (__builtin_add_overflow(*value, delta, &sum)) {
      return absl::OutOfRangeError(absl::StrFormat(
          "Add of %d to store key %s (holding %d) overflows int64", delta, key, *value));
    }
    pb::TxnRequest txn;
    pb::Compare* unchanged = txn.add_compare();
    unchanged->set_key(etcd_key);
    unchanged->set_target(pb::Compare::MOD);
    unchanged->set_result(pb::Compare::EQUAL);
    unchanged->set_mod_revision(current->kvs_size() == 0 ? 0 : current->kvs(0).mod_revision());
    *txn.add_success() = PutOp(etcd_key, absl::StrCat(sum), 0);
    *txn.add_failure() = RangeOp(etcd_key);
    absl::StatusOr<pb::TxnResponse> response = FencedTxn(
        *client_, fence_key_, generation_.load(), std::move(txn), deadline, Retry::kOnlyIfUnsent);
    if (!response.ok())
      return Annotate(response.status(), absl::StrFormat("Add of store key %s", key), timeout);
    if (response->succeeded()) return sum;
    *current = std::move(*response->mutable_responses(0)->mutable_response_range());
    BackOffAfterConflict(++conflicts, deadline);
  }
}

absl::StatusOr<CompareAndSetResult> EtcdStore::CompareAndSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
    absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  const std::string etcd_key = EtcdKey(key);
  pb::TxnRequest txn;
  if (expected.has_value()) {
    AddValueCompare(txn, etcd_key, pb::Compare::EQUAL, *expected);
  } else {
    AddAbsentCompare(txn, etcd_key);
  }
  *txn.add_success() = PutOp(etcd_key, desired, 0);
  *txn.add_failure() = RangeOp(etcd_key);
  absl::StatusOr<pb::TxnResponse> response =
      FencedTxn(*client_, fence_key_, generation_.load(), std::move(txn), absl::Now() + timeout,
                Retry::kOnlyIfUnsent);
  if (!response.ok())
    return Annotate(response.status(), absl::StrFormat("CompareAndSet of store key %s", key),
                    timeout);
  if (response->succeeded()) return CompareAndSetResult{true, std::string(desired)};
  pb::RangeResponse* now = response->mutable_responses(0)->mutable_response_range();
  if (now->kvs_size() == 0) return CompareAndSetResult{false, std::nullopt};
  return CompareAndSetResult{false, std::move(*now->mutable_kvs(0)->mutable_value())};
}

// One transaction: each Set a put, each CompareAndSet a transaction within it (put if the key holds
// what is expected, else read it), the fence raise one too (put if below, or absent); the whole
// fenced as any write. etcd applies a transaction at one revision: a watcher sees all or none.
absl::StatusOr<std::vector<CompareAndSetResult>> EtcdStore::WriteBatch(
    const std::vector<BatchWrite>& writes, absl::Duration timeout) {
  if (absl::Status s = CheckBatch(writes); !s.ok()) return s;
  std::vector<CompareAndSetResult> results(writes.size());
  pb::TxnRequest txn;
  std::vector<int> response_of(writes.size(), -1);  // the reply's index of each write
  for (size_t i = 0; i < writes.size(); ++i) {
    const BatchWrite& write = writes[i];
    results[i].swapped = true;
    switch (write.op) {
      case BatchWrite::Op::kSet:
        *txn.add_success() = PutOp(EtcdKey(write.key), write.value, 0);
        results[i].current = write.value;
        break;
      case BatchWrite::Op::kCompareAndSet: {
        const std::string etcd_key = EtcdKey(write.key);
        pb::TxnRequest* cas = txn.add_success()->mutable_request_txn();
        if (write.expected.has_value()) {
          AddValueCompare(*cas, etcd_key, pb::Compare::EQUAL, *write.expected);
        } else {
          AddAbsentCompare(*cas, etcd_key);
        }
        *cas->add_success() = PutOp(etcd_key, write.value, 0);
        *cas->add_failure() = RangeOp(etcd_key);
        results[i].current = write.value;
        break;
      }
      case BatchWrite::Op::kRaiseFence: {
        if (write.generation <= 0) continue;  // the fence starts at 0: nothing to raise
        // Below `generation`: raised. Else absent (a value compare fails on an absent key):
        // created at `generation`. Else at or above it already.
        pb::TxnRequest* raise = txn.add_success()->mutable_request_txn();
        AddValueCompare(*raise, fence_key_, pb::Compare::LESS, FenceValue(write.generation));
        *raise->add_success() = PutOp(fence_key_, FenceValue(write.generation), 0);
        pb::TxnRequest* create = raise->add_failure()->mutable_request_txn();
        AddAbsentCompare(*create, fence_key_);
        *create->add_success() = PutOp(fence_key_, FenceValue(write.generation), 0);
        break;
      }
    }
    response_of[i] = txn.success_size() - 1;
  }
  if (txn.success_size() == 0) return results;
  absl::StatusOr<pb::TxnResponse> response =
      FencedTxn(*client_, fence_key_, generation_.load(), std::move(txn), absl::Now() + timeout,
                Retry::kOnlyIfUnsent);
  const std::string what = absl::StrFormat("WriteBatch of %d writes", writes.size());
  if (!response.ok()) return Annotate(response.status(), what, timeout);
  if (!response->succeeded()) {  // no compare of its own: only the fence refuses it
    return Annotate(absl::InternalError("etcd took the failure branch of an unconditional batch"),
                    what, timeout);
  }
  for (size_t i = 0; i < writes.size(); ++i) {
    if (writes[i].op != BatchWrite::Op::kCompareAndSet) continue;
    pb::TxnResponse* cas = response->mutable_responses(response_of[i])->mutable_response_txn();
    if (cas->succeeded()) continue;
    results[i].swapped = false;
    results[i].current.reset();
    if (cas->responses_size() == 1 && cas->responses(0).response_range().kvs_size() > 0) {
      results[i].current = std::move(
          *cas->mutable_responses(0)->mutable_response_range()->mutable_kvs(0)->mutable_value());
    }
  }
  return results;
}

absl::StatusOr<bool> EtcdStore::Delete(std::string_view key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  pb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key(EtcdKey(key));
  absl::StatusOr<pb::TxnResponse> response =
      FencedTxn(*client_, fence_key_, generation_.load(), std::move(txn), absl::Now() + timeout,
                Retry::kIdempotent);
  if (!response.ok())
    return Annotate(response.status(), absl::StrFormat("Delete of store key %s", key), timeout);
  return response->responses(0).response_delete_range().deleted() > 0;
}

absl::StatusOr<std::vector<std::optional<std::string>>> EtcdStore::MultiGet(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::optional<std::string>> values;
  values.reserve(keys.size());
  // One transaction (one consistent revision) per kMaxTxnOps keys.
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    const size_t end = std::min(keys.size(), begin + kMaxTxnOps);
    pb::TxnRequest txn;
    for (size_t i = begin; i < end; ++i) {
      if (absl::Status s = CheckKey(keys[i]); !s.ok()) return s;
      *txn.add_success() = RangeOp(EtcdKey(keys[i]));
    }
    absl::StatusOr<pb::TxnResponse> response = RunTxn(*client_, txn, deadline, Retry::kIdempotent);
    if (!response.ok())
      return Annotate(response.status(),
                      absl::StrFormat("MultiGet of store keys from %s", keys[begin]), timeout);
    for (pb::ResponseOp& op : *response->mutable_responses()) {
      pb::RangeResponse* range = op.mutable_response_range();
      values.push_back(range->kvs_size() == 0 ? std::nullopt
                                              : std::optional<std::string>(std::move(
                                                    *range->mutable_kvs(0)->mutable_value())));
    }
  }
  return values;
}

absl::StatusOr<std::vector<std::string>> EtcdStore::ListKeys(std::string_view prefix,
                                                             absl::Duration timeout) {
  pb::RangeRequest request;
  request.set_key(EtcdKey(prefix));
  request.set_range_end(PrefixEnd(EtcdKey(prefix)));
  request.set_keys_only(true);
  absl::StatusOr<pb::RangeResponse> range = Range(*client_, request, absl::Now() + timeout);
  if (!range.ok())
    return Annotate(range.status(), absl::StrFormat("ListKeys of prefix %s", prefix), timeout);
  // etcd returns a range in key order, which is the order ListKeys promises.
  std::vector<std::string> keys;
  keys.reserve(range->kvs_size());
  for (const pb::KeyValue& kv : range->kvs()) keys.push_back(kv.key().substr(key_prefix_.size()));
  return keys;
}

absl::Status EtcdStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  KeyPresence present;
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    present.emplace(EtcdKey(key), false);
  }
  if (present.empty()) return absl::OkStatus();
  auto failed = [&](const absl::Status& status) {
    std::vector<std::string> missing;
    for (const auto& [etcd_key, here] : present) {
      if (!here) missing.push_back(etcd_key.substr(key_prefix_.size()));
    }
    if (absl::IsDeadlineExceeded(status)) {
      return absl::DeadlineExceededError(
          absl::StrFormat("waited %s for store keys (etcd job %s); still missing: %s",
                          absl::FormatDuration(timeout), job_id_, absl::StrJoin(missing, ", ")));
    }
    return Annotate(status, absl::StrCat("Wait for store keys ", absl::StrJoin(missing, ", ")),
                    timeout);
  };

  absl::Duration backoff = kWatchRetryBackoffInitial;
  for (;;) {
    // The check is a read, sent again by the client when its member fails; it fails at once when
    // no endpoint accepts a connection.
    absl::StatusOr<int64_t> revision = CheckPresence(*client_, present, deadline);
    if (!revision.ok()) return failed(revision.status());
    if (AllPresent(present)) return absl::OkStatus();
    absl::Status watched = WatchUntilAllPresent(*client_, present, *revision + 1, deadline);
    if (watched.ok()) return absl::OkStatus();
    if (absl::IsAborted(watched)) continue;  // compacted between the check and the watch
    if (!absl::IsUnavailable(watched)) return failed(watched);
    // The watch's member died, lost its leader or ended the stream: the client has moved on to the
    // next endpoint; check and watch again there, as long as the deadline allows.
    if (absl::Now() + backoff >= deadline) return failed(watched);
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, kWatchRetryBackoffMax);
  }
}

absl::StatusOr<size_t> EtcdStore::WaitAny(const std::vector<std::string>& keys,
                                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (keys.empty()) return absl::InvalidArgumentError("WaitAny needs at least one store key");
  KeyPresence present;
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    present.emplace(EtcdKey(key), false);
  }
  const std::string what = absl::StrCat("WaitAny for store keys ", absl::StrJoin(keys, ", "));
  while (true) {
    // A read, sent again by the client when its member fails, within the deadline.
    absl::StatusOr<int64_t> revision = CheckPresence(*client_, present, deadline);
    if (!revision.ok()) return Annotate(revision.status(), what, timeout);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (present.at(EtcdKey(keys[i]))) return i;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrFormat("waited %s for any of the store keys %s (etcd job %s)",
                          absl::FormatDuration(timeout), absl::StrJoin(keys, ", "), job_id_));
    }
    absl::SleepFor(std::min(kWaitAnyPoll, left));
  }
}

absl::Status EtcdStore::RaiseFence(int64_t generation, absl::Duration timeout) {
  // The fence starts at 0 (or absent, which fenced writes treat as 0): nothing to raise.
  if (generation <= 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what = absl::StrFormat("RaiseFence to generation %d", generation);
  for (int round = 0; round < kMaxFenceRounds; ++round) {
    // Raise only from below, in one transaction, so that the fence never goes down.
    pb::TxnRequest txn;
    AddValueCompare(txn, fence_key_, pb::Compare::LESS, FenceValue(generation));
    *txn.add_success() = PutOp(fence_key_, FenceValue(generation), 0);
    *txn.add_failure() = RangeOp(fence_key_);
    absl::StatusOr<pb::TxnResponse> response = RunTxn(*client_, txn, deadline, Retry::kIdempotent);
    if (!response.ok()) return Annotate(response.status(), what, timeout);
    if (response->succeeded()) return absl::OkStatus();
    if (response->responses(0).response_range().kvs_size() > 0) {
      return absl::OkStatus();  // already at or above `generation`
    }
    absl::StatusOr<bool> created = CreateFenceIfAbsent(*client_, fence_key_, generation, deadline);
    if (!created.ok()) return Annotate(created.status(), what, timeout);
    if (*created) return absl::OkStatus();
    // Someone else created it in between: compare against theirs.
  }
  return Annotate(absl::AbortedError(absl::StrFormat("fence key %s keeps vanishing", fence_key_)),
                  what, timeout);
}

void EtcdStore::SetWriterGeneration(int64_t generation) { generation_.store(generation); }

std::string EtcdStore::current_endpoint() const { return client_->CurrentEndpoint(); }

absl::StatusOr<EtcdLease> EtcdStore::GrantLease(absl::Duration ttl, absl::Duration timeout) {
  pb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  pb::LeaseGrantResponse response;
  const std::string what = absl::StrFormat("GrantLease of TTL %s", absl::FormatDuration(ttl));
  // Not sent again once it may have applied: a second grant would be a second lease.
  if (absl::Status s = client_->Call("/v3/lease/grant", request, &response, absl::Now() + timeout,
                                     Retry::kOnlyIfUnsent);
      !s.ok()) {
    return Annotate(s, what, timeout);
  }
  if (!response.error().empty()) {
    return Annotate(absl::UnavailableError(response.error()), what, timeout);
  }
  return EtcdLease{response.id(), absl::Seconds(response.ttl())};
}

absl::StatusOr<absl::Duration> EtcdStore::KeepAliveOnce(int64_t lease_id, absl::Duration timeout) {
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease_id);
  int64_t ttl = 0;
  const std::string what = absl::StrFormat("KeepAliveOnce of lease %d", lease_id);
  absl::Status s = client_->Stream(
      "/v3/lease/keepalive", request, absl::Now() + timeout,
      [&ttl](std::string_view frame) -> absl::StatusOr<EtcdGatewayClient::StreamControl> {
        pb::LeaseKeepAliveStreamFrame parsed;
        if (absl::Status s = EtcdGatewayClient::ParseJson(frame, &parsed); !s.ok()) return s;
        if (parsed.has_error()) {
          return EtcdGatewayClient::StatusFromGrpc(parsed.error().grpc_code(),
                                                   parsed.error().message());
        }
        ttl = parsed.result().ttl();
        return EtcdGatewayClient::StreamControl::kStop;
      });
  if (!s.ok()) return Annotate(s, what, timeout);
  if (ttl <= 0) {
    return Annotate(absl::NotFoundError("the lease has expired or was revoked"), what, timeout);
  }
  return absl::Seconds(ttl);
}

absl::Status EtcdStore::RevokeLease(int64_t lease_id, absl::Duration timeout) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  pb::LeaseRevokeResponse response;
  if (absl::Status s = client_->Call("/v3/lease/revoke", request, &response, absl::Now() + timeout,
                                     Retry::kIdempotent);
      !s.ok()) {
    return Annotate(s, absl::StrFormat("RevokeLease of lease %d", lease_id), timeout);
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::SetWithLease(std::string_view key, std::string_view value, int64_t lease_id,
                                     absl::Duration timeout) {
  return Put(key, value, lease_id, timeout);
}

}  // namespace trainguard
