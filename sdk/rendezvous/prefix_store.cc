#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainguard/store.h"

namespace trainguard {

PrefixStore::PrefixStore(std::string prefix, Store* base)
    : prefix_(std::move(prefix)), base_(base) {}

std::string PrefixStore::Full(std::string_view key) const {
  return absl::StrCat(prefix_, "/", absl::string_view(key.data(), key.size()));
}

std::vector<std::string> PrefixStore::Full(const std::vector<std::string>& keys) const {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(Full(key));
  return full;
}

absl::Status PrefixStore::Set(std::string_view key, std::string_view value,
                              absl::Duration timeout) {
  return base_->Set(Full(key), value, timeout);
}
absl::StatusOr<std::string> PrefixStore::Get(std::string_view key, absl::Duration timeout) {
  return base_->Get(Full(key), timeout);
}
absl::StatusOr<int64_t> PrefixStore::Add(std::string_view key, int64_t delta,
                                         absl::Duration timeout) {
  return base_->Add(Full(key), delta, timeout);
}
absl::StatusOr<int64_t> PrefixStore::SetAndAdd(std::string_view set_key, std::string_view value,
                                               std::string_view add_key, int64_t delta,
                                               absl::Duration timeout) {
  return base_->SetAndAdd(Full(set_key), value, Full(add_key), delta, timeout);
}
absl::StatusOr<CompareAndSetResult> PrefixStore::CompareAndSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired,
    absl::Duration timeout) {
  return base_->CompareAndSet(Full(key), expected, desired, timeout);
}
absl::StatusOr<bool> PrefixStore::Delete(std::string_view key, absl::Duration timeout) {
  return base_->Delete(Full(key), timeout);
}
absl::StatusOr<std::vector<std::optional<std::string>>> PrefixStore::MultiGet(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return base_->MultiGet(Full(keys), timeout);
}
absl::StatusOr<std::vector<std::optional<Store::AgedValue>>> PrefixStore::MultiGetWithAges(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return base_->MultiGetWithAges(Full(keys), timeout);
}
absl::StatusOr<std::vector<std::string>> PrefixStore::ListKeys(std::string_view prefix,
                                                               absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> keys = base_->ListKeys(Full(prefix), timeout);
  if (!keys.ok()) return keys;
  const size_t strip = prefix_.size() + 1;
  for (std::string& key : *keys) key.erase(0, strip);
  return keys;
}
absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return base_->Wait(Full(keys), timeout);
}
absl::StatusOr<size_t> PrefixStore::WaitAny(const std::vector<std::string>& keys,
                                            absl::Duration timeout) {
  return base_->WaitAny(Full(keys), timeout);
}
absl::StatusOr<AnyKeyAndValues> PrefixStore::WaitAnyAndRead(const std::vector<std::string>& awaited,
                                                            const std::vector<std::string>& read,
                                                            absl::Duration timeout) {
  return base_->WaitAnyAndRead(Full(awaited), Full(read), timeout);
}
absl::StatusOr<std::vector<std::optional<std::string>>> PrefixStore::WaitAndRead(
    const std::vector<std::string>& awaited, const std::vector<std::string>& read,
    absl::Duration timeout) {
  return base_->WaitAndRead(Full(awaited), Full(read), timeout);
}
absl::StatusOr<bool> PrefixStore::CreateAndAdd(std::string_view key, std::string_view value,
                                               std::string_view add_key, int64_t delta,
                                               absl::Duration timeout) {
  return base_->CreateAndAdd(Full(key), value, Full(add_key), delta, timeout);
}

absl::Status PrefixStore::RaiseFence(int64_t generation, absl::Duration timeout) {
  return base_->RaiseFence(generation, timeout);
}

absl::StatusOr<std::vector<CompareAndSetResult>> PrefixStore::WriteBatch(
    const std::vector<BatchWrite>& writes, absl::Duration timeout) {
  // An empty key stays empty, for the store behind to refuse by its index.
  std::vector<BatchWrite> full = writes;
  for (BatchWrite& write : full) {
    if (!write.key.empty()) write.key = Full(write.key);
  }
  return base_->WriteBatch(full, timeout);
}
void PrefixStore::SetWriterGeneration(int64_t generation) {
  base_->SetWriterGeneration(generation);
}

}  // namespace trainguard
