// ForwardingStore: a Store that passes every call to another one. A store that answers, records,
// counts or fails some calls (TurnReadStore; the tests' recording and counting stores) derives from
// it and overrides only those: the others still reach the store behind. Thread safety: that of the
// store behind.
#ifndef TRAINGUARD_SDK_CORE_FORWARDING_STORE_H_
#define TRAINGUARD_SDK_CORE_FORWARDING_STORE_H_

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
#include "absl/time/time.h"
#include "trainguard/store.h"

namespace trainguard {

class ForwardingStore : public Store {
 public:
  // REQUIRES: `base` outlives this store.
  explicit ForwardingStore(Store* base) : base_(base) {}
  // Owns the store behind.
  explicit ForwardingStore(std::unique_ptr<Store> base)
      : owned_(std::move(base)), base_(owned_.get()) {}

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override {
    return base_->Set(key, value, timeout);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    return base_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta,
                              absl::Duration timeout) override {
    return base_->Add(key, delta, timeout);
  }
  absl::StatusOr<int64_t> SetAndAdd(std::string_view set_key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override {
    return base_->SetAndAdd(set_key, value, add_key, delta, timeout);
  }
  absl::StatusOr<bool> CreateAndAdd(std::string_view key, std::string_view value,
                                    std::string_view add_key, int64_t delta,
                                    absl::Duration timeout) override {
    return base_->CreateAndAdd(key, value, add_key, delta, timeout);
  }
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override {
    return base_->CompareAndSet(key, expected, desired, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override {
    return base_->Delete(key, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_->MultiGet(keys, timeout);
  }
  absl::StatusOr<std::vector<std::optional<AgedValue>>> MultiGetWithAges(
      const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_->MultiGetWithAges(keys, timeout);
  }
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override {
    return base_->ListKeys(prefix, timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_->Wait(keys, timeout);
  }
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override {
    return base_->WaitAny(keys, timeout);
  }
  absl::StatusOr<AnyKeyAndValues> WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                 const std::vector<std::string>& read,
                                                 absl::Duration timeout) override {
    return base_->WaitAnyAndRead(awaited, read, timeout);
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> WaitAndRead(
      const std::vector<std::string>& awaited, const std::vector<std::string>& read,
      absl::Duration timeout) override {
    return base_->WaitAndRead(awaited, read, timeout);
  }
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override {
    return base_->RaiseFence(generation, timeout);
  }
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override {
    return base_->WriteBatch(writes, timeout);
  }
  void SetWriterGeneration(int64_t generation) override { base_->SetWriterGeneration(generation); }

 protected:
  Store* base() const { return base_; }

 private:
  const std::unique_ptr<Store> owned_;
  Store* const base_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_FORWARDING_STORE_H_
