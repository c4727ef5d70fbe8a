#include "sdk/runtime/generation_entry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sdk/core/utf8.h"

namespace trainguard {
namespace {

// How much of a failure a request for a new generation carries to the launcher's report.
constexpr size_t kNewGenerationReasonBytes = 300;

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

RestoreOutcome ClassifyRestore(const absl::Status& restore, bool superseded) {
  if (restore.ok()) return RestoreOutcome::kRestored;
  if (absl::IsNotFound(restore)) return RestoreOutcome::kNothingCommitted;
  // Aborted alone is no reason to try again: only a newer generation, where the others meet, is.
  // FailedPrecondition is how the store refuses a write of a generation that a newer one fenced
  // out (a rank still starting up publishes its backup service's address as a replacement's
  // generation forms): the others meet in the newer one too.
  if ((absl::IsAborted(restore) || absl::IsFailedPrecondition(restore)) && superseded) {
    return RestoreOutcome::kSupersededMeanwhile;
  }
  // Committed state exists and cannot be restored: starting without it would silently lose the
  // job's progress.
  return RestoreOutcome::kFailed;
}

StateSource DecideStateSource(bool restored, const std::optional<RecoveryPlan>& plan) {
  if (restored || !plan.has_value()) return StateSource::kOwn;
  return plan->state_source_rank >= 0 ? StateSource::kBroadcast : StateSource::kLost;
}

EntryFailure BroadcastFailure(int rank, int root) {
  return rank == root ? EntryFailure::kRetry : EntryFailure::kRetryWithoutState;
}

EntryRetryDecision DecideAfterFailedTry(EntryFailure failure, bool has_store, int attempts,
                                        int max_attempts, int64_t ready_step) {
  using Action = EntryRetryDecision::Action;
  if (failure == EntryFailure::kStopJob) return {Action::kStopJob};
  if (failure == EntryFailure::kFinal || !has_store) return {Action::kFail};
  if (attempts >= max_attempts) return {Action::kGiveUp};
  // A rank whose state a failed broadcast overwrote has none to offer.
  return {Action::kRetry, failure == EntryFailure::kRetryWithoutState ? int64_t{-1} : ready_step};
}

void RankGeneration::Adopt(Membership membership, std::optional<RecoveryPlan> plan) {
  {
    MutexLock lock(&members_mu_);
    members_generation_ = membership.generation;
    member_ids_ = membership.members;
  }
  membership_ = std::move(membership);
  plan_ = std::move(plan);
  generation_.store(membership_.generation);
}

std::vector<std::string> RankGeneration::MemberIdsOf(int64_t generation) const {
  MutexLock lock(&members_mu_);
  if (members_generation_ != generation) return {};
  return member_ids_;
}

void RankGeneration::SetMemberIds(int64_t generation, std::vector<std::string> ids) {
  KeepMemberIds(generation, std::move(ids));
}

void RankGeneration::KeepMemberIds(int64_t generation, std::vector<std::string> ids) const {
  MutexLock lock(&members_mu_);
  if (members_generation_ == generation && member_ids_.empty()) member_ids_ = std::move(ids);
}

const Membership& RankGeneration::MembershipWithIds(const ReadRankTable& read) const {
  if (membership_.generation < 0 || !membership_.members.empty()) return membership_;
  if (with_ids_.generation == membership_.generation) return with_ids_;
  std::vector<std::string> ids = MemberIdsOf(membership_.generation);
  if (ids.empty()) {
    absl::StatusOr<Membership> table = read(membership_.generation);
    if (!table.ok() || table->generation != membership_.generation ||
        table->world_size != membership_.world_size) {
      return membership_;
    }
    ids = std::move(table->members);
    KeepMemberIds(membership_.generation, ids);
  }
  with_ids_ = membership_;
  with_ids_.members = std::move(ids);
  return with_ids_;
}

GenerationEntry::GenerationEntry(GenerationEntryOptions options) : options_(std::move(options)) {}

GenerationEntry::~GenerationEntry() { CloseCommunicator(); }

void GenerationEntry::CloseCommunicator() {
  if (communicator_ == nullptr) return;
  // Abort first: a peer (or a thread of ours) blocked in one of its collectives fails at once
  // instead of waiting out its timeout.
  communicator_->Abort();
  for (uint64_t id : communicator_ids_) (void)options_.tracker->UnregisterCommunicator(id);
  communicator_ids_.clear();
  communicator_.reset();
}

absl::StatusOr<int64_t> GenerationEntry::Recover(const StepResult& failed, RecoveryReport& report) {
  // Peers still blocked in the old communicator's collectives fail at once.
  CloseCommunicator();
  absl::StatusOr<int64_t> joined = ReRendezvous(failed, failed.step);
  if (!joined.ok()) return joined;
  report.joined_generation = true;
  return Enter(*joined, failed.step, report);
}

absl::StatusOr<int64_t> GenerationEntry::ReRendezvous(const StepResult& failed,
                                                      int64_t offered_step) {
  RendezvousMember* const member = options_.member;
  const int rank = options_.rank;
  if (member == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank, " step ", failed.step,
        ": a communication failure needs a re-rendezvous, and this job has no store (a static "
        "job); restart the job; last: ",
        failed.status.message()));
  }
  const absl::Duration timeout = options_.rendezvous_timeout;
  int64_t after = options_.current->generation();
  // If no rank died (a dropped connection, a hang declared on a healthy job), nobody else would
  // start a new generation: ask for one with the same members. When a rank did die, the launcher
  // replaces it and that generation answers the request.
  const std::string why(Utf8Prefix(failed.status.message(), kNewGenerationReasonBytes));
  if (absl::Status asked =
          member->RequestNewGeneration(options_.current->membership(), why, timeout);
      !asked.ok()) {
    return WithContext(asked, absl::StrCat("rank ", rank, " step ", failed.step));
  }
  while (true) {
    absl::StatusOr<Membership> m = member->AwaitGeneration(after, timeout);
    if (absl::IsFailedPrecondition(m.status())) {
      options_.hooks.replaced(std::string(m.status().message()));
      return m.status();
    }
    if (!m.ok()) return WithContext(m.status(), absl::StrCat("rank ", rank, " step ", failed.step));
    absl::StatusOr<RecoveryPlan> plan = member->AgreeOnResume(*m, offered_step, timeout);
    if (absl::IsAborted(plan.status())) {
      // Another rank died meanwhile: meet in the newer generation.
      after = m->generation;
      continue;
    }
    if (!plan.ok()) return plan.status();
    const int64_t resume_step = plan->resume_step;
    options_.current->Adopt(*std::move(m), *std::move(plan));
    options_.hooks.adopted();
    return resume_step;
  }
}

absl::Status GenerationEntry::BuildCommunicator() {
  CloseCommunicator();
  const int64_t generation = options_.current->generation();
  CommunicatorSpec spec;
  spec.rank = options_.rank;
  spec.world_size = options_.world_size;
  spec.generation = generation;
  spec.membership = &options_.current->membership();
  spec.tracker = options_.tracker;
  spec.comm_id = static_cast<uint64_t>(generation) + 1;
  spec.name = absl::StrCat("comm/gen", generation);
  std::shared_ptr<Store> scoped;
  if (options_.store != nullptr) {
    scoped = std::make_shared<PrefixStore>(spec.name, options_.store);
    spec.store = scoped.get();
  }
  const std::string where =
      absl::StrCat("rank ", options_.rank, ": building communicator ", spec.name);
  absl::StatusOr<std::unique_ptr<Communicator>> built = factory_(spec);
  if (!built.ok()) return WithContext(built.status(), where);
  if (*built == nullptr) {
    return absl::InternalError(absl::StrCat(where, ": the factory returned no communicator"));
  }
  // The deleter keeps the scoped store alive as long as the communicator, wherever the last
  // reference goes (the watchdog thread may hold one while it aborts it).
  communicator_ =
      std::shared_ptr<Communicator>(built->release(), [scoped](Communicator* c) mutable {
        delete c;
        scoped.reset();
      });
  std::shared_ptr<Communicator> held = communicator_;
  std::vector<Communicator::Group> groups = communicator_->Groups();
  groups.insert(groups.begin(), Communicator::Group{spec.comm_id, spec.name});
  for (Communicator::Group& group : groups) {
    const std::string name = group.name;
    if (absl::Status s = options_.tracker->RegisterCommunicator(
            group.comm_id, std::move(group.name), [held] { held->Abort(); });
        !s.ok()) {
      CloseCommunicator();
      return WithContext(
          s, absl::StrCat(where, ": registering ", name, " with the collective tracker"));
    }
    communicator_ids_.push_back(group.comm_id);
  }
  return absl::OkStatus();
}

absl::Status GenerationEntry::BroadcastState(int root) {
  const int rank = options_.rank;
  StateRegistry& state = *options_.state;
  for (const StateBuffer& b : state.buffers()) {
    if (absl::Status s = communicator_->Broadcast(b.data, b.bytes, b.device, root); !s.ok()) {
      return WithContext(s, absl::StrCat("rank ", rank, ": broadcasting state buffer \"", b.name,
                                         "\" (", b.bytes, " bytes) from rank ", root));
    }
  }
  if (absl::Status s = BroadcastLossWindow(root); !s.ok()) return s;
  // A blob's size may differ between ranks (a data-loader position): the root's sizes go first.
  // The loss window's blob is not among them: a rank that has checkpointed holds it and a fresh
  // replacement does not, and it is each rank's own (BroadcastLossWindow).
  std::vector<std::pair<std::string, std::string>> blobs;
  for (const auto& blob : state.blobs()) {
    if (blob.first != kLossWindowBlob) blobs.push_back(blob);
  }
  if (blobs.empty()) return absl::OkStatus();
  std::vector<uint64_t> sizes;
  for (const auto& [name, value] : blobs) sizes.push_back(value.size());
  const std::string where =
      absl::StrCat("rank ", rank, ": broadcasting the state blobs from rank ", root);
  if (absl::Status s = communicator_->Broadcast(sizes.data(), sizes.size() * sizeof(uint64_t),
                                                Device::Host(), root);
      !s.ok()) {
    return WithContext(s, where);
  }
  for (size_t i = 0; i < blobs.size(); ++i) {
    std::string& value = blobs[i].second;
    value.resize(sizes[i]);
    if (absl::Status s = communicator_->Broadcast(value.data(), value.size(), Device::Host(), root);
        !s.ok()) {
      return WithContext(s, absl::StrCat(where, " (", blobs[i].first, ")"));
    }
    if (absl::Status s = state.SetBlob(blobs[i].first, std::move(value)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status GenerationEntry::BroadcastLossWindow(int root) {
  const int rank = options_.rank;
  std::string window = rank == root ? options_.hooks.loss_window() : std::string();
  uint64_t size = window.size();
  const std::string where =
      absl::StrCat("rank ", rank, ": broadcasting the loss-spike window from rank ", root);
  if (absl::Status s = communicator_->Broadcast(&size, sizeof(size), Device::Host(), root);
      !s.ok()) {
    return WithContext(s, where);
  }
  window.resize(size);
  if (size > 0) {
    if (absl::Status s = communicator_->Broadcast(window.data(), size, Device::Host(), root);
        !s.ok()) {
      return WithContext(s, where);
    }
  }
  const std::vector<int>& fresh = options_.current->plan()->new_ranks;
  if (std::find(fresh.begin(), fresh.end(), rank) == fresh.end()) return absl::OkStatus();
  if (absl::Status s = options_.hooks.load_loss_window(window); !s.ok()) {
    return WithContext(s, where);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GenerationEntry::TryEnter(int64_t step, RecoveryReport& report,
                                                  EntryFailure* failure, int64_t* ready_step) {
  const int rank = options_.rank;
  const RankGeneration& current = *options_.current;
  *failure = EntryFailure::kFinal;
  int64_t next = step;
  bool restored = false;
  report.restored_from.clear();
  report.state_source_rank = -1;
  if (options_.hooks.checkpointing()) {
    absl::StatusOr<RestoreResult> r = options_.hooks.restore();
    bool superseded = options_.member != nullptr && options_.member->superseded();
    if (!superseded && options_.member != nullptr &&
        ClassifyRestore(r.status(), /*superseded=*/true) == RestoreOutcome::kSupersededMeanwhile) {
      // A failure that a newer generation would explain: the heartbeat that would mark this
      // member superseded may not have run since it was published; its table in the store says
      // so (a short wait: the table is there or it is not, and a store call needs a moment to
      // connect).
      absl::StatusOr<bool> newer = options_.member->AwaitNewerGeneration(absl::Milliseconds(100));
      superseded = newer.ok() && *newer;
    }
    switch (ClassifyRestore(r.status(), superseded)) {
      case RestoreOutcome::kRestored:
        next = r->step;
        restored = true;
        report.restored_from = r->source;
        report.restore_skipped = r->skipped;
        break;
      case RestoreOutcome::kNothingCommitted:
        break;
      case RestoreOutcome::kSupersededMeanwhile:
        // A rank died while the ranks restored together: meet the others in the newer generation.
        *failure = EntryFailure::kRetry;
        return WithContext(r.status(), absl::StrCat("rank ", rank, ": restoring in generation ",
                                                    current.generation()));
      case RestoreOutcome::kFailed:
        return WithContext(r.status(), absl::StrCat("rank ", rank,
                                                    ": restoring the newest "
                                                    "committed checkpoint of generation ",
                                                    current.generation()));
    }
  }
  *ready_step = next;
  const StateSource source = DecideStateSource(restored, current.plan());
  if (source == StateSource::kLost) {
    *failure = EntryFailure::kStopJob;
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, ": every rank of generation ", current.generation(),
        " is new (no survivor holds the model state) and no checkpoint is committed: the job's "
        "progress is lost; it is not restarted from step 0"));
  }
  if (!factory_) return next;
  if (absl::Status s = BuildCommunicator(); !s.ok()) {
    *failure = EntryFailure::kRetry;
    return s;
  }
  if (source == StateSource::kBroadcast) {
    const int root = current.plan()->state_source_rank;
    if (absl::Status s = BroadcastState(root); !s.ok()) {
      *failure = BroadcastFailure(rank, root);
      return s;
    }
    report.state_source_rank = root;
  }
  return next;
}

absl::StatusOr<int64_t> GenerationEntry::Enter(int64_t step, int64_t failed_step,
                                               RecoveryReport& report) {
  const int max_attempts = options_.max_attempts;
  std::vector<std::string> errors;
  while (true) {
    ++report.generation_attempts;
    EntryFailure failure = EntryFailure::kFinal;
    int64_t ready_step = step;
    absl::StatusOr<int64_t> next = TryEnter(step, report, &failure, &ready_step);
    const int64_t generation = options_.current->generation();
    report.generation = generation;
    if (next.ok()) return next;
    const EntryRetryDecision decision = DecideAfterFailedTry(
        failure, options_.member != nullptr, report.generation_attempts, max_attempts, ready_step);
    if (decision.action == EntryRetryDecision::Action::kStopJob) {
      return options_.hooks.stop_job(std::string(next.status().message()), report);
    }
    if (decision.action == EntryRetryDecision::Action::kFail) return next.status();
    errors.push_back(absl::StrCat("generation ", generation, ": ", next.status().message()));
    Event event = EventOfKind(EventKind::kGenerationEntryFailed,
                              absl::StrCat("entering generation ", generation, " failed (attempt ",
                                           report.generation_attempts, " of ", max_attempts,
                                           "): ", next.status().message()));
    event.step = step;
    options_.hooks.emit(std::move(event));
    if (decision.action == EntryRetryDecision::Action::kGiveUp) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", options_.rank, ": no communicator could be built in ",
          report.generation_attempts, " generations (limit kMaxGenerationAttempts ", max_attempts,
          "); ranks kept failing while they rebuilt: ", absl::StrJoin(errors, "; ")));
    }
    // A rank died (or its link dropped) while the communicator was being built: the launcher
    // publishes a newer generation, or renews this one on request.
    CloseCommunicator();
    StepResult failed;
    failed.step = failed_step;
    failed.fault = FaultKind::kCommunicationFailure;
    failed.action = StepAction::kReRendezvous;
    failed.status = next.status();
    absl::StatusOr<int64_t> joined = ReRendezvous(failed, decision.offered_step);
    if (!joined.ok()) return joined.status();
    report.joined_generation = true;
    step = *joined;
  }
}

}  // namespace trainguard
