// InMemoryStore: the reference Store semantics, in one process. Shared state behind one mutex; Wait
// blocks on a condition with a deadline.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "sdk/core/mutex.h"
#include "trainguard/store.h"

namespace trainguard {

class InMemoryStore::State {
 public:
  explicit State(Clock* clock) : clock(clock) {}

  Clock* const clock;
  Mutex mu;
  struct Entry {
    std::string value;
    int64_t written_ns;  // when it was last written (the clock's MonotonicNanos): its age
  };
  std::map<std::string, Entry, std::less<>> data ABSL_GUARDED_BY(mu);
  int64_t fence ABSL_GUARDED_BY(mu) = Store::kUnfenced;

  // Every write of a key goes through Put, which dates it.
  void Put(std::string_view key, std::string_view value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    data.insert_or_assign(std::string(key), Entry{std::string(value), clock->MonotonicNanos()});
  }

  absl::Status CheckFence(int64_t writer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (writer == Store::kUnfenced || writer >= fence) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("stale generation ", writer, " < fence ", fence, ": write rejected"));
  }
};

namespace {

absl::Status CheckKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("store key must not be empty");
  return absl::OkStatus();
}

}  // namespace

class InMemoryStore::Client final : public Store {
 public:
  explicit Client(std::shared_ptr<State> state) : state_(std::move(state)) {}

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration) override {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    state_->Put(key, value);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration) override {
    MutexLock lock(&state_->mu);
    auto it = state_->data.find(key);
    if (it == state_->data.end())
      return absl::NotFoundError(absl::StrFormat("store key %s not found", key));
    return it->second.value;
  }

  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration) override {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    absl::StatusOr<int64_t> sum = SumOf(key, delta);
    if (!sum.ok()) return sum.status();
    state_->Put(key, absl::StrCat(*sum));
    return *sum;
  }

  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration) override {
    absl::StatusOr<std::optional<int64_t>> sum =
        SetThenAdd(set_key, value, add_key, delta, /*only_if_absent=*/false);
    if (!sum.ok()) return sum.status();
    return **sum;
  }

  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration) override {
    absl::StatusOr<std::optional<int64_t>> sum =
        SetThenAdd(key, value, add_key, delta, /*only_if_absent=*/true);
    if (!sum.ok()) return sum.status();
    return sum->has_value();
  }

  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration) override {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    auto it = state_->data.find(key);
    std::optional<std::string> current;
    if (it != state_->data.end()) current = it->second.value;
    if (current != expected) return CompareAndSetResult{false, std::move(current)};
    state_->Put(key, desired);
    return CompareAndSetResult{true, std::string(desired)};
  }

  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration) override {
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    auto it = state_->data.find(key);
    if (it == state_->data.end()) return false;
    state_->data.erase(it);
    return true;
  }

  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration) override {
    MutexLock lock(&state_->mu);
    return Read(keys);
  }

  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration) override {
    MutexLock lock(&state_->mu);
    const int64_t now_ns = state_->clock->MonotonicNanos();
    std::vector<std::optional<AgedValue>> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      auto it = state_->data.find(key);
      if (it == state_->data.end()) {
        values.push_back(std::nullopt);
        continue;
      }
      values.push_back(AgedValue{it->second.value, absl::Nanoseconds(std::max<int64_t>(
                                                       0, now_ns - it->second.written_ns))});
    }
    return values;
  }

  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration) override {
    MutexLock lock(&state_->mu);
    std::vector<std::string> keys;
    for (auto it = state_->data.lower_bound(prefix);
         it != state_->data.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      keys.push_back(it->first);
    }
    return keys;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    MutexLock lock(&state_->mu);
    return AwaitAll(keys, timeout);
  }

  // Reads `read` under the lock that saw `awaited` present: the values as they were then.
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override {
    MutexLock lock(&state_->mu);
    if (absl::Status s = AwaitAll(awaited, timeout); !s.ok()) return s;
    return Read(read);
  }

  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    absl::StatusOr<AnyKeyAndValues> found = WaitAnyAndRead(keys, {}, timeout);
    if (!found.ok()) return found.status();
    return found->index;
  }

  // Reads `read` under the lock that saw a key of `awaited` present.
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override {
    if (awaited.empty()) return absl::InvalidArgumentError("WaitAny needs at least one store key");
    for (const std::string& key : awaited) {
      if (absl::Status s = CheckKey(key); !s.ok()) return s;
    }
    MutexLock lock(&state_->mu);
    size_t found = awaited.size();
    auto any_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      for (size_t i = 0; i < awaited.size(); ++i) {
        if (state_->data.find(awaited[i]) != state_->data.end()) {
          found = i;
          return true;
        }
      }
      return false;
    };
    if (!state_->mu.AwaitWithTimeout(any_present, timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout),
                                                      " for any of the store keys ",
                                                      absl::StrJoin(awaited, ", ")));
    }
    return AnyKeyAndValues{found, Read(read)};
  }

  absl::Status RaiseFence(int64_t generation, absl::Duration) override {
    MutexLock lock(&state_->mu);
    state_->fence = std::max(state_->fence, generation);
    return absl::OkStatus();
  }

  // Under one lock: no other client, waiting or not, sees the store between two of the writes.
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration) override {
    if (absl::Status s = CheckBatch(writes); !s.ok()) return s;
    std::vector<CompareAndSetResult> results;
    results.reserve(writes.size());
    if (writes.empty()) return results;
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    for (const BatchWrite& write : writes) {
      switch (write.op) {
        case BatchWrite::Op::kSet:
          state_->Put(write.key, write.value);
          results.push_back(CompareAndSetResult{true, write.value});
          break;
        case BatchWrite::Op::kCompareAndSet: {
          std::optional<std::string> current = Lookup(write.key);
          if (current != write.expected) {
            results.push_back(CompareAndSetResult{false, std::move(current)});
            break;
          }
          state_->Put(write.key, write.value);
          results.push_back(CompareAndSetResult{true, write.value});
          break;
        }
        case BatchWrite::Op::kRaiseFence:
          state_->fence = std::max(state_->fence, write.generation);
          results.push_back(CompareAndSetResult{true, std::nullopt});
          break;
      }
    }
    return results;
  }

  void SetWriterGeneration(int64_t generation) override { generation_.store(generation); }

 private:
  // SetAndAdd, or (`only_if_absent`) CreateAndAdd: both writes under one lock, together or
  // neither; the sum, or nullopt when `set_key` exists and `only_if_absent` wrote nothing.
  absl::StatusOr<std::optional<int64_t>> SetThenAdd(std::string_view set_key,
                                                    std::string_view value,
                                                    std::string_view add_key, int64_t delta,
                                                    bool only_if_absent) {
    if (absl::Status s = CheckKey(set_key); !s.ok()) return s;
    if (absl::Status s = CheckKey(add_key); !s.ok()) return s;
    MutexLock lock(&state_->mu);
    if (absl::Status s = state_->CheckFence(generation_.load()); !s.ok()) return s;
    if (only_if_absent && Lookup(set_key).has_value()) return std::optional<int64_t>();
    // The sum is checked before either write, so that both happen or neither. It is taken after
    // the Set, as the two calls would: `add_key` may be `set_key`.
    absl::StatusOr<int64_t> sum = SumOf(
        add_key, add_key == set_key ? std::optional<std::string>(value) : Lookup(add_key), delta);
    if (!sum.ok()) return sum.status();
    state_->Put(set_key, value);
    state_->Put(add_key, absl::StrCat(*sum));
    return std::optional<int64_t>(*sum);
  }

  std::optional<std::string> Lookup(std::string_view key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    auto it = state_->data.find(key);
    if (it == state_->data.end()) return std::nullopt;
    return it->second.value;
  }

  // What Add(`key`, `delta`) would store; FailedPrecondition when the key holds a non-integer.
  absl::StatusOr<int64_t> SumOf(std::string_view key, int64_t delta) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    return SumOf(key, Lookup(key), delta);
  }
  // The same for `key` holding `value` (nullopt: absent).
  static absl::StatusOr<int64_t> SumOf(std::string_view key,
                                       const std::optional<std::string>& value, int64_t delta) {
    int64_t current = 0;
    if (value.has_value() && !value->empty() && !absl::SimpleAtoi(*value, &current)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "store key %s holds a non-integer value; Add needs a decimal int64", key));
    }
    return current + delta;
  }

  // Blocks until every key of `keys` exists; DeadlineExceeded names those still missing.
  absl::Status AwaitAll(const std::vector<std::string>& keys, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      for (const std::string& key : keys) {
        if (state_->data.find(key) == state_->data.end()) return false;
      }
      return true;
    };
    if (state_->mu.AwaitWithTimeout(all_present, timeout)) return absl::OkStatus();
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (state_->data.find(key) == state_->data.end()) missing.push_back(key);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("waited ", absl::FormatDuration(timeout),
                     " for store keys; still missing: ", absl::StrJoin(missing, ", ")));
  }

  std::vector<std::optional<std::string>> Read(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    std::vector<std::optional<std::string>> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      auto it = state_->data.find(key);
      values.push_back(it == state_->data.end() ? std::nullopt
                                                : std::optional<std::string>(it->second.value));
    }
    return values;
  }

  const std::shared_ptr<State> state_;
  std::atomic<int64_t> generation_{Store::kUnfenced};
};

InMemoryStore::InMemoryStore() : InMemoryStore(Clock::Real()) {}
InMemoryStore::InMemoryStore(Clock* clock)
    : state_(std::make_shared<State>(clock)), self_(NewClient()) {}
InMemoryStore::~InMemoryStore() = default;

std::unique_ptr<Store> InMemoryStore::NewClient() { return std::make_unique<Client>(state_); }

absl::Status InMemoryStore::Set(std::string_view key, std::string_view value,
                                absl::Duration timeout) {
  return self_->Set(key, value, timeout);
}
absl::StatusOr<std::string> InMemoryStore::Get(std::string_view key, absl::Duration timeout) {
  return self_->Get(key, timeout);
}
absl::StatusOr<int64_t> InMemoryStore::Add(std::string_view key, int64_t delta,
                                           absl::Duration timeout) {
  return self_->Add(key, delta, timeout);
}
absl::StatusOr<int64_t> InMemoryStore::SetAndAdd(std::string_view set_key, std::string_view value,
                                                 std::string_view add_key, int64_t delta,
                                                 absl::Duration timeout) {
  return self_->SetAndAdd(set_key, value, add_key, delta, timeout);
}
absl::StatusOr<bool> InMemoryStore::CreateAndAdd(std::string_view key, std::string_view value,
                                                 std::string_view add_key, int64_t delta,
                                                 absl::Duration timeout) {
  return self_->CreateAndAdd(key, value, add_key, delta, timeout);
}

absl::StatusOr<CompareAndSetResult> InMemoryStore::CompareAndSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
    absl::Duration timeout) {
  return self_->CompareAndSet(key, expected, desired, timeout);
}
absl::StatusOr<bool> InMemoryStore::Delete(std::string_view key, absl::Duration timeout) {
  return self_->Delete(key, timeout);
}
absl::StatusOr<std::vector<std::optional<std::string>>> InMemoryStore::MultiGet(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return self_->MultiGet(keys, timeout);
}
absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> InMemoryStore::MultiGetWithAges(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return self_->MultiGetWithAges(keys, timeout);
}
absl::StatusOr<std::vector<std::string>> InMemoryStore::ListKeys(std::string_view prefix,
                                                                 absl::Duration timeout) {
  return self_->ListKeys(prefix, timeout);
}
absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return self_->Wait(keys, timeout);
}
absl::StatusOr<size_t> InMemoryStore::WaitAny(const std::vector<std::string>& keys,
                                              absl::Duration timeout) {
  return self_->WaitAny(keys, timeout);
}
absl::StatusOr<AnyKeyAndValues> InMemoryStore::WaitAnyAndRead(
    const std::vector<std::string>& awaited, const std::vector<std::string>& read,
    absl::Duration timeout) {
  return self_->WaitAnyAndRead(awaited, read, timeout);
}
absl::StatusOr<std::vector<std::optional<std::string>>> InMemoryStore::WaitAndRead(
    const std::vector<std::string>& awaited, const std::vector<std::string>& read,
    absl::Duration timeout) {
  return self_->WaitAndRead(awaited, read, timeout);
}
absl::Status InMemoryStore::RaiseFence(int64_t generation, absl::Duration timeout) {
  return self_->RaiseFence(generation, timeout);
}
absl::StatusOr<std::vector<CompareAndSetResult>> InMemoryStore::WriteBatch(
    const std::vector<BatchWrite>& writes, absl::Duration timeout) {
  return self_->WriteBatch(writes, timeout);
}

void InMemoryStore::SetWriterGeneration(int64_t generation) {
  self_->SetWriterGeneration(generation);
}

}  // namespace trainguard
