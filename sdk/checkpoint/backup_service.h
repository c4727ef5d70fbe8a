// Peer backups of in-memory snapshots: the holder service (BackupService) and, through the headers
// it includes, the sender / restorer side (PushBackup, FetchBackup: backup_client.h) and the rate
// limiter of pushes (backup_rate_limiter.h). See BackupPlacement for who holds whose backups.
//
// A holder keeps each source rank's backup in a named shared-memory arena of its own host
// ("/trainguard.<job_id>.backup.rank<S>", the SnapshotArena format: two slots, each kWriting until
// every byte and checksum is in place), so the last complete backup is never overwritten by an
// incomplete one, and it outlives the holder process: a holder killed while receiving leaves the
// previous complete backup, which the next BackupService on that host serves (held_backups.h).
//
// The parts: BackupService (this header) listens and runs a thread per connection; BackupHolder
// (backup_holder.h) serves the push or fetch of each; both sides speak the wire format of
// backup_wire.h over a BackupTransport (backup_transport.h): TCP by default
// (tcp_backup_transport.h, out of band: never the training communicator), in one process for tests
// (in_memory_backup_transport.h). The holder verifies every chunk against the chunk checksum table
// as it lands (XXH3-64, the checksums the snapshot computed while copying) and acknowledges with
// the snapshot's fingerprint recomputed from the table; a fetch's reply carries the table and the
// payload of the chunks asked for, and FetchBackup (or FetchBackupInto / FetchBackupFromHolders,
// straight into the restorer's arena, from one holder or a share from each of several) verifies
// every chunk again as it lands (end to end). Requests carry the job's shared token when one is
// configured; a wrong token is refused.
//
// Thread safety: BackupService runs one listener thread and a bounded number of connection
// threads, all owned by it and joined by its destructor, which wakes every wait of theirs first.
// PushBackup/FetchBackup are blocking calls, safe from any thread.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/backup_client.h"
#include "sdk/checkpoint/backup_rate_limiter.h"
#include "sdk/checkpoint/held_backups.h"

namespace trainguard {

class BackupTransport;
class Env;

struct BackupServiceOptions {
  std::string job_id = "default";
  int rank = 0;  // the holder rank (names logs and errors)
  std::string bind_address = "127.0.0.1";
  int port = 0;        // 0: an ephemeral port
  std::string token;   // empty: no authentication
  Env* env = nullptr;  // the arenas' shared memory; nullptr: Env::Default()
  absl::Duration io_timeout = absl::Seconds(30);  // a peer silent this long is dropped
  BackupTransport* transport = nullptr;           // nullptr: TCP (TcpBackupTransport::Get())
};

class BackupService {
 public:
  static absl::StatusOr<std::unique_ptr<BackupService>> Start(const BackupServiceOptions& options);
  // Shuts the listener down (waking every connection's wait) and joins every thread.
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

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_SERVICE_H_
