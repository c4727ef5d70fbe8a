// `trainguard ckpt export`: one rank's persisted shard as a safetensors file
// (https://huggingface.co/docs/safetensors): u64 little-endian header length, a JSON header naming
// every tensor's dtype, shape and byte range, then the tensors' bytes, back to back. Every buffer
// the trainer registered is a tensor under its registered name; every blob (the pickled optimizer
// param_groups, the RNG states, `extra`) is a U8 tensor under "__blob__/<name>". The header's
// "__metadata__" carries the step, rank, world size, generation and layout hash.
//
// The shard's manifest must record its payload layout (sdk/checkpoint/payload_layout.h); the
// layout is checked against the shard's layout hash and every chunk of the payload against its
// checksum before anything is written. The file is written to a temporary name beside `out_path`,
// fsynced and renamed, so a failed export never leaves a partial file under `out_path`.
//
// Thread safety: a plain function without shared state.
#ifndef TRAINGUARD_TOOLS_SAFETENSORS_EXPORT_H_
#define TRAINGUARD_TOOLS_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/checkpoint/persister.h"

namespace trainguard {
class Env;
}

namespace trainguard::tools {

// The prefix of a blob's tensor name in an exported file.
inline constexpr char kExportedBlobPrefix[] = "__blob__/";

struct SafetensorsExportSummary {
  size_t tensors = 0;  // registered buffers
  size_t blobs = 0;
  uint64_t file_bytes = 0;
};

// Writes `shard` to `out_path` (see the header comment); `metadata` goes into "__metadata__" as
// given. Errors name the shard or the output file and what is wrong: no recorded layout
// (FailedPrecondition), a layout that does not fit the shard or a corrupt chunk (DataLoss), a
// write that failed (the Env's error).
absl::StatusOr<SafetensorsExportSummary> ExportShardAsSafetensors(
    Env* env, const ShardRecord& shard,
    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& out_path);

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_SAFETENSORS_EXPORT_H_
