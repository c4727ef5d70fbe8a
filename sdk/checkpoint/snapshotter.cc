// Snapshotter: copies the registered state into the free slot of the shared-memory arena on worker
// threads, checksumming each chunk as it lands; restores from the newest complete slot after
// verifying every chunk. Arena layout: sdk/checkpoint/snapshot_arena.h and docs/FORMATS.md.
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/payload_layout.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/core/job_id.h"
#include "sdk/core/mutex.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"

#if defined(TRAINGUARD_HAVE_CUDA)
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/checkpoint/snapshotter_cuda.h"
#endif

namespace trainguard {

using checkpoint_internal::AlignUp;
using checkpoint_internal::ArenaGeometry;
using checkpoint_internal::ChunkChecksums;
using checkpoint_internal::kArenaAlignment;
using checkpoint_internal::kArenaFormatVersion;
using checkpoint_internal::kSlotComplete;
using checkpoint_internal::kSlotEmpty;
using checkpoint_internal::kSlotMagic;
using checkpoint_internal::kSlotWriting;
using checkpoint_internal::LoadState;
using checkpoint_internal::SlotHeader;
using checkpoint_internal::SnapshotArena;
using checkpoint_internal::StoreState;

namespace {

// A device copy (a chunk of a snapshot, a whole buffer of a restore) that takes longer than this is
// a hung GPU or bus, not a slow one.
constexpr absl::Duration kDeviceCopyTimeout = absl::Seconds(60);
// A restore verifies its chunks on up to copy_threads threads, each given at least this many.
constexpr uint64_t kMinChunksPerVerifyThread = 4;
// How often an idle worker re-checks for shutdown.
constexpr absl::Duration kWorkerIdlePoll = absl::Milliseconds(200);

// The part of one chunk that comes from one buffer.
struct Piece {
  int buffer = 0;
  size_t buffer_offset = 0;
  size_t payload_offset = 0;
  size_t bytes = 0;
};

// Where everything goes in a slot's payload: each buffer at a 4096-aligned offset, in registry
// order, then the blob area.
struct PayloadPlan {
  ArenaGeometry geometry;
  std::vector<size_t> buffer_offsets;
  std::vector<int64_t> buffer_chunks;      // chunks that hold part of each buffer
  std::vector<std::vector<Piece>> chunks;  // pieces of each chunk of the buffer region
  // The replicated region (payload_layout.h): its chunks, and where each one's pieces start in
  // the list of replica digests (one per piece, in payload order).
  int64_t replicated_chunks = 0;
  std::vector<size_t> replica_piece_begin;  // per replicated chunk, then the total
  std::vector<Snapshotter::ReplicaPiece> replica_pieces;
  size_t blob_offset = 0;
  size_t blob_capacity = 0;
};

PayloadPlan PlanPayload(const StateRegistry& registry, const SnapshotterOptions& options) {
  PayloadPlan plan;
  const size_t chunk = options.chunk_bytes;
  const PayloadLayout layout = LayoutOf(registry);  // what the Persister records in manifests
  for (size_t i = 0; i < registry.buffers().size(); ++i) {
    const size_t bytes = registry.buffers()[i].bytes;
    const size_t offset = layout.offsets[i];
    plan.buffer_offsets.push_back(offset);
    int64_t chunks = 0;
    for (size_t at = 0; at < bytes; ++chunks) {
      const size_t k = (offset + at) / chunk;
      const size_t piece = std::min(bytes - at, (k + 1) * chunk - (offset + at));
      if (plan.chunks.size() <= k) plan.chunks.resize(k + 1);
      plan.chunks[k].push_back(Piece{static_cast<int>(i), at, offset + at, piece});
      at += piece;
    }
    plan.buffer_chunks.push_back(chunks);
  }
  // Within a chunk, pieces in payload order: the replica digests are prefixes of the chunk.
  for (std::vector<Piece>& pieces : plan.chunks) {
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.payload_offset < b.payload_offset; });
  }
  plan.replicated_chunks = static_cast<int64_t>((layout.replicated_bytes + chunk - 1) / chunk);
  for (int64_t k = 0; k < plan.replicated_chunks; ++k) {
    plan.replica_piece_begin.push_back(plan.replica_pieces.size());
    if (static_cast<size_t>(k) >= plan.chunks.size()) continue;
    for (const Piece& piece : plan.chunks[k]) {
      if (!registry.buffers()[piece.buffer].replicated) continue;
      plan.replica_pieces.push_back(
          Snapshotter::ReplicaPiece{registry.buffers()[piece.buffer].name, k,
                                    static_cast<uint64_t>(piece.buffer_offset), piece.bytes});
    }
  }
  plan.replica_piece_begin.push_back(plan.replica_pieces.size());
  plan.blob_offset = layout.blob_offset;
  plan.blob_capacity = AlignUp(options.max_blob_bytes + sizeof(uint32_t), kArenaAlignment);
  plan.geometry = checkpoint_internal::GeometryFor(registry.LayoutHash(), chunk,
                                                   plan.blob_offset + plan.blob_capacity);
  return plan;
}

SnapshotInfo InfoOf(SlotHeader* slot) {
  const uint64_t* sums = ChunkChecksums(slot);
  return SnapshotInfo{slot->step, slot->generation, slot->layout_hash,
                      static_cast<size_t>(slot->payload_bytes),
                      SnapshotFingerprint(slot->step, slot->layout_hash, slot->payload_bytes,
                                          std::vector<uint64_t>(sums, sums + slot->num_chunks))};
}

}  // namespace

class Snapshotter::Impl {
 public:
  Impl(const StateRegistry* registry, const SnapshotterOptions& options, PayloadPlan plan,
       std::unique_ptr<SnapshotArena> arena, std::string replaced_reason)
      : registry_(registry),
        options_(options),
        plan_(std::move(plan)),
        arena_(std::move(arena)),
        replaced_reason_(std::move(replaced_reason)),
        replica_digests_{std::vector<uint64_t>(plan_.replica_pieces.size()),
                         std::vector<uint64_t>(plan_.replica_pieces.size())},
        buffer_remaining_(registry->buffers().size(), 0) {}

  ~Impl() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& worker : workers_) worker.join();
    // A snapshot cut short here stays kWriting: never restored, as after a crash.
  }

  // Finds the newest complete slot a previous process left, then starts the copy workers.
  absl::Status Start() {
#if defined(TRAINGUARD_HAVE_CUDA)
    std::vector<int> ordinals;
    for (const StateBuffer& buffer : registry_->buffers()) {
      if (buffer.device.kind == Device::Kind::kCuda &&
          std::find(ordinals.begin(), ordinals.end(), buffer.device.index) == ordinals.end()) {
        ordinals.push_back(buffer.device.index);
      }
    }
    if (!ordinals.empty()) {
      absl::StatusOr<std::unique_ptr<checkpoint_internal::DeviceCopier>> copier =
          checkpoint_internal::DeviceCopier::Create(arena_->payloads_begin(),
                                                    arena_->payloads_bytes(), ordinals);
      if (!copier.ok()) {
        return absl::Status(copier.status().code(),
                            absl::StrFormat("%s: %s", Where(), copier.status().message()));
      }
      device_copier_ = *std::move(copier);
    }
#endif
    MutexLock lock(&mu_);
    uint64_t newest = 0;
    for (int i = 0; i < 2; ++i) {
      SlotHeader* slot = arena_->slot(i);
      next_sequence_ = std::max(next_sequence_, slot->sequence + 1);
      if (LoadState(slot) == kSlotWriting) StoreState(slot, kSlotEmpty);  // a crash mid-copy
      if (LoadState(slot) != kSlotComplete || !SlotUsable(slot)) continue;
      if (latest_slot_ < 0 || slot->sequence > newest) {
        latest_slot_ = i;
        newest = slot->sequence;
      }
    }
    for (int i = 0; i < options_.copy_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
    return absl::OkStatus();
  }

  absl::Status Begin(int64_t step, std::optional<int64_t> keep) {
    MutexLock lock(&mu_);
    if (in_flight_) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: Begin(%d): the snapshot of step %d is still in flight (%d of %d chunks copied)",
          Where(), step, step_, chunks_done_, num_chunks_));
    }
    int w = latest_slot_ == 0 ? 1 : 0;
    if (keep.has_value() && latest_slot_ >= 0) {
      SlotHeader* older = arena_->slot(w);
      if (LoadState(older) == kSlotComplete && SlotUsable(older) && older->step == *keep &&
          arena_->slot(latest_slot_)->step != *keep) {
        // The older slot is the latest complete one while the newer is written.
        w = latest_slot_;
        latest_slot_ = 1 - w;
      }
    }
    SlotHeader* slot = arena_->slot(w);
    // Mark the slot unfinished before touching a byte of it: a crash from here on leaves it
    // kWriting, and the other slot (the latest complete one) is never written.
    StoreState(slot, kSlotWriting);
    verified_on_install_[w] = false;
    replica_digests_valid_[w] = false;
    const std::string blobs = SerializeBlobArea(registry_->blobs());
    if (blobs.size() > plan_.blob_capacity) {
      StoreState(slot, kSlotEmpty);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: Begin(%d): the blobs need %d bytes, the arena reserves %d (max_blob_bytes)", Where(),
          step, blobs.size(), plan_.blob_capacity));
    }
    std::memcpy(arena_->payload(w) + plan_.blob_offset, blobs.data(), blobs.size());
    const uint64_t payload_bytes = plan_.blob_offset + blobs.size();
    std::memcpy(slot->magic, kSlotMagic, sizeof(kSlotMagic));
    slot->format_version = kArenaFormatVersion;
    slot->step = step;
    slot->generation = options_.generation;
    slot->layout_hash = plan_.geometry.layout_hash;
    slot->payload_bytes = payload_bytes;
    slot->chunk_bytes = options_.chunk_bytes;
    slot->num_chunks = (payload_bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
    slot->sequence = next_sequence_++;

    writing_slot_ = w;
    step_ = step;
    in_flight_ = true;
    snapshot_status_ = absl::OkStatus();
    num_chunks_ = static_cast<int64_t>(slot->num_chunks);
    next_chunk_ = 0;
    chunks_done_ = 0;
    for (size_t i = 0; i < buffer_remaining_.size(); ++i) {
      buffer_remaining_[i] = plan_.buffer_chunks[i];
    }
    return absl::OkStatus();
  }

  absl::Status FenceBuffer(const std::string& name, absl::Duration timeout) {
    int index = -1;
    for (size_t i = 0; i < registry_->buffers().size(); ++i) {
      if (registry_->buffers()[i].name == name) index = static_cast<int>(i);
    }
    if (index < 0) {
      return absl::NotFoundError(
          absl::StrFormat("%s: FenceBuffer: no buffer \"%s\" is registered", Where(), name));
    }
    MutexLock lock(&mu_);
    const bool done = mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !in_flight_ || buffer_remaining_[index] == 0 || !snapshot_status_.ok();
        },
        timeout);
    if (!done) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s: the copy of buffer \"%s\" for step %d is not done after %s", Where(),
                          name, step_, absl::FormatDuration(timeout)));
    }
    return snapshot_status_;
  }

  absl::Status Fence(absl::Duration timeout) {
    MutexLock lock(&mu_);
    const bool done =
        mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !in_flight_; }, timeout);
    if (!done) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: the snapshot of step %d is not done after %s (%d of %d chunks copied)", Where(),
          step_, absl::FormatDuration(timeout), chunks_done_, num_chunks_));
    }
    return snapshot_status_;
  }

  std::optional<SnapshotInfo> LatestComplete() {
    MutexLock lock(&mu_);
    if (latest_slot_ < 0) return std::nullopt;
    return InfoOf(arena_->slot(latest_slot_));
  }

  absl::StatusOr<SnapshotInfo> RestoreLatest(StateRegistry* registry) {
    MutexLock lock(&mu_);
    if (in_flight_) return InFlightError("restore");
    if (latest_slot_ < 0) return NoSnapshotError("RestoreLatest");
    return RestoreSlot(registry, latest_slot_);
  }

  std::vector<SnapshotInfo> CompleteSnapshots() {
    MutexLock lock(&mu_);
    std::vector<SnapshotInfo> out;
    if (latest_slot_ < 0) return out;
    out.push_back(InfoOf(arena_->slot(latest_slot_)));
    SlotHeader* other = arena_->slot(1 - latest_slot_);
    if (!(in_flight_ && writing_slot_ == 1 - latest_slot_) && LoadState(other) == kSlotComplete &&
        SlotUsable(other)) {
      out.push_back(InfoOf(other));
    }
    return out;
  }

  absl::StatusOr<SnapshotInfo> RestoreStep(StateRegistry* registry, int64_t step) {
    MutexLock lock(&mu_);
    if (in_flight_) return InFlightError("restore");
    for (int i : {latest_slot_, 1 - latest_slot_}) {
      if (latest_slot_ < 0) break;
      SlotHeader* slot = arena_->slot(i);
      if (LoadState(slot) == kSlotComplete && SlotUsable(slot) && slot->step == step) {
        return RestoreSlot(registry, i);
      }
    }
    return absl::NotFoundError(
        absl::StrFormat("%s: no complete snapshot of step %d in the arena", Where(), step));
  }

  // `restore_into`: the registry InstallAndRestoreWith restores as the chunks land (nullptr: an
  // install only, `fill` gets no sink).
  absl::StatusOr<SnapshotInfo> Install(
      int64_t step, int64_t generation, uint64_t payload_bytes,
      const std::vector<uint64_t>& checksums, std::optional<uint64_t> fingerprint,
      absl::FunctionRef<absl::Status(char* dst, ChunkSink* sink)> fill,
      StateRegistry* restore_into = nullptr) {
    MutexLock lock(&mu_);
    if (in_flight_) return InFlightError("install");
    if (restore_into != nullptr && restore_into->LayoutHash() != plan_.geometry.layout_hash) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: cannot install and restore step %d: the registry to restore into has layout hash "
          "%016x, this arena %016x (other buffers, sizes, dtypes, shapes or devices)",
          Where(), step, restore_into->LayoutHash(), plan_.geometry.layout_hash));
    }
    const uint64_t chunk = options_.chunk_bytes;
    const uint64_t num_chunks = (payload_bytes + chunk - 1) / chunk;
    if (payload_bytes < plan_.blob_offset || payload_bytes > plan_.geometry.payload_capacity ||
        checksums.size() != num_chunks) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: cannot install step %d: %d payload bytes in %d chunks do not fit this registry's "
          "layout (buffers take %d bytes, capacity %d, chunk %d bytes)",
          Where(), step, payload_bytes, checksums.size(), plan_.blob_offset,
          plan_.geometry.payload_capacity, chunk));
    }
    if (fingerprint.has_value()) {
      // The snapshot this arena would record (its own layout hash, the table as given) must be
      // the one asked for: checked before a byte is written, so that a backup of another layout
      // never costs a transfer, and again at the end on what the slot records.
      const uint64_t installing =
          SnapshotFingerprint(step, plan_.geometry.layout_hash, payload_bytes, checksums);
      if (installing != *fingerprint) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "%s: cannot install step %d: with this registry's layout (hash %016x) its fingerprint "
            "is %016x, not the expected %016x (a snapshot of another layout?)",
            Where(), step, plan_.geometry.layout_hash, installing, *fingerprint));
      }
    }
    const int w = InstallSlot();
    SlotHeader* slot = arena_->slot(w);
    StoreState(slot, kSlotWriting);
    verified_on_install_[w] = false;
    replica_digests_valid_[w] = false;  // only a snapshot copied here has them
    std::optional<Landing> landing;
    if (restore_into != nullptr) landing.emplace(this, restore_into, arena_->payload(w));
    if (absl::Status filled = fill(arena_->payload(w), landing ? &*landing : nullptr);
        !filled.ok()) {
      AbandonInstall(w);
      return absl::Status(filled.code(), absl::StrFormat("%s: installing step %d: %s", Where(),
                                                         step, filled.message()));
    }
    std::copy(checksums.begin(), checksums.end(), ChunkChecksums(slot));
    std::memcpy(slot->magic, kSlotMagic, sizeof(kSlotMagic));
    slot->format_version = kArenaFormatVersion;
    slot->step = step;
    slot->generation = generation;
    slot->layout_hash = plan_.geometry.layout_hash;
    slot->payload_bytes = payload_bytes;
    slot->chunk_bytes = chunk;
    slot->num_chunks = num_chunks;
    slot->sequence = next_sequence_++;
    const SnapshotInfo info = InfoOf(slot);
    if (fingerprint.has_value() && info.fingerprint != *fingerprint) {
      // What the slot records (header and checksum table) is not what was checked: never
      // restorable.
      AbandonInstall(w);
      return absl::DataLossError(absl::StrFormat(
          "%s: installing step %d: the slot records fingerprint %016x, expected %016x", Where(),
          step, info.fingerprint, *fingerprint));
    }
    StoreState(slot, kSlotComplete);
    latest_slot_ = w;
    // `fill` checked every chunk as it wrote it: the restore that follows need not hash it again.
    verified_on_install_[w] = true;
    if (!landing.has_value()) return info;
    // The chunks `fill` did not tell, then the blobs: the restore that follows is done.
    if (absl::Status copied = landing->Finish(); !copied.ok()) return copied;
    if (absl::Status set = RestoreBlobs(restore_into, slot, arena_->payload(w)); !set.ok()) {
      return set;
    }
    verified_on_install_[w] = false;  // restored: a later restore checks it again
    return info;
  }

  void set_install_keep(std::vector<int64_t> steps) {
    MutexLock lock(&mu_);
    install_keep_ = std::move(steps);
  }

  uint64_t chunk_bytes() const { return options_.chunk_bytes; }
  const std::vector<ReplicaPiece>& replica_pieces() const { return plan_.replica_pieces; }
  int64_t replicated_chunks() const { return plan_.replicated_chunks; }

  absl::StatusOr<View> LatestView() {
    MutexLock lock(&mu_);
    if (latest_slot_ < 0) return NoSnapshotError("LatestView");
    return ViewOfSlot(latest_slot_);
  }

  absl::StatusOr<View> ViewOf(int64_t step) {
    MutexLock lock(&mu_);
    for (int i : {latest_slot_, 1 - latest_slot_}) {
      if (latest_slot_ < 0) break;
      if (in_flight_ && writing_slot_ == i) continue;
      SlotHeader* slot = arena_->slot(i);
      if (LoadState(slot) == kSlotComplete && SlotUsable(slot) && slot->step == step) {
        return ViewOfSlot(i);
      }
    }
    return absl::NotFoundError(absl::StrFormat(
        "%s: ViewOf(%d): no complete snapshot of step %d in the arena", Where(), step, step));
  }

  size_t payload_capacity() const { return plan_.geometry.payload_capacity; }
  size_t arena_bytes() const { return plan_.geometry.segment_bytes(); }

 private:
  // The slot Install writes: the older one, unless it holds a step of install_keep_ that the
  // newer one does not hold, or holds an earlier-listed one (more wanted) than the newer's.
  int InstallSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int older = latest_slot_ == 0 ? 1 : 0;
    if (latest_slot_ < 0 || install_keep_.empty()) return older;
    // How much slot i is wanted: its step's place in install_keep_ (lower: more wanted), or
    // past the end when its snapshot is not wanted or not complete.
    auto wanted = [&](int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      SlotHeader* slot = arena_->slot(i);
      if (LoadState(slot) != kSlotComplete || !SlotUsable(slot)) return install_keep_.size() + 1;
      return static_cast<size_t>(
          std::find(install_keep_.begin(), install_keep_.end(), slot->step) -
          install_keep_.begin());
    };
    return wanted(latest_slot_) > wanted(older) ? latest_slot_ : older;
  }

  // Empties slot `w` after a failed install: never restorable.
  void AbandonInstall(int w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StoreState(arena_->slot(w), kSlotEmpty);
    if (w == latest_slot_) {  // set_install_keep chose the newer slot: the older is the latest
      SlotHeader* other = arena_->slot(1 - w);
      latest_slot_ = LoadState(other) == kSlotComplete && SlotUsable(other) ? 1 - w : -1;
    }
  }

  View ViewOfSlot(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SlotHeader* slot = arena_->slot(index);
    View view;
    view.info = InfoOf(slot);
    view.payload = std::string_view(arena_->payload(index), slot->payload_bytes);
    view.chunk_checksums.assign(ChunkChecksums(slot), ChunkChecksums(slot) + slot->num_chunks);
    if (replica_digests_valid_[index]) view.replica_digests = replica_digests_[index];
    return view;
  }

  absl::Status InFlightError(const char* operation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: cannot %s while the snapshot of step %d is being copied; Fence() first", Where(),
        operation, step_));
  }

  // Verifies slot `index` and copies it into `registry`'s buffers and blobs.
  absl::StatusOr<SnapshotInfo> RestoreSlot(StateRegistry* registry, int index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SlotHeader* slot = arena_->slot(index);
    SnapshotInfo info = InfoOf(slot);
    if (registry->LayoutHash() != slot->layout_hash) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: the snapshot of step %d has layout hash %016x, the registry to restore into has "
          "%016x (other buffers, sizes, dtypes, shapes or devices): refusing to restore",
          Where(), info.step, slot->layout_hash, registry->LayoutHash()));
    }
    const char* payload = arena_->payload(index);
    // Everything is checked before the first byte is copied back: on corruption the trainer's
    // buffers are left exactly as they were. A slot that Install checked chunk by chunk as it
    // wrote it, in this process, is not hashed again by the first restore after (the restore of a
    // fetched backup reads it at once); any later restore of it checks every chunk again.
    const bool verified_on_install = verified_on_install_[index];
    verified_on_install_[index] = false;
    absl::StatusOr<std::vector<char>> held =
        CheckChunks(*registry, slot, payload, /*verify=*/!verified_on_install);
    if (!held.ok()) return held.status();
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> blobs = BlobsOf(slot, payload);
    if (!blobs.ok()) return blobs.status();
    for (size_t i = 0; i < registry->buffers().size(); ++i) {
      const StateBuffer& buffer = registry->buffers()[i];
      if (buffer.device.kind != Device::Kind::kCuda) continue;
      if (absl::Status copied = CopyToDevice(buffer, payload + plan_.buffer_offsets[i]);
          !copied.ok()) {
        return copied;
      }
    }
    const uint64_t chunks = std::min<uint64_t>(plan_.chunks.size(), slot->num_chunks);
    ForChunkRanges(chunks, [&](uint64_t, uint64_t begin, uint64_t end) {
      for (uint64_t k = begin; k < end; ++k) {
        if ((*held)[k]) continue;
        for (const Piece& piece : plan_.chunks[k]) {
          if (registry->buffers()[piece.buffer].device.kind != Device::Kind::kHost) continue;
          CopyPieceBack(*registry, piece, payload);
        }
      }
    });
    info.restored_bytes_held = 0;
    for (uint64_t k = 0; k < chunks; ++k) {
      if ((*held)[k]) info.restored_bytes_held += plan_.chunks[k][0].bytes;
    }
    if (absl::Status set = SetBlobs(registry, *std::move(blobs)); !set.ok()) return set;
    return info;
  }

  // Copies `piece` from the slot payload at `payload` into its (host) buffer of `registry`.
  static void CopyPieceBack(const StateRegistry& registry, const Piece& piece,
                            const char* payload) {
    std::memcpy(static_cast<char*>(registry.buffers()[piece.buffer].data) + piece.buffer_offset,
                payload + piece.payload_offset, piece.bytes);
  }

  // Sets `registry`'s blobs to `blobs`.
  static absl::Status SetBlobs(StateRegistry* registry,
                               std::vector<std::pair<std::string, std::string>> blobs) {
    for (auto& [name, value] : blobs) {
      if (absl::Status set = registry->SetBlob(name, std::move(value)); !set.ok()) return set;
    }
    return absl::OkStatus();
  }

  // The blobs of `slot`, whose payload is at `payload`.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> BlobsOf(
      const SlotHeader* slot, const char* payload) const {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> blobs = ParseBlobArea(
        std::string_view(payload + plan_.blob_offset, slot->payload_bytes - plan_.blob_offset));
    if (!blobs.ok()) {
      return absl::DataLossError(absl::StrFormat("%s: snapshot of step %d: %s", Where(), slot->step,
                                                 blobs.status().message()));
    }
    return blobs;
  }

  // Sets `registry`'s blobs to those of `slot`.
  absl::Status RestoreBlobs(StateRegistry* registry, const SlotHeader* slot,
                            const char* payload) const {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> blobs = BlobsOf(slot, payload);
    if (!blobs.ok()) return blobs.status();
    return SetBlobs(registry, *std::move(blobs));
  }

  // The sink of InstallAndRestoreWith: copies each chunk that lands into the registry's host
  // buffers at once, and each CUDA buffer once its last chunk landed. Touches only what does not
  // change while the arena's lock is held by the install (the plan, the slot being filled, the
  // registry's buffers, the device copier), so the fill's threads call it without that lock.
  class Landing final : public ChunkSink {
   public:
    Landing(Impl* impl, StateRegistry* registry, char* payload)
        : impl_(impl),
          registry_(registry),
          payload_(payload),
          landed_(impl->plan_.chunks.size()),
          device_chunks_left_(registry->buffers().size()) {
      for (size_t b = 0; b < registry->buffers().size(); ++b) {
        device_chunks_left_[b].store(impl->plan_.buffer_chunks[b]);
      }
    }

    void Landed(uint64_t k) override {
      // Chunks past the buffers' last one hold only the blob area (restored at the end).
      if (k >= landed_.size() || landed_[k].exchange(true)) return;
      for (const Piece& piece : impl_->plan_.chunks[k]) {
        const StateBuffer& buffer = registry_->buffers()[piece.buffer];
        if (buffer.device.kind == Device::Kind::kHost) {
          CopyPieceBack(*registry_, piece, payload_);
        } else if (device_chunks_left_[piece.buffer].fetch_sub(1) == 1) {
          absl::Status copied =
              impl_->CopyToDevice(buffer, payload_ + impl_->plan_.buffer_offsets[piece.buffer]);
          if (!copied.ok()) {
            MutexLock lock(&mu_);
            if (error_.ok()) error_ = std::move(copied);
          }
        }
      }
    }

    // Copies the chunks not told, on this thread; the first error of a device copy.
    absl::Status Finish() {
      for (uint64_t k = 0; k < landed_.size(); ++k) Landed(k);
      MutexLock lock(&mu_);
      return error_;
    }

   private:
    Impl* const impl_;
    StateRegistry* const registry_;
    char* const payload_;
    std::vector<std::atomic<bool>> landed_;                 // of each chunk of the buffer region
    std::vector<std::atomic<int64_t>> device_chunks_left_;  // of each buffer (CUDA ones count)
    Mutex mu_;
    absl::Status error_ ABSL_GUARDED_BY(mu_);
  };

  std::string Where() const {
    return absl::StrFormat("snapshotter (rank %d, arena %s)", options_.rank, arena_->name());
  }

  absl::Status NoSnapshotError(const char* operation) const {
    std::string why = "no complete snapshot in the arena";
    if (!replaced_reason_.empty()) {
      why += absl::StrFormat(" (the arena a previous process left was replaced: %s)",
                             replaced_reason_);
    }
    return absl::NotFoundError(absl::StrFormat("%s: %s: %s", Where(), operation, why));
  }

  // A complete slot left by a previous process is trusted only when its header is consistent.
  bool SlotUsable(const SlotHeader* slot) const {
    const ArenaGeometry& g = plan_.geometry;
    return std::memcmp(slot->magic, kSlotMagic, sizeof(kSlotMagic)) == 0 &&
           slot->format_version == kArenaFormatVersion && slot->layout_hash == g.layout_hash &&
           slot->chunk_bytes == g.chunk_bytes && slot->payload_bytes >= plan_.blob_offset &&
           slot->payload_bytes <= g.payload_capacity &&
           slot->num_chunks == (slot->payload_bytes + g.chunk_bytes - 1) / g.chunk_bytes;
  }

  // How many ranges ForChunkRanges splits `chunks` chunks into: one a thread, up to copy_threads,
  // each of at least kMinChunksPerVerifyThread chunks.
  uint64_t ChunkRanges(uint64_t chunks) const {
    return std::clamp<uint64_t>(chunks / kMinChunksPerVerifyThread, 1,
                                static_cast<uint64_t>(options_.copy_threads));
  }

  // Runs fn(range, begin, end) over the ChunkRanges(chunks) contiguous ranges that split
  // [0, chunks), each on its own thread (this one included); returns when every range is done.
  // The checksums bound a restore (about 8 GB/s a thread, where a copy to a GPU runs at 50), and
  // a copy back on one thread was most of a survivor's rollback.
  void ForChunkRanges(uint64_t chunks,
                      absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn) const {
    const uint64_t threads = ChunkRanges(chunks);
    auto range = [&](uint64_t t) { fn(t, chunks * t / threads, chunks * (t + 1) / threads); };
    std::vector<std::thread> helpers;
    uint64_t t = 1;
    for (; t < threads; ++t) {
      try {
        helpers.emplace_back(range, t);
      } catch (const std::system_error&) {
        break;  // no thread to be had: this one does the rest
      }
    }
    for (uint64_t rest = t; rest < threads; ++rest) range(rest);
    range(0);
    for (std::thread& helper : helpers) helper.join();
  }

  // The live bytes of chunk `k` (`bytes` long) in `registry`'s buffers when the whole chunk is one
  // host buffer's (no padding, no blob area, no device memory); nullptr otherwise.
  const char* LiveChunk(const StateRegistry& registry, uint64_t k, uint64_t bytes) const {
    if (k >= plan_.chunks.size() || plan_.chunks[k].size() != 1) return nullptr;
    const Piece& piece = plan_.chunks[k][0];
    const StateBuffer& buffer = registry.buffers()[piece.buffer];
    if (buffer.device.kind != Device::Kind::kHost || piece.bytes != bytes ||
        piece.payload_offset != k * options_.chunk_bytes) {
      return nullptr;
    }
    return static_cast<const char*>(buffer.data) + piece.buffer_offset;
  }

  // Before a restore of `slot` into `registry`, with `verify`: which chunks the live buffers
  // already hold (1: their bytes hash to the snapshot's checksum of the chunk, so the restore
  // leaves them as they are and need not read, or verify, the arena's copy), and that every other
  // chunk of the arena has its checksum (DataLoss naming the lowest corrupt one otherwise).
  // A survivor that rolls back to the snapshot it took before the fault finds most of a buffer
  // that training does not rewrite at every step (frozen weights, a sparsely updated embedding)
  // unchanged: one hash of its live bytes where the arena's would be hashed, and no copy. Without
  // `verify` (a slot checked as it was installed) nothing is compared: a copy costs no more than
  // the hash that could spare it. The comparison pays for itself: along a buffer, a thread stops
  // comparing once the chunks that differed outnumber those that matched by two (state rewritten
  // at every step costs two chunk hashes per buffer, not a pass).
  absl::StatusOr<std::vector<char>> CheckChunks(const StateRegistry& registry, SlotHeader* slot,
                                                const char* payload, bool verify) const {
    const uint64_t chunk = slot->chunk_bytes;
    const uint64_t* expected = ChunkChecksums(slot);
    const uint64_t chunks = slot->num_chunks;
    auto bytes_of = [&](uint64_t k) { return std::min(chunk, slot->payload_bytes - k * chunk); };
    auto checksum = [&](uint64_t k) { return XXH3_64bits(payload + k * chunk, bytes_of(k)); };
    std::vector<char> held(chunks, 0);
    // Each range stops verifying at its first corrupt chunk; the lowest of those is reported,
    // whichever range finished first. Ranges touch disjoint elements of `held` and `first_corrupt`.
    std::vector<uint64_t> first_corrupt(ChunkRanges(chunks), chunks);
    ForChunkRanges(chunks, [&](uint64_t r, uint64_t begin, uint64_t end) {
      int buffer = -1;
      int64_t matched = 0, differed = 0;
      for (uint64_t k = begin; k < end; ++k) {
        const char* live = verify ? LiveChunk(registry, k, bytes_of(k)) : nullptr;
        if (live != nullptr) {
          const int b = plan_.chunks[k][0].buffer;
          if (b != buffer) {
            buffer = b;
            matched = 0;
            differed = 0;
          }
          if (differed <= matched + 1) {
            held[k] = XXH3_64bits(live, bytes_of(k)) == expected[k];
            ++(held[k] ? matched : differed);
          }
        }
        if (!held[k] && verify && checksum(k) != expected[k]) {
          first_corrupt[r] = k;
          return;
        }
      }
    });
    const uint64_t k = *std::min_element(first_corrupt.begin(), first_corrupt.end());
    if (k == chunks) return held;
    return absl::DataLossError(absl::StrFormat(
        "%s: the snapshot of step %d (rank %d, generation %d) is corrupt: chunk %d (payload "
        "offset %d, %d bytes) has checksum %016x, expected %016x; it holds %s",
        Where(), slot->step, options_.rank, slot->generation, k, k * chunk, bytes_of(k),
        checksum(k), expected[k], DescribeChunk(k)));
  }

  // Which buffers (and which bytes of them) chunk `k` holds, for error messages.
  std::string DescribeChunk(uint64_t k) const {
    std::string out;
    if (k < plan_.chunks.size()) {
      for (const Piece& piece : plan_.chunks[k]) {
        if (!out.empty()) out += ", ";
        out += absl::StrFormat("buffer \"%s\" offset %d (%d bytes)",
                               registry_->buffers()[piece.buffer].name, piece.buffer_offset,
                               piece.bytes);
      }
    }
    const uint64_t chunk = options_.chunk_bytes;
    if ((k + 1) * chunk > plan_.blob_offset) {
      if (!out.empty()) out += ", ";
      out += "the blob area";
    }
    return out.empty() ? "padding only" : out;
  }

  absl::Status CopyToDevice(const StateBuffer& buffer, const char* src) {
#if defined(TRAINGUARD_HAVE_CUDA)
    // One copy per buffer: chunk-sized copies, each waited for, made a restore of 1 GiB take
    // 53 ms instead of 35 ms on an H100 (docs/PERFORMANCE.md).
    if (buffer.bytes == 0) return absl::OkStatus();
    absl::Status copied = device_copier_->CopyToDevice(buffer.device.index, buffer.data, src,
                                                       buffer.bytes, kDeviceCopyTimeout);
    if (!copied.ok()) {
      return absl::Status(copied.code(), absl::StrFormat("%s: restoring buffer \"%s\": %s", Where(),
                                                         buffer.name, copied.message()));
    }
    return absl::OkStatus();
#else
    (void)src;
    return absl::UnimplementedError(absl::StrFormat(
        "%s: buffer \"%s\" is on a CUDA device; built without CUDA", Where(), buffer.name));
#endif
  }

  absl::Status CopyPiece(const Piece& piece, char* payload, int64_t step) {
    const StateBuffer& buffer = registry_->buffers()[piece.buffer];
    char* dst = payload + piece.payload_offset;
    const char* src = static_cast<const char*>(buffer.data) + piece.buffer_offset;
    if (buffer.device.kind == Device::Kind::kHost) {
      std::memcpy(dst, src, piece.bytes);
      return absl::OkStatus();
    }
#if defined(TRAINGUARD_HAVE_CUDA)
    absl::Status copied =
        device_copier_->CopyToHost(buffer.device.index, dst, src, piece.bytes, kDeviceCopyTimeout);
    if (copied.ok()) return copied;
    return absl::Status(
        copied.code(),
        absl::StrFormat("%s: copying buffer \"%s\" at offset %d for step %d: %s", Where(),
                        buffer.name, piece.buffer_offset, step, copied.message()));
#else
    (void)step;
    return absl::UnimplementedError(absl::StrFormat(
        "%s: buffer \"%s\" is on a CUDA device; built without CUDA", Where(), buffer.name));
#endif
  }

  void WorkerLoop() {
    while (true) {
      int64_t k = 0;
      int slot_index = 0;
      int64_t step = 0;
      bool skip = false;
      {
        MutexLock lock(&mu_);
        while (!stop_ && next_chunk_ >= num_chunks_) {
          mu_.AwaitWithTimeout(
              [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || next_chunk_ < num_chunks_; },
              kWorkerIdlePoll);
        }
        if (stop_) return;
        k = next_chunk_++;
        slot_index = writing_slot_;
        step = step_;
        skip = !snapshot_status_.ok();  // a failed snapshot: drain its chunks without copying
      }
      absl::Status status;
      if (!skip) status = CopyChunk(k, slot_index, step);
      ChunkDone(k, slot_index, std::move(status));
    }
  }

  // Copies the buffer pieces of chunk `k` into slot `slot_index` and checksums the whole chunk; a
  // chunk of the replicated region also records its replica digests.
  absl::Status CopyChunk(int64_t k, int slot_index, int64_t step) {
    // The slot's header fields and the blob area were written by Begin() under mu_, before this
    // chunk was handed out; nothing writes them again until the snapshot is done.
    char* payload = arena_->payload(slot_index);
    SlotHeader* slot = arena_->slot(slot_index);
    if (static_cast<size_t>(k) < plan_.chunks.size()) {
      for (const Piece& piece : plan_.chunks[k]) {
        if (absl::Status copied = CopyPiece(piece, payload, step); !copied.ok()) return copied;
      }
    }
    const uint64_t begin = static_cast<uint64_t>(k) * options_.chunk_bytes;
    const uint64_t bytes = std::min<uint64_t>(options_.chunk_bytes, slot->payload_bytes - begin);
    ChunkChecksums(slot)[k] = k < plan_.replicated_chunks
                                  ? ReplicatedChunkChecksum(k, payload, begin, bytes, slot_index)
                                  : XXH3_64bits(payload + begin, bytes);
    return absl::OkStatus();
  }

  // The checksum of replicated chunk `k` (the same XXH3-64 as any chunk's: streamed, one pass),
  // taking the digest of the chunk's bytes up to the end of each piece on the way: the replica
  // digests (Snapshotter::ReplicaPiece), which name the first piece where two replicas' chunks
  // differ. The padding between pieces is zeroed first, so that replicas agree on it whatever
  // the arena held before. Each chunk writes its own digests; ChunkDone publishes them under mu_.
  uint64_t ReplicatedChunkChecksum(int64_t k, char* payload, uint64_t begin, uint64_t bytes,
                                   int slot_index) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    uint64_t* digests = replica_digests_[slot_index].data() + plan_.replica_piece_begin[k];
    uint64_t at = begin;
    if (static_cast<size_t>(k) < plan_.chunks.size()) {
      for (const Piece& piece : plan_.chunks[k]) {
        // The padding before a buffer (its predecessor's alignment), never another's bytes.
        std::memset(payload + at, 0, piece.payload_offset - at);
        const uint64_t end = piece.payload_offset + piece.bytes;
        XXH3_64bits_update(state, payload + at, end - at);
        at = end;
        // The last chunk of the region may hold other buffers after the replicated ones.
        if (registry_->buffers()[piece.buffer].replicated) *digests++ = XXH3_64bits_digest(state);
      }
    }
    // The rest as it is: the padding after the last buffer, the blob area Begin wrote.
    XXH3_64bits_update(state, payload + at, begin + bytes - at);
    const uint64_t checksum = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return checksum;
  }

  void ChunkDone(int64_t k, int slot_index, absl::Status status) {
    MutexLock lock(&mu_);
    if (!status.ok() && snapshot_status_.ok()) snapshot_status_ = std::move(status);
    if (static_cast<size_t>(k) < plan_.chunks.size()) {
      int last = -1;
      for (const Piece& piece : plan_.chunks[k]) {
        if (piece.buffer != last) --buffer_remaining_[piece.buffer];
        last = piece.buffer;
      }
    }
    if (++chunks_done_ < num_chunks_) return;
    SlotHeader* slot = arena_->slot(slot_index);
    if (snapshot_status_.ok()) {
      // Release: every payload byte and checksum of the slot is visible before "complete" is.
      StoreState(slot, kSlotComplete);
      latest_slot_ = slot_index;
      replica_digests_valid_[slot_index] = !plan_.replica_pieces.empty();
    } else {
      StoreState(slot, kSlotEmpty);
    }
    in_flight_ = false;
  }

  const StateRegistry* const registry_;
  const SnapshotterOptions options_;
  const PayloadPlan plan_;
  const std::unique_ptr<SnapshotArena> arena_;
  const std::string replaced_reason_;
#if defined(TRAINGUARD_HAVE_CUDA)
  // Declared after arena_: destroyed first, so the stream is drained before the arena is unmapped.
  std::unique_ptr<checkpoint_internal::DeviceCopier> device_copier_;
#endif

  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int latest_slot_ ABSL_GUARDED_BY(mu_) = -1;  // the newest complete slot, -1 if none
  std::vector<int64_t> install_keep_ ABSL_GUARDED_BY(mu_);  // set_install_keep
  // Per slot: filled by Install, every chunk checked as it landed, and not restored since.
  bool verified_on_install_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  // Per slot: the replica digests of the snapshot copied into it (written by the copy workers,
  // chunk by chunk, read once the snapshot is complete), and whether they are its own (false once
  // the slot is written again or installed).
  std::vector<uint64_t> replica_digests_[2];
  bool replica_digests_valid_[2] ABSL_GUARDED_BY(mu_) = {false, false};
  int writing_slot_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;  // of the snapshot in flight (or the last one)
  absl::Status snapshot_status_ ABSL_GUARDED_BY(mu_);
  int64_t num_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t chunks_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> buffer_remaining_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

absl::StatusOr<std::unique_ptr<Snapshotter>> Snapshotter::Create(
    const StateRegistry* registry, const SnapshotterOptions& options) {
  const std::string where =
      absl::StrFormat("snapshotter (job %s, rank %d)", options.job_id, options.rank);
  if (absl::Status s = ValidateJobId(options.job_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", where, s.message()));
  }
  if (options.rank < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: negative rank", where));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % kArenaAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: chunk_bytes %d is not a positive multiple of %d", where,
                        options.chunk_bytes, kArenaAlignment));
  }
  if (options.copy_threads < 1 || options.copy_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: copy_threads %d is not in [1, 256]", where, options.copy_threads));
  }
#if !defined(TRAINGUARD_HAVE_CUDA)
  for (const StateBuffer& buffer : registry->buffers()) {
    if (buffer.device.kind == Device::Kind::kCuda) {
      return absl::UnimplementedError(absl::StrFormat(
          "%s: buffer \"%s\" is on CUDA device %d, but this trainguard was built without CUDA",
          where, buffer.name, buffer.device.index));
    }
  }
#endif
  PayloadPlan plan = PlanPayload(*registry, options);
  std::string replaced_reason;
  std::string this_layout;  // for the message when an arena of another layout is kept
  if (options.keep_arena_of_other_layout) {
    std::vector<std::string> names;
    for (const StateBuffer& b : registry->buffers()) {
      if (names.size() == 3) {
        names.push_back("...");
        break;
      }
      names.push_back(b.name);
    }
    this_layout = absl::StrFormat(
        "%d buffers, %d bytes: %s; another model under the same job id? Give the new run its own "
        "job id, or remove the old state (trainguard shm remove --job %s) to start over",
        registry->buffers().size(), registry->total_bytes(), absl::StrJoin(names, ", "),
        options.job_id);
  }
  absl::StatusOr<std::unique_ptr<SnapshotArena>> arena = SnapshotArena::OpenOrCreate(
      options.env != nullptr ? options.env : Env::Default(),
      ArenaName(options.job_id, options.rank), plan.geometry, &replaced_reason, this_layout,
      options.spare_arena, options.arena_lock_wait);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat(where, ": ", arena.status().message()));
  }
  if (!replaced_reason.empty()) {
    // Said once, loudly: the previous process's snapshot is gone and will not be restored.
    std::fprintf(stderr, "trainguard: %s: replaced the snapshot arena %s: %s\n", where.c_str(),
                 (*arena)->name().c_str(), replaced_reason.c_str());
  }
  auto impl = std::make_unique<Impl>(registry, options, std::move(plan), *std::move(arena),
                                     std::move(replaced_reason));
  if (absl::Status started = impl->Start(); !started.ok()) return started;
  return std::unique_ptr<Snapshotter>(new Snapshotter(std::move(impl)));
}

Snapshotter::Snapshotter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Snapshotter::~Snapshotter() = default;

absl::Status Snapshotter::Begin(int64_t step, std::optional<int64_t> keep) {
  return impl_->Begin(step, keep);
}
absl::Status Snapshotter::FenceBuffer(const std::string& name, absl::Duration timeout) {
  return impl_->FenceBuffer(name, timeout);
}
absl::Status Snapshotter::Fence(absl::Duration timeout) { return impl_->Fence(timeout); }
std::optional<SnapshotInfo> Snapshotter::LatestComplete() const { return impl_->LatestComplete(); }
std::vector<SnapshotInfo> Snapshotter::CompleteSnapshots() const {
  return impl_->CompleteSnapshots();
}
absl::StatusOr<SnapshotInfo> Snapshotter::RestoreStep(StateRegistry* registry, int64_t step) {
  return impl_->RestoreStep(registry, step);
}
absl::StatusOr<SnapshotInfo> Snapshotter::Install(int64_t step, int64_t generation,
                                                  std::string_view payload,
                                                  const std::vector<uint64_t>& chunk_checksums) {
  const uint64_t chunk = impl_->chunk_bytes();
  return impl_->Install(
      step, generation, payload.size(), chunk_checksums, std::nullopt,
      [&](char* dst, ChunkSink*) -> absl::Status {
        for (uint64_t k = 0, begin = 0; begin < payload.size(); ++k, begin += chunk) {
          const uint64_t bytes = std::min<uint64_t>(chunk, payload.size() - begin);
          std::memcpy(dst + begin, payload.data() + begin, bytes);
          const uint64_t actual = XXH3_64bits(dst + begin, bytes);
          if (actual != chunk_checksums[k]) {
            return absl::DataLossError(
                absl::StrFormat("chunk %d (payload offset %d) has checksum %016x, expected %016x",
                                k, begin, actual, chunk_checksums[k]));
          }
        }
        return absl::OkStatus();
      });
}

void Snapshotter::set_install_keep(std::vector<int64_t> steps) {
  impl_->set_install_keep(std::move(steps));
}

absl::StatusOr<SnapshotInfo> Snapshotter::InstallWith(
    int64_t step, int64_t generation, uint64_t payload_bytes,
    const std::vector<uint64_t>& chunk_checksums, uint64_t fingerprint,
    absl::FunctionRef<absl::Status(char* dst)> fill) {
  return impl_->Install(step, generation, payload_bytes, chunk_checksums, fingerprint,
                        [&](char* dst, ChunkSink*) { return fill(dst); });
}

absl::StatusOr<SnapshotInfo> Snapshotter::InstallAndRestoreWith(
    StateRegistry* registry, int64_t step, int64_t generation, uint64_t payload_bytes,
    const std::vector<uint64_t>& chunk_checksums, uint64_t fingerprint,
    absl::FunctionRef<absl::Status(char* dst, ChunkSink* sink)> fill) {
  return impl_->Install(step, generation, payload_bytes, chunk_checksums, fingerprint, fill,
                        registry);
}

uint64_t SnapshotFingerprint(int64_t step, uint64_t layout_hash, uint64_t payload_bytes,
                             const std::vector<uint64_t>& chunk_checksums) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const uint64_t header[3] = {static_cast<uint64_t>(step), layout_hash, payload_bytes};
  XXH3_64bits_update(state, header, sizeof(header));
  XXH3_64bits_update(state, chunk_checksums.data(), chunk_checksums.size() * sizeof(uint64_t));
  const uint64_t fingerprint = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fingerprint;
}
absl::StatusOr<SnapshotInfo> Snapshotter::RestoreLatest(StateRegistry* registry) {
  return impl_->RestoreLatest(registry);
}
absl::StatusOr<Snapshotter::View> Snapshotter::LatestView() const { return impl_->LatestView(); }
absl::StatusOr<Snapshotter::View> Snapshotter::ViewOf(int64_t step) const {
  return impl_->ViewOf(step);
}
size_t Snapshotter::payload_capacity() const { return impl_->payload_capacity(); }
const std::vector<Snapshotter::ReplicaPiece>& Snapshotter::replica_pieces() const {
  return impl_->replica_pieces();
}
int64_t Snapshotter::replicated_chunks() const { return impl_->replicated_chunks(); }
uint64_t Snapshotter::chunk_bytes() const { return impl_->chunk_bytes(); }
size_t Snapshotter::arena_bytes() const { return impl_->arena_bytes(); }

std::string Snapshotter::ArenaName(std::string_view job_id, int rank) {
  return absl::StrFormat("/trainguard.%s.rank%d", job_id, rank);
}

absl::Status Snapshotter::RemoveArena(std::string_view job_id, int rank, Env* env) {
  return SnapshotArena::Remove(env != nullptr ? env : Env::Default(), ArenaName(job_id, rank));
}

}  // namespace trainguard
