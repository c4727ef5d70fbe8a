// PeerBackups: one rank's part in the redundant in-memory backups (private to sdk/checkpoint, used
// by the Checkpointer). It runs the rank's BackupService (the holder side: this rank keeps the
// backups of its sources, BackupPlacement::SourceRanks), pushes each completed snapshot to the
// rank's holders (HolderRanks) and, on a restore, fetches the rank's snapshot back from them.
//
// Store keys (under the Checkpointer's "ckpt/" prefix, docs/FORMATS.md):
//   backup/addr/<rank>   "ADDRESS:PORT HOSTNAME" of the rank's BackupService, rewritten by every
//                        process that takes the rank
//   backup/size/<rank>   the bytes of the rank's arena, read by the memory-budget check
//
// Why the ranks hold the backups (not the host agent): the pairing is rank to rank (local rank i
// to local rank i of the holder host, so traffic stays on one rail), ranks exist however the job
// was started (trainguard run, Slurm, Kubernetes), and a backup arena lives in the host's shared
// memory, so a holder process that dies leaves its complete backups to the process that takes its
// rank on that host.
//
// Thread safety: Replicate and Restore may run on different threads (the Checkpointer's worker
// and the training thread); Cancel may be called from any thread. The BackupService's threads are
// owned through it.
#ifndef TRAINGUARD_SDK_CHECKPOINT_PEER_BACKUPS_H_
#define TRAINGUARD_SDK_CHECKPOINT_PEER_BACKUPS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/snapshotter.h"

namespace trainguard {

class Env;
class Store;

struct PeerBackupsOptions {
  std::string job_id;
  int rank = 0;
  BackupPlacement placement;
  std::string host_addr;  // the service's address and the pushes' source ("": 127.0.0.1)
  std::string host_name;  // names this host to the ranks that restore from it
  std::string token;
  uint64_t rate_bytes_per_second = 0;  // 0: unlimited
  uint64_t memory_budget_bytes = 0;    // per host; 0: /dev/shm's size only
  std::string shm_dir = "/dev/shm";    // whose size bounds the footprint
  absl::Duration timeout = absl::Minutes(1);  // bounds one push, one fetch, the size exchange
  Env* env = nullptr;
  // The service's, the pushes' and the fetches' transport; nullptr: TCP
  // (TcpBackupTransport::Get()). Tests pass an InMemoryBackupTransport to drop a holder's
  // connection in the middle of a fetch.
  BackupTransport* transport = nullptr;
  // True once this rank's generation was superseded (CheckpointerOptions::superseded, which the
  // Checkpointer passes on): the size exchange stops waiting for a rank that never published its
  // size (it failed at start-up) and Create fails with Aborted naming it. Empty: never.
  std::function<bool()> superseded;
};

// Where a restored snapshot came from: the holders that delivered part of it.
struct PeerRestore {
  std::vector<int> holder_ranks;
  std::vector<std::string> holder_hosts;
};

class PeerBackups {
 public:
  // Starts the service, publishes its address and this rank's arena size, then checks the host's
  // shared-memory footprint (every local rank's arena and every backup its ranks hold, two slots
  // each) against the budget and /dev/shm: ResourceExhausted naming the figures when it does not
  // fit; Aborted naming the ranks whose sizes never came when the generation was superseded
  // meanwhile (options.superseded). `job_store` is the job's store (keys go under "ckpt/"; it must outlive this object);
  // `arena_bytes` this rank's arena.
  static absl::StatusOr<std::unique_ptr<PeerBackups>> Create(const PeerBackupsOptions& options,
                                                             Store* job_store,
                                                             uint64_t arena_bytes);
  ~PeerBackups();

  // Pushes `view` to every holder; OK when each acknowledged the complete backup (or already had
  // it). The first error names the holder rank, its host and the step. `keep_fingerprint`: the
  // backup each holder keeps (PushRequest::keep_fingerprint; 0: none).
  absl::Status Replicate(const Snapshotter::View& view, uint64_t chunk_bytes,
                         uint64_t payload_capacity, uint64_t keep_fingerprint = 0);

  // Fetches this rank's snapshot of `step` with `fingerprint` from all its holders at once
  // (FetchBackupFromHolders: a share of the chunks each, a failed holder's chunks from the
  // others) into `snapshotter`, each chunk verified as it lands, and installs it there. NotFound
  // listing every holder and why it could not serve (unreachable, no such backup, a chunk that
  // failed its checksum) when some chunk came from none. With `restore_into`, the registry's
  // buffers and blobs are restored as the chunks land (FetchBackupFromHolders); on an error they
  // may hold part of the snapshot.
  absl::StatusOr<PeerRestore> Restore(int64_t step, uint64_t fingerprint, Snapshotter* snapshotter,
                                      StateRegistry* restore_into = nullptr);

  // Makes a Replicate or Restore in progress return Cancelled soon; later calls run again after
  // ClearCancel().
  void Cancel() { cancel_.store(true); }
  void ClearCancel() { cancel_.store(false); }

  // The key (under the job store's "ckpt/") where `rank` publishes its arena's size in bytes.
  static std::string ArenaSizeKey(int rank);

  const BackupPlacement& placement() const { return options_.placement; }
  int copies() const { return options_.placement.copies(); }

 private:
  PeerBackups(PeerBackupsOptions options, Store* job_store,
              std::unique_ptr<BackupService> service);
  absl::Status CheckMemoryBudget(uint64_t arena_bytes);
  // "ADDRESS:PORT" and host name of `rank`'s service, from the store.
  absl::StatusOr<std::pair<std::string, std::string>> AddressOf(int rank);
  std::string Where() const;

  const PeerBackupsOptions options_;
  const std::unique_ptr<Store> store_;  // "ckpt/" in the job's store
  const std::unique_ptr<BackupService> service_;
  BackupRateLimiter limiter_;
  std::atomic<bool> cancel_{false};
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_PEER_BACKUPS_H_
