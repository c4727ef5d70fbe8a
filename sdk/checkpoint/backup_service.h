// Peer backups of in-memory snapshots: the holder side (BackupService) and the sender / restorer
// side (PushBackup, FetchBackup). See BackupPlacement for who holds whose backups.
//
// A holder keeps each source rank's backup in a named shared-memory arena of its own host
// ("/trainguard.<job_id>.backup.rank<S>", the SnapshotArena format: two slots, each kWriting until
// every byte and checksum is in place), so the last complete backup is never overwritten by an
// incomplete one, and it outlives the holder process: a holder killed while receiving leaves the
// previous complete backup, which the next BackupService on that host serves.
//
// Wire protocol (TCP, out of band: never the training communicator): every message is a u32
// little-endian length and a BackupMessage protobuf (sdk/proto/backup.proto); a push's header is
// followed by the raw payload. The holder verifies every chunk against the chunk checksum table
// as it lands (XXH3-64, the checksums the snapshot computed while copying) and acknowledges with the
// snapshot's fingerprint recomputed from the table; a fetch's reply carries the table and the
// payload, and FetchBackup (or FetchBackupInto, straight into the restorer's arena) verifies every
// chunk again as it lands (end to end). Requests
// carry the job's shared token when one is configured; a wrong token is refused.
//
// Thread safety: BackupService runs one listener thread and a bounded number of connection
// threads, all owned by it and joined by its destructor. PushBackup/FetchBackup are blocking
// calls, safe from any thread; each returns by its deadline, or earlier when `cancel` is set
// (checked between chunks and while waiting for the socket).
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/snapshotter.h"

namespace trainguard {

class Clock;
class Env;

struct BackupServiceOptions {
  std::string job_id = "default";
  int rank = 0;                         // the holder rank (names logs and errors)
  std::string bind_address = "127.0.0.1";
  int port = 0;                         // 0: an ephemeral port
  std::string token;                    // empty: no authentication
  Env* env = nullptr;                   // the arenas' shared memory; nullptr: Env::Default()
  absl::Duration io_timeout = absl::Seconds(30);  // a peer silent this long is dropped
};

// One backup a holder has, complete or not.
struct HeldBackup {
  int source_rank = -1;
  int64_t step = -1;
  uint64_t fingerprint = 0;
  uint64_t payload_bytes = 0;
};

class BackupService {
 public:
  static absl::StatusOr<std::unique_ptr<BackupService>> Start(const BackupServiceOptions& options);
  ~BackupService();
  BackupService(const BackupService&) = delete;
  BackupService& operator=(const BackupService&) = delete;

  // "ADDRESS:PORT" that peers connect to.
  std::string address() const;
  // The complete backups held now (opening the arenas a previous holder process left on this host
  // too), newest first per source.
  std::vector<HeldBackup> Held() const;

  // The shared-memory name of the backup of `source_rank`'s snapshots.
  static std::string ArenaName(std::string_view job_id, int source_rank);
  // Removes the backup arenas of the given sources (job shutdown).
  static absl::Status RemoveArenas(std::string_view job_id, const std::vector<int>& source_ranks,
                                   Env* env = nullptr);

 private:
  class Impl;
  explicit BackupService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sends at most `bytes_per_second` (0: unlimited), in chunks: a token bucket the pushes of one
// process share. Each Acquire reserves the link for bytes / rate after the previous reservation
// ends (or now, if that is later) and waits until its reservation starts, so a first chunk goes at
// once and N bytes in chunks take at least (N - the last chunk) / rate. Time is `clock`'s
// (nullptr: Clock::Real()): on a ManualClock the waits advance the clock and return at once.
// Thread-safe.
class BackupRateLimiter {
 public:
  explicit BackupRateLimiter(uint64_t bytes_per_second, Clock* clock = nullptr);
  // Blocks until `bytes` may be sent, or `deadline`, or `cancel`; false when it gave up. Gives up
  // at once, reserving nothing, when the bytes would be free only after `deadline` (a deadline
  // is wall time, compared with the clock's Now()). A reservation whose wait is cancelled is
  // still spent.
  bool Acquire(uint64_t bytes, absl::Time deadline, const std::atomic<bool>* cancel);
  uint64_t bytes_per_second() const { return rate_; }

 private:
  const uint64_t rate_;
  Clock* const clock_;
  std::atomic<int64_t> next_free_ns_{0};  // on clock_'s monotonic time
};

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
  BackupRateLimiter* limiter = nullptr;     // nullptr: unlimited
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancel = nullptr;
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
// path of a replacement, with no copy of the payload in between. The same errors, and
// FailedPrecondition when the backup does not fit the arena's layout or chunk size; on any error
// the arena's latest complete snapshot is untouched.
absl::StatusOr<SnapshotInfo> FetchBackupInto(const FetchRequest& request, Snapshotter* snapshotter);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_
