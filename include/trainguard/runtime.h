// Runtime: the per-process object a trainer creates once; it owns every trainguard subsystem of the
// rank.
//
//     absl::StatusOr<sdk::Options> options = sdk::Options::FromEnv();
//     absl::StatusOr<std::unique_ptr<sdk::Runtime>> rt = sdk::Runtime::Create(*options);
//
// It holds the rank's Options and Topology, its event file, its Heartbeat (the lock-free progress
// record that guards write and a watchdog reads) and its recovery policy (recover()).
//
// With a store configured (Options::store), the Runtime is also the process's rendezvous member:
// Create() joins generation 0 as rank `options.rank`, or, for role "standby", parks until the
// launcher assigns it a dead rank's id (rank() is then that id, and resume_step() and
// recovery_plan() say where to start and whose model state to take). After a communication failure,
// recover() meets the survivors and the replacement in the next generation.
//
// Thread safety: the accessors, EmitEvent() and heartbeat() may be used from any thread. Guards,
// AddObserver() and recover() belong to the training thread.
#ifndef TRAINGUARD_RUNTIME_H_
#define TRAINGUARD_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/checkpoint.h"
#include "trainguard/checkpointer.h"
#include "trainguard/collectives.h"
#include "trainguard/events.h"
#include "trainguard/flight_recorder.h"
#include "trainguard/guard.h"
#include "trainguard/health.h"
#include "trainguard/mutex.h"
#include "trainguard/options.h"
#include "trainguard/rendezvous.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"
#include "trainguard/watchdog.h"

namespace trainguard {

class Clock;
class Env;
class LauncherWatch;

// What the last heartbeat said. Read by monitors (a watchdog thread, a launcher) without locking.
struct HeartbeatSnapshot {
  int64_t beats = 0;         // heartbeats so far; changes on every step entry and exit
  int64_t step = -1;         // the step entered last
  bool in_step = false;      // a guarded step is running
  int64_t last_beat_ns = 0;  // Clock::MonotonicNanos() of the last beat
  int64_t last_step_duration_ns = 0;
  int64_t steps_completed = 0;  // guarded steps finished, failed or not
};

// Written by the training thread on every guard entry and exit; readable from any thread. Each
// field is an independent atomic: a reader may see a beat half-applied (a new step with the old
// timestamp), which a watchdog tolerates because it compares across several reads.
class Heartbeat {
 public:
  void Enter(int64_t step, int64_t now_ns);
  void Exit(int64_t duration_ns, int64_t now_ns);
  HeartbeatSnapshot Read() const;

 private:
  std::atomic<int64_t> beats_{0};
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> in_step_{false};
  std::atomic<int64_t> last_beat_ns_{0};
  std::atomic<int64_t> last_step_duration_ns_{0};
  std::atomic<int64_t> steps_completed_{0};
};

// Receives step boundaries on the training thread (the seam for the watchdog and checkpoint
// policy). Callbacks must be quick and must not throw or start a guard.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnStepBegin(int64_t step) = 0;
  virtual void OnStepEnd(const StepResult& result) = 0;
};

class Runtime {
 public:
  // Validates the options, builds the topology, joins the rendezvous when a store is configured and
  // opens the rank's event file (kRuntimeStarted). Errors name the option, the file or the
  // rendezvous step at fault.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Options& options);

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  // Writes kRuntimeStopped. REQUIRES: no guard is active.
  ~Runtime();

  // As given to Create(). For a standby, options().rank is meaningless: use rank().
  const Options& options() const { return options_; }
  const Topology& topology() const { return topology_; }
  int rank() const { return rank_; }
  int world_size() const { return options_.world_size; }
  // The membership generation of the job: 0 until a rank is replaced.
  int64_t generation() const { return generation_.load(); }
  // The step to start training at: 0 for an initial rank; for a standby that replaced a rank, the
  // step the job resumes at (with checkpointing, RestoreCheckpoint() says where the state is).
  int64_t resume_step() const { return resume_step_; }
  // The plan of the last re-rendezvous this process took part in (as a survivor in recover(), or as
  // a replacement in Create()); nullopt before any. Trainers broadcast the model state from
  // state_source_rank to the other ranks before resuming.
  const std::optional<RecoveryPlan>& recovery_plan() const { return recovery_plan_; }
  // The current generation's rank table; generation -1 for a static job (no store).
  const Membership& membership() const { return membership_; }
  // The job's store; nullptr for a static job. Use it to rendezvous the job's communicators, e.g. a
  // GlooStore over PrefixStore("gloo/gen<generation>", store()).
  Store* store() const { return store_; }
  const std::string& run_dir() const { return run_dir_; }
  Env& env() const { return *env_; }
  Clock& clock() const { return *clock_; }
  const Heartbeat& heartbeat() const { return heartbeat_; }

  // The state a checkpoint holds (checkpoint.h). Register every buffer and blob before the first
  // checkpoint or restore: the registry is read-only from then on.
  StateRegistry& state() { return state_; }

  // Checkpointing (checkpointer.h). With checkpoint_every_steps / checkpoint_every_seconds set, the
  // guard saves after a successful step S (tagged S+1, the step to resume at) and, at the next
  // guard entry, fences the copy, so the step body may modify every registered buffer. Without a
  // policy, Checkpoint() saves on demand.
  //
  // RestoreCheckpoint(): restores the newest committed checkpoint that every rank can restore and
  // returns the step to resume at; NotFound when there is none. Collective in a job with a store:
  // every rank of the generation calls it (a fresh or restarted rank after registering its state;
  // survivors do it inside recover()).
  absl::StatusOr<int64_t> RestoreCheckpoint();
  // Starts a checkpoint of the registered state now, tagged `resume_step`. FailedPrecondition
  // while the previous one is still being saved. With checkpoint_every_steps = N, the save of
  // step S is persisted when (S / N) % checkpoint_persist_every == 0, the same on every rank;
  // otherwise every checkpoint_persist_every-th save of this process is.
  absl::Status Checkpoint(int64_t resume_step);
  // Waits until the checkpoint in progress (if any) is copied, persisted and committed. REQUIRED
  // before a registered buffer is freed: a snapshot still copying reads it.
  absl::Status WaitForCheckpoints(absl::Duration timeout);
  // True when a checkpoint policy is configured or Checkpoint()/RestoreCheckpoint() was called.
  bool checkpointing() const { return checkpointing_; }
  // "arena" or "disk" after a successful RestoreCheckpoint(); "" before.
  const std::string& last_restore_source() const { return last_restore_source_; }
  // nullptr until the first checkpoint or restore.
  Checkpointer* checkpointer() const { return checkpointer_.get(); }

  // Hang detection (watchdog.h, collectives.h, flight_recorder.h). The Runtime owns the rank's
  // flight-recorder ring ("/trainguard.<job>.fr.rank<R>"; removed by the Runtime's destructor, so
  // the ring of a rank that was killed or crashed stays for the launcher or `trainguard
  // flight-recorder show` to read; `trainguard run` removes those when the job succeeds), a
  // CollectiveTracker writing to it, and, unless
  // watchdog_poll_ms is 0, a Watchdog whose thread judges the phases (every guarded step is a
  // "step" phase; nest your own with ScopedPhase(rt->watchdog(), "forward_backward")) and the
  // collectives in flight. On a hang, on the watchdog thread: every thread's stack is captured, the
  // ring and the stacks are dumped to <run_dir>/flight_recorder/rank-<R>.<n>.pb, a `hang` event is
  // written, the hang is published in the store (hang/gen<G>) so that every other rank dumps its
  // ring and stacks too, the communicators' abort hooks run, and the guard of the step returns a
  // communication failure carrying the evidence. The process is never aborted. `kill -USR2 <pid>`
  // dumps the ring and the stacks the same way, on demand (within half a second), unless the
  // application installed its own SIGUSR2 handler first.
  FlightRecorder* flight_recorder() const { return flight_recorder_.get(); }
  CollectiveTracker* collectives() const { return collectives_.get(); }
  Watchdog* watchdog() const { return watchdog_.get(); }  // nullptr when watchdog_poll_ms is 0
  // Hangs this process declared, and dumps written (its own hangs and those of peers).
  int64_t hang_dumps() const { return hang_dumps_.load(); }

  // Appends an event to the rank's event file, filling in time (if unset), rank and generation.
  absl::Status EmitEvent(Event event);

  // Adds an observer of step boundaries. REQUIRES: no guard is active; `observer` outlives the
  // Runtime.
  void AddObserver(StepObserver* observer);

  // Carries out the recovery for a step result and returns the step to run next, or an error when
  // this process cannot go on (the trainer should then exit non-zero). The policy, per action:
  //
  //   kContinue: result.step + 1.
  //   kSkip: result.step + 1, unless more than max_consecutive_step_failures steps in a row failed:
  //     then FailedPrecondition.
  //   kRollback, or kSkip past the limit when checkpointing: restores the newest committed
  //     checkpoint (RestoreCheckpoint) and returns its step; without checkpointing, Unimplemented.
  //   kReRendezvous, with a store: asks for a new generation (RequestNewGeneration) and waits for
  //     the next one, published by the launcher once it has replaced a dead rank, or with the same
  //     members when every rank is alive (a dropped connection, a hang declared on a healthy job);
  //     agrees with every rank on the resume step and returns it;
  //     recovery_plan() then names the rank to take the model state from, and the trainer rebuilds
  //     its communicators for generation(). FailedPrecondition when this process was itself
  //     replaced (it must exit). When checkpointing, every rank of the new generation (the
  //     replacement through RestoreCheckpoint()) then restores the newest committed checkpoint
  //     and resumes at its step, and recovery_plan()->state_source_rank is -1 (nothing to
  //     broadcast). Otherwise the failed step must not have modified the model state (apply
  //     updates after the step's last collective): its state is offered as "ready to run that
  //     step".
  //   kReRendezvous, static job (no store): Unavailable; restart the job.
  //   kFatal: the fault's status. After a fatal device error the Runtime also rejects every later
  //     guard (see fatal()).
  //
  // Each decision is written as a kRecoveryDecision event.
  absl::StatusOr<int64_t> recover(const StepResult& result);

  // True after a guarded step failed with FaultKind::kFatalDeviceError, or after this process
  // learnt that it was replaced: guards are rejected from then on.
  bool fatal() const { return fatal_.load(std::memory_order_acquire); }

 private:
  friend class Step;
  friend class StepScope;

  Runtime(Options options, Topology topology, std::string run_dir);

  // The parts of Create() after construction.
  absl::Status ConnectStore();
  absl::Status JoinRendezvous();
  absl::Status OpenEvents();
  absl::StatusOr<int64_t> ReRendezvous(const StepResult& result);
  void MarkFatal(std::string reason);

  // Guard internals, called by StepScope.
  bool TryBeginStep();
  void EndStep();
  // After a successful step: the first one of each generation is announced in the store
  // (rdzv/gen/<g>/resumed/<rank>), which is how a launcher times a recovery. One compare otherwise.
  void NoteStepSucceeded(int64_t step) {
    if (announced_generation_ != generation_.load(std::memory_order_relaxed)) AnnounceResumed(step);
  }
  void AnnounceResumed(int64_t step);
  // Checkpoint policy, on the training thread: after a successful step, and at a guard's entry
  // (fences a snapshot still being copied).
  void MaybeCheckpoint(int64_t step) {
    if (options_.checkpoint_every_steps > 0 || options_.checkpoint_every_seconds > 0) {
      MaybeCheckpointSlow(step);
    }
  }
  void MaybeCheckpointSlow(int64_t step);
  void FenceSnapshot() {
    if (snapshot_unfenced_) FenceSnapshotSlow();
  }
  void FenceSnapshotSlow();
  absl::Status EnsureCheckpointer();
  absl::StatusOr<int64_t> Rollback(const StepResult& result);
  // Detection internals.
  absl::Status StartDetection();
  void OnHang(const HangReport& report);
  // Dumps the ring and every thread's stack; returns the dump's path ("" if it failed).
  std::string DumpEvidence(const std::string& reason, std::string* stacks_out);
  void WatchPeerHangs();  // and SIGUSR2 dump requests, and publishes this rank's progress
  // The watcher thread's period (shorter when watchdog_peer_progress_ms is).
  static constexpr absl::Duration kWatcherPeriod = absl::Milliseconds(250);
  // Watcher thread: writes this rank's progress record (sdk/runtime/peer_progress.h) when it
  // changed and watchdog_peer_progress_ms has passed since the last one.
  void PublishProgress();
  // The watchdog's peer_progress question (watchdog.h), answered from the peers' records.
  std::optional<std::string> ExplainPeerWait(const InFlightCollective& waiting_in);
  // Store key hang/gen<G>/dumped/<rank>: this rank has dumped generation G's hang.
  void AcknowledgeHangDump(int64_t generation, const std::string& path);
  // Bounded polling (hang_dump_wait_ms) until every rank acknowledged its dump of `generation`.
  void AwaitHangDumps(int64_t generation);
  FiniteChecker* finite_checker();
  // The detector behind Step::CheckLoss (created at the first call, from the loss_spike_* options).
  LossSpikeDetector& loss_spike_detector();
  // Writes the kStepFault event of a failed step; marks the runtime fatal after a fatal device
  // error.
  void RecordStepFault(const StepResult& result);
  const std::string& fatal_reason() const { return fatal_reason_; }

  const Options options_;
  const Topology topology_;
  const std::string run_dir_;
  Env* const env_;
  Clock* const clock_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<Store> owned_store_;
  Store* store_ = nullptr;
  std::unique_ptr<RendezvousMember> member_;
  Membership membership_;
  std::optional<RecoveryPlan> recovery_plan_;
  int rank_ = 0;
  int64_t resume_step_ = 0;
  std::atomic<int64_t> generation_{0};
  int64_t announced_generation_ = -1;  // training thread only
  Heartbeat heartbeat_;
  std::vector<StepObserver*> observers_;
  std::atomic<bool> step_active_{false};
  std::atomic<bool> fatal_{false};
  std::string fatal_reason_;  // written once before fatal_ is set
  int consecutive_failures_ = 0;
  StateRegistry state_;
  bool checkpointing_ = false;
  bool snapshot_unfenced_ = false;  // training thread only
  int64_t last_checkpoint_ns_ = 0;
  std::string last_restore_source_;
  std::unique_ptr<FlightRecorder> flight_recorder_;
  std::unique_ptr<CollectiveTracker> collectives_;
  std::unique_ptr<FiniteChecker> finite_checker_;  // created at the first device check
  std::optional<LossSpikeDetector> loss_spike_detector_;  // created at the first CheckLoss
  std::atomic<int64_t> hang_dumps_{0};
  Mutex dump_mu_;                   // one dump at a time (the watchdog's, the peer watcher's)
  int64_t dumped_generation_ = -1;  // guarded by dump_mu_: a generation's hang is dumped once
  Mutex watcher_mu_;
  bool stop_watcher_ = false;  // guarded by watcher_mu_
  // Watcher thread only: when PublishProgress last wrote a record, and what it said.
  struct PublishedProgress {
    int64_t written_ns = 0;        // clock_->MonotonicNanos() when written
    int64_t last_progress_ns = 0;  // the watchdog's last_progress_ns() it reported
    std::vector<std::pair<uint64_t, int64_t>> begun;
    int64_t generation = -1;
  };
  PublishedProgress published_;
  // Watchdog thread only: the collective whose postponement was last written as an event.
  uint64_t excused_collective_ = 0;
  std::thread peer_hang_watcher_;
  // Its thread calls OnHang, which uses everything above: destroyed before them.
  std::unique_ptr<Watchdog> watchdog_;
  // watchdog_.get(), set once before the hang callbacks are registered: they read it on the
  // watchdog's own thread, also while ~Runtime is resetting watchdog_ (which joins that thread).
  Watchdog* phase_watchdog_ = nullptr;
  // Last: its worker thread uses the store and the event log, so it is destroyed first.
  std::unique_ptr<Checkpointer> checkpointer_;
  // Under `trainguard run`: ends this process when the launcher is gone (sdk/runtime/
  // launcher_watch.h). Reset first in ~Runtime: its observer writes an event.
  std::unique_ptr<LauncherWatch> launcher_watch_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_RUNTIME_H_
