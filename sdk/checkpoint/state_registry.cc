// StateRegistry: the list of buffers and blobs a checkpoint holds, validated as they are
// registered.
#include <xxhash.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "sdk/checkpoint/payload_layout.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

void HashInt(XXH3_state_t* state, int64_t value) {
  XXH3_64bits_update(state, &value, sizeof(value));
}

void HashString(XXH3_state_t* state, std::string_view s) {
  HashInt(state, static_cast<int64_t>(s.size()));
  XXH3_64bits_update(state, s.data(), s.size());
}

}  // namespace

absl::Status StateRegistry::Register(StateBuffer buffer) {
  if (buffer.name.empty()) {
    return absl::InvalidArgumentError("state buffer: the name is empty");
  }
  const std::string where = absl::StrFormat("state buffer \"%s\"", buffer.name);
  if (frozen_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: registered after the first checkpoint or restore (%d buffers were registered "
        "before it); the registry is frozen then, because a snapshot of the old layout could no "
        "longer be restored into it: register every buffer before Start()",
        where, buffers_.size()));
  }
  for (const StateBuffer& existing : buffers_) {
    if (existing.name == buffer.name) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: registered twice", where));
    }
  }
  if (buffer.data == nullptr && buffer.bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: null data pointer with %d bytes", where, buffer.bytes));
  }
  const size_t element_bytes = DTypeSize(buffer.dtype);
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: unknown dtype %d", where, static_cast<int>(buffer.dtype)));
  }
  // An empty shape means "not given": the bytes need only be whole elements.
  if (buffer.shape.empty()) {
    if (buffer.bytes % element_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %d bytes is not a whole number of %s elements", where, buffer.bytes,
                          DTypeName(buffer.dtype)));
    }
  } else {
    uint64_t elements = 1;
    for (int64_t dim : buffer.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: negative dimension %d in its shape", where, dim));
      }
      elements *= static_cast<uint64_t>(dim);
    }
    if (elements * element_bytes != buffer.bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: shape holds %d %s elements (%d bytes) but the buffer has %d bytes", where, elements,
          DTypeName(buffer.dtype), elements * element_bytes, buffer.bytes));
    }
  }
  if (buffer.device.kind == Device::Kind::kCuda) {
#if defined(TRAINGUARD_HAVE_CUDA)
    if (buffer.device.index < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative CUDA device ordinal %d", where, buffer.device.index));
    }
#else
    return absl::UnimplementedError(
        absl::StrFormat("%s: on CUDA device %d, but this trainguard was built without CUDA", where,
                        buffer.device.index));
#endif
  }
  buffers_.push_back(std::move(buffer));
  return absl::OkStatus();
}

absl::Status StateRegistry::SetBlob(const std::string& name, std::string value) {
  if (name.empty()) return absl::InvalidArgumentError("state blob: the name is empty");
  for (auto& [existing, existing_value] : blobs_) {
    if (existing == name) {
      existing_value = std::move(value);
      return absl::OkStatus();
    }
  }
  blobs_.emplace_back(name, std::move(value));
  return absl::OkStatus();
}

absl::StatusOr<std::string> StateRegistry::GetBlob(const std::string& name) const {
  for (const auto& [existing, value] : blobs_) {
    if (existing == name) return value;
  }
  return absl::NotFoundError(absl::StrFormat("state blob \"%s\": not set", name));
}

size_t StateRegistry::total_bytes() const {
  size_t total = 0;
  for (const StateBuffer& buffer : buffers_) total += buffer.bytes;
  return total;
}

uint64_t LayoutHashOf(const std::vector<StateBuffer>& buffers) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  HashInt(state, static_cast<int64_t>(buffers.size()));
  for (const StateBuffer& buffer : buffers) {
    HashString(state, buffer.name);
    HashInt(state, static_cast<int64_t>(buffer.bytes));
    HashInt(state, static_cast<int64_t>(buffer.dtype));
    HashInt(state, static_cast<int64_t>(buffer.shape.size()));
    for (int64_t dim : buffer.shape) HashInt(state, dim);
    HashInt(state, static_cast<int64_t>(buffer.device.kind));
    HashInt(state, buffer.device.index);
    // Only when set: the layouts (and arenas, shards) of registries without replicated buffers
    // keep the hash they always had.
    if (buffer.replicated) HashString(state, "replicated");
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

uint64_t StateRegistry::LayoutHash() const { return LayoutHashOf(buffers_); }

}  // namespace trainguard
