// The client side of peer backups: PushBackup (a source rank sends its snapshot to a holder) and
// FetchBackup / FetchBackupInto / FetchBackupFromHolders (a restorer takes it back, from one holder
// or from several at once), over any BackupTransport (TCP unless the request names another). Wire
// format: backup_wire.h. Every chunk is verified against the snapshot's checksum table as it lands,
// on the holder for a push and here for a fetch (end to end), so a corrupt copy is never installed
// or returned as OK.
//
// Thread safety: blocking calls, safe from any thread. Each returns by its deadline, or earlier
// when `cancel` is set (checked between chunks and in every wait of the stream).
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_CLIENT_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/snapshotter.h"

namespace trainguard {

class BackupRateLimiter;
class BackupTransport;

struct PushRequest {
  std::string holder_address;  // "ADDRESS:PORT"
  std::string token;
  std::string source_address;  // the source address of the connection ("": the kernel's choice)
  std::string job_id;
  int source_rank = -1;
  const Snapshotter::View* view = nullptr;  // the snapshot to send; valid for the whole call
  uint64_t chunk_bytes = 0;                 // of view->chunk_checksums
  // The source arena's per-slot capacity (Snapshotter::payload_capacity()): the holder's arena has
  // the same, so snapshots whose blobs grow a little do not replace it (and lose the last backup).
  uint64_t payload_capacity = 0;
  // The fingerprint of a backup the holder must not overwrite (the newest the source knows is
  // committed: BackupPush.keep_fingerprint); 0: the holder overwrites its older slot.
  uint64_t keep_fingerprint = 0;
  BackupRateLimiter* limiter = nullptr;  // nullptr: unlimited
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancel = nullptr;
  BackupTransport* transport = nullptr;  // nullptr: TCP (TcpBackupTransport::Get())
};

struct PushResult {
  bool already_held = false;  // the holder had this fingerprint complete; nothing was sent
  uint64_t bytes_sent = 0;
  absl::Duration elapsed;
};

// Pushes a snapshot to a holder and waits for its acknowledgement of the complete slot. Errors
// name holder, source rank and step: Unavailable (cannot connect, connection lost), DataLoss (the
// holder saw a chunk that does not match its checksum, or acked another fingerprint),
// DeadlineExceeded, Cancelled, PermissionDenied (token), ResourceExhausted (the holder's /dev/shm
// is full).
absl::StatusOr<PushResult> PushBackup(const PushRequest& request);

struct FetchRequest {
  std::string holder_address;
  std::string token;
  std::string source_address;
  std::string job_id;
  int source_rank = -1;
  int64_t step = -1;
  uint64_t fingerprint = 0;  // the committed snapshot's; another one is NotFound
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancel = nullptr;
  BackupTransport* transport = nullptr;  // nullptr: TCP (TcpBackupTransport::Get())
};

struct FetchedBackup {
  int64_t step = -1;
  int64_t generation = 0;
  uint64_t layout_hash = 0;
  std::string payload;
  std::vector<uint64_t> chunk_checksums;
  uint64_t chunk_bytes = 0;
};

// Fetches `source_rank`'s backup of `step` with `fingerprint` from a holder and verifies every
// chunk. NotFound when the holder has no complete backup with that fingerprint; DataLoss naming
// holder, source rank, step and chunk when a chunk does not match (a backup corrupted in the
// holder's memory is never returned); Unavailable when the holder cannot be reached.
absl::StatusOr<FetchedBackup> FetchBackup(const FetchRequest& request);
// As FetchBackup, received straight into `snapshotter`'s free slot (Snapshotter::InstallWith), each
// chunk checked once as it lands, and installed there as its newest complete snapshot: the restore
// path of a replacement, with no copy of the payload in between; the RestoreStep that follows
// copies it into the buffers without hashing it again. The same errors, and FailedPrecondition
// when the backup does not fit the arena's layout or chunk size (its fingerprint with this arena's
// layout is not the committed one); on any error the arena's latest complete snapshot is
// untouched and no part of the backup is restorable.
absl::StatusOr<SnapshotInfo> FetchBackupInto(const FetchRequest& request, Snapshotter* snapshotter);

// What each holder did for FetchBackupFromHolders.
struct HolderShare {
  std::string holder_address;
  uint64_t bytes = 0;   // payload bytes it delivered, verified
  absl::Status status;  // why it stopped serving (its undelivered chunks came from the others)
};
struct FetchedFromHolders {
  SnapshotInfo installed;
  std::vector<HolderShare> holders;  // in the order given
};

// As FetchBackupInto, from every holder in `holder_addresses` at once (request.holder_address is
// not used): each serves an equal share of the chunks over its own connection, straight into the
// slot, every chunk checked as it lands. A holder that fails (unreachable, its connection dropped
// mid-transfer, a chunk that does not match) is not asked again: the chunks it had not delivered
// are fetched from the others, verified; a holder that finished its share takes over the share
// of one still being dialled. The slot is installed only once every chunk is in and verified.
// When no holder could deliver some chunk: the error of the one holder, or with several, one
// naming each holder and why (NotFound when none had the backup); on any error the arena's latest
// complete snapshot is untouched. Runs a thread per holder, all joined before it returns.
// With `restore_into`, the backup is also restored into that registry as it lands
// (Snapshotter::InstallAndRestoreWith: each chunk copied into its buffers by the thread that
// received and checked it, while the other holders still send): on OK every buffer and blob holds
// the snapshot and no RestoreStep is needed; on an error the buffers may hold part of it.
absl::StatusOr<FetchedFromHolders> FetchBackupFromHolders(
    const FetchRequest& request, const std::vector<std::string>& holder_addresses,
    Snapshotter* snapshotter, StateRegistry* restore_into = nullptr);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_CLIENT_H_
