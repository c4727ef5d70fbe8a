// Checkpointing, part 1: what a checkpoint holds (StateRegistry) and the in-memory snapshot of it
// (Snapshotter, backed by a shared-memory arena that outlives the process).
//
// A trainer registers, once, every buffer a checkpoint must hold (weights, optimizer state, host or
// CUDA device memory) and small blobs (RNG state, data-loader position). Every few steps it asks
// the Snapshotter to copy them into the arena; the training thread only enqueues and goes on. The
// arena is a named POSIX shared-memory segment ("/trainguard.<job_id>.rank<R>", allocated once)
// with two slots: one being written, one holding the last complete snapshot, so a snapshot in
// flight never damages the previous one. A process restarted on the same machine (or a standby
// replacing it) opens the dead rank's arena and restores from it without touching disk. Every
// buffer's bytes carry an XXH3-64 checksum per chunk, computed once while copying and checked on
// every restore.
//
// The fence contract: after Begin(step), the trainer must not modify a registered buffer until the
// copy of that buffer is done: call FenceBuffer(name) (or Fence() for all) before the first write
// to it. The guard does this for the whole state at the next step boundary when the trainer does
// not.
//
// Thread safety: StateRegistry is filled before the Snapshotter is created and read-only after
// that. Snapshotter methods may be called from any thread; copies run on its own worker threads,
// owned by it and joined by its destructor.
#ifndef TRAINGUARD_CHECKPOINT_H_
#define TRAINGUARD_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainguard {

enum class DType : int32_t { kU8 = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kF64 = 4, kI32 = 5, kI64 = 6 };
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

struct Device {
  enum class Kind : int32_t { kHost = 0, kCuda = 1 };
  Kind kind = Kind::kHost;
  int index = 0;  // the CUDA device ordinal

  static Device Host() { return {}; }
  static Device Cuda(int ordinal) { return {Kind::kCuda, ordinal}; }
  bool operator==(const Device&) const = default;
};

// One registered buffer.
struct StateBuffer {
  std::string name;   // unique, e.g. "layer0.weight", "optimizer.exp_avg.layer0"
  std::string group;  // e.g. "model", "optimizer", "policy", "critic"; "" if none
  void* data = nullptr;
  size_t bytes = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // informational; its element count times DTypeSize must equal bytes
  Device device;
};

class StateRegistry {
 public:
  // InvalidArgument for a duplicate or empty name, a null pointer with non-zero size, or a shape
  // that does not match `bytes`.
  absl::Status Register(StateBuffer buffer);
  // A small byte string saved with the state (RNG state, data-loader position). Its value is read
  // at each snapshot; SetBlob may be called again at any time between snapshots.
  absl::Status SetBlob(const std::string& name, std::string value);
  absl::StatusOr<std::string> GetBlob(const std::string& name) const;

  const std::vector<StateBuffer>& buffers() const { return buffers_; }
  const std::vector<std::pair<std::string, std::string>>& blobs() const { return blobs_; }
  size_t total_bytes() const;
  // A hash of names, sizes, dtypes, shapes and devices: restoring into a registry with another
  // layout is refused.
  uint64_t LayoutHash() const;

 private:
  std::vector<StateBuffer> buffers_;
  std::vector<std::pair<std::string, std::string>> blobs_;
};

struct SnapshotterOptions {
  std::string job_id = "default";
  int rank = 0;
  int64_t generation = 0;
  int copy_threads = 4;             // parallel memcpy for host buffers
  size_t chunk_bytes = 4 << 20;     // checksum granularity (and CUDA copy size)
  size_t max_blob_bytes = 1 << 20;  // arena space reserved for blobs
};

struct SnapshotInfo {
  int64_t step = -1;
  int64_t generation = 0;
  uint64_t layout_hash = 0;
  size_t bytes = 0;
  // Identifies the contents: SnapshotFingerprint() of the step, layout, size and chunk checksums.
  // Equal on the arena copy and the disk copy of the same snapshot; a global commit records it.
  uint64_t fingerprint = 0;
};

// XXH3-64 of (step, layout_hash, payload_bytes, every chunk checksum).
uint64_t SnapshotFingerprint(int64_t step, uint64_t layout_hash, uint64_t payload_bytes,
                             const std::vector<uint64_t>& chunk_checksums);

class Snapshotter {
 public:
  // Creates (or re-opens, when a previous process of this rank left one with the same layout) the
  // arena for `registry`. REQUIRES: `registry` outlives the Snapshotter and is not modified after.
  static absl::StatusOr<std::unique_ptr<Snapshotter>> Create(const StateRegistry* registry,
                                                             const SnapshotterOptions& options);
  ~Snapshotter();

  // Starts copying every registered buffer and blob into the free slot, tagged with `step`; returns
  // as soon as the copy is enqueued. FailedPrecondition if a snapshot is still in flight.
  absl::Status Begin(int64_t step);
  // Blocks until the in-flight copy of `name` (or of everything) is done, at most `timeout`.
  absl::Status FenceBuffer(const std::string& name, absl::Duration timeout);
  absl::Status Fence(absl::Duration timeout);
  // The newest complete snapshot in the arena (this process's or a previous one's), if any.
  std::optional<SnapshotInfo> LatestComplete() const;
  // Verifies every chunk of the latest complete snapshot and copies it back into the registry's
  // buffers (and blobs). DataLoss naming buffer, offset, rank and step on a checksum mismatch; the
  // buffers are then left as they were.
  absl::StatusOr<SnapshotInfo> RestoreLatest(StateRegistry* registry);
  // The complete snapshots in the arena (at most two), newest first.
  std::vector<SnapshotInfo> CompleteSnapshots() const;
  // As RestoreLatest, from the complete snapshot of `step` (either slot). NotFound when the arena
  // holds no complete snapshot of that step.
  absl::StatusOr<SnapshotInfo> RestoreStep(StateRegistry* registry, int64_t step);
  // Installs a snapshot read from elsewhere (a persisted shard) as the newest complete one, after
  // checking every chunk against `chunk_checksums`; then RestoreStep(step) restores it. DataLoss on
  // a mismatch (the arena keeps its previous snapshots); FailedPrecondition while a snapshot is in
  // flight or when the payload does not fit this registry's layout.
  absl::StatusOr<SnapshotInfo> Install(int64_t step, int64_t generation, std::string_view payload,
                                       const std::vector<uint64_t>& chunk_checksums);
  // The bytes and per-chunk checksums of the latest complete snapshot, for persistence and peers.
  // Valid until the next Begin().
  struct View {
    SnapshotInfo info;
    std::string_view payload;               // all buffers, then blobs, in registry order
    std::vector<uint64_t> chunk_checksums;  // XXH3-64 of each chunk_bytes piece of payload
  };
  absl::StatusOr<View> LatestView() const;

  // The shared-memory segment name of a rank's arena.
  static std::string ArenaName(std::string_view job_id, int rank);
  // Removes a rank's arena (normal shutdown of a job, or `trainguard` on request).
  static absl::Status RemoveArena(std::string_view job_id, int rank);

 private:
  class Impl;
  explicit Snapshotter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_CHECKPOINT_H_
