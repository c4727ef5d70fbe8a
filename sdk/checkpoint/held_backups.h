// The backups a host's shared memory holds: the backup arenas' names, their geometry and complete
// slots read without locking them (their holder may be another live process on this host), and
// the listing of a job's backup arenas in /dev/shm. A holder killed while receiving leaves its
// previous complete backup in such an arena, which the next BackupService on that host finds here.
// Functions of the arenas' bytes: thread-safe.
#ifndef TRAINGUARD_SDK_CHECKPOINT_HELD_BACKUPS_H_
#define TRAINGUARD_SDK_CHECKPOINT_HELD_BACKUPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/checkpoint/snapshot_arena.h"

namespace trainguard {

class Env;

// One backup a holder has, complete or not.
struct HeldBackup {
  int source_rank = -1;
  int64_t step = -1;
  uint64_t fingerprint = 0;
  uint64_t payload_bytes = 0;
};

namespace checkpoint_internal {

// "/trainguard.<job_id>.backup.rank<S>": the shared-memory name of `source_rank`'s backup arena.
std::string BackupArenaName(std::string_view job_id, int source_rank);

// The fingerprint of a slot, from its header and checksum table.
uint64_t SlotFingerprint(SlotHeader* slot);

// A complete slot is trusted only when its header fits the arena's geometry.
bool SlotUsable(const SlotHeader* slot, const ArenaGeometry& geometry);

// The geometry the arena `name` was created with; nullopt when there is no such segment.
// DataLoss when it is not a usable arena (its creator died while creating it).
absl::StatusOr<std::optional<ArenaGeometry>> ReadBackupGeometry(Env* env, const std::string& name);

// The complete, usable slots among `slots` (skipping slot `writing`; -1: none), newest first.
std::vector<HeldBackup> CompleteSlots(int source_rank, const ArenaGeometry& geometry,
                                      SlotHeader* slots[2], int writing);

// The complete backups in the arena `name`, read without locking it; empty when it has none or is
// not a usable arena.
std::vector<HeldBackup> PeekBackupArena(Env* env, const std::string& name, int source_rank);

// The POSIX shared memory segments of this host named `prefix` and a decimal number (at most 9
// digits): each one's name ("/<prefix><number>", as the Env takes it) and number.
std::vector<std::pair<std::string, int>> NumberedSharedMemory(std::string_view prefix);

// The source ranks whose backup arenas of `job_id` exist on this host.
std::vector<int> BackupArenasOnHost(std::string_view job_id);

}  // namespace checkpoint_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_HELD_BACKUPS_H_
