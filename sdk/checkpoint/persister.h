// Checkpointing, part 2: one rank's snapshot of one step, made durable on local disk, and read back
// with every byte verified.
//
// Layout under the checkpoint directory:
//     step-<S, 12 digits>/rank-<R, 5 digits>.shard      the payload, self-describing
//     (docs/FORMATS.md):
//                                                       4 KiB header, chunks aligned for O_DIRECT,
//                                                       trailer with the per-chunk XXH3-64 table
//     step-<S>/rank-<R>.manifest                        the commit record of that shard (protobuf,
//                                                       checksummed); written last, atomically
// A shard exists for readers only once its manifest is committed: written to a temporary name,
// fdatasync'ed, renamed, and the directory fsync'ed. A crash, a full disk or an I/O error at any
// point before that leaves every previously committed shard intact and readable; the half-written
// shard is never listed. Writes go through io_uring with O_DIRECT and registered, aligned buffers
// (liburing), at a configurable queue depth and chunk size, into a preallocated file; where the
// kernel or a container profile refuses io_uring (EPERM, ENOSYS), the same writes go through
// pwritev on the same O_DIRECT descriptor, with a logged warning, producing identical files.
//
// Thread safety: a Persister is used by one thread at a time. The free functions may be called from
// any thread.
#ifndef TRAINGUARD_SDK_CHECKPOINT_PERSISTER_H_
#define TRAINGUARD_SDK_CHECKPOINT_PERSISTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sdk/checkpoint/payload_layout.h"

namespace trainguard {

class Env;

// The commit record of one persisted shard.
struct ShardRecord {
  int64_t step = -1;
  int rank = -1;
  int64_t generation = 0;
  uint64_t layout_hash = 0;
  std::string shard_path;  // absolute path of the .shard file
  uint64_t payload_bytes = 0;
  uint64_t chunk_bytes = 0;
  std::vector<uint64_t> chunk_checksums;  // XXH3-64 of each chunk of the payload
  int world_size = 0;  // ranks whose shards make the step complete; 0: not recorded
  // The payload's buffers and blob area; nullopt when the manifest records none (written before
  // layouts were recorded, or persisted without one).
  std::optional<PayloadLayout> layout;
};

struct PersisterOptions {
  std::string dir;               // created if missing
  size_t chunk_bytes = 4 << 20;  // multiple of 4096; also the checksum granularity
  int queue_depth = 16;          // io_uring writes in flight
  bool use_io_uring = true;      // false: pwritev only
  int keep_last = 3;             // committed steps kept per rank; older ones are deleted
  Env* env = nullptr;            // metadata operations (manifests, renames, directory syncs)
  // Recorded in every manifest, so that readers (`trainguard ckpt`) can tell a step that lacks a
  // rank's shard from a complete one. 0: not recorded.
  int world_size = 0;
};

class Persister {
 public:
  static absl::StatusOr<std::unique_ptr<Persister>> Create(const PersisterOptions& options);
  ~Persister();

  // Writes and commits the shard of (`step`, `rank`). `chunk_checksums` are the payload's XXH3-64
  // per chunk_bytes piece, computed once by the Snapshotter and reused here (and verified against
  // the payload before writing). `layout`, if given, is recorded in the manifest (what
  // `trainguard ckpt export` reads). Errors name the file, the operation and the offset.
  // REQUIRES: `layout`, if given, describes `payload` (LayoutOf the registry it was taken from).
  absl::StatusOr<ShardRecord> Persist(int64_t step, int rank, int64_t generation,
                                      uint64_t layout_hash, std::string_view payload,
                                      const std::vector<uint64_t>& chunk_checksums,
                                      const PayloadLayout* layout = nullptr);
  // True when writes go through io_uring (false after the pwritev fallback was taken).
  bool using_io_uring() const;

 private:
  class Impl;
  explicit Persister(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Every committed shard under `dir` (each with a manifest that parses and whose checksum holds),
// ordered by step then rank. Uncommitted leftovers are ignored.
absl::StatusOr<std::vector<ShardRecord>> ListCommittedShards(Env* env, const std::string& dir);

struct CorruptChunk {
  uint64_t offset = 0;  // in the payload
  std::string what;     // e.g. "checksum mismatch", "file truncated"
};

// Reads `record`'s shard and checks its header, every chunk and its trailer. Returns the corrupt
// chunks (empty when the shard is intact); an error only when the file cannot be read at all.
// `progress`, if set, is called with (bytes checked, total bytes).
absl::StatusOr<std::vector<CorruptChunk>> VerifyShard(
    Env* env, const ShardRecord& record,
    const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

// The verified payload of `record`: DataLoss naming the file, offset, rank and step at the first
// corrupt chunk.
absl::StatusOr<std::string> ReadShardPayload(Env* env, const ShardRecord& record);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_PERSISTER_H_
