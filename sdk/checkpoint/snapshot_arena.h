// SnapshotArena: the named POSIX shared-memory segment behind a Snapshotter (private to
// sdk/checkpoint). It outlives the process that wrote it, so a restarted rank (or a standby on the
// same machine) can open it and restore without disk.
//
// Layout (all integers little-endian, offsets from the start of the segment; docs/FORMATS.md):
//     [0, 4096)                        ArenaHeader
//     slot 0 header, slot 1 header     SlotHeader + the chunk checksum table, each padded to 4096
//     slot 0 payload, slot 1 payload   `payload_capacity` bytes each, 4096-aligned
// A slot's `state` is written with release semantics and read with acquire: it becomes kComplete
// only after every payload byte and checksum of that slot is in place, so a process killed mid-copy
// leaves a slot in kWriting, which readers treat as empty, and the other slot keeps the last
// complete snapshot.
//
// Thread safety: an arena is mapped by one Snapshotter; the exclusive flock(2) it takes on the
// segment keeps a second live process (or a second Snapshotter) from writing it at the same time.
// Callers serialise header access themselves.
#ifndef TRAINGUARD_SDK_CHECKPOINT_SNAPSHOT_ARENA_H_
#define TRAINGUARD_SDK_CHECKPOINT_SNAPSHOT_ARENA_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/checkpoint/spare_arena.h"

namespace trainguard {
class Env;

namespace checkpoint_internal {

inline constexpr size_t kArenaAlignment = 4096;
inline constexpr uint32_t kArenaFormatVersion = 1;
inline constexpr char kArenaMagic[8] = {'T', 'G', 'A', 'R', 'E', 'N', 'A', '1'};
inline constexpr uint64_t kArenaMagicValue = [] {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(kArenaMagic[i]);
  return value;
}();
inline constexpr char kSlotMagic[8] = {'T', 'G', 'S', 'L', 'O', 'T', '0', '1'};

inline constexpr size_t AlignUp(size_t n, size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// What an arena must look like for a given registry and options; two arenas with equal geometry are
// interchangeable.
struct ArenaGeometry {
  uint64_t layout_hash = 0;
  uint64_t chunk_bytes = 0;
  uint64_t payload_capacity = 0;   // per slot: padded buffers plus the blob area
  uint64_t max_chunks = 0;         // checksum table entries per slot
  uint64_t slot_header_bytes = 0;  // SlotHeader plus the checksum table, padded

  uint64_t segment_bytes() const {
    return kArenaAlignment + 2 * (slot_header_bytes + payload_capacity);
  }
  bool operator==(const ArenaGeometry&) const = default;
};

struct ArenaHeader {
  uint64_t magic;  // the bytes of kArenaMagic; written last, with release semantics
  uint32_t format_version;
  uint32_t reserved;
  uint64_t layout_hash;
  uint64_t chunk_bytes;
  uint64_t payload_capacity;
  uint64_t max_chunks;
  uint64_t slot_header_bytes;
  uint64_t segment_bytes;
};

enum SlotState : uint32_t { kSlotEmpty = 0, kSlotWriting = 1, kSlotComplete = 2 };

struct SlotHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t state;  // SlotState; accessed only through LoadState/StoreState
  int64_t step;
  int64_t generation;
  uint64_t layout_hash;
  uint64_t payload_bytes;
  uint64_t chunk_bytes;
  uint64_t num_chunks;
  uint64_t sequence;  // the newer of two complete slots has the larger sequence
  // Followed by the chunk checksum table: num_chunks XXH3-64 values, one per chunk_bytes piece.
};
static_assert(sizeof(SlotHeader) == 72);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

// The geometry of an arena whose slots hold `payload_capacity` bytes checksummed in `chunk_bytes`
// pieces: what the Snapshotter computes for its registry, and what a backup holder computes from a
// push's header so that its arena has the same shape. REQUIRES: chunk_bytes > 0.
inline ArenaGeometry GeometryFor(uint64_t layout_hash, uint64_t chunk_bytes,
                                 uint64_t payload_capacity) {
  ArenaGeometry geometry;
  geometry.layout_hash = layout_hash;
  geometry.chunk_bytes = chunk_bytes;
  geometry.payload_capacity = payload_capacity;
  geometry.max_chunks = (payload_capacity + chunk_bytes - 1) / chunk_bytes;
  geometry.slot_header_bytes =
      AlignUp(sizeof(SlotHeader) + 8 * geometry.max_chunks, kArenaAlignment);
  return geometry;
}

inline uint64_t* ChunkChecksums(SlotHeader* slot) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(slot) + sizeof(SlotHeader));
}

inline uint32_t LoadState(SlotHeader* slot) {
  return std::atomic_ref<uint32_t>(slot->state).load(std::memory_order_acquire);
}
inline void StoreState(SlotHeader* slot, SlotState state) {
  std::atomic_ref<uint32_t>(slot->state).store(state, std::memory_order_release);
}

class SnapshotArena {
 public:
  // Opens the segment `name` when it exists with exactly `geometry`, else creates it (replacing one
  // with another geometry; `*replaced_reason` then says why). With `keep_other_layout` non-empty
  // (what the caller's layout is, for the message), a valid arena whose layout hash differs (state
  // of other buffers) is kept instead, and the call fails with FailedPrecondition naming both
  // layouts: replacing it would lose state that no registry of this layout can restore.
  // FailedPrecondition also when a live process holds it, at most `lock_wait` after the call
  // (polled every millisecond: a killed rank's process, or a child that inherited its descriptor,
  // may still be exiting when its replacement starts);
  // ResourceExhausted when /dev/shm cannot hold it. The segment is opened, created, sized and
  // removed through `env` (mapped here). Where it must be created and `spare` (a parked
  // standby's, spare_arena.h) has exactly its size, the spare is renamed to `name` and its mapping
  // kept instead.
  static absl::StatusOr<std::unique_ptr<SnapshotArena>> OpenOrCreate(
      Env* env, const std::string& name, const ArenaGeometry& geometry,
      std::string* replaced_reason, std::string_view keep_other_layout = {},
      SpareArena* spare = nullptr, absl::Duration lock_wait = absl::ZeroDuration());
  ~SnapshotArena();
  SnapshotArena(const SnapshotArena&) = delete;
  SnapshotArena& operator=(const SnapshotArena&) = delete;

  const std::string& name() const { return name_; }
  const ArenaGeometry& geometry() const { return geometry_; }
  bool reopened() const { return reopened_; }
  SlotHeader* slot(int i) const;
  char* payload(int i) const;
  // Both payloads, contiguous (for cudaHostRegister).
  char* payloads_begin() const { return payload(0); }
  size_t payloads_bytes() const { return 2 * geometry_.payload_capacity; }

  static absl::Status Remove(Env* env, const std::string& name);

 private:
  SnapshotArena(std::string name, ArenaGeometry geometry, int fd, char* base, bool reopened)
      : name_(std::move(name)), geometry_(geometry), fd_(fd), base_(base), reopened_(reopened) {}
  // Writes the headers of a new arena into `base` (zeroed memory of geometry.segment_bytes()).
  static std::unique_ptr<SnapshotArena> Initialise(std::string name, const ArenaGeometry& geometry,
                                                   int fd, char* base);
  // The spare renamed to `name`, or nullptr when it cannot be (another size, the rename failed).
  static std::unique_ptr<SnapshotArena> Adopt(Env* env, const std::string& name,
                                              const ArenaGeometry& geometry, SpareArena* spare);

  const std::string name_;
  const ArenaGeometry geometry_;
  const int fd_;
  char* const base_;
  const bool reopened_;
};

}  // namespace checkpoint_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_SNAPSHOT_ARENA_H_
