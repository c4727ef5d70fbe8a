#include "sdk/checkpoint/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/generation_wait.h"
#include "sdk/checkpoint/payload_layout.h"
#include "sdk/checkpoint/persister.h"
#include "sdk/core/agent_keys.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "trainguard/env.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

constexpr absl::Duration kWorkerIdlePoll = absl::Milliseconds(200);
// How long a new checkpointer waits for the rank's previous process to release its arena: what
// an agent allows a killed process to be reaped (posix_process_supervisor.cc).
constexpr absl::Duration kArenaLockWait = absl::Seconds(10);

// The store key recording that `step` is committed as `kind` ("snapshot" or "durable").
std::string CommitKey(int64_t step, absl::string_view kind) {
  return absl::StrCat("commit/", step, "/", kind);
}
// How often the worker looks for the commit of a step it voted for without completing the vote.
constexpr absl::Duration kCommitPoll = absl::Milliseconds(20);
// How long a rank whose snapshot was compared waits for its ballot's verdict before it persists
// the snapshot anyway: the ranks of a synchronous job vote within a step of each other.
constexpr absl::Duration kJudgementWait = absl::Seconds(1);

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

std::optional<uint64_t> ParseHex(absl::string_view s) {
  uint64_t v = 0;
  if (s.size() != 16 || !absl::SimpleHexAtoi(s, &v)) return std::nullopt;
  return v;
}

// This rank's replica digests (Snapshotter::View::replica_digests) of the snapshot it voted for
// at `step` in `epoch`, kept for a judge that asks for them.
struct VotedReplica {
  int64_t step;
  std::string epoch;
  std::vector<uint64_t> digests;
};

// One restore candidate: a step and the fingerprint every rank's snapshot of it must have.
struct Candidate {
  int64_t step = -1;
  std::string origin;                  // "store:snapshot", "store:durable", "disk"
  std::vector<uint64_t> fingerprints;  // per rank
};

std::string EncodeCandidates(const std::vector<Candidate>& candidates) {
  std::vector<std::string> lines;
  for (const Candidate& c : candidates) {
    std::vector<std::string> fps;
    for (uint64_t fp : c.fingerprints) fps.push_back(Hex(fp));
    lines.push_back(absl::StrCat(c.step, " ", c.origin, " ", absl::StrJoin(fps, ",")));
  }
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<std::vector<Candidate>> DecodeCandidates(absl::string_view text, int world_size) {
  std::vector<Candidate> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    Candidate c;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &c.step)) {
      return absl::DataLossError(absl::StrCat("malformed restore candidate \"", line, "\""));
    }
    c.origin = std::string(parts[1]);
    for (absl::string_view fp : absl::StrSplit(parts[2], ',')) {
      std::optional<uint64_t> v = ParseHex(fp);
      if (!v) return absl::DataLossError(absl::StrCat("malformed fingerprint in \"", line, "\""));
      c.fingerprints.push_back(*v);
    }
    if (static_cast<int>(c.fingerprints.size()) != world_size) {
      return absl::DataLossError(absl::StrCat("restore candidate \"", line, "\" has ",
                                              c.fingerprints.size(), " ranks, the job has ",
                                              world_size));
    }
    out.push_back(std::move(c));
  }
  return out;
}

uint64_t FingerprintOf(const ShardRecord& r) {
  return SnapshotFingerprint(r.step, r.layout_hash, r.payload_bytes, r.chunk_checksums);
}

}  // namespace

class Checkpointer::Impl {
 public:
  Impl(StateRegistry* registry, CheckpointerOptions options,
       std::unique_ptr<Snapshotter> snapshotter, std::unique_ptr<Persister> persister,
       std::unique_ptr<PeerBackups> peers)
      : registry_(registry),
        layout_(LayoutOf(*registry)),
        options_(std::move(options)),
        env_(options_.env != nullptr ? options_.env : Env::Default()),
        snapshotter_(std::move(snapshotter)),
        persister_(std::move(persister)),
        peers_(std::move(peers)),
        store_(options_.store != nullptr ? std::make_unique<PrefixStore>("ckpt", options_.store)
                                         : nullptr),
        generation_(options_.generation) {
    worker_ = std::thread([this] { WorkerLoop(); });
  }

  ~Impl() {
    (void)WaitIdle(options_.timeout);
    if (peers_ != nullptr) peers_->Cancel();
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    worker_.join();
  }

  absl::Status Save(int64_t step, std::optional<bool> persist) {
    const std::optional<int64_t> keep = StepToKeep();
    MutexLock lock(&mu_);
    if (job_.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: Save(%d): the checkpoint of step %d is still being saved", Where(),
                          step, job_->step));
    }
    if (absl::Status begun = snapshotter_->Begin(step, keep); !begun.ok()) return begun;
    ++saves_;
    const bool by_count = options_.persist_every > 0 && saves_ % options_.persist_every == 0;
    job_ = Job{step,
               absl::Now(),
               !options_.dir.empty() && persist.value_or(by_count),
               Epoch(),
               /*reprotect=*/false,
               keep};
    return absl::OkStatus();
  }

  absl::Status Fence(absl::Duration timeout) { return snapshotter_->Fence(timeout); }

  absl::Status WaitIdle(absl::Duration timeout) {
    MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !job_.has_value(); },
                             timeout)) {
      return absl::OkStatus();
    }
    return absl::DeadlineExceededError(
        absl::StrFormat("%s: the checkpoint of step %d is still being saved after %s", Where(),
                        job_->step, absl::FormatDuration(timeout)));
  }

  bool busy() {
    MutexLock lock(&mu_);
    return job_.has_value();
  }

  int64_t known_committed() {
    MutexLock lock(&mu_);
    return known_committed_;
  }

  void set_observer(std::function<void(const SaveOutcome&)> observer) {
    MutexLock lock(&mu_);
    observer_ = std::move(observer);
  }

  void SetGeneration(int64_t generation) {
    MutexLock lock(&mu_);
    if (generation != generation_) restores_ = 0;
    generation_ = generation;
  }

  absl::StatusOr<std::vector<int64_t>> CommittedSteps() {
    absl::StatusOr<std::vector<Candidate>> candidates =
        store_ != nullptr ? StoreCommits() : StaticCandidates();
    if (!candidates.ok()) return candidates.status();
    std::vector<int64_t> steps;
    for (const Candidate& c : *candidates) {
      if (steps.empty() || steps.back() != c.step) steps.push_back(c.step);
    }
    return steps;
  }

  absl::StatusOr<RestoreResult> RestoreNewestCommitted() {
    // A push to a holder that died with the fault must not hold the restore up: the save in
    // flight is rolled back anyway.
    if (peers_ != nullptr) peers_->Cancel();
    judgement_cancelled_.store(true);  // nor a wait for the judgement of a snapshot's replicas
    absl::Status idle = WaitIdle(options_.timeout);
    judgement_cancelled_.store(false);
    if (peers_ != nullptr) peers_->ClearCancel();
    if (!idle.ok()) return idle;
    std::string epoch;
    {
      MutexLock lock(&mu_);
      epoch = absl::StrCat("restore/", Epoch());
      ++restores_;  // later votes belong to the timeline that starts at this restore
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<RestoreResult> restored =
        store_ == nullptr ? RestoreAlone() : RestoreTogether(epoch);
    if (restored.ok()) {
      restored->took = absl::Now() - start;
      MutexLock lock(&mu_);
      known_committed_ = restored->step;  // a commit of the timeline that starts here
      unresolved_.clear();
      ++timeline_;
    }
    if (store_ == nullptr) return restored;
    if (restored.ok() && options_.rank == 0) DropSnapshotCommitsAfter(restored->step);
    if (restored.ok() && peers_ != nullptr) Reprotect(restored->step);
    return restored;
  }

  Snapshotter& snapshotter() { return *snapshotter_; }

 private:
  struct Job {
    int64_t step;
    absl::Time started;
    bool persist;
    std::string epoch;
    bool reprotect;  // push the restored snapshot of `step` to the holders; no copy, no commit
    // The committed step the arena keeps (Snapshotter::Begin's `keep`), whose backups the
    // holders keep too.
    std::optional<int64_t> keep = std::nullopt;
  };

  // After a restore every rank pushes the restored snapshot to its holders in the background (a
  // holder that has it answers at once; a replacement host's ranks receive it), so the placement
  // is whole again before the next snapshot.
  void Reprotect(int64_t step) {
    MutexLock lock(&mu_);
    if (job_.has_value()) return;
    job_ = Job{step, absl::Now(), false, Epoch(), /*reprotect=*/true, std::nullopt};
  }

  std::string Where() const {
    return absl::StrFormat("checkpointer (job %s, rank %d)", options_.job_id, options_.rank);
  }

  // The snapshot the next save keeps in the arena (Snapshotter::Begin's `keep`): the newest step
  // this rank knows is committed. When the arena's newest snapshot is one whose commit the worker
  // has not seen yet, the store is asked first (one read; the worker usually knows within 20 ms
  // of the commit): keeping an older commit on stale knowledge would evict a newer one.
  std::optional<int64_t> StepToKeep() {
    const std::optional<SnapshotInfo> newest = snapshotter_->LatestComplete();
    bool ask = false;
    {
      MutexLock lock(&mu_);
      if (known_committed_ < 0 || !newest.has_value()) return std::nullopt;
      ask = newest->step != known_committed_ &&
            std::find(unresolved_.begin(), unresolved_.end(), newest->step) != unresolved_.end();
    }
    if (ask) {
      absl::StatusOr<std::vector<std::optional<std::string>>> record = store_->MultiGet(
          {CommitKey(newest->step, "snapshot")}, std::min(options_.timeout, kCommitPoll * 10));
      if (!record.ok()) return std::nullopt;  // unknown: the default, the older slot
      MutexLock lock(&mu_);
      if ((*record)[0].has_value()) known_committed_ = std::max(known_committed_, newest->step);
    }
    MutexLock lock(&mu_);
    return known_committed_;
  }

  // Which of the `steps` this rank voted for (not the last voter) the store now records as
  // committed. A step is looked for while its snapshot is in the arena: once committed it is the
  // one the next save keeps (Snapshotter::Begin's `keep`); one no longer there is dropped. Nothing
  // is learnt when a restore started another timeline meanwhile.
  void ResolveCommits(const std::vector<int64_t>& steps, uint64_t timeline) {
    std::vector<std::string> keys;
    for (int64_t step : steps) keys.push_back(CommitKey(step, "snapshot"));
    // In the same request: whether a judge wants this rank's replica digests of a step it voted
    // for (its replicas disagreed, so the step is never committed).
    std::vector<VotedReplica> voted;
    {
      MutexLock lock(&mu_);
      for (const VotedReplica& v : voted_) {
        if (std::find(steps.begin(), steps.end(), v.step) != steps.end()) voted.push_back(v);
      }
    }
    for (const VotedReplica& v : voted) keys.push_back(DigestWantKey(v.epoch, v.step));
    absl::StatusOr<std::vector<std::optional<std::string>>> records =
        store_->MultiGet(keys, std::min(options_.timeout, kCommitPoll * 10));
    for (size_t i = 0; records.ok() && i < voted.size(); ++i) {
      const std::optional<std::string>& want = (*records)[steps.size() + i];
      if (want.has_value()) AnswerWant(voted[i], *want);
    }
    std::vector<int64_t> in_arena;
    for (const SnapshotInfo& info : snapshotter_->CompleteSnapshots()) {
      in_arena.push_back(info.step);
    }
    MutexLock lock(&mu_);
    if (timeline != timeline_) return;
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool committed = records.ok() && (*records)[i].has_value();
      if (committed) known_committed_ = std::max(known_committed_, steps[i]);
      if (committed || steps[i] <= known_committed_ ||
          std::find(in_arena.begin(), in_arena.end(), steps[i]) == in_arena.end()) {
        unresolved_.erase(std::remove(unresolved_.begin(), unresolved_.end(), steps[i]),
                          unresolved_.end());
      }
    }
  }

  // Votes and restores are namespaced by the generation and by the restores done in it: every rank
  // of a generation restores the same number of times, so they agree on the epoch.
  std::string Epoch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::StrCat("g", generation_, ".r", restores_);
  }

  // ---- the worker: copy, vote, persist, vote ----

  void WorkerLoop() {
    while (true) {
      Job job;
      std::vector<int64_t> unresolved;
      uint64_t timeline = 0;
      bool have_job = false;
      {
        MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(
            [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || (job_ && !job_running_); },
            unresolved_.empty() ? kWorkerIdlePoll : kCommitPoll);
        if (stop_) return;
        have_job = job_.has_value() && !job_running_;
        if (have_job) {
          job_running_ = true;
          job = *job_;
        } else {
          unresolved = unresolved_;
          timeline = timeline_;
        }
      }
      if (!have_job) {
        if (!unresolved.empty()) ResolveCommits(unresolved, timeline);
        continue;
      }
      SaveOutcome outcome = RunJob(job);
      std::function<void(const SaveOutcome&)> observer;
      {
        MutexLock lock(&mu_);
        observer = observer_;
      }
      if (observer) observer(outcome);
      MutexLock lock(&mu_);
      job_.reset();
      job_running_ = false;
    }
  }

  SaveOutcome RunJob(const Job& job) {
    if (job.reprotect) return RunReprotect(job);
    SaveOutcome outcome;
    outcome.step = job.step;
    outcome.status = snapshotter_->Fence(options_.timeout);
    outcome.copy_time = absl::Now() - job.started;
    if (!outcome.status.ok()) return outcome;
    absl::StatusOr<Snapshotter::View> view = snapshotter_->LatestView();
    if (!view.ok()) {
      outcome.status = view.status();
      return outcome;
    }
    const uint64_t fingerprint = SnapshotFingerprint(view->info.step, view->info.layout_hash,
                                                     view->payload.size(), view->chunk_checksums);
    // The replica part of the vote: this rank's replicated region, compared with its group's;
    // then the compute canary's, compared with every rank's.
    std::string replica_vote;
    if (!options_.replica_group.empty() && store_ != nullptr && !view->replica_digests.empty()) {
      replica_vote =
          EncodeReplicaVote(ReplicaReport{options_.rank, options_.replica_group, options_.host,
                                          ReplicaFingerprint(view->replica_digests)});
      MutexLock lock(&mu_);
      voted_.push_back(VotedReplica{job.step, job.epoch, view->replica_digests});
      if (voted_.size() > 2) voted_.erase(voted_.begin());
    }
    if (options_.canary && store_ != nullptr) {
      replica_vote += EncodeCanaryVote(options_.canary(), options_.host);
    }
    // Without its backups a snapshot is not voted for, so the step is never committed in memory;
    // persistence goes on unchanged.
    bool vote = true;
    if (peers_ != nullptr) {
      const absl::Time start = absl::Now();
      absl::Status replicated = peers_->Replicate(
          *view, options_.chunk_bytes, snapshotter_->payload_capacity(), KeptFingerprint(job.keep));
      outcome.replicate_time = absl::Now() - start;
      outcome.replicated = replicated.ok();
      if (!replicated.ok()) {
        outcome.status = replicated;
        vote = false;
      }
    }
    if (vote) {
      bool rejected = false;
      absl::StatusOr<bool> committed =
          Vote(job, "snapshot", Hex(fingerprint) + replica_vote, &outcome.disagreements, &rejected);
      if (!committed.ok()) {
        outcome.status = committed.status();
        return outcome;
      }
      // A snapshot whose replicas were compared reaches the disk only once they agreed: the
      // shards of a rejected step would look like a checkpoint on disk and push older, agreeing
      // ones out (keep_last). The ballot is usually complete within milliseconds.
      if (!*committed && !rejected && !replica_vote.empty() && job.persist) {
        rejected = AwaitJudgement(job);
      }
      // The judge asks for the digests right after its claim: answered here, not at the next
      // commit poll, which a rank whose last save this was would never reach.
      if (rejected && outcome.disagreements.empty()) AnswerDigestRequest(job);
      if (rejected) {
        outcome.status = absl::DataLossError(absl::StrFormat(
            "%s: step %d: the replicas of a data-parallel group disagree (silent data "
            "corruption; the job's silent_corruption events name the rank): not committed, "
            "not persisted",
            Where(), job.step));
        MutexLock lock(&mu_);
        unresolved_.push_back(job.step);  // a judge may still want this rank's replica digests
        if (unresolved_.size() > 2) unresolved_.erase(unresolved_.begin());
        return outcome;
      }
      outcome.committed = *committed;
      {
        MutexLock lock(&mu_);
        if (*committed) {
          known_committed_ = std::max(known_committed_, job.step);
        } else if (store_ != nullptr) {
          unresolved_.push_back(job.step);  // a later voter commits it, or none does
          if (unresolved_.size() > 2) unresolved_.erase(unresolved_.begin());
        }
      }
      if (*committed && peers_ != nullptr) {
        outcome.protected_again = MarkProtected(job.step, job.epoch);
      }
    }
    if (!job.persist) return outcome;
    const absl::Time persist_start = absl::Now();
    int64_t generation;
    {
      MutexLock lock(&mu_);
      generation = generation_;
    }
    absl::StatusOr<ShardRecord> record =
        persister_->Persist(job.step, options_.rank, generation, view->info.layout_hash,
                            view->payload, view->chunk_checksums, &layout_);
    outcome.persist_time = absl::Now() - persist_start;
    if (!record.ok()) {
      if (outcome.status.ok()) outcome.status = record.status();
      PublishPersistFailure(job.step, record.status());
      return outcome;
    }
    outcome.persisted = true;
    absl::StatusOr<bool> durable = Vote(job, "durable", Hex(fingerprint) + replica_vote);
    if (!durable.ok()) {
      if (outcome.status.ok()) outcome.status = durable.status();
      return outcome;
    }
    outcome.durable_committed = *durable;
    return outcome;
  }

  SaveOutcome RunReprotect(const Job& job) {
    SaveOutcome outcome;
    outcome.step = job.step;
    outcome.reprotect = true;
    absl::StatusOr<Snapshotter::View> view = snapshotter_->ViewOf(job.step);
    if (!view.ok()) {
      outcome.status = view.status();
      return outcome;
    }
    const absl::Time start = absl::Now();
    outcome.status =
        peers_->Replicate(*view, options_.chunk_bytes, snapshotter_->payload_capacity());
    outcome.replicate_time = absl::Now() - start;
    outcome.replicated = outcome.status.ok();
    if (!outcome.status.ok()) return outcome;
    // Every rank's vote: the last one to vote sees the job protected again.
    absl::StatusOr<std::optional<Ballot>> ballot = CastVote(job, "protected", "1");
    if (!ballot.ok()) {
      outcome.status = ballot.status();
      return outcome;
    }
    if (!ballot->has_value()) return outcome;  // a later voter sees it
    (*ballot)->Clear(store_.get(), options_.timeout);
    outcome.protected_again = MarkProtected(job.step, job.epoch);
    return outcome;
  }

  // The fingerprint of the arena's snapshot of `step` (the committed one a save keeps), for the
  // holders to keep its backup; 0 when there is none.
  uint64_t KeptFingerprint(std::optional<int64_t> step) const {
    if (!step.has_value()) return 0;
    for (const SnapshotInfo& info : snapshotter_->CompleteSnapshots()) {
      if (info.step == *step) return info.fingerprint;
    }
    return 0;
  }

  // Records that every rank's snapshot of `step` has all its copies: ckpt/protected = "STEP EPOCH"
  // (the host agents report it). True when this call changed it (the first in the epoch). Once
  // this rank has seen the epoch protected, later commits only move the step: one Set, no Get.
  bool MarkProtected(int64_t step, const std::string& epoch) {
    const std::string value = absl::StrCat(step, " ", epoch);
    if (protected_epoch_ == epoch) {
      (void)store_->Set("protected", value, options_.timeout);
      return false;
    }
    absl::StatusOr<std::string> old = store_->Get("protected", options_.timeout);
    const bool already = old.ok() && absl::StrContains(*old, absl::StrCat(" ", epoch));
    const bool set = store_->Set("protected", value, options_.timeout).ok();
    if (set) protected_epoch_ = epoch;
    return set && !already;
  }

  // A rank whose shard could not be written keeps training (the step is just never committed on
  // disk), so the failure would be seen only in its event file: it is also published under
  // job/persist_failed/<step, 12 digits>/<rank> for the launcher to print. Best effort, bounded.
  void PublishPersistFailure(int64_t step, const absl::Status& status) {
    if (options_.store == nullptr) return;
    // The job's store itself, not store_ ("ckpt/"): the key belongs to the launcher's namespace.
    (void)options_.store->Set(
        store_keys::JobPersistFailed(step, options_.rank),
        absl::StrFormat("rank %d step %d: %s", options_.rank, step, status.message()),
        std::min(options_.timeout, absl::Seconds(10)));
  }

  // Records this rank's `kind` ("snapshot" or "durable") of the job's step; the rank that completes
  // the set of votes commits the step. Returns whether the step is now committed. Without a store a
  // single-rank job commits at once; a multi-rank static job has no job-wide record (restore reads
  // the disk).
  // A vote is the snapshot's fingerprint followed by its replica part (replica_check.h); the
  // commit record keeps the fingerprints. A ballot whose replicas disagree commits nothing:
  // `disagreements` is filled on the rank that judges a snapshot ballot, `rejected` set on every
  // rank that saw such a ballot complete.
  absl::StatusOr<bool> Vote(const Job& job, absl::string_view kind, const std::string& vote,
                            std::vector<ReplicaDisagreement>* disagreements = nullptr,
                            bool* rejected = nullptr) {
    if (store_ == nullptr) return options_.world_size == 1;
    absl::StatusOr<std::optional<Ballot>> ballot = CastVote(job, kind, vote);
    if (!ballot.ok()) return ballot.status();
    if (!ballot->has_value()) return false;  // a later voter commits
    std::vector<std::string> fingerprints;
    std::vector<ReplicaReport> reports;
    std::vector<ReplicaReport> canaries;
    for (size_t r = 0; r < (*ballot)->values.size(); ++r) {
      const std::string& value = (*ballot)->values[r];
      fingerprints.push_back(value.substr(0, value.find(' ')));
      absl::StatusOr<std::optional<ReplicaReport>> report =
          DecodeReplicaVote(static_cast<int>(r), value);
      absl::StatusOr<std::optional<ReplicaReport>> canary =
          DecodeCanaryVote(static_cast<int>(r), value);
      for (const absl::StatusOr<std::optional<ReplicaReport>>* part : {&report, &canary}) {
        if (!part->ok()) {
          return absl::DataLossError(absl::StrFormat("%s: the ballot of step %d: %s", Where(),
                                                     job.step, part->status().message()));
        }
      }
      if (report->has_value()) reports.push_back(**report);
      if (canary->has_value()) canaries.push_back(**canary);
    }
    // A canary that differs says the machine's arithmetic is wrong, not that this step's state
    // is: it is reported (by one rank) and does not hold the commit up.
    std::vector<ReplicaDisagreement> canary;
    if (kind == "snapshot") canary = JudgeReplicas(canaries);
    if (std::vector<ReplicaDisagreement> judged = JudgeReplicas(reports); !judged.empty()) {
      // Never committed, in memory or on disk. The snapshot ballot's judge names the ranks.
      if (kind != "snapshot") return false;
      // Every rank's shard of the step may reach the disk (a rank persists after voting): the
      // restore's leader skips a step of these fingerprints (LeaderCandidates).
      (void)store_->Set(RejectedKey(job.step), absl::StrJoin(fingerprints, ","), options_.timeout);
      // One rank judges (the first to claim it); another that also saw the ballot complete
      // answers the judge's request for digests like any rank.
      absl::StatusOr<int64_t> claim = store_->Add(JudgeKey(job), 1, options_.timeout);
      if (claim.ok() && *claim == 1) {
        PruneRejected();
        NameDifferingBuffers(job, judged);
        judged.insert(judged.end(), canary.begin(), canary.end());
        RecordVerdict(job, judged);
        if (disagreements != nullptr) *disagreements = std::move(judged);
        (*ballot)->Clear(store_.get(), options_.timeout);
      }
      if (rejected != nullptr) *rejected = true;
      return false;
    }
    if (!canary.empty()) {
      absl::StatusOr<int64_t> claim = store_->Add(
          absl::StrCat("sdc/", job.epoch, "/", job.step, "/canary"), 1, options_.timeout);
      if (claim.ok() && *claim == 1) {
        RecordVerdict(job, canary);
        if (disagreements != nullptr) *disagreements = std::move(canary);
      }
    }
    const std::string record =
        absl::StrCat(job.step, " store:", kind, " ", absl::StrJoin(fingerprints, ","));
    if (absl::Status set = store_->Set(CommitKey(job.step, kind), record, options_.timeout);
        !set.ok()) {
      return set;
    }
    (*ballot)->Clear(store_.get(), options_.timeout);
    PruneCommits(kind);
    return true;
  }

  // Waits until the snapshot ballot of `job` is judged: true when its replicas disagreed (the
  // judge's claim exists), false when it was committed, and false (persist, as without the
  // comparison) when neither happened within kJudgementWait (a rank that skipped this save,
  // being busy with its previous one, never votes for it), the generation was superseded or a
  // restore began. A step rejected after that is still never committed or restored (the durable
  // ballot and the restore's leader check its replicas too).
  bool AwaitJudgement(const Job& job) {
    const std::vector<std::string> keys = {CommitKey(job.step, "snapshot"), JudgeKey(job)};
    const absl::Time deadline = absl::Now() + std::min(options_.timeout, kJudgementWait);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<std::optional<std::string>>> got =
          store_->MultiGet(keys, std::min(options_.timeout, kCommitPoll * 10));
      if (got.ok() && (*got)[1].has_value()) return true;
      if (got.ok() && (*got)[0].has_value()) return false;
      if (judgement_cancelled_.load() || (options_.superseded && options_.superseded())) {
        return false;
      }
      absl::SleepFor(kCommitPoll);
    }
    return false;
  }

  // The judge's request `want` ("R,R,...") for the digests of `voted`'s step: this rank's are
  // published if it is named; either way the request is answered and `voted` is dropped.
  void AnswerWant(const VotedReplica& voted, const std::string& want) {
    for (absl::string_view r : absl::StrSplit(want, ',')) {
      int rank;
      if (absl::SimpleAtoi(r, &rank) && rank == options_.rank) {
        (void)store_->Set(DigestKey(voted.epoch, voted.step, options_.rank),
                          EncodeDigests(voted.digests), options_.timeout);
      }
    }
    MutexLock lock(&mu_);
    voted_.erase(std::remove_if(voted_.begin(), voted_.end(),
                                [&](const VotedReplica& v) {
                                  return v.step == voted.step && v.epoch == voted.epoch;
                                }),
                 voted_.end());
  }

  // Publishes this rank's replica digests of `job` if the judge asks for them within
  // kJudgementWait.
  void AnswerDigestRequest(const Job& job) {
    std::optional<VotedReplica> voted;
    {
      MutexLock lock(&mu_);
      for (const VotedReplica& v : voted_) {
        if (v.step == job.step && v.epoch == job.epoch) voted = v;
      }
    }
    if (!voted.has_value()) return;
    const absl::Time deadline = absl::Now() + std::min(options_.timeout, kJudgementWait);
    while (absl::Now() < deadline && !judgement_cancelled_.load()) {
      absl::StatusOr<std::string> want = store_->Get(DigestWantKey(job.epoch, job.step),
                                                     std::min(options_.timeout, kCommitPoll * 10));
      if (want.ok()) {
        AnswerWant(*voted, *want);
        return;
      }
      absl::SleepFor(kCommitPoll);
    }
  }

  // A job whose replicas keep disagreeing (silent_corruption=alert) rejects a step at every
  // snapshot: the judge keeps the records of the newest kKeptRejections rejected steps (ckpt/
  // rejected/ and the judges' claims), enough for the restore to skip whatever was persisted
  // unjudged. Best effort.
  void PruneRejected() {
    constexpr size_t kKeptRejections = 16;
    absl::StatusOr<std::vector<std::string>> rejected =
        store_->ListKeys("rejected/", options_.timeout);
    absl::StatusOr<std::vector<std::string>> claims = store_->ListKeys("sdc/", options_.timeout);
    if (!rejected.ok() || !claims.ok()) return;
    std::vector<int64_t> steps;
    for (const std::string& key : *rejected) {
      int64_t step;
      if (absl::SimpleAtoi(absl::StripPrefix(key, "rejected/"), &step)) steps.push_back(step);
    }
    if (steps.size() <= kKeptRejections) return;
    std::sort(steps.rbegin(), steps.rend());
    const int64_t oldest_kept = steps[kKeptRejections - 1];
    for (int64_t step : steps) {
      if (step < oldest_kept) (void)store_->Delete(RejectedKey(step), options_.timeout);
    }
    for (const std::string& key : *claims) {  // sdc/<epoch>/<step>/judge
      std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
      int64_t step;
      if (parts.size() == 4 && parts[3] == "judge" && absl::SimpleAtoi(parts[2], &step) &&
          step < oldest_kept) {
        (void)store_->Delete(key, options_.timeout);
      }
    }
  }

  // Claimed (Add) by every rank that saw a disagreeing snapshot ballot of `job` complete; the
  // first claim judges.
  static std::string JudgeKey(const Job& job) {
    return absl::StrCat("sdc/", job.epoch, "/", job.step, "/judge");
  }
  // A snapshot step whose replicas disagreed: "<fingerprint of rank 0>,<of rank 1>,...".
  static std::string RejectedKey(int64_t step) { return absl::StrCat("rejected/", step); }
  static std::string DigestWantKey(const std::string& epoch, int64_t step) {
    return absl::StrCat("sdc/", epoch, "/", step, "/want");
  }
  static std::string DigestKey(const std::string& epoch, int64_t step, int rank) {
    return absl::StrCat("sdc/", epoch, "/", step, "/digests/", rank);
  }

  // The judge of a ballot whose replicas disagree: asks the ranks of each disagreeing group for
  // their replica digests (answered by their workers within a commit poll) and names the buffers
  // that differ. Waits at most replica_digest_wait; a group whose digests did not all arrive is
  // reported without its buffers.
  void NameDifferingBuffers(const Job& job, std::vector<ReplicaDisagreement>& judged) {
    // Which rank's digests are compared with which: each minority rank with the reference;
    // undecidable, each rank with the group's first.
    std::vector<std::vector<std::pair<int, int>>> pairs(judged.size());
    std::vector<int> wanted;
    for (size_t g = 0; g < judged.size(); ++g) {
      const ReplicaDisagreement& d = judged[g];
      if (d.majority.has_value()) {
        for (int r : d.minority) pairs[g].emplace_back(r, d.reference);
      } else {
        for (size_t i = 1; i < d.ranks.size(); ++i) pairs[g].emplace_back(d.ranks[i], d.ranks[0]);
      }
      for (const auto& [a, b] : pairs[g]) {
        for (int r : {a, b}) {
          if (std::find(wanted.begin(), wanted.end(), r) == wanted.end()) wanted.push_back(r);
        }
      }
    }
    std::sort(wanted.begin(), wanted.end());
    std::map<int, std::vector<uint64_t>> digests;
    {
      MutexLock lock(&mu_);
      for (const VotedReplica& v : voted_) {
        if (v.step == job.step && v.epoch == job.epoch) digests[options_.rank] = v.digests;
      }
    }
    std::vector<std::string> keys;
    std::vector<int> asked;
    for (int r : wanted) {
      if (digests.count(r) > 0) continue;
      keys.push_back(DigestKey(job.epoch, job.step, r));
      asked.push_back(r);
    }
    if (!keys.empty()) {
      (void)store_->Set(DigestWantKey(job.epoch, job.step), absl::StrJoin(asked, ","),
                        options_.timeout);
      const absl::Time deadline = absl::Now() + options_.replica_digest_wait;
      while (true) {
        absl::StatusOr<std::vector<std::optional<std::string>>> got =
            store_->MultiGet(keys, std::min(options_.timeout, kCommitPoll * 10));
        bool all = got.ok();
        for (size_t i = 0; got.ok() && i < keys.size(); ++i) {
          if (!(*got)[i].has_value()) {
            all = false;
            continue;
          }
          absl::StatusOr<std::vector<uint64_t>> d = DecodeDigests(*(*got)[i]);
          if (d.ok()) digests[asked[i]] = *std::move(d);
        }
        if (all || absl::Now() >= deadline) break;
        absl::SleepFor(kCommitPoll);
      }
      (void)store_->Delete(DigestWantKey(job.epoch, job.step), options_.timeout);
      for (const std::string& key : keys) (void)store_->Delete(key, options_.timeout);
    }
    const std::vector<Snapshotter::ReplicaPiece>& pieces = snapshotter_->replica_pieces();
    for (size_t g = 0; g < judged.size(); ++g) {
      ReplicaDisagreement& d = judged[g];
      std::vector<int> absent;
      for (const auto& [a, b] : pairs[g]) {
        for (int r : {a, b}) {
          if (digests.count(r) == 0 && std::find(absent.begin(), absent.end(), r) == absent.end())
            absent.push_back(r);
        }
      }
      if (!absent.empty()) {
        d.digests_missing = absl::StrFormat(
            "the replica digests of rank(s) %s did not arrive within %s",
            absl::StrJoin(absent, ","), absl::FormatDuration(options_.replica_digest_wait));
      } else {
        for (const auto& [a, b] : pairs[g]) {
          d.buffers.push_back(DifferingBuffers(pieces, digests[a], digests[b]));
        }
      }
    }
  }

  // The verdict on the ballot of `job`, for `trainguard run` (job/silent_corruption).
  void RecordVerdict(const Job& job, const std::vector<ReplicaDisagreement>& verdict) {
    (void)options_.store->Set(
        store_keys::kJobSilentCorruption,
        VerdictRecord(absl::StrCat(job.epoch, "/", job.step), job.step, verdict),
        std::min(options_.timeout, absl::Seconds(10)));
  }

  // Every rank's vote of one kind on one step of an epoch, once all are in.
  struct Ballot {
    std::vector<std::string> keys;    // e/<epoch>/<step>/<kind>/<rank>, rank order
    std::vector<std::string> values;  // the votes, rank order
    // The votes are no longer needed once the outcome is recorded. Best effort.
    void Clear(Store* store, absl::Duration timeout) const {
      for (const std::string& key : keys) (void)store->Delete(key, timeout);
    }
  };

  // Records this rank's `value` for `kind` of the job's step and reads every rank's: the ballot
  // when all ranks have voted (this rank was the last, or one of the last, to vote), nullopt when
  // some vote is still missing (a later voter will see the ballot complete).
  absl::StatusOr<std::optional<Ballot>> CastVote(const Job& job, absl::string_view kind,
                                                 const std::string& value) {
    const std::string base = absl::StrCat("e/", job.epoch, "/", job.step, "/", kind, "/");
    if (absl::Status set = store_->Set(absl::StrCat(base, options_.rank), value, options_.timeout);
        !set.ok()) {
      return absl::Status(set.code(), absl::StrFormat("%s: recording the %s of step %d: %s",
                                                      Where(), kind, job.step, set.message()));
    }
    Ballot ballot;
    for (int r = 0; r < options_.world_size; ++r) ballot.keys.push_back(absl::StrCat(base, r));
    absl::StatusOr<std::vector<std::optional<std::string>>> votes =
        store_->MultiGet(ballot.keys, options_.timeout);
    if (!votes.ok()) return votes.status();
    for (const std::optional<std::string>& v : *votes) {
      if (!v.has_value()) return std::optional<Ballot>();
      ballot.values.push_back(*v);
    }
    return std::optional<Ballot>(std::move(ballot));
  }


  // The arena holds two snapshots, the disk keep_last steps: older commit records name state that
  // no longer exists.
  void PruneCommits(absl::string_view kind) {
    std::vector<std::pair<int64_t, std::string>> mine = CommitKeys(kind);
    std::sort(mine.rbegin(), mine.rend());
    const size_t keep = kind == "snapshot" ? 2 : static_cast<size_t>(options_.keep_last);
    for (size_t i = keep; i < mine.size(); ++i)
      (void)store_->Delete(mine[i].second, options_.timeout);
  }

  // After the job rolled back to `step`, the snapshot commits of newer steps name a timeline
  // that was abandoned: the arenas overwrite those snapshots as the job goes on. Left in place
  // they would also outrank the new timeline's commits in PruneCommits (which keeps the newest
  // steps), so that a fault soon after a rollback found no snapshot in memory and restored from
  // disk. Rank 0 drops them before its next vote, and no step of the new timeline is committed
  // without that vote, so none of its commits is dropped. Durable commits stay: their shards are
  // still on disk. Best effort.
  void DropSnapshotCommitsAfter(int64_t step) {
    for (const auto& [committed, key] : CommitKeys("snapshot")) {
      if (committed > step) (void)store_->Delete(key, options_.timeout);
    }
  }

  // The store's commit records of `kind` ("commit/<step>/<kind>") with their steps; none when the
  // store cannot list them.
  std::vector<std::pair<int64_t, std::string>> CommitKeys(absl::string_view kind) {
    std::vector<std::pair<int64_t, std::string>> out;
    absl::StatusOr<std::vector<std::string>> keys = store_->ListKeys("commit/", options_.timeout);
    if (!keys.ok()) return out;
    for (const std::string& key : *keys) {
      std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
      int64_t step;
      if (parts.size() == 3 && parts[2] == kind && absl::SimpleAtoi(parts[1], &step)) {
        out.emplace_back(step, key);
      }
    }
    return out;
  }

  // ---- restore ----

  // Committed steps recorded in the store, newest first; "snapshot" before "durable" for a step.
  absl::StatusOr<std::vector<Candidate>> StoreCommits() {
    absl::StatusOr<std::vector<std::string>> keys = store_->ListKeys("commit/", options_.timeout);
    if (!keys.ok()) return keys.status();
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        store_->MultiGet(*keys, options_.timeout);
    if (!values.ok()) return values.status();
    std::vector<Candidate> out;
    for (const std::optional<std::string>& v : *values) {
      if (!v.has_value()) continue;  // pruned meanwhile
      absl::StatusOr<std::vector<Candidate>> c = DecodeCandidates(*v, options_.world_size);
      if (!c.ok()) {
        return absl::DataLossError(
            absl::StrFormat("%s: the store's commit record: %s", Where(), c.status().message()));
      }
      out.insert(out.end(), c->begin(), c->end());
    }
    SortCandidates(out);
    return out;
  }

  static void SortCandidates(std::vector<Candidate>& c) {
    std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
      if (a.step != b.step) return a.step > b.step;
      return a.origin > b.origin;  // "store:snapshot" > "store:durable" > "disk"
    });
    c.erase(std::unique(c.begin(), c.end(),
                        [](const Candidate& a, const Candidate& b) {
                          return a.step == b.step && a.fingerprints == b.fingerprints;
                        }),
            c.end());
  }

  // This rank's committed shards on disk as "step:fingerprint" lines.
  absl::StatusOr<std::vector<ShardRecord>> MyShards() {
    if (options_.dir.empty()) return std::vector<ShardRecord>{};
    absl::StatusOr<std::vector<ShardRecord>> all = ListCommittedShards(env_, options_.dir);
    if (!all.ok()) return all.status();
    std::vector<ShardRecord> mine;
    for (ShardRecord& r : *all) {
      if (r.rank == options_.rank) mine.push_back(std::move(r));
    }
    return mine;
  }

  // Without a store: every step whose shards of all ranks are committed on disk; a single-rank job
  // also counts its arena snapshots.
  absl::StatusOr<std::vector<Candidate>> StaticCandidates() {
    std::map<int64_t, std::vector<std::optional<uint64_t>>> by_step;
    if (!options_.dir.empty()) {
      absl::StatusOr<std::vector<ShardRecord>> all = ListCommittedShards(env_, options_.dir);
      if (!all.ok()) return all.status();
      for (const ShardRecord& r : *all) {
        if (r.rank < 0 || r.rank >= options_.world_size) continue;
        auto& fps = by_step[r.step];
        fps.resize(options_.world_size);
        fps[r.rank] = FingerprintOf(r);
      }
    }
    std::vector<Candidate> out;
    for (const auto& [step, fps] : by_step) {
      Candidate c{step, "disk", {}};
      for (const std::optional<uint64_t>& fp : fps) {
        if (fp) c.fingerprints.push_back(*fp);
      }
      if (static_cast<int>(c.fingerprints.size()) == options_.world_size) out.push_back(c);
    }
    if (options_.world_size == 1) {
      for (const SnapshotInfo& info : snapshotter_->CompleteSnapshots()) {
        out.push_back(Candidate{info.step, "store:snapshot", {info.fingerprint}});
      }
    }
    SortCandidates(out);
    return out;
  }

  absl::StatusOr<RestoreResult> RestoreAlone() {
    absl::StatusOr<std::vector<Candidate>> candidates = StaticCandidates();
    if (!candidates.ok()) return candidates.status();
    RestoreResult result;
    for (size_t i = 0; i < candidates->size(); ++i) {
      const Candidate& c = (*candidates)[i];
      absl::StatusOr<RestoreResult> r = TryCandidate(*candidates, i);
      if (r.ok()) {
        r->skipped.insert(r->skipped.begin(), result.skipped.begin(), result.skipped.end());
        return r;
      }
      result.skipped.push_back(absl::StrCat("step ", c.step, ": ", r.status().ToString()));
    }
    return NothingToRestore(result.skipped);
  }

  absl::Status NothingToRestore(const std::vector<std::string>& skipped) const {
    return absl::NotFoundError(
        absl::StrFormat("%s: no committed checkpoint can be restored%s%s", Where(),
                        skipped.empty() ? "" : "; tried: ", absl::StrJoin(skipped, "; ")));
  }

  static RestoreResult Restored(int64_t step, std::string source, uint64_t fingerprint) {
    RestoreResult result;
    result.step = step;
    result.source = std::move(source);
    result.fingerprint = fingerprint;
    return result;
  }

  // Restores candidate `index` of `candidates` for this rank: its arena snapshot when the
  // fingerprint matches, else a verified backup from one of its holders, else its verified shard
  // on disk. A backup or shard installed in the arena overwrites neither slot that holds a later
  // candidate, if it can: when another rank cannot restore this one, the next may be in memory.
  absl::StatusOr<RestoreResult> TryCandidate(const std::vector<Candidate>& candidates,
                                             size_t index) {
    const Candidate& c = candidates[index];
    std::vector<int64_t> later;
    for (size_t i = index + 1; i < candidates.size(); ++i) later.push_back(candidates[i].step);
    snapshotter_->set_install_keep(std::move(later));
    absl::Cleanup no_keep = [this] { snapshotter_->set_install_keep({}); };
    const uint64_t want = c.fingerprints[options_.rank];
    // Good for the first candidate tried only: a restore may write the buffers from here on.
    const std::optional<Ahead> ahead = std::exchange(ahead_, std::nullopt);
    if (ahead.has_value() && ahead->step == c.step && ahead->fingerprint == want) {
      // RestoreAhead copied it, and nothing wrote the buffers since (see there).
      RestoreResult result = Restored(c.step, "arena", want);
      result.copy_time = ahead->took;
      result.bytes_held = ahead->bytes_held;
      result.copied_ahead = true;
      return result;
    }
    std::string why = "not in the arena";
    for (const SnapshotInfo& info : snapshotter_->CompleteSnapshots()) {
      if (info.step != c.step) continue;
      if (info.fingerprint != want) {
        why = absl::StrFormat("the arena's snapshot has fingerprint %016x, the commit %016x",
                              info.fingerprint, want);
        continue;
      }
      const absl::Time copy_start = absl::Now();
      absl::StatusOr<SnapshotInfo> restored = snapshotter_->RestoreStep(registry_, c.step);
      if (restored.ok()) {
        RestoreResult result = Restored(c.step, "arena", want);
        result.copy_time = absl::Now() - copy_start;
        result.bytes_held = restored->restored_bytes_held;
        return result;
      }
      why = restored.status().ToString();
    }
    std::string peers_why;
    if (peers_ != nullptr) {
      // The buffers take each chunk as it lands: the copy runs beside the transfer, not after
      // it. If the fetch fails, the disk (or the next candidate) overwrites what it wrote.
      const absl::Time fetch_start = absl::Now();
      absl::StatusOr<PeerRestore> peer =
          peers_->Restore(c.step, want, snapshotter_.get(), registry_);
      if (peer.ok()) {
        RestoreResult result =
            Restored(c.step,
                     absl::StrCat(peer->holder_hosts.size() == 1 ? "peer host " : "peer hosts ",
                                  absl::StrJoin(peer->holder_hosts, ",")),
                     want);
        result.fetch_time = absl::Now() - fetch_start;  // the copy is within it
        return result;
      }
      peers_why = std::string(peer.status().message());
    }
    absl::StatusOr<std::vector<ShardRecord>> shards = MyShards();
    if (!shards.ok()) return shards.status();
    for (const ShardRecord& r : *shards) {
      if (r.step != c.step || FingerprintOf(r) != want) continue;
      const absl::Time read_start = absl::Now();
      absl::StatusOr<std::string> payload = ReadShardPayload(env_, r);
      if (!payload.ok()) return payload.status();  // names file, offset, rank and step
      absl::StatusOr<SnapshotInfo> installed =
          snapshotter_->Install(r.step, r.generation, *payload, r.chunk_checksums);
      if (!installed.ok()) return installed.status();
      const absl::Time copy_start = absl::Now();
      absl::StatusOr<SnapshotInfo> restored = snapshotter_->RestoreStep(registry_, c.step);
      if (!restored.ok()) return restored.status();
      RestoreResult result = Restored(c.step, "disk", want);
      result.fetch_time = copy_start - read_start;
      result.copy_time = absl::Now() - copy_start;
      result.bytes_held = restored->restored_bytes_held;
      // Why the peers' memory did not serve it (a holder lost with the host, a corrupt backup).
      if (peers_ != nullptr) {
        result.skipped.push_back(
            absl::StrCat("step ", c.step, " from peer memory: ", peers_why));
      }
      return result;
    }
    return absl::NotFoundError(absl::StrFormat(
        "rank %d has no snapshot of step %d with fingerprint %016x (arena: %s;%s disk: no such "
        "committed shard in %s)",
        options_.rank, c.step, want, why,
        peers_ != nullptr ? absl::StrCat(" peers: ", peers_why, ";") : "",
        options_.dir.empty() ? "(none)" : options_.dir));
  }

  // While rank 0 waits for every rank to join the collective restore (a replacement joins last:
  // its process starts, its checkpointer is made), a rank whose arena holds a committed snapshot
  // copies the newest one back into its buffers: the ranks almost always agree on it, and the
  // copy is then done before the replacement's fetch begins instead of beside it, on the same
  // cores. Only the training thread writes the registered buffers (the snapshot contract), and it
  // is in this restore until TryCandidate, which takes the copy when the agreed step and
  // fingerprint are this one's, and restores what was agreed otherwise.
  void RestoreAhead() {
    ahead_.reset();
    absl::StatusOr<std::vector<Candidate>> commits = StoreCommits();
    if (!commits.ok()) return;
    const std::vector<SnapshotInfo> in_arena = snapshotter_->CompleteSnapshots();
    for (const Candidate& c : *commits) {
      for (const SnapshotInfo& info : in_arena) {
        if (info.step != c.step || info.fingerprint != c.fingerprints[options_.rank]) continue;
        const absl::Time start = absl::Now();
        absl::StatusOr<SnapshotInfo> restored = snapshotter_->RestoreStep(registry_, c.step);
        if (restored.ok()) {
          ahead_ =
              Ahead{c.step, info.fingerprint, absl::Now() - start, restored->restored_bytes_held};
        }
        return;  // the newest only: an older one is restored once agreed
      }
    }
  }

  absl::StatusOr<RestoreResult> RestoreTogether(const std::string& epoch) {
    const absl::Duration t = options_.timeout;
    const absl::Time start = absl::Now();
    // Every rank says which shards it has on disk, so a job restarted with an empty store still
    // finds the steps every rank persisted.
    absl::StatusOr<std::vector<ShardRecord>> shards = MyShards();
    if (!shards.ok()) return shards.status();
    std::vector<std::string> have;
    for (const ShardRecord& r : *shards)
      have.push_back(absl::StrCat(r.step, ":", Hex(FingerprintOf(r))));
    if (absl::Status s =
            store_->Set(absl::StrCat(epoch, "/disk/", options_.rank), absl::StrJoin(have, ","), t);
        !s.ok()) {
      return s;
    }
    const std::string candidates_key = absl::StrCat(epoch, "/candidates");
    RestoreAhead();
    absl::Cleanup no_ahead = [this] { ahead_.reset(); };
    if (options_.rank == 0) {
      absl::StatusOr<std::vector<Candidate>> candidates = LeaderCandidates(epoch);
      if (!candidates.ok()) return candidates.status();
      if (absl::Status s = store_->Set(candidates_key, EncodeCandidates(*candidates), t); !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = WaitInGeneration({candidates_key}, t); !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrFormat("%s: waiting for rank 0's restore candidates: %s", Where(), s.message()));
    }
    absl::StatusOr<std::string> text = store_->Get(candidates_key, t);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<Candidate>> candidates =
        DecodeCandidates(*text, options_.world_size);
    if (!candidates.ok()) return candidates.status();
    const absl::Duration candidates_wait = absl::Now() - start;

    std::vector<std::string> skipped;
    for (size_t round = 0; round < candidates->size(); ++round) {
      const Candidate& c = (*candidates)[round];
      absl::StatusOr<RestoreResult> mine = TryCandidate(*candidates, round);
      const std::string base = absl::StrCat(epoch, "/round", round, "/");
      const std::string vote = mine.ok() ? "ok" : absl::StrCat("fail: ", mine.status().ToString());
      if (absl::Status s = store_->Set(absl::StrCat(base, options_.rank), vote, t); !s.ok()) {
        return s;
      }
      std::vector<std::string> keys;
      for (int r = 0; r < options_.world_size; ++r) keys.push_back(absl::StrCat(base, r));
      if (absl::Status s = WaitInGeneration(keys, t); !s.ok()) {
        return absl::Status(s.code(), absl::StrFormat("%s: restore round for step %d: %s", Where(),
                                                      c.step, s.message()));
      }
      absl::StatusOr<std::vector<std::optional<std::string>>> votes = store_->MultiGet(keys, t);
      if (!votes.ok()) return votes.status();
      std::vector<std::string> failures;
      for (int r = 0; r < options_.world_size; ++r) {
        const std::optional<std::string>& v = (*votes)[r];
        if (!v.has_value() || *v != "ok") {
          failures.push_back(absl::StrCat("rank ", r, ": ", v.value_or("no answer")));
        }
      }
      if (failures.empty()) {
        mine->skipped.insert(mine->skipped.begin(), skipped.begin(), skipped.end());
        mine->candidates_wait = candidates_wait;
        return mine;
      }
      skipped.push_back(absl::StrCat("step ", c.step, ": ", absl::StrJoin(failures, "; ")));
    }
    return NothingToRestore(skipped);
  }

  // store_->Wait(keys, timeout) until the generation is superseded (WaitUnlessSuperseded): a rank
  // that died during the restore never writes its keys. Aborted then.
  absl::Status WaitInGeneration(const std::vector<std::string>& keys, absl::Duration timeout) {
    absl::Status s = WaitUnlessSuperseded(*store_, keys, timeout, options_.superseded);
    if (absl::IsAborted(s)) {
      return absl::AbortedError(
          "a newer generation was published while the ranks restored together (a rank died): "
          "restore again in the newer generation");
    }
    return s;
  }

  absl::StatusOr<std::vector<Candidate>> LeaderCandidates(const std::string& epoch) {
    absl::StatusOr<std::vector<Candidate>> out = StoreCommits();
    if (!out.ok()) return out.status();
    std::vector<std::string> keys;
    for (int r = 0; r < options_.world_size; ++r) keys.push_back(absl::StrCat(epoch, "/disk/", r));
    if (absl::Status s = WaitInGeneration(keys, options_.timeout); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("%s: waiting for every rank's shard list: %s",
                                                    Where(), s.message()));
    }
    absl::StatusOr<std::vector<std::optional<std::string>>> lists =
        store_->MultiGet(keys, options_.timeout);
    if (!lists.ok()) return lists.status();
    std::map<int64_t, std::vector<std::optional<uint64_t>>> by_step;
    for (int r = 0; r < options_.world_size; ++r) {
      for (absl::string_view item :
           absl::StrSplit((*lists)[r].value_or(""), ',', absl::SkipEmpty())) {
        std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, ':');
        int64_t step;
        std::optional<uint64_t> fp = ParseHex(kv.second);
        if (!absl::SimpleAtoi(kv.first, &step) || !fp) continue;
        auto& fps = by_step[step];
        fps.resize(options_.world_size);
        fps[r] = *fp;
      }
    }
    for (const auto& [step, fps] : by_step) {
      Candidate c{step, "disk", {}};
      for (const std::optional<uint64_t>& fp : fps) {
        if (fp) c.fingerprints.push_back(*fp);
      }
      if (static_cast<int>(c.fingerprints.size()) == options_.world_size) out->push_back(c);
    }
    // Never a snapshot whose replicas disagreed (silent data corruption), though every rank's
    // shard of it is on disk. The same step of a later timeline has other fingerprints.
    absl::StatusOr<std::vector<std::string>> rejected_keys =
        store_->ListKeys("rejected/", options_.timeout);
    if (!rejected_keys.ok()) return rejected_keys.status();
    if (!rejected_keys->empty()) {
      absl::StatusOr<std::vector<std::optional<std::string>>> rejected =
          store_->MultiGet(*rejected_keys, options_.timeout);
      if (!rejected.ok()) return rejected.status();
      out->erase(std::remove_if(out->begin(), out->end(),
                                [&](const Candidate& c) {
                                  const std::string fps = absl::StrJoin(
                                      c.fingerprints, ",",
                                      [](std::string* o, uint64_t fp) { o->append(Hex(fp)); });
                                  for (const std::optional<std::string>& r : *rejected) {
                                    if (r.has_value() && *r == fps) return true;
                                  }
                                  return false;
                                }),
                 out->end());
    }
    SortCandidates(*out);
    return out;
  }

  StateRegistry* const registry_;
  const PayloadLayout layout_;  // recorded in every manifest, for `trainguard ckpt export`
  const CheckpointerOptions options_;
  Env* const env_;
  const std::unique_ptr<Snapshotter> snapshotter_;
  const std::unique_ptr<Persister> persister_;  // nullptr without a directory
  const std::unique_ptr<PeerBackups> peers_;    // nullptr without peer backups
  const std::unique_ptr<Store> store_;          // "ckpt/" in the job's store; nullptr if none

  Mutex mu_;
  std::optional<Job> job_ ABSL_GUARDED_BY(mu_);
  bool job_running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t saves_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_);
  int64_t restores_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const SaveOutcome&)> observer_ ABSL_GUARDED_BY(mu_);
  // The newest step this rank knows is committed in memory (it completed the vote, saw the
  // commit record, or restored it), -1 if none; and the steps it voted for whose commit it has not
  // seen yet (at most 2, the arena's slots).
  int64_t known_committed_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> unresolved_ ABSL_GUARDED_BY(mu_);
  // This rank's replica digests of its last snapshot votes (at most 2), until a judge asked for
  // them or the step was resolved.
  std::vector<VotedReplica> voted_ ABSL_GUARDED_BY(mu_);
  // Set while a restore waits for the worker: AwaitJudgement gives up.
  std::atomic<bool> judgement_cancelled_{false};
  uint64_t timeline_ ABSL_GUARDED_BY(mu_) = 0;  // restores done: a new timeline starts at each
  // The snapshot RestoreAhead copied into the buffers during the restore in progress; the
  // training thread's only.
  struct Ahead {
    int64_t step;
    uint64_t fingerprint;
    absl::Duration took;
    uint64_t bytes_held;
  };
  std::optional<Ahead> ahead_;
  // The epoch this rank last saw protected (MarkProtected); the worker thread's only.
  std::string protected_epoch_;
  std::thread worker_;  // last: started after every other member is initialised
};

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(
    StateRegistry* registry, const CheckpointerOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("checkpointer: rank %d is out of range [0, world_size=%d)", options.rank,
                        options.world_size));
  }
  if (options.persist_every < 0 || options.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("checkpointer: persist_every %d must be >= 0 and keep_last %d >= 1",
                        options.persist_every, options.keep_last));
  }
  SnapshotterOptions so;
  so.job_id = options.job_id;
  so.rank = options.rank;
  so.generation = options.generation;
  so.copy_threads = options.copy_threads;
  so.chunk_bytes = options.chunk_bytes;
  so.env = options.env;
  so.keep_arena_of_other_layout = options.keep_arena_of_other_layout;
  so.spare_arena = options.spare_arena;
  // The rank's previous process may still be exiting (its children too, which share the arena's
  // lock): as long as an agent waits for a killed process to be reaped.
  so.arena_lock_wait = std::min(options.timeout, kArenaLockWait);
  absl::StatusOr<std::unique_ptr<Snapshotter>> snapshotter = Snapshotter::Create(registry, so);
  if (!snapshotter.ok()) return snapshotter.status();
  std::unique_ptr<Persister> persister;
  if (!options.dir.empty()) {
    PersisterOptions po;
    po.dir = options.dir;
    po.chunk_bytes = options.chunk_bytes;
    po.keep_last = options.keep_last;
    po.world_size = options.world_size;
    po.use_io_uring = options.use_io_uring;
    po.env = options.env;
    absl::StatusOr<std::unique_ptr<Persister>> p = Persister::Create(po);
    if (!p.ok()) return p.status();
    persister = *std::move(p);
  }
  std::unique_ptr<PeerBackups> peers;
  if (options.peer_backups.has_value() && options.peer_backups->placement.copies() > 1) {
    if (options.store == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpointer (rank %d): peer backups need the job's store (to find the holders)",
          options.rank));
    }
    PeerBackupsOptions peer_options = *options.peer_backups;
    if (!peer_options.superseded) peer_options.superseded = options.superseded;
    absl::StatusOr<std::unique_ptr<PeerBackups>> p =
        PeerBackups::Create(peer_options, options.store, (*snapshotter)->arena_bytes());
    if (!p.ok()) return p.status();
    peers = *std::move(p);
  }
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::make_unique<Impl>(
      registry, options, *std::move(snapshotter), std::move(persister), std::move(peers))));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;
absl::Status Checkpointer::Save(int64_t step, std::optional<bool> persist) {
  return impl_->Save(step, persist);
}
absl::Status Checkpointer::Fence(absl::Duration timeout) { return impl_->Fence(timeout); }
absl::Status Checkpointer::WaitIdle(absl::Duration timeout) { return impl_->WaitIdle(timeout); }
bool Checkpointer::busy() const { return impl_->busy(); }
int64_t Checkpointer::known_committed() const { return impl_->known_committed(); }
void Checkpointer::set_observer(std::function<void(const SaveOutcome&)> observer) {
  impl_->set_observer(std::move(observer));
}
void Checkpointer::SetGeneration(int64_t generation) { impl_->SetGeneration(generation); }
absl::StatusOr<RestoreResult> Checkpointer::RestoreNewestCommitted() {
  return impl_->RestoreNewestCommitted();
}
absl::StatusOr<std::vector<int64_t>> Checkpointer::CommittedSteps() {
  return impl_->CommittedSteps();
}
Snapshotter& Checkpointer::snapshotter() { return impl_->snapshotter(); }

}  // namespace trainguard
