// Checkpointing, part 3: the job-wide checkpoint of a rank. A Checkpointer ties one rank's
// Snapshotter (shared-memory arena) and Persister (local disk) to the job's Store, so that a step
// is committed for the whole job, and restores the newest state every rank can restore.
//
// Save(S): the training thread enqueues a snapshot of the registered state, tagged S (the step
// training resumes at when this state is restored), and goes on. The Checkpointer's worker thread
// then, in the background:
//   1. waits for the copy into the arena, and records in the store that this rank holds snapshot S
//      with its fingerprint (SnapshotFingerprint: the snapshot's identity);
//   2. when every rank of the job has recorded S, records S as committed in memory ("snapshot");
//      With peer backups it first pushes the snapshot to the rank's holders and votes only once
//      every holder acknowledged it complete: a step is committed in memory with all its copies;
//   3. every `persist_every`-th save, writes the shard to disk (Persister) and records it durable;
//      when every rank's shard of S is durable, S is committed on disk ("durable") — the issue's
//      global commit: only then does `trainguard ckpt list` show S as a job-wide checkpoint.
// Keys live under "ckpt/" in the job's store; see docs/FORMATS.md. Votes are namespaced by an epoch
// (generation and restore count) so a vote from before a rollback never completes a commit after
// it.
//
// RestoreNewestCommitted(): collective (every rank of the current generation calls it, survivors in
// Runtime::recover() and a replacement after registering its state). Rank 0 publishes the candidate
// steps, newest committed first; then, round by round, every rank tries the candidate — its own
// arena first, then its shard on disk, accepting only a snapshot whose fingerprint equals the
// committed one, with every chunk verified — and says whether it succeeded. The first candidate
// every rank restored wins; a failure on any rank (corruption, a missing shard) moves every rank to
// the next older candidate. While rank 0 waits for every rank to join (a replacement comes last), a
// rank whose arena holds the newest committed step copies it back at once, and keeps that copy
// when the ranks agree on it. Errors name file, offset, rank and step. Without a store (a static
// job) the rank restores on its own: the newest step whose shards of every rank are committed on
// disk, or, for a single-rank job, its newest arena snapshot.
//
// Thread safety: Save, Fence, WaitIdle and RestoreNewestCommitted belong to the training thread.
// The worker thread is owned by the Checkpointer and joined by its destructor (which waits for a
// save in progress, at most `timeout`).
#ifndef TRAINGUARD_SDK_CHECKPOINT_CHECKPOINTER_H_
#define TRAINGUARD_SDK_CHECKPOINT_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/peer_backups.h"
#include "sdk/checkpoint/replica_check.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

class Env;
class SpareArena;
class Store;

struct CheckpointerOptions {
  std::string job_id = "default";
  int rank = 0;
  int world_size = 1;
  int64_t generation = 0;
  std::string dir;        // the Persister's directory; empty: arena only
  int keep_last = 3;      // committed steps kept on disk
  int persist_every = 1;  // persist every k-th save; 0: never
  size_t chunk_bytes = 4 << 20;
  int copy_threads = 4;
  bool use_io_uring = true;
  Store* store = nullptr;  // the job's store; nullptr: a static job
  Env* env = nullptr;
  // SnapshotterOptions::keep_arena_of_other_layout.
  bool keep_arena_of_other_layout = false;
  absl::Duration timeout = absl::Minutes(5);  // bounds every wait (copy, votes, persistence)
  // Peer backups (peer_backups.h): every snapshot is pushed to the rank's holders before the rank
  // votes for it, so a step is committed in memory only when every rank's backups are complete;
  // a restore tries the holders after the arena and before the disk. nullopt: none. REQUIRES a
  // store.
  std::optional<PeerBackupsOptions> peer_backups;
  // True once this rank's generation was superseded (a newer one is published: a rank died while
  // the others restored with it). The collective restore's store waits check it every
  // 250 ms and give up with Aborted instead of waiting out `timeout` for a rank that is
  // gone. Any thread. Empty: never superseded.
  std::function<bool()> superseded;
  // SnapshotterOptions::spare_arena.
  SpareArena* spare_arena = nullptr;
  // Silent data corruption (replica_check.h): this rank's data-parallel group, named by its
  // model-parallel coordinates (e.g. "tp0.cp0.pp1"), and its host. With a store and replicated
  // buffers (StateBuffer::replicated), every snapshot vote carries the fingerprint of the
  // replicated region; the ballot's last voter compares each group's replicas, and a step whose
  // replicas disagree is not committed (SaveOutcome::disagreements). Empty group: not compared.
  std::string replica_group;
  std::string host;
  // The compute canary (sdk/health/compute_canary.h; the Runtime's runs on the rank's GPU when it
  // has CUDA state): called on the worker at each snapshot; its
  // fingerprint rides in the vote and the ballot's last voter compares every rank's (a rank that
  // differs is reported in SaveOutcome::disagreements, group kCanaryGroup; the step is committed
  // all the same). Empty: none. REQUIRES a store.
  std::function<uint64_t()> canary;
  // How long the judge of a disagreement waits for the group's replica digests to name the
  // buffers.
  absl::Duration replica_digest_wait = absl::Seconds(5);
};

struct RestoreResult {
  int64_t step = -1;
  std::string source;  // "arena", "disk", "peer host HOST" or "peer hosts HOST,HOST"
  uint64_t fingerprint = 0;
  // Newer candidates that could not be restored and why (e.g. "step 120: rank 2: DataLoss ..."),
  // and, for a rank that read the disk, why its peers' memory did not serve the step ("step 120
  // from peer memory: ...").
  std::vector<std::string> skipped;
  // Where the time went, for the operator who wonders why a recovery took as long as it did:
  // bringing the step into the arena (a peer fetch or a shard read, with their checks; zero when
  // the arena held it), copying it from the arena into the registered buffers, and the whole
  // collective restore (both, plus the waits for the other ranks). A peer fetch copies each chunk
  // into the buffers as it lands: its fetch_time includes the copy, and copy_time is zero.
  absl::Duration fetch_time;
  absl::Duration copy_time;
  absl::Duration took;
  // Of `took`, the wait for rank 0's list of candidates (which waits for every rank's list of
  // shards on disk: a replacement that comes late holds every rank up here).
  absl::Duration candidates_wait;
  // Of the restored bytes, those the live buffers already held (SnapshotInfo::restored_bytes_held):
  // checked, not copied. A survivor rolling back to the snapshot it took finds the buffers
  // training did not write since.
  uint64_t bytes_held = 0;
  // The copy from the arena was made while the ranks were still joining the restore, before they
  // agreed on the step (the newest committed step in the arena, which they then agreed on).
  bool copied_ahead = false;
};

// What the worker did with one save; passed to the observer (the Runtime writes it as an event).
struct SaveOutcome {
  int64_t step = -1;
  absl::Status status;             // of the whole save; the first error if any
  bool committed = false;          // this rank saw every rank's snapshot of the step
  bool persisted = false;          // this rank's shard is durable
  bool durable_committed = false;  // this rank saw every rank's shard durable
  absl::Duration copy_time;        // from Save() to the snapshot being complete
  absl::Duration persist_time;
  // Peer backups: whether this rank's holders acknowledged the snapshot, and how long it took.
  bool replicated = false;
  absl::Duration replicate_time;
  // A re-protection after a restore (no new snapshot: the restored one pushed to the holders that
  // lack it), and whether this rank saw every rank's backups of it complete: the job is protected
  // again (the rank that completes the set reports it once, and records ckpt/protected).
  bool reprotect = false;
  bool protected_again = false;
  // The step's replicas disagreed (silent data corruption): the step is not committed. Filled on
  // the rank that judged the ballot (one rank of the job), with the differing buffers named. A
  // group kCanaryGroup: ranks whose compute canary differs (the step may be committed).
  std::vector<ReplicaDisagreement> disagreements;
};

class Checkpointer {
 public:
  // REQUIRES: `registry` is filled and outlives the Checkpointer; it is read-only from now on.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(StateRegistry* registry,
                                                              const CheckpointerOptions& options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Starts a checkpoint of the current state tagged `step`. FailedPrecondition (nothing started)
  // while the previous save is still being copied or persisted: the caller skips this one.
  // `persist`: whether this save also goes to disk; nullopt: every persist_every-th save of this
  // process. Ranks must agree on it (a step is durable only when every rank persisted it), so
  // policies derive it from the step (the Runtime does), not from a per-process count.
  absl::Status Save(int64_t step, std::optional<bool> persist = std::nullopt);
  // Waits until the copy of the save in flight is in the arena (the fence of the snapshot contract:
  // after it, every registered buffer may be modified).
  absl::Status Fence(absl::Duration timeout);
  // Waits until the worker is idle (the last save fully processed).
  absl::Status WaitIdle(absl::Duration timeout);
  // True while a save is being copied, persisted or committed.
  bool busy() const;

  // Called on the worker thread after each save. Set before the first Save().
  void set_observer(std::function<void(const SaveOutcome&)> observer);
  // After a re-rendezvous: later votes and restores belong to `generation`.
  void SetGeneration(int64_t generation);

  // See the header comment. NotFound when no committed step can be restored by every rank.
  // Aborted when the generation was superseded meanwhile (CheckpointerOptions::superseded): meet
  // the others in the newer generation and restore again there.
  absl::StatusOr<RestoreResult> RestoreNewestCommitted();

  // Committed steps known to the store (or, without a store, found on disk), newest first.
  absl::StatusOr<std::vector<int64_t>> CommittedSteps();
  // The newest step this rank knows is committed in memory, -1 if none: one whose vote it
  // completed, whose commit record its worker has seen since (it looks every 20 ms while such a
  // snapshot is in the arena), or that it restored. The next Save keeps that snapshot in the arena
  // (Snapshotter::Begin's `keep`) if a newer one is not committed yet.
  int64_t known_committed() const;

  Snapshotter& snapshotter();

 private:
  class Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CHECKPOINT_CHECKPOINTER_H_
