// Store: the small key-value service through which the ranks of a job coordinate (rendezvous,
// failure notices, checkpoint commits), in the manner of gloo's rendezvous::Store.
//
// Keys are byte strings (by convention '/'-separated paths); values are byte strings. Every call
// takes a timeout: it returns DeadlineExceeded (naming the key and the timeout) rather than block
// longer, and Unavailable when the service cannot be reached. Implementations: TcpStore
// (tcp_store.h, embedded default), EtcdStore (etcd_store.h), InMemoryStore (below, one process).
// Decorators such as PrefixStore wrap any Store.
//
// Fencing. Every write carries the writer's generation (SetWriterGeneration). RaiseFence(g) makes
// the service reject, from then on, every write that carries a generation below g, with
// FailedPrecondition "stale generation ...". A rank of a superseded membership generation (a
// "zombie" that was declared dead but still runs) therefore cannot overwrite the state of the new
// generation. Writes carrying kUnfenced (the default) are never rejected: they are for launchers
// and tools, not for ranks. The fence never goes down.
//
// Thread safety: every Store in trainguard may be used from several threads at once.
#ifndef TRAINGUARD_STORE_H_
#define TRAINGUARD_STORE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainguard/clock.h"

namespace trainguard {

struct CompareAndSetResult {
  bool swapped = false;
  // The value after the call: `desired` when swapped, else what the key held (nullopt: absent).
  std::optional<std::string> current;
};

// One write of a Store::WriteBatch: a Set, a CompareAndSet or a RaiseFence.
struct BatchWrite {
  enum class Op { kSet, kCompareAndSet, kRaiseFence };

  static BatchWrite Set(std::string key, std::string value) {
    return BatchWrite{Op::kSet, std::move(key), std::move(value), std::nullopt, 0};
  }
  // Writes `desired` if the key holds `expected` (nullopt: if it is absent).
  static BatchWrite CompareAndSet(std::string key, std::optional<std::string> expected,
                                  std::string desired) {
    return BatchWrite{Op::kCompareAndSet, std::move(key), std::move(desired), std::move(expected),
                      0};
  }
  static BatchWrite RaiseFence(int64_t generation) {
    return BatchWrite{Op::kRaiseFence, "", "", std::nullopt, generation};
  }

  Op op = Op::kSet;
  std::string key;                      // kSet, kCompareAndSet
  std::string value;                    // kSet: the value; kCompareAndSet: the desired value
  std::optional<std::string> expected;  // kCompareAndSet
  int64_t generation = 0;               // kRaiseFence
};

// What Store::WaitAnyAndRead returns: the index WaitAny returns, and the keys read with it.
struct AnyKeyAndValues {
  size_t index = 0;
  std::vector<std::optional<std::string>> values;  // nullopt: absent
};

class Store {
 public:
  static constexpr int64_t kUnfenced = -1;

  virtual ~Store() = default;

  virtual absl::Status Set(std::string_view key, std::string_view value,
                           absl::Duration timeout) = 0;
  // NotFound (naming the key) when the key is absent; does not wait for it (see Wait).
  virtual absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) = 0;
  // Adds `delta` to the decimal integer stored at `key` (absent counts as 0) and returns the new
  // value. FailedPrecondition when the key holds something other than a decimal int64.
  virtual absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta,
                                      absl::Duration timeout) = 0;
  // Set(`set_key`, `value`), then Add(`add_key`, `delta`), as one call; returns the Add's new
  // value. A rank that publishes a value and then counts it (its progress, then the count of ranks
  // whose progress is written) does both at once; a store that can applies both in one round trip
  // (TcpStore, InMemoryStore: together, or neither when either fails). This default is the two
  // calls: a failed Set adds nothing; a failed Add leaves the value set.
  virtual absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                            std::string_view add_key, int64_t delta,
                                            absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    if (absl::Status s = Set(set_key, value, timeout); !s.ok()) return s;
    return Add(add_key, delta, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
  // Creates `key` with `value` if it is absent and then, only then, adds `delta` to `add_key`, as
  // one call; returns whether it created the key (and counted). A rank that announces something
  // once and counts the announcements (its first step of a generation: PublishResumed) is counted
  // once however often it calls, in one round trip on a store that can (TcpStore, InMemoryStore:
  // together, or neither when the Add fails). This default is CompareAndSet from absent, then the
  // Add when it swapped (a failed Add leaves the key created and uncounted).
  virtual absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                            std::string_view add_key, int64_t delta,
                                            absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<CompareAndSetResult> created = CompareAndSet(key, std::nullopt, value, timeout);
    if (!created.ok()) return created.status();
    if (!created->swapped) return false;
    absl::StatusOr<int64_t> added =
        Add(add_key, delta, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!added.ok()) return added.status();
    return true;
  }
  // Sets `key` to `desired` if it currently holds `expected` (nullopt: if it is absent).
  virtual absl::StatusOr<CompareAndSetResult> CompareAndSet(
      std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
      absl::Duration timeout) = 0;
  // Returns whether the key existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) = 0;
  // The values of `keys` in order; nullopt for an absent key.
  virtual absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // MultiGet, with how long ago each key was last written as the store's own clock measures it
  // (from the write it applied to the instant it read the key for this call). A watcher that
  // judges silence (a host's heartbeat, a rank's) then knows when each writer last wrote without
  // having watched the value change: a reader's deadline `answer's arrival - age + bound` is
  // never before `last write + bound`, and late by at most the answer's way back. Every write
  // counts, one of the same value too (Set, Add, a swap, a batch's write); Delete forgets the key.
  // Unimplemented where the store keeps no write instants (etcd; a TcpStore server that predates
  // the field): the caller falls back to watching values change.
  struct AgedValue {
    std::string value;
    absl::Duration age;  // at least zero
  };
  virtual absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) {
    (void)keys;
    (void)timeout;
    return absl::UnimplementedError("this store does not say when its keys were written");
  }
  // Every key that starts with `prefix`, sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                            absl::Duration timeout) = 0;
  // Blocks until every key in `keys` exists. DeadlineExceeded names the keys still missing.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Blocks until at least one key of `keys` exists and returns its index in `keys` (the lowest,
  // when several do). A watcher that must react to whichever of several events comes first
  // (a newer generation, a peer's hang, its own shutdown) parks one call on all of their keys
  // instead of polling each. DeadlineExceeded names the keys when none appeared within `timeout`;
  // InvalidArgument when `keys` is empty.
  virtual absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                         absl::Duration timeout) = 0;
  // Wait(`awaited`), then MultiGet(`read`), as one call: blocks until every key in `awaited`
  // exists and returns the values of `read` in order (nullopt for an absent key), read after the
  // last awaited key appeared. Errors are Wait's (DeadlineExceeded names the keys still missing),
  // then MultiGet's. A member that waits for a key in order to read it (its generation's changes,
  // an agreed plan) learns it in one call; a store that can answers both in one round trip
  // (TcpStore: the server reads `read` in the pass that finds `awaited` present). This default is
  // the two calls, the second bounded by what is left of `timeout`.
  virtual absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    if (absl::Status s = Wait(awaited, timeout); !s.ok()) return s;
    return MultiGet(read, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }

  // WaitAny(`awaited`), then MultiGet(`read`), as one call: blocks until a key of `awaited`
  // exists and returns its index (as WaitAny) with the values of `read` in order, read once that
  // key was found present. Errors are WaitAny's, then MultiGet's. A rank's watcher that parks on
  // the next generation's table among other keys learns the generation's first reads (its number
  // and changes) in the round trip that wakes it; a store that can answers both in one (TcpStore:
  // the server reads `read` in the pass that finds the key present). This default is the two
  // calls, the second bounded by what is left of `timeout`.
  virtual absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                         const std::vector<std::string>& read,
                                                         absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<size_t> index = WaitAny(awaited, timeout);
    if (!index.ok()) return index.status();
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        MultiGet(read, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!values.ok()) return values.status();
    return AnyKeyAndValues{*index, *std::move(values)};
  }

  // Raises the fence to `generation` (no-op if it is already at least that).
  virtual absl::Status RaiseFence(int64_t generation, absl::Duration timeout) = 0;

  // Applies `writes` in order, as one: no other client sees the store between two of them, and a
  // Wait (or WaitAndRead) woken by any key of the batch reads the store after the whole batch. A
  // publication whose last write is the one its readers wait for, or whose readers must never see
  // half of it (a coordinator dying midway leaves all of it or none), is one call; one round trip
  // on a TcpStore (one request the server applies in one pass), one transaction on etcd.
  //
  // Returns one result per write, in order: a CompareAndSet's as CompareAndSet returns it (not
  // swapped, with what the key holds, when it did not hold `expected`: that write is skipped and
  // the others still applied); a Set's {swapped, the value}; a RaiseFence's {swapped, nullopt}.
  // All or none: the whole batch is refused, nothing written, when this client's writer
  // generation is below the fence as it stands before the batch (FailedPrecondition, "stale
  // generation"; a RaiseFence within the batch does not refuse the batch's later writes), or when
  // the batch is malformed (InvalidArgument naming the write: an empty key, a key written twice,
  // the fence raised twice, more than kMaxBatchWrites writes). An empty batch writes nothing and
  // returns no results. REQUIRES: a caller that may retry after a timeout treats the batch as
  // applied or not, as for CompareAndSet: a timed-out batch may have been applied.
  static constexpr size_t kMaxBatchWrites = 128;  // etcd's default --max-txn-ops
  virtual absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(
      const std::vector<BatchWrite>& writes, absl::Duration timeout) = 0;
  // The generation this client's writes carry from now on.
  virtual void SetWriterGeneration(int64_t generation) = 0;
};

// A Store in this process's memory: for tests and single-process jobs. NewClient() gives further
// clients of the same data, each with its own writer generation, as separate connections would be.
// The keys' ages (MultiGetWithAges) are read from `clock` (a ManualClock in tests).
class InMemoryStore final : public Store {
 public:
  InMemoryStore();
  // REQUIRES: `clock` outlives the store.
  explicit InMemoryStore(Clock* clock);
  ~InMemoryStore() override;

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration timeout) override;
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override;
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override;
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override;
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override;
  void SetWriterGeneration(int64_t generation) override;

  // Another client of the same data with its own writer generation (as a second process's
  // connection to a server would be). The view must not outlive this store.
  std::unique_ptr<Store> NewClient();

 private:
  class State;
  class Client;
  std::shared_ptr<State> state_;
  std::unique_ptr<Store> self_;  // this object's own client
};

// Prepends `prefix` + "/" to every key (and strips it from ListKeys results). Does not own `base`.
class PrefixStore final : public Store {
 public:
  // REQUIRES: `base` outlives this store.
  PrefixStore(std::string prefix, Store* base);

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration timeout) override;
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override;
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override;
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override;
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override;
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override;
  void SetWriterGeneration(int64_t generation) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Full(std::string_view key) const;
  std::vector<std::string> Full(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  Store* const base_;
};

// InvalidArgument naming the first malformed write of `writes` (an empty key, a key written twice,
// a second RaiseFence), or a batch of more than Store::kMaxBatchWrites writes; what every
// WriteBatch checks first.
absl::Status CheckBatch(const std::vector<BatchWrite>& writes);

// Connects to the store named by `url`: "tcp://HOST:PORT" (a TcpStore server; `token` is the job's
// shared token) or "etcd://HOST:PORT[,HOST:PORT...]" (an etcd v3 cluster; `token` unused). Keys are
// namespaced by `job_id`. InvalidArgument for a malformed URL; Unavailable when nothing answers
// within `timeout`.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view url, std::string_view job_id,
                                                 std::string_view token, absl::Duration timeout);

// How OpenStore connects, beyond the URL.
struct OpenStoreOptions {
  // The local address every connection to the store leaves from (bound before connecting): a
  // numeric IPv4 or IPv6 address of this host. Empty: the kernel's choice.
  std::string source_address;
  // A store client of the job's control plane (the coordinator's and the host agents'; the
  // launcher's agents set it): a TcpStore server reads its requests ahead of the ranks'
  // (TcpStoreOptions::control). etcd has no such lane and ignores it.
  bool control = false;
};

// OpenStore, with `options`. InvalidArgument also for a source address that is not numeric (naming
// it); Unavailable when it is not an address of this host.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view url, std::string_view job_id,
                                                 std::string_view token, absl::Duration timeout,
                                                 const OpenStoreOptions& options);

}  // namespace trainguard

#endif  // TRAINGUARD_STORE_H_
