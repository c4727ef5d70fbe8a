// Checkpointing: what a checkpoint holds (StateRegistry). The Runtime copies it into an in-memory
// snapshot (the Snapshotter, sdk/checkpoint/snapshotter.h, backed by a shared-memory arena that
// outlives the process), persists and commits it.
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
  // Every rank of this rank's data-parallel group holds the same bytes after each optimizer step
  // (the parameters and replicated optimizer state of data parallelism; not ZeRO/FSDP shards).
  // The replicas' snapshots are compared at every snapshot and a rank that disagrees is named
  // (docs/GUIDE.md, "Silent data corruption"). Replicated buffers lie first in the payload.
  bool replicated = false;
};

class StateRegistry {
 public:
  // InvalidArgument for a duplicate or empty name, a null pointer with non-zero size, or a shape
  // that does not match `bytes`; FailedPrecondition once the registry is frozen.
  absl::Status Register(StateBuffer buffer);
  // Called by the Runtime before its first snapshot or restore: the layout (LayoutHash) is fixed
  // from then on, since a snapshot taken before a late buffer could no longer be restored into the
  // registry. Blobs may still be set, new ones included (they are not part of the layout).
  void Freeze() { frozen_ = true; }
  bool frozen() const { return frozen_; }
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
  bool frozen_ = false;
};

}  // namespace trainguard

#endif  // TRAINGUARD_CHECKPOINT_H_
