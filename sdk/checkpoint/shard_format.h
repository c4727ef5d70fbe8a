// The on-disk format of one persisted checkpoint shard and of its manifest (docs/FORMATS.md,
// "Checkpoint shard and manifest"). Private to sdk/checkpoint and the `trainguard ckpt` tool.
//
// Shard file, every region aligned to kShardAlignment so it can be written with O_DIRECT:
//   [0, 4096)                      header: "TGSHARD1", version, geometry, XXH3-64 of bytes [0,
//   4088) [4096, 4096 + padded payload)  payload chunks of chunk_bytes; the last one zero-padded
//   [trailer offset, end)          trailer: chunk XXH3-64 table, "TGTRAIL1", chunk count,
//                                  XXH3-64 of the preceding trailer bytes; zero-padded
// Manifest file: "TGMANIF1", u32 message length, u64 XXH3-64 of the message, the ShardManifest
// message. All integers little-endian.
//
// Thread safety: plain functions without shared state.
#ifndef TRAINGUARD_SDK_CHECKPOINT_SHARD_FORMAT_H_
#define TRAINGUARD_SDK_CHECKPOINT_SHARD_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sdk/proto/checkpoint.pb.h"

namespace trainguard::checkpoint {

inline constexpr uint64_t kShardAlignment = 4096;
inline constexpr uint64_t kShardHeaderBytes = 4096;
inline constexpr uint32_t kShardFormatVersion = 1;

struct ShardHeader {
  uint32_t format_version = kShardFormatVersion;
  int64_t step = -1;
  int32_t rank = -1;
  int64_t generation = 0;
  uint64_t layout_hash = 0;
  uint64_t payload_bytes = 0;
  uint64_t chunk_bytes = 0;
  uint64_t chunk_count = 0;
};

inline uint64_t AlignUp(uint64_t n) {
  return (n + kShardAlignment - 1) / kShardAlignment * kShardAlignment;
}
inline uint64_t ChunkCount(uint64_t payload_bytes, uint64_t chunk_bytes) {
  return (payload_bytes + chunk_bytes - 1) / chunk_bytes;
}
// Unpadded size of the trailer of `chunk_count` chunks.
inline uint64_t TrailerBytes(uint64_t chunk_count) { return 8 * chunk_count + 24; }
inline uint64_t TrailerOffset(uint64_t payload_bytes) {
  return kShardHeaderBytes + AlignUp(payload_bytes);
}
inline uint64_t ShardFileBytes(uint64_t payload_bytes, uint64_t chunk_bytes) {
  return TrailerOffset(payload_bytes) +
         AlignUp(TrailerBytes(ChunkCount(payload_bytes, chunk_bytes)));
}

uint64_t ChunkChecksum(absl::string_view chunk);

// The 4096-byte header block, its XXH3-64 in the last 8 bytes.
std::string EncodeShardHeader(const ShardHeader& header);
// The checksum stored in an encoded header block.
uint64_t StoredHeaderChecksum(absl::string_view block);
// DataLoss naming `path` when the magic, the checksum or the version does not hold.
absl::StatusOr<ShardHeader> DecodeShardHeader(absl::string_view block, const std::string& path);

// The trailer, zero-padded to kShardAlignment.
std::string EncodeShardTrailer(const std::vector<uint64_t>& chunk_checksums);
// DataLoss naming `path` when the magic, the count, the checksum or the zero padding does not hold.
absl::StatusOr<std::vector<uint64_t>> DecodeShardTrailer(absl::string_view padded_trailer,
                                                         uint64_t chunk_count,
                                                         const std::string& path);

std::string EncodeManifest(const proto::ShardManifest& manifest);
// DataLoss naming `path` for a torn, truncated or corrupt manifest.
absl::StatusOr<proto::ShardManifest> DecodeManifest(absl::string_view bytes,
                                                    const std::string& path);

// "step-000000000042", "rank-00003.shard", "rank-00003.manifest".
std::string StepDirName(int64_t step);
std::string ShardFileName(int rank);
std::string ManifestFileName(int rank);
// Parse the names above; false for anything else (temporary files included).
bool ParseStepDirName(absl::string_view name, int64_t* step);
bool ParseRankFileName(absl::string_view name, absl::string_view suffix, int* rank);

}  // namespace trainguard::checkpoint

#endif  // TRAINGUARD_SDK_CHECKPOINT_SHARD_FORMAT_H_
