// Where a registry's buffers and blobs lie in a snapshot payload (docs/FORMATS.md, "Snapshot
// arena"): every buffer at a 4096-aligned offset, the replicated ones first (in registry order:
// the replicated region, compared across replicas), then the others in registry order, then the
// blob area. The
// Snapshotter lays payloads out by it; the Persister records it in each shard's manifest, so that a
// reader without the trainer's registry (`trainguard ckpt export`) can name, type and cut out every
// byte of a shard.
//
// Thread safety: plain values and functions without shared state.
#ifndef TRAINGUARD_SDK_CHECKPOINT_PAYLOAD_LAYOUT_H_
#define TRAINGUARD_SDK_CHECKPOINT_PAYLOAD_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

struct PayloadLayout {
  // The registered buffers without their memory (`data` is null): name, group, bytes, dtype,
  // shape, device.
  std::vector<StateBuffer> buffers;
  std::vector<uint64_t> offsets;  // where each buffer's bytes start in the payload
  uint64_t blob_offset = 0;       // where the blob area starts
  // The replicated region: the payload's first replicated_bytes (0 without replicated buffers).
  uint64_t replicated_bytes = 0;
};

// The layout of `registry`'s payload.
PayloadLayout LayoutOf(const StateRegistry& registry);

// StateRegistry::LayoutHash() of a registry holding `buffers` (their `data` is not hashed).
uint64_t LayoutHashOf(const std::vector<StateBuffer>& buffers);

// A payload's blob area: u32 count, then per blob u32 name length, u64 value length, name, value.
std::string SerializeBlobArea(const std::vector<std::pair<std::string, std::string>>& blobs);
// The blobs of a blob area, in their order. DataLoss when the area is shorter than what it
// declares.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseBlobArea(
    std::string_view area);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_PAYLOAD_LAYOUT_H_
