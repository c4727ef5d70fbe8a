// BackupHolder: the holder's side of peer backups, one request per stream, on any transport. A
// push is verified chunk by chunk as it lands in the source rank's backup arena (held_backups.h);
// a fetch sends the newest complete slot with that step and fingerprint (the chunks asked for: all,
// a share of them, or a range). A push writes the slot
// that is not the newest complete one, marked kWriting until its last byte and checksum are in,
// so a push that fails (a dropped connection, a corrupt chunk, a crash) leaves the older complete
// backup in place. BackupService runs it behind a listener; tests run it over
// InMemoryBackupTransport.
//
// Thread-safe: Serve runs on one thread per connection; a source's pushes are serialised (a second
// concurrent push is Aborted) and wait for the fetches of the slot they replace.
#ifndef TRAINGUARD_SDK_CHECKPOINT_BACKUP_HOLDER_H_
#define TRAINGUARD_SDK_CHECKPOINT_BACKUP_HOLDER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/backup_transport.h"
#include "sdk/checkpoint/held_backups.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/core/mutex.h"
#include "sdk/proto/backup.pb.h"

namespace trainguard {

class BackupHolder {
 public:
  // `address` is where clients reach this holder: with options.rank it names the holder in every
  // error and log line. REQUIRES: options were validated (BackupService::Start does).
  BackupHolder(const BackupServiceOptions& options, std::string address);
  BackupHolder(const BackupHolder&) = delete;
  BackupHolder& operator=(const BackupHolder&) = delete;

  // Serves the one request on `stream`, a push or a fetch, and answers it. OK when the request was
  // served or answered as a miss (a fetch of a backup not held); otherwise what went wrong, naming
  // this holder and the peer (the client got the answer when the stream could carry one).
  absl::Status Serve(BackupStream* stream);

  // The complete backups held now (opening the arenas a previous holder process left on this host
  // too), newest first per source.
  std::vector<HeldBackup> Held();

  // "backup holder rank R (ADDRESS)".
  std::string name() const;

 private:
  // The backups of one source rank: its arena (opened on the first push or fetch) and who is
  // using which slot. A push writes one slot while fetches read the other.
  struct Source {
    Mutex mu;
    std::unique_ptr<checkpoint_internal::SnapshotArena> arena ABSL_GUARDED_BY(mu);
    int writing ABSL_GUARDED_BY(mu) = -1;
    int readers[2] ABSL_GUARDED_BY(mu) = {0, 0};
  };

  void Log(const std::string& what) const;
  Source* FindSource(int rank);
  Source* GetSource(int rank);

  absl::Status CheckRequest(uint32_t version, const std::string& token, const std::string& job_id,
                            int source_rank, const std::string& peer) const;
  absl::Status EnsureArena(Source* source, int source_rank,
                           const checkpoint_internal::ArenaGeometry& geometry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu);
  absl::Status OpenArena(Source* source, int source_rank,
                         const checkpoint_internal::ArenaGeometry& geometry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu);
  static int NewestSlot(Source* source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu);

  absl::Status ValidatePush(const proto::BackupPush& push, const std::string& peer,
                            uint64_t* capacity) const;
  absl::Status ServePush(BackupStream* stream, const proto::BackupPush& push);
  // `keep_fingerprint`: BackupPush.keep_fingerprint.
  absl::Status BeginPush(Source* source, int rank, const proto::BackupSnapshotHeader& h,
                         uint64_t capacity, uint64_t keep_fingerprint, int* w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu);
  absl::Status ReceivePayload(BackupStream* stream, Source* source, int w,
                              const proto::BackupSnapshotHeader& h);
  absl::Status ServeFetch(BackupStream* stream, const proto::BackupFetch& fetch);
  static absl::Status ChunksAskedFor(const proto::BackupFetch& fetch, uint64_t chunks,
                                     uint64_t* first, uint64_t* end);
  absl::Status FindForFetch(Source* source, const proto::BackupFetch& fetch, int* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(source->mu);

  const BackupServiceOptions options_;
  Env* const env_;
  const std::string address_;

  Mutex sources_mu_;
  // Never erased: the threads serving connections keep pointers to the entries.
  std::map<int, std::unique_ptr<Source>> sources_ ABSL_GUARDED_BY(sources_mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_BACKUP_HOLDER_H_
