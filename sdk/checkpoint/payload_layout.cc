// PayloadLayout: the payload offsets of a registry's buffers and blobs, and the blob area's codec.
#include "sdk/checkpoint/payload_layout.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "sdk/checkpoint/snapshot_arena.h"

namespace trainguard {

PayloadLayout LayoutOf(const StateRegistry& registry) {
  using checkpoint_internal::AlignUp;
  using checkpoint_internal::kArenaAlignment;
  PayloadLayout layout;
  const std::vector<StateBuffer>& buffers = registry.buffers();
  layout.offsets.assign(buffers.size(), 0);
  uint64_t offset = 0;
  for (bool replicated : {true, false}) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].replicated != replicated) continue;
      layout.offsets[i] = offset;
      offset += AlignUp(buffers[i].bytes, kArenaAlignment);
    }
    if (replicated) layout.replicated_bytes = offset;
  }
  for (const StateBuffer& buffer : buffers) {
    StateBuffer described = buffer;
    described.data = nullptr;
    layout.buffers.push_back(std::move(described));
  }
  layout.blob_offset = offset;
  return layout;
}

std::string SerializeBlobArea(const std::vector<std::pair<std::string, std::string>>& blobs) {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint32_t count = static_cast<uint32_t>(blobs.size());
  put(&count, sizeof(count));
  for (const auto& [name, value] : blobs) {
    const uint32_t name_bytes = static_cast<uint32_t>(name.size());
    const uint64_t value_bytes = value.size();
    put(&name_bytes, sizeof(name_bytes));
    put(&value_bytes, sizeof(value_bytes));
    out += name;
    out += value;
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseBlobArea(
    std::string_view area) {
  std::vector<std::pair<std::string, std::string>> blobs;
  auto take = [&area](void* p, size_t n) {
    if (area.size() < n) return false;
    std::memcpy(p, area.data(), n);
    area.remove_prefix(n);
    return true;
  };
  uint32_t count = 0;
  if (!take(&count, sizeof(count))) return absl::DataLossError("blob area shorter than its count");
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_bytes = 0;
    uint64_t value_bytes = 0;
    if (!take(&name_bytes, sizeof(name_bytes)) || !take(&value_bytes, sizeof(value_bytes)) ||
        area.size() < name_bytes || area.size() - name_bytes < value_bytes) {
      return absl::DataLossError(
          absl::StrFormat("blob %d of %d runs past the blob area", i, count));
    }
    std::string name(area.substr(0, name_bytes));
    std::string value(area.substr(name_bytes, value_bytes));
    area.remove_prefix(name_bytes + value_bytes);
    blobs.emplace_back(std::move(name), std::move(value));
  }
  return blobs;
}

}  // namespace trainguard
