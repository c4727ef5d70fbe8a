#include "sdk/host_agent/turn_read_store.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainguard {

absl::Status TurnReadStore::BeginTurn(const std::vector<std::string>& keys,
                                      absl::Duration timeout) {
  EndTurn();
  if (keys.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<std::optional<std::string>>> values = base()->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) held_[keys[i]] = std::move((*values)[i]);
  return absl::OkStatus();
}

void TurnReadStore::EndTurn() {
  MutexLock lock(&mu_);
  held_.clear();
}

void TurnReadStore::Forget(std::string_view key) {
  MutexLock lock(&mu_);
  if (auto it = held_.find(key); it != held_.end()) held_.erase(it);
}

absl::StatusOr<std::string> TurnReadStore::Get(std::string_view key, absl::Duration timeout) {
  {
    MutexLock lock(&mu_);
    if (auto it = held_.find(key); it != held_.end()) {
      ++reads_answered_;
      // As the store words an absent key (the callers test the code, not the text).
      if (!it->second.has_value()) {
        return absl::NotFoundError(
            absl::StrCat("store key ", absl::string_view(key.data(), key.size()), " not found"));
      }
      return *it->second;
    }
  }
  return base()->Get(key, timeout);
}

absl::StatusOr<std::vector<std::optional<std::string>>> TurnReadStore::MultiGet(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  {
    MutexLock lock(&mu_);
    std::vector<std::optional<std::string>> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      auto it = held_.find(key);
      if (it == held_.end()) break;
      values.push_back(it->second);
    }
    if (values.size() == keys.size()) {
      ++reads_answered_;
      return values;
    }
  }
  return base()->MultiGet(keys, timeout);
}

absl::Status TurnReadStore::Set(std::string_view key, std::string_view value,
                                absl::Duration timeout) {
  Forget(key);
  return base()->Set(key, value, timeout);
}

absl::StatusOr<int64_t> TurnReadStore::Add(std::string_view key, int64_t delta,
                                           absl::Duration timeout) {
  Forget(key);
  return base()->Add(key, delta, timeout);
}

absl::StatusOr<CompareAndSetResult> TurnReadStore::CompareAndSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
    absl::Duration timeout) {
  Forget(key);
  return base()->CompareAndSet(key, expected, desired, timeout);
}

absl::StatusOr<bool> TurnReadStore::Delete(std::string_view key, absl::Duration timeout) {
  Forget(key);
  return base()->Delete(key, timeout);
}

absl::StatusOr<int64_t> TurnReadStore::SetAndAdd(std::string_view set_key, std::string_view value,
                                                 std::string_view add_key, int64_t delta,
                                                 absl::Duration timeout) {
  Forget(set_key);
  Forget(add_key);
  return base()->SetAndAdd(set_key, value, add_key, delta, timeout);
}

absl::StatusOr<bool> TurnReadStore::CreateAndAdd(std::string_view key, std::string_view value,
                                                 std::string_view add_key, int64_t delta,
                                                 absl::Duration timeout) {
  Forget(key);
  Forget(add_key);
  return base()->CreateAndAdd(key, value, add_key, delta, timeout);
}

absl::StatusOr<std::vector<CompareAndSetResult>> TurnReadStore::WriteBatch(
    const std::vector<BatchWrite>& writes, absl::Duration timeout) {
  for (const BatchWrite& write : writes) {
    if (write.op != BatchWrite::Op::kRaiseFence) Forget(write.key);
  }
  return base()->WriteBatch(writes, timeout);
}

}  // namespace trainguard
