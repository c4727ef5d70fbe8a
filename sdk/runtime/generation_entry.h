// Generation entry (private to sdk/runtime): how a rank enters a generation (Runtime::Start, and
// recover() after a communication failure), as pure decisions and the component that carries them
// out.
//
// Entering a generation is one try after another. A try restores the newest committed checkpoint
// (when checkpointing), builds the generation's communicator and, when the plan names a state
// source and nothing was restored, broadcasts the state from it. A try that fails because a peer
// died or its link dropped meanwhile is tried again in the next generation (the rank asks for one,
// RendezvousMember::RequestNewGeneration), at most Runtime::kMaxGenerationAttempts tries in all;
// any other failure ends the entry.
//
//   the decisions (pure functions): how a restore ended, where the state comes from, how a try
//       failed, and retry / give up / stop the job / fail after it;
//   RankGeneration: the generation the rank holds (its number for every thread, its membership
//       and recovery plan for the training thread, its members' ids for the watchdog's);
//   GenerationEntry: the sequence itself on the training thread: the re-rendezvous, the
//       restore (through a hook: the Runtime's RestoreCheckpoint), the communicator's build and
//       close, the state broadcast, the retries. The Runtime owns one and calls it; a test drives
//       it with an InMemoryStore, RendezvousMembers and a communicator of its own.
#ifndef TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_
#define TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/checkpoint.h"
#include "trainguard/collectives.h"
#include "trainguard/communicator.h"
#include "trainguard/events.h"
#include "trainguard/guard.h"
#include "trainguard/membership.h"
#include "trainguard/runtime.h"
#include "trainguard/store.h"

namespace trainguard {

// The blob every snapshot holds the loss-spike detector's window in (Step::CheckLoss). A state
// broadcast leaves it out: it is each rank's own (GenerationEntry::BroadcastLossWindow).
inline constexpr char kLossWindowBlob[] = "trainguard.loss_window";

// How a try's restore of the newest committed checkpoint ended.
enum class RestoreOutcome {
  kRestored,             // the state is the checkpoint's
  kNothingCommitted,     // NotFound: a fresh job; not a failure
  kSupersededMeanwhile,  // Aborted, or a write fenced out (FailedPrecondition), while a newer
                         // generation exists: a rank died as they restored
  kFailed,               // committed state exists and cannot be restored: the entry ends
};
// `restore`: RestoreCheckpoint's status; `superseded`: whether the rank's generation is
// superseded (RendezvousMember::superseded) as it failed.
RestoreOutcome ClassifyRestore(const absl::Status& restore, bool superseded);

// Where the rank's state comes from in the generation, once the restore is done.
enum class StateSource {
  kOwn,        // the rank keeps what it has: restored, or the initial start without a plan
  kBroadcast,  // from the plan's state source rank, once the communicator is built
  kLost,       // every rank of the generation is new and nothing was restored: stop the job
};
// `restored`: the restore's outcome was kRestored; `plan`: the generation's recovery plan
// (nullopt for a static job, or an initial rank's first generation).
StateSource DecideStateSource(bool restored, const std::optional<RecoveryPlan>& plan);

// How one try failed.
enum class EntryFailure {
  kFinal,              // an error to return (a restore failure)
  kRetry,              // building or syncing failed: try in the next generation
  kRetryWithoutState,  // the same, and a failed broadcast left this rank's state undefined
  kStopJob,            // the job cannot go on (its state is lost)
};
// The failure of a broadcast from `root`, seen by `rank`: the root still holds its state, every
// other rank's buffers may be half overwritten.
EntryFailure BroadcastFailure(int rank, int root);

// What the entry does after a failed try.
struct EntryRetryDecision {
  enum class Action {
    kStopJob,  // publish the reason as job/stop and fail (Runtime::StopJob)
    kFail,     // return the try's error
    kGiveUp,   // the limit of tries is reached: fail naming every try's error
    kRetry,    // close the communicator and meet the others in the next generation
  };
  Action action = Action::kFail;
  // kRetry: the step this rank's state is ready to run, offered in the next generation (-1: it
  // has no usable state).
  int64_t offered_step = -1;
};
// `failure`: how the try failed; `has_store`: the job has a store (a static job cannot meet in a
// next generation); `attempts`: the tries made, this one included; `max_attempts`: the limit
// (Runtime::kMaxGenerationAttempts); `ready_step`: the step the rank's state was ready to run
// after the try. REQUIRES: attempts >= 1.
EntryRetryDecision DecideAfterFailedTry(EntryFailure failure, bool has_store, int attempts,
                                        int max_attempts, int64_t ready_step);

// The generation a rank holds. Its number is read by every thread of the rank (events, the
// watchers, the hang responder); its membership and recovery plan belong to the training thread,
// which adopts each generation; the members' ids are copied for the watchdog's thread
// (Runtime::ExplainPeerWait), under a lock.
//
// A rank learns its place in a generation without the generation's member ids (reading them costs
// O(world size) bytes per rank, O(world size^2) for the job): they are read on first use, by
// MembershipWithIds (Runtime::membership()) or by the watchdog's thread (SetMemberIds).
//
// Thread safety: generation(), MemberIdsOf() and SetMemberIds() from any thread; the rest on the
// training thread.
class RankGeneration {
 public:
  RankGeneration() = default;
  RankGeneration(const RankGeneration&) = delete;
  RankGeneration& operator=(const RankGeneration&) = delete;

  int64_t generation() const { return generation_.load(); }
  // The membership held; its members are empty for a rank's own place (see above).
  const Membership& membership() const { return membership_; }
  // Reads the member ids of the generation held (RendezvousMember::ReadRankTable).
  using ReadRankTable = std::function<absl::StatusOr<Membership>(int64_t generation)>;
  // The membership held, with its member ids: read with `read` on the first call in a generation
  // (unless the watchdog's thread read them already), kept for the next calls. Without them (the
  // read failed) when `read` fails; it is tried again at the next call.
  const Membership& MembershipWithIds(const ReadRankTable& read) const;
  // nullopt for a static job and an initial rank's generation 0.
  const std::optional<RecoveryPlan>& plan() const { return plan_; }
  // The rank's place in a generation it joined (an initial rank's generation 0: no plan), or
  // met in after a failure (with the plan every rank of it agreed on).
  void Adopt(Membership membership, std::optional<RecoveryPlan> plan);
  // The rank restored the newest committed checkpoint: every rank of the generation holds that
  // state, so no rank's state is broadcast in it.
  void ForgetStateSource() {
    if (plan_.has_value()) plan_->state_source_rank = -1;
  }
  // The member ids of `generation`, by rank, while it is the one held and they were read; empty
  // otherwise.
  std::vector<std::string> MemberIdsOf(int64_t generation) const;
  // Keeps `ids`, the member ids of `generation` read by another thread, if it is still the one
  // held (MemberIdsOf answers with them, and MembershipWithIds without reading them again).
  void SetMemberIds(int64_t generation, std::vector<std::string> ids);

 private:
  // Keeps `ids` as the member ids of `generation` if it is still the one held and none are kept
  // yet (a cache fill: const for MembershipWithIds).
  void KeepMemberIds(int64_t generation, std::vector<std::string> ids) const;

  std::atomic<int64_t> generation_{0};
  Membership membership_;
  // membership_ with its member ids once MembershipWithIds read them (a cache, hence mutable);
  // membership_ itself never changes within a generation: CommunicatorSpec points at it.
  mutable Membership with_ids_;
  std::optional<RecoveryPlan> plan_;
  mutable Mutex members_mu_;
  int64_t members_generation_ ABSL_GUARDED_BY(members_mu_) = -1;
  // Mutable as with_ids_: MembershipWithIds fills both.
  mutable std::vector<std::string> member_ids_ ABSL_GUARDED_BY(members_mu_);
};

// What GenerationEntry asks of its owner: the parts of a rank's state and reporting that are the
// Runtime's. Each is called on the training thread, inside Enter() or Recover().
struct GenerationEntryHooks {
  // Whether the rank checkpoints (a Runtime starts to when the trainer calls Checkpoint()).
  std::function<bool()> checkpointing;
  // Restores the newest committed checkpoint into the registered state (collective: every rank of
  // the generation calls it): Runtime::RestoreCheckpoint. NotFound when nothing is committed.
  std::function<absl::StatusOr<RestoreResult>()> restore;
  // The rank's loss-spike window (kept out of the blobs: it is each rank's own), and loading one
  // broadcast from the state source into a rank new in the generation.
  std::function<std::string()> loss_window;
  std::function<absl::Status(std::string_view window)> load_loss_window;
  // Writes an event of the current generation (generation_entry_failed).
  std::function<void(Event event)> emit;
  // Publishes `reason` as job/stop and returns the FailedPrecondition to fail with (the job cannot
  // go on: every rank of the generation is new and nothing was restored).
  std::function<absl::Status(const std::string& reason, RecoveryReport& report)> stop_job;
  // The rank met the others in a newer generation (the failure run of its recovery policy ends).
  std::function<void()> adopted;
  // The rank learnt that it was replaced (the newer generation does not name it): it must stop.
  std::function<void(std::string reason)> replaced;
};

struct GenerationEntryOptions {
  int rank = 0;
  int world_size = 1;
  // The job's store and this process's rendezvous member; both nullptr for a static job, which
  // has no next generation to meet in.
  Store* store = nullptr;
  RendezvousMember* member = nullptr;
  // Where the communicator is registered (its Abort() is the hang's abort hook).
  CollectiveTracker* tracker = nullptr;
  // The state a broadcast sends from the state source rank (buffers, then blobs).
  StateRegistry* state = nullptr;
  // The generation the rank holds; the entry adopts each one it meets in.
  RankGeneration* current = nullptr;
  // Bounds each rendezvous wait (Options::rendezvous_timeout_ms).
  absl::Duration rendezvous_timeout = absl::Minutes(5);
  // Tries in all before the entry gives up.
  int max_attempts = Runtime::kMaxGenerationAttempts;
  GenerationEntryHooks hooks;
};

// Carries out generation entry on the training thread (see the top of this file) and owns the
// communicator it builds: one per generation, aborted and closed before the next is built.
//
// It has no thread of its own. Every wait is a rendezvous wait bounded by rendezvous_timeout or
// the communicator's own (CommunicatorFactory), so it reads no clock.
//
// Thread safety: the training thread only. The communicator's abort hook, registered with the
// tracker, may run on the watchdog's thread meanwhile (it holds its own reference).
class GenerationEntry {
 public:
  // REQUIRES: tracker, state and current set; they (and the store and member, if any) outlive the
  // entry; every hook set.
  explicit GenerationEntry(GenerationEntryOptions options);
  // Closes the communicator (unregistering it from the tracker).
  ~GenerationEntry();
  GenerationEntry(const GenerationEntry&) = delete;
  GenerationEntry& operator=(const GenerationEntry&) = delete;

  // The trainer's factory (Runtime::SetCommunicatorFactory); none: no communicator is built.
  void SetCommunicatorFactory(CommunicatorFactory factory) { factory_ = std::move(factory); }
  // The current generation's communicator, or nullptr.
  Communicator* communicator() const { return communicator_.get(); }
  // Aborts the communicator (peers, and threads of this rank, blocked in its collectives fail at
  // once), unregisters it and lets it go. Nothing when there is none.
  void CloseCommunicator();

  // Enters the generation held now (Start(), and after a re-rendezvous), resuming at `step` (the
  // plan's resume step); `failed_step` is the step a re-rendezvous reports as failed. Returns the
  // step to run next; fills `report` (restored_from, state_source_rank, generation,
  // generation_attempts, joined_generation when it met the others again).
  absl::StatusOr<int64_t> Enter(int64_t step, int64_t failed_step, RecoveryReport& report);
  // recover()'s answer to a communication failure: closes the communicator, meets the ranks in
  // the next generation (asking for one with the same members: when no rank died, nobody else
  // would), and enters it.
  absl::StatusOr<int64_t> Recover(const StepResult& failed, RecoveryReport& report);

 private:
  // Meets the ranks in a generation newer than the one held, offering `offered_step` (-1: no
  // usable state); returns the plan's resume step.
  absl::StatusOr<int64_t> ReRendezvous(const StepResult& failed, int64_t offered_step);
  // One try of Enter in the current generation. *failure: how it failed; *ready_step: the step
  // this rank's state is ready to run after it (what it offers in the next generation).
  absl::StatusOr<int64_t> TryEnter(int64_t step, RecoveryReport& report, EntryFailure* failure,
                                   int64_t* ready_step);
  absl::Status BuildCommunicator();
  absl::Status BroadcastState(int root);
  // BroadcastState's part for the loss-spike window: the root's window goes to the ranks that are
  // new in this generation.
  absl::Status BroadcastLossWindow(int root);

  const GenerationEntryOptions options_;
  CommunicatorFactory factory_;
  // Shared with the abort hook registered in the tracker, which the watchdog thread may be running
  // while the training thread lets go of it. Its deleter also owns the generation's PrefixStore
  // (CommunicatorSpec::store), destroyed after the communicator.
  std::shared_ptr<Communicator> communicator_;
  // Registered in the tracker: the communicator's id and its groups' (Communicator::Groups).
  std::vector<uint64_t> communicator_ids_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_
