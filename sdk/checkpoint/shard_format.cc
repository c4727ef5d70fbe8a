#include "sdk/checkpoint/shard_format.h"

#include <xxhash.h>

#include <bit>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace trainguard::checkpoint {
namespace {

constexpr char kHeaderMagic[8] = {'T', 'G', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr char kTrailerMagic[8] = {'T', 'G', 'T', 'R', 'A', 'I', 'L', '1'};
constexpr char kManifestMagic[8] = {'T', 'G', 'M', 'A', 'N', 'I', 'F', '1'};
constexpr size_t kHeaderChecksumOffset = kShardHeaderBytes - 8;
constexpr size_t kManifestPrefixBytes = 8 + 4 + 8;

template <typename T>
void Put(char* at, T value) {
  static_assert(std::endian::native == std::endian::little, "the format is little-endian");
  std::memcpy(at, &value, sizeof(value));
}
template <typename T>
T Get(const char* at) {
  T value;
  std::memcpy(&value, at, sizeof(value));
  return value;
}

}  // namespace

uint64_t ChunkChecksum(absl::string_view chunk) { return XXH3_64bits(chunk.data(), chunk.size()); }

std::string EncodeShardHeader(const ShardHeader& h) {
  std::string block(kShardHeaderBytes, '\0');
  char* p = block.data();
  std::memcpy(p, kHeaderMagic, 8);
  Put<uint32_t>(p + 8, h.format_version);
  Put<uint32_t>(p + 12, static_cast<uint32_t>(kShardHeaderBytes));
  Put<int64_t>(p + 16, h.step);
  Put<int32_t>(p + 24, h.rank);
  Put<int64_t>(p + 32, h.generation);
  Put<uint64_t>(p + 40, h.layout_hash);
  Put<uint64_t>(p + 48, h.payload_bytes);
  Put<uint64_t>(p + 56, h.chunk_bytes);
  Put<uint64_t>(p + 64, h.chunk_count);
  Put<uint64_t>(p + kHeaderChecksumOffset, XXH3_64bits(p, kHeaderChecksumOffset));
  return block;
}

uint64_t StoredHeaderChecksum(absl::string_view block) {
  return block.size() < kShardHeaderBytes ? 0 : Get<uint64_t>(block.data() + kHeaderChecksumOffset);
}

absl::StatusOr<ShardHeader> DecodeShardHeader(absl::string_view block, const std::string& path) {
  if (block.size() < kShardHeaderBytes) {
    return absl::DataLossError(absl::StrFormat("shard %s: header truncated (%d of %d bytes)", path,
                                               block.size(), kShardHeaderBytes));
  }
  const char* p = block.data();
  if (std::memcmp(p, kHeaderMagic, 8) != 0) {
    return absl::DataLossError(absl::StrFormat("shard %s: bad header magic", path));
  }
  if (XXH3_64bits(p, kHeaderChecksumOffset) != StoredHeaderChecksum(block)) {
    return absl::DataLossError(absl::StrFormat("shard %s: header checksum mismatch", path));
  }
  ShardHeader h;
  h.format_version = Get<uint32_t>(p + 8);
  if (h.format_version != kShardFormatVersion || Get<uint32_t>(p + 12) != kShardHeaderBytes) {
    return absl::DataLossError(
        absl::StrFormat("shard %s: unsupported format version %d", path, h.format_version));
  }
  h.step = Get<int64_t>(p + 16);
  h.rank = Get<int32_t>(p + 24);
  h.generation = Get<int64_t>(p + 32);
  h.layout_hash = Get<uint64_t>(p + 40);
  h.payload_bytes = Get<uint64_t>(p + 48);
  h.chunk_bytes = Get<uint64_t>(p + 56);
  h.chunk_count = Get<uint64_t>(p + 64);
  return h;
}

std::string EncodeShardTrailer(const std::vector<uint64_t>& chunk_checksums) {
  const uint64_t bytes = TrailerBytes(chunk_checksums.size());
  std::string trailer(AlignUp(bytes), '\0');
  char* p = trailer.data();
  for (size_t i = 0; i < chunk_checksums.size(); ++i) Put<uint64_t>(p + 8 * i, chunk_checksums[i]);
  char* tail = p + 8 * chunk_checksums.size();
  std::memcpy(tail, kTrailerMagic, 8);
  Put<uint64_t>(tail + 8, chunk_checksums.size());
  Put<uint64_t>(tail + 16, XXH3_64bits(p, bytes - 8));
  return trailer;
}

absl::StatusOr<std::vector<uint64_t>> DecodeShardTrailer(absl::string_view padded_trailer,
                                                         uint64_t chunk_count,
                                                         const std::string& path) {
  const uint64_t bytes = TrailerBytes(chunk_count);
  if (padded_trailer.size() < AlignUp(bytes)) {
    return absl::DataLossError(absl::StrFormat("shard %s: trailer truncated (%d of %d bytes)", path,
                                               padded_trailer.size(), AlignUp(bytes)));
  }
  const char* p = padded_trailer.data();
  const char* tail = p + 8 * chunk_count;
  if (std::memcmp(tail, kTrailerMagic, 8) != 0) {
    return absl::DataLossError(absl::StrFormat("shard %s: bad trailer magic", path));
  }
  if (Get<uint64_t>(tail + 8) != chunk_count) {
    return absl::DataLossError(absl::StrFormat("shard %s: trailer holds %d chunks, expected %d",
                                               path, Get<uint64_t>(tail + 8), chunk_count));
  }
  if (XXH3_64bits(p, bytes - 8) != Get<uint64_t>(tail + 16)) {
    return absl::DataLossError(absl::StrFormat("shard %s: trailer checksum mismatch", path));
  }
  for (uint64_t i = bytes; i < AlignUp(bytes); ++i) {
    if (p[i] != '\0') {
      return absl::DataLossError(absl::StrFormat("shard %s: nonzero trailer padding", path));
    }
  }
  std::vector<uint64_t> checksums(chunk_count);
  for (uint64_t i = 0; i < chunk_count; ++i) checksums[i] = Get<uint64_t>(p + 8 * i);
  return checksums;
}

std::string EncodeManifest(const proto::ShardManifest& manifest) {
  const std::string message = manifest.SerializeAsString();
  std::string out(kManifestPrefixBytes, '\0');
  std::memcpy(out.data(), kManifestMagic, 8);
  Put<uint32_t>(out.data() + 8, static_cast<uint32_t>(message.size()));
  Put<uint64_t>(out.data() + 12, XXH3_64bits(message.data(), message.size()));
  return out + message;
}

absl::StatusOr<proto::ShardManifest> DecodeManifest(absl::string_view bytes,
                                                    const std::string& path) {
  if (bytes.size() < kManifestPrefixBytes || std::memcmp(bytes.data(), kManifestMagic, 8) != 0) {
    return absl::DataLossError(absl::StrFormat("manifest %s: bad magic or truncated", path));
  }
  const uint32_t length = Get<uint32_t>(bytes.data() + 8);
  if (bytes.size() != kManifestPrefixBytes + length) {
    return absl::DataLossError(absl::StrFormat("manifest %s: torn (%d bytes, expected %d)", path,
                                               bytes.size(), kManifestPrefixBytes + length));
  }
  const absl::string_view message = bytes.substr(kManifestPrefixBytes);
  if (XXH3_64bits(message.data(), message.size()) != Get<uint64_t>(bytes.data() + 12)) {
    return absl::DataLossError(absl::StrFormat("manifest %s: checksum mismatch", path));
  }
  proto::ShardManifest manifest;
  if (!manifest.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
    return absl::DataLossError(absl::StrFormat("manifest %s: does not parse", path));
  }
  return manifest;
}

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%012d", step); }
std::string ShardFileName(int rank) { return absl::StrFormat("rank-%05d.shard", rank); }
std::string ManifestFileName(int rank) { return absl::StrFormat("rank-%05d.manifest", rank); }

bool ParseStepDirName(absl::string_view name, int64_t* step) {
  if (name.size() != 17 || name.substr(0, 5) != "step-") return false;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name.substr(5), step);
}

bool ParseRankFileName(absl::string_view name, absl::string_view suffix, int* rank) {
  if (name.size() != 10 + suffix.size() || name.substr(0, 5) != "rank-" ||
      name.substr(10) != suffix) {
    return false;
  }
  for (char c : name.substr(5, 5)) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name.substr(5, 5), rank);
}

}  // namespace trainguard::checkpoint
