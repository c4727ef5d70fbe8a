// Snapshotter: the in-memory snapshot of a rank's StateRegistry (include/trainguard/checkpoint.h),
// backed by a shared-memory arena that outlives the process. See checkpoint.h for the arena and
// the fence contract.
//
// Thread safety: Snapshotter methods may be called from any thread; copies run on its own worker
// threads, owned by it and joined by its destructor.
#ifndef TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_H_
#define TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

class Env;
class SpareArena;

struct SnapshotterOptions {
  std::string job_id = "default";
  int rank = 0;
  int64_t generation = 0;
  int copy_threads = 4;             // parallel memcpy for host buffers
  size_t chunk_bytes = 4 << 20;     // checksum granularity (and CUDA copy size)
  size_t max_blob_bytes = 1 << 20;  // arena space reserved for blobs
  Env* env = nullptr;               // the arena's shared memory; nullptr: Env::Default()
  // An existing arena of this rank that holds another layout's state (another model under the same
  // job id) is kept and Create fails naming both layouts, instead of being replaced (its state
  // lost). The Runtime's own arena asks for this; a backup holder's does not.
  bool keep_arena_of_other_layout = false;
  // A parked standby's prepared segment (spare_arena.h): adopted as the arena when the rank has
  // none on this host and the sizes agree; otherwise left to its owner. nullptr: none.
  SpareArena* spare_arena = nullptr;
  // How long Create waits for another process that holds this rank's arena to exit (a killed
  // rank's process, or a child that inherited its descriptor, still tearing down when its
  // replacement starts) before it fails with FailedPrecondition. Zero: it fails at once.
  absl::Duration arena_lock_wait = absl::ZeroDuration();
};

struct SnapshotInfo {
  int64_t step = -1;
  int64_t generation = 0;
  uint64_t layout_hash = 0;
  size_t bytes = 0;
  // Identifies the contents: SnapshotFingerprint() of the step, layout, size and chunk checksums.
  // Equal on the arena copy and the disk copy of the same snapshot; a global commit records it.
  uint64_t fingerprint = 0;
  // Set by a restore: the bytes of host buffers that already held the snapshot's bytes (whole
  // chunks whose live bytes hash to the snapshot's checksum), left as they were, not copied.
  size_t restored_bytes_held = 0;
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
  // `keep`: a step to keep in the arena (the newest step the caller knows is committed). The free
  // slot is the older one, unless that holds `keep` and the newer does not: then the newer one (an
  // uncommitted snapshot) is overwritten, so that a commit that stalls for a few saves leaves the
  // committed snapshot in the arena.
  absl::Status Begin(int64_t step, std::optional<int64_t> keep = std::nullopt);
  // Blocks until the in-flight copy of `name` (or of everything) is done, at most `timeout`.
  absl::Status FenceBuffer(const std::string& name, absl::Duration timeout);
  absl::Status Fence(absl::Duration timeout);
  // The newest complete snapshot in the arena (this process's or a previous one's), if any.
  std::optional<SnapshotInfo> LatestComplete() const;
  // Verifies every chunk of the latest complete snapshot and copies it back into the registry's
  // buffers (and blobs), on up to copy_threads threads. A chunk of a host buffer whose live bytes
  // already hash to the snapshot's checksum is left as it is (neither copied nor read from the
  // arena; SnapshotInfo::restored_bytes_held counts them); not looked for by the restore that
  // does not verify (see RestoreStep), where a copy costs no more than the comparison. DataLoss
  // naming buffer, offset, rank and step on a checksum mismatch; the buffers are then left as they
  // were.
  absl::StatusOr<SnapshotInfo> RestoreLatest(StateRegistry* registry);
  // The complete snapshots in the arena (at most two), newest first.
  std::vector<SnapshotInfo> CompleteSnapshots() const;
  // As RestoreLatest, from the complete snapshot of `step` (either slot). NotFound when the arena
  // holds no complete snapshot of that step. The first restore of a slot that Install or
  // InstallWith filled (every chunk checked as it landed, in this process) copies it without
  // hashing it again; every other restore verifies every chunk first.
  absl::StatusOr<SnapshotInfo> RestoreStep(StateRegistry* registry, int64_t step);
  // Installs a snapshot read from elsewhere (a persisted shard) as the newest complete one, after
  // checking every chunk against `chunk_checksums`; then RestoreStep(step) restores it. It
  // overwrites the older slot, or the one set_install_keep says. DataLoss on a mismatch (the
  // other slot keeps its snapshot); FailedPrecondition while a snapshot is in
  // flight or when the payload does not fit this registry's layout.
  absl::StatusOr<SnapshotInfo> Install(int64_t step, int64_t generation, std::string_view payload,
                                       const std::vector<uint64_t>& chunk_checksums);
  // As Install, for a payload of `payload_bytes` that `fill` writes straight into the arena's free
  // slot (a peer's backup received from the network: no copy in between). `fill` must write every
  // byte and check every chunk against `chunk_checksums` (the arena records them as given, without
  // hashing again); an error from it is returned and leaves that slot empty, the other slot's
  // snapshot untouched (the latest complete one, unless set_install_keep chose to overwrite
  // that). `fingerprint` is the snapshot's expected SnapshotFingerprint with this registry's
  // layout: FailedPrecondition before `fill` runs when step, size and table give another one
  // (a snapshot of another layout), DataLoss when the slot as recorded at the end does not have
  // it. The arena's lock is held while `fill` runs, so it must be bounded (a deadline) and must
  // not call this Snapshotter.
  absl::StatusOr<SnapshotInfo> InstallWith(int64_t step, int64_t generation, uint64_t payload_bytes,
                                           const std::vector<uint64_t>& chunk_checksums,
                                           uint64_t fingerprint,
                                           absl::FunctionRef<absl::Status(char* dst)> fill);
  // Told by an install's `fill` which chunks of the slot are written and checked
  // (InstallAndRestoreWith).
  class ChunkSink {
   public:
    // Chunk `k` of the payload is in the slot and matched its checksum. May be called from several
    // threads at once, for different chunks; a chunk told twice is taken once.
    virtual void Landed(uint64_t k) = 0;

   protected:
    ~ChunkSink() = default;
  };
  // As InstallWith, and restores the snapshot into `registry`'s buffers as it lands, for a rank
  // that has no state to keep (a replacement; a survivor whose arena lacks the step): each chunk
  // that `fill` tells the sink has landed is copied at once into the host buffers it holds, from
  // the cache its checksum was just computed in, on the thread that told it; a CUDA buffer is
  // copied from the (pinned) slot once its last chunk landed, one copy per buffer, while the rest
  // of the payload is still arriving. Chunks `fill` did not tell are copied once it returns, the
  // blobs once the slot is complete. Returns the installed snapshot with every buffer and blob
  // restored: no RestoreStep is needed. FailedPrecondition (nothing written) when `registry`'s
  // layout is not this arena's; the errors of InstallWith, and those of a device copy (the slot
  // then stays installed and a RestoreStep of it may be tried). On any error the buffers may hold
  // part of the snapshot: the caller restores them from elsewhere or not at all.
  absl::StatusOr<SnapshotInfo> InstallAndRestoreWith(
      StateRegistry* registry, int64_t step, int64_t generation, uint64_t payload_bytes,
      const std::vector<uint64_t>& chunk_checksums, uint64_t fingerprint,
      absl::FunctionRef<absl::Status(char* dst, ChunkSink* sink)> fill);
  // The steps that Install and InstallWith avoid overwriting, most wanted first (a restore's
  // candidates not tried yet): an install writes the slot holding none of them, else the one
  // holding the later-listed step. Empty (the default): the older slot, so that the latest
  // complete snapshot is kept.
  void set_install_keep(std::vector<int64_t> steps);
  // The bytes and per-chunk checksums of the latest complete snapshot, for persistence and peers.
  // Valid until the next Begin().
  struct View {
    SnapshotInfo info;
    std::string_view payload;               // all buffers, then blobs (payload_layout.h)
    std::vector<uint64_t> chunk_checksums;  // XXH3-64 of each chunk_bytes piece of payload
    // One per replica_pieces() entry, for a snapshot this Snapshotter copied from the buffers
    // (empty for one installed or left by an earlier process, and without replicated buffers).
    std::vector<uint64_t> replica_digests;
  };
  absl::StatusOr<View> LatestView() const;
  // As LatestView, for the complete snapshot of `step` (either slot; not one being written).
  // NotFound when the arena holds no complete snapshot of that step. Valid until the next Begin().
  absl::StatusOr<View> ViewOf(int64_t step) const;
  // The checksum granularity of this arena (SnapshotOptions::chunk_bytes).
  uint64_t chunk_bytes() const;
  // The replicated region (StateBuffer::replicated; payload_layout.h) lies in the first
  // replicated_chunks() chunks. Each piece of a replicated buffer has a replica digest
  // (View::replica_digests): the XXH3-64 of its chunk's bytes from the chunk's start to the
  // piece's end (replicated bytes and zeroed padding only), taken on the way while the chunk's
  // checksum is computed: no second pass. Replicas whose replicated buffers hold the same bytes
  // have the same digests; two replicas' first differing digest in a chunk names the buffer that
  // differs.
  struct ReplicaPiece {
    std::string buffer;  // the registered buffer's name
    int64_t chunk = 0;
    uint64_t buffer_offset = 0;  // where the piece starts in the buffer
    uint64_t bytes = 0;
  };
  const std::vector<ReplicaPiece>& replica_pieces() const;
  int64_t replicated_chunks() const;
  // The arena's per-slot payload capacity in bytes (padded buffers plus the blob area): what a
  // backup holder's arena for this rank must hold.
  size_t payload_capacity() const;
  // The bytes of the whole arena segment (both slots and their headers): its shared-memory cost.
  size_t arena_bytes() const;

  // The shared-memory segment name of a rank's arena.
  static std::string ArenaName(std::string_view job_id, int rank);
  // Removes a rank's arena (normal shutdown of a job, or `trainguard` on request).
  static absl::Status RemoveArena(std::string_view job_id, int rank, Env* env = nullptr);

 private:
  class Impl;
  explicit Snapshotter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_SNAPSHOTTER_H_
