// Generation entry's decisions, as pure functions (private to sdk/runtime): what a rank does with
// each outcome while it enters a generation (Runtime::Start, and recover() after a re-rendezvous).
//
// Entering a generation is one try after another. A try restores the newest committed checkpoint
// (when checkpointing), builds the generation's communicator and, when the plan names a state
// source and nothing was restored, broadcasts the state from it. A try that fails because a peer
// died or its link dropped meanwhile is tried again in the next generation (the rank asks for one,
// RendezvousMember::RequestNewGeneration), at most Runtime::kMaxGenerationAttempts tries in all;
// any other failure ends the entry. RuntimeImpl carries the decisions out: the restore, the
// communicator, the broadcast and the re-rendezvous are its, and so are the events and messages.
//
// Thread safety: pure functions of their arguments.
#ifndef TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_
#define TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "trainguard/membership.h"

namespace trainguard {

// How a try's restore of the newest committed checkpoint ended.
enum class RestoreOutcome {
  kRestored,             // the state is the checkpoint's
  kNothingCommitted,     // NotFound: a fresh job; not a failure
  kSupersededMeanwhile,  // Aborted while a newer generation exists: a rank died as they restored
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

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_GENERATION_ENTRY_H_
