// CountingStore: wraps any Store and counts the requests sent through it, by verb and key family
// (the key with every run of digits written "N": "rdzv/hb/m3" counts as "rdzv/hb/mN"; a request
// naming several keys, as "a|b"). It measures what a component costs the store: bench_steady_state
// puts one around each rank's client. Thread-safe: a rank's threads share one.
#ifndef TRAINGUARD_TESTS_SUPPORT_COUNTING_STORE_H_
#define TRAINGUARD_TESTS_SUPPORT_COUNTING_STORE_H_

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sdk/core/mutex.h"
#include "tests/support/forwarding_store.h"
#include "trainguard/store.h"

namespace trainguard::testing {

class CountingStore final : public ForwardingStore {
 public:
  // (verb, key family) -> requests.
  using Counts = std::map<std::pair<std::string, std::string>, int64_t>;

  // REQUIRES: `base` outlives this store.
  explicit CountingStore(Store* base) : ForwardingStore(base) {}

  // The counts since construction or the last Reset().
  Counts counts() {
    MutexLock lock(&mu_);
    return counts_;
  }
  void Reset() {
    MutexLock lock(&mu_);
    counts_.clear();
  }

  // `key` with every run of digits written "N".
  static std::string Family(std::string_view key) {
    std::string family;
    for (size_t i = 0; i < key.size(); ++i) {
      if (std::isdigit(static_cast<unsigned char>(key[i]))) {
        family += 'N';
        while (i + 1 < key.size() && std::isdigit(static_cast<unsigned char>(key[i + 1]))) ++i;
      } else {
        family += key[i];
      }
    }
    return family;
  }

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override {
    Count("Set", key);
    return base()->Set(key, value, timeout);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    Count("Get", key);
    return base()->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta,
                              absl::Duration timeout) override {
    Count("Add", key);
    return base()->Add(key, delta, timeout);
  }
  // Counted under the key it sets: one request, as a TcpStore sends it.
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override {
    Count("SetAndAdd", set_key);
    return base()->SetAndAdd(set_key, value, add_key, delta, timeout);
  }
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override {
    Count("CompareAndSet", key);
    return base()->CompareAndSet(key, expected, desired, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override {
    Count("Delete", key);
    return base()->Delete(key, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    Count("MultiGet", keys);
    return base()->MultiGet(keys, timeout);
  }
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    Count("MultiGetWithAges", keys);
    return base()->MultiGetWithAges(keys, timeout);
  }
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override {
    Count("ListKeys", prefix);
    return base()->ListKeys(prefix, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    Count("Wait", keys);
    return base()->Wait(keys, timeout);
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    Count("WaitAny", keys);
    return base()->WaitAny(keys, timeout);
  }
  // Counted under the awaited keys' families: one request, as a TcpStore sends it.
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override {
    Count("WaitAny", awaited);
    return base()->WaitAnyAndRead(awaited, read, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override {
    Count("WaitAndRead", awaited);
    return base()->WaitAndRead(awaited, read, timeout);
  }
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override {
    Count("RaiseFence", "(fence)");
    return base()->RaiseFence(generation, timeout);
  }
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override {
    Count("CreateAndAdd", {std::string(key), std::string(add_key)});
    return base()->CreateAndAdd(key, value, add_key, delta, timeout);
  }
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override {
    std::vector<std::string> keys;
    for (const BatchWrite& write : writes) {
      keys.push_back(write.op == BatchWrite::Op::kRaiseFence ? "(fence)" : write.key);
    }
    Count("WriteBatch", keys);
    return base()->WriteBatch(writes, timeout);
  }

 private:
  void Count(std::string_view verb, std::string_view key) {
    MutexLock lock(&mu_);
    ++counts_[{std::string(verb), Family(key)}];
  }
  void Count(std::string_view verb, const std::vector<std::string>& keys) {
    // A MultiGet of many keys of one family counts under that family once.
    std::vector<std::string> families;
    for (const std::string& key : keys) {
      std::string family = Family(key);
      if (families.empty() || families.back() != family) families.push_back(std::move(family));
    }
    MutexLock lock(&mu_);
    ++counts_[{std::string(verb), absl::StrJoin(families, "|")}];
  }

  Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_COUNTING_STORE_H_
