// StoreState: what a TcpStoreServer serves: the keys and the fence of every job, and the Waits
// parked on them. It executes requests that passed ValidateStoreRequest and answers parked Waits
// when their keys appear or their deadlines pass. It knows nothing of sockets, so the fuzzer and
// the event loop drive it alike.
//
// Times are monotonic (any fixed origin), given by the caller.
//
// Thread safety: none; one thread (the server's event loop) owns it.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_STORE_STATE_H_
#define TRAINGUARD_SDK_RENDEZVOUS_STORE_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sdk/proto/store.pb.h"

namespace trainguard {

// InvalidArgument naming the problem when `request` is malformed: no known operation, a zero
// request id, an empty key, or a WriteBatch that Store::WriteBatch would refuse (CheckBatch). The
// server answers it and closes the connection.
absl::Status ValidateStoreRequest(const proto::StoreRequest& request);

// The response frame for a status (no payload).
proto::StoreResponse StatusResponse(uint64_t request_id, const absl::Status& status);

class StoreState {
 public:
  // A parked Wait that has been answered (its keys exist, or its deadline passed).
  struct Completion {
    uint64_t session_id;
    proto::StoreResponse response;
  };

  // At most this many Waits of one session are parked at once; more get ResourceExhausted. The
  // same bound holds for its WaitAnys, counted apart.
  static constexpr size_t kMaxParkedWaitsPerSession = 16;
  // A Wait's DeadlineExceeded names at most this many of the keys still missing.
  static constexpr size_t kNamedMissingKeys = 8;

  // `max_response_bytes`: a response larger than this (e.g. a MultiGet of many large values)
  // becomes a ResourceExhausted error instead.
  explicit StoreState(uint32_t max_response_bytes) : max_response_bytes_(max_response_bytes) {}

  StoreState(const StoreState&) = delete;
  StoreState& operator=(const StoreState&) = delete;

  // Executes `request` of `session_id`, authenticated as `job`. Returns the response, or nullopt
  // when the request is a Wait that is now parked (its answer comes from TakeCompletions).
  // REQUIRES: ValidateStoreRequest(request).ok().
  std::optional<proto::StoreResponse> Execute(uint64_t session_id, const std::string& job,
                                              const proto::StoreRequest& request, absl::Time now);

  // Answers, with DeadlineExceeded, every parked Wait whose deadline is at or before `now`.
  void ExpireWaits(absl::Time now);

  // The answers produced since the last call, in order.
  std::vector<Completion> TakeCompletions();

  // The earliest deadline of a parked Wait.
  std::optional<absl::Time> NextWaitDeadline() const;

  // Forgets every Wait of a session whose connection closed.
  void CancelWaits(uint64_t session_id);

  size_t parked_waits() const { return waiters_.size() + any_waiters_.size(); }
  // The key lookups that parked Waits cost so far as their keys were written: O(K) for a Wait on K
  // keys written one by one (what the tests check), not O(K^2).
  uint64_t parked_wait_lookups() const { return parked_wait_lookups_; }

 private:
  struct Job {
    std::map<std::string, std::string, std::less<>> data;
    // When each key of `data` was last written (the `now` of the request that wrote it): a
    // MultiGet with_ages answers how long ago. Kept by KeyWritten and the Delete.
    absl::flat_hash_map<std::string, absl::Time> written;
    int64_t fence = -1;  // Store::kUnfenced
    // A parked Wait is indexed under the first key it still misses; when that key is written the
    // Wait goes on from there and is re-indexed under the next missing key, if any.
    std::multimap<std::string, uint64_t, std::less<>> waiting_on;
    // A parked WaitAny is indexed under every one of its keys (all absent while it is parked).
    std::multimap<std::string, uint64_t, std::less<>> any_waiting_on;
  };
  struct Waiter {
    uint64_t session_id;
    uint64_t request_id;
    Job* job;
    std::vector<std::string> keys;
    // A WaitAndRead's keys to read once `keys` exist (WaitOp.read_keys); empty for a plain Wait.
    std::vector<std::string> read_keys;
    // keys[0, present) were found present, keys[present] is the key it is indexed under: a write
    // of it resumes the scan there, so a Wait on K keys written one by one costs O(K) lookups, not
    // O(K^2). A Delete may take an earlier key away meanwhile; the Wait is answered only after a
    // last check of every key (KeyWritten), so it still returns when all exist at once.
    size_t present = 0;
    absl::Duration timeout;
    absl::Time deadline;
    std::multimap<std::string, uint64_t, std::less<>>::iterator index;
  };

  absl::Status CheckFence(const Job& job, int64_t writer) const;
  // What an Add of `delta` to `key` stores: FailedPrecondition when the key holds a non-integer,
  // OutOfRange when the sum overflows. The second form takes the key's value (empty: absent).
  static absl::StatusOr<int64_t> SumOf(const Job& job, const std::string& key, int64_t delta);
  static absl::StatusOr<int64_t> SumOf(const std::string& value, const std::string& key,
                                       int64_t delta);
  // `response`, or ResourceExhausted in its place when it exceeds max_response_bytes_.
  proto::StoreResponse WithinFrameLimit(proto::StoreResponse response) const;
  // Appends the values of `keys` in `job` to response->values, as a MultiGet answers.
  template <typename Keys>
  static void AddValues(const Job& job, const Keys& keys, proto::StoreResponse* response);
  // A WriteBatch (validated): every write, then the Waits its keys wake.
  proto::StoreResponse ApplyBatch(Job& job, const proto::StoreRequest& request, absl::Time now);
  proto::StoreResponse Apply(uint64_t session_id, Job& job, const proto::StoreRequest& request,
                             absl::Time now, bool* parked);
  // Records that `key` was written at `now`, and re-checks the Waits indexed under it.
  void KeyWritten(Job& job, const std::string& key, absl::Time now);
  // Appends to response->ages_ns how long before `now` each of `keys` was written (0: absent).
  static void AddAges(const Job& job, const google::protobuf::RepeatedPtrField<std::string>& keys,
                      absl::Time now, proto::StoreResponse* response);
  // The index of the first key of `keys` at or after `from` that `job` lacks; keys.size() when
  // there is none. Counts its lookups in *lookups.
  static size_t FirstMissing(const Job& job, const std::vector<std::string>& keys, size_t from,
                             uint64_t* lookups);
  // The DeadlineExceeded of a Wait on `keys` that waited `waited`: it names at most
  // kNamedMissingKeys of the keys still missing and counts the rest, so that a Wait on many keys
  // is not answered with a message as long as its request.
  static absl::Status MissingKeys(const Job& job, const std::vector<std::string>& keys,
                                  absl::string_view waited);
  // Parks a Wait on `keys` (the request's), indexed under keys[missing].
  void Park(uint64_t session_id, Job& job, std::vector<std::string> keys,
            const proto::StoreRequest& request, size_t missing, absl::Time now);
  void Finish(uint64_t waiter_id, proto::StoreResponse response);

  // WaitAny, apart from Wait's waiters: answered when any one of its keys is written.
  struct AnyWaiter {
    uint64_t session_id;
    uint64_t request_id;
    Job* job;
    std::vector<std::string> keys;
    // A WaitAnyAndRead's keys to read once a key exists (WaitAnyOp.read_keys); empty for a plain
    // WaitAny.
    std::vector<std::string> read_keys;
    absl::Duration timeout;
    absl::Time deadline;
    // One entry in job->any_waiting_on per key.
    std::vector<std::multimap<std::string, uint64_t, std::less<>>::iterator> index;
  };
  proto::StoreResponse ApplyWaitAny(uint64_t session_id, Job& job,
                                    const proto::StoreRequest& request, absl::Time now,
                                    bool* parked);
  // Answers the WaitAnys indexed under `key`, which was just written.
  void WakeAnyWaiters(Job& job, const std::string& key);
  void FinishAny(uint64_t waiter_id, proto::StoreResponse response);
  void ExpireAnyWaits(absl::Time now);
  void CancelAnyWaits(uint64_t session_id);

  const uint32_t max_response_bytes_;
  // std::map: a Job's address is stable (waiters point at it).
  std::map<std::string, Job, std::less<>> jobs_;
  std::map<uint64_t, Waiter> waiters_;
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> waiters_of_session_;
  std::vector<Completion> completions_;
  uint64_t next_waiter_id_ = 1;
  std::map<uint64_t, AnyWaiter> any_waiters_;
  std::set<std::pair<absl::Time, uint64_t>> any_deadlines_;
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> any_waiters_of_session_;
  uint64_t parked_wait_lookups_ = 0;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_STORE_STATE_H_
