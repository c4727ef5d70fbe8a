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
// The Runtime owns the recovery protocol. A trainer registers its state, gives the Runtime a
// communicator factory (communicator.h), and calls Start() once; its loop is then
//
//     absl::StatusOr<int64_t> start = rt->Start();   // restored, synced, communicator built
//     for (int64_t step = *start; step < steps;) {
//       sdk::StepResult r = sdk::guard(*rt, step, [&](sdk::Step& s) { train_step(s); });
//       if (r.ok()) { ++step; continue; }
//       absl::StatusOr<int64_t> next = rt->recover(r);   // an error: exit non-zero
//       if (!next.ok()) return 1;
//       step = *next;
//     }
//
// and recover() does the rest: skips, rollbacks, stopping the job on a fault that recurs, and after
// a re-rendezvous aborting the old communicator, restoring or broadcasting the state and building
// the next one.
//
// Thread safety: the accessors, EmitEvent() and heartbeat() may be used from any thread. Guards,
// AddObserver(), SetCommunicatorFactory(), Start(), recover(), communicator() and
// CloseCommunicator() belong to the training thread.
#ifndef TRAINGUARD_RUNTIME_H_
#define TRAINGUARD_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/checkpoint.h"
#include "trainguard/collectives.h"
#include "trainguard/communicator.h"
#include "trainguard/events.h"
#include "trainguard/guard.h"
#include "trainguard/membership.h"
#include "trainguard/options.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"
#include "trainguard/watchdog.h"

namespace trainguard {

class Checkpointer;
class Clock;
class Env;
class EventLog;
class FlightRecorder;
class RendezvousMember;

// What the last heartbeat said. Read by monitors (a watchdog thread, a launcher) without locking.
struct HeartbeatSnapshot {
  int64_t beats = 0;         // heartbeats so far; changes on every step entry and exit
  int64_t step = -1;         // the step entered last
  bool in_step = false;      // a guarded step is running
  int64_t last_beat_ns = 0;  // Clock::MonotonicNanos() of the last beat
  int64_t last_step_duration_ns = 0;
  int64_t steps_completed = 0;  // guarded steps finished, failed or not
  int64_t total_step_ns = 0;    // the durations of those steps, summed
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
  std::atomic<int64_t> total_step_ns_{0};
};

// What Runtime::Start() or Runtime::recover() did (StepObserver::OnRecovery; the same is written
// to the event file).
struct RecoveryReport {
  // The failed step recover() was given; -1 for Start().
  int64_t failed_step = -1;
  // "start", "continue", "skip", "rollback", "skip_batches", "re_rendezvous" or "give_up".
  std::string decision;
  // What Start() or recover() returned: OK, or why this process cannot go on.
  absl::Status status;
  int64_t next_step = -1;  // the step to run next (status OK)
  // "arena", "disk" or "peer host HOST" (a backup holder's memory) when a checkpoint was restored;
  // "" otherwise.
  std::string restored_from;
  // Newer committed steps that could not be restored, and why (a holder unreachable, a backup
  // that failed its checksum, a missing shard), e.g. "step 300: rank 2: NotFound: ...".
  std::vector<std::string> restore_skipped;
  // The membership generation the rank is in now, and whether it joined it here (a re-rendezvous,
  // or a standby's takeover in Start()).
  int64_t generation = 0;
  bool joined_generation = false;
  // The rank whose state was broadcast to every rank here; -1 when none was.
  int state_source_rank = -1;
  // Generations tried until the communicator was built (more than 1: a rank died meanwhile).
  int generation_attempts = 0;
  // recover() gave up because the job cannot go on (not because this process failed): the reason
  // was published as the store key job/stop.
  bool job_stopped = false;
};

// Receives step boundaries on the training thread (the seam for the watchdog and checkpoint
// policy). Callbacks must be quick and must not throw or start a guard.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnStepBegin(int64_t step) = 0;
  virtual void OnStepEnd(const StepResult& result) = 0;
  // After Start() and after every recover(), before they return.
  virtual void OnRecovery(const RecoveryReport& report) { (void)report; }
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
  virtual ~Runtime();

  // As given to Create(). For a standby, options().rank is meaningless: use rank().
  virtual const Options& options() const = 0;
  virtual const Topology& topology() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The membership generation of the job: 0 until a rank is replaced.
  virtual int64_t generation() const = 0;
  // The generation this rank is still in although a newer one exists (a peer died, a host was
  // lost, a rank asked for a re-rendezvous), or -1. A collective of that generation this rank is
  // blocked in may never complete (its peers have left for the new one): abort the communicators
  // you built for it (AddSupersededHandler), then recover(). Cleared when this rank joins the new
  // generation. Any thread; -1 for a job without a store.
  virtual int64_t superseded_generation() const = 0;
  // Calls `handler(generation)` when this rank learns that `generation`, the one it is in, was
  // superseded: a thread of the Runtime waits (a store Wait, no polling) for the next generation's
  // rank table and calls it within milliseconds of the publication, or after the heartbeat's
  // refusal, once per generation. A handler may abort the communicators the trainer built for that
  // generation (trainguard.torch aborts its process group), so that a collective blocked on a peer
  // that left fails at once. The Runtime does not abort the factory's communicator: a rank that
  // leaves its collective waits in the next generation for every member, and on one host a member
  // that is stopped there (SIGSTOP, a hung process) is replaced only after the launcher's
  // heartbeat timeout, where a rank still in the collective declares the hang, which names it (on
  // several hosts the member's agent reports it stopped and it is replaced after --host-timeout).
  // It runs on the Runtime's thread, possibly while the training thread is in a step: it must be
  // quick, must not block and must not call back into the Runtime. Any thread, before or after
  // Start(); handlers are never removed, so what they capture must outlive the Runtime. Never
  // called for a job without a store.
  virtual void AddSupersededHandler(std::function<void(int64_t generation)> handler) = 0;
  // The step to start training at: 0 for an initial rank; for a standby that replaced a rank, the
  // step the job resumes at. After Start(), what Start() returned.
  virtual int64_t resume_step() const = 0;
  // The plan of the last re-rendezvous this process took part in (as a survivor in recover(), or as
  // a replacement in Create()); nullopt before any. With a communicator factory, Start() and
  // recover() broadcast the registered state from state_source_rank; without one, the trainer
  // does, before resuming.
  virtual const std::optional<RecoveryPlan>& recovery_plan() const = 0;
  // The current generation's rank table; generation -1 for a static job (no store). The first call
  // in a generation reads its member ids from the store (O(world size) bytes); members stays empty
  // when that read fails, and the next call tries again.
  virtual const Membership& membership() const = 0;
  // The job's store; nullptr for a static job. Use it to rendezvous the job's communicators, e.g. a
  // GlooStore over PrefixStore("gloo/gen<generation>", store()).
  virtual Store* store() const = 0;
  virtual const std::string& run_dir() const = 0;
  virtual Env& env() const = 0;
  virtual Clock& clock() const = 0;
  virtual const Heartbeat& heartbeat() const = 0;

  // The state a checkpoint holds (checkpoint.h). Register every buffer and blob before the first
  // checkpoint or restore: the registry is read-only from then on.
  virtual StateRegistry& state() = 0;

  // Checkpointing (checkpointer.h). With checkpoint_every_steps / checkpoint_every_seconds set, the
  // guard saves after a successful step S (tagged S+1, the step to resume at) and, at the next
  // guard entry, fences the copy, so the step body may modify every registered buffer. Without a
  // policy, Checkpoint() saves on demand.
  //
  // RestoreCheckpoint(): restores the newest committed checkpoint that every rank can restore and
  // returns the step to resume at; NotFound when there is none. Start() and recover() call it;
  // trainers that call Start() need not. Collective in a job with a store:
  // every rank of the generation calls it (a fresh or restarted rank after registering its state;
  // survivors do it inside recover()).
  virtual absl::StatusOr<int64_t> RestoreCheckpoint() = 0;
  // Starts a checkpoint of the registered state now, tagged `resume_step`. FailedPrecondition
  // while the previous one is still being saved. With checkpoint_every_steps = N, the save of
  // step S is persisted when (S / N) % checkpoint_persist_every == 0, the same on every rank;
  // otherwise every checkpoint_persist_every-th save of this process is.
  virtual absl::Status Checkpoint(int64_t resume_step) = 0;
  // Waits until the checkpoint in progress (if any) is copied, persisted and committed. REQUIRED
  // before a registered buffer is freed: a snapshot still copying reads it.
  virtual absl::Status WaitForCheckpoints(absl::Duration timeout) = 0;
  // Waits until the snapshot in flight (if any) has copied the registered buffer `name`, so the
  // trainer may modify it before the next guard fences the whole state: overlapping the copy
  // with the next step's forward pass. OK when no snapshot is in flight; NotFound for a name that
  // was never registered.
  virtual absl::Status FenceStateBuffer(const std::string& name, absl::Duration timeout) = 0;
  // True when a checkpoint policy is configured or Checkpoint()/RestoreCheckpoint() was called.
  virtual bool checkpointing() const = 0;
  // Whether step `step`, if it succeeds, starts a checkpoint under the configured policy
  // (checkpoint_every_steps / checkpoint_every_seconds), without side effects: an integration
  // that must refresh blobs or check its buffers before a snapshot does that work only then.
  // Training thread.
  virtual bool CheckpointDueAfter(int64_t step) const = 0;
  // "arena" or "disk" after a successful RestoreCheckpoint(); "" before.
  virtual const std::string& last_restore_source() const = 0;
  // The window of recent losses Step::CheckLoss judges against (LossSpikeDetector::SaveState();
  // "" before the first CheckLoss), and its replacement (InvalidArgument for bytes it did not
  // write). Every snapshot saves the window and every restore brings it back, so a replay judges
  // each loss as the uninterrupted run did; only the losses of steps that succeeded enter it. When
  // no checkpoint is committed and a survivor's state is broadcast to a replacement, the
  // replacement takes the source rank's window (the dead rank's own is lost with it) and the
  // survivors keep theirs: with a communicator factory the Runtime does it, and an integration
  // that broadcasts the state itself (trainguard.torch.broadcast_state) passes it along with
  // these two. Training thread.
  virtual std::string LossWindowState() = 0;
  virtual absl::Status LoadLossWindow(std::string_view state) = 0;

  // Hang detection (watchdog.h, collectives.h). The
  // Runtime owns the rank's flight-recorder ring ("/trainguard.<job>.fr.rank<R>"; removed by the
  // Runtime's destructor, so the ring of a rank that was killed or crashed stays for the launcher
  // or `trainguard flight-recorder show` to read; `trainguard run` removes those when the job
  // succeeds), a CollectiveTracker writing to it, and, unless watchdog_poll_ms is 0, a Watchdog
  // whose thread judges the phases (every guarded step is a "step" phase; nest your own with
  // ScopedPhase(rt->watchdog(), "forward_backward")) and the collectives in flight. On a hang, on
  // the watchdog thread: every thread's stack is captured, the ring and the stacks are dumped to
  // <run_dir>/flight_recorder/rank-<R>.<n>.pb, a `hang` event is written, the hang is published in
  // the store (hang/gen<G>) so that every other rank dumps its ring and stacks too, the
  // communicators' abort hooks run, and the guard of the step returns a communication failure
  // carrying the evidence. The process is never aborted. `kill -USR2 <pid>` dumps the ring and the
  // stacks the same way, on demand (within half a second), unless the application installed its own
  // SIGUSR2 handler first.
  virtual CollectiveTracker* collectives() const = 0;
  virtual Watchdog* watchdog() const = 0;  // nullptr when watchdog_poll_ms is 0
  // Hangs this process declared, and dumps written (its own hangs and those of peers).
  virtual int64_t hang_dumps() const = 0;

  // Communicators (communicator.h). With a factory set, the Runtime builds the communicator of
  // every generation (Start(), recover()), aborts and destroys the previous one first, registers it
  // with collectives() (a hang aborts it), and broadcasts the registered state from the recovery
  // plan's source rank when no checkpoint was restored. Without one (the escape hatch), the trainer
  // builds, aborts and syncs its own communicators around Start() and recover(), which then only
  // restore checkpoints and agree on the step. REQUIRES: before Start().
  virtual void SetCommunicatorFactory(CommunicatorFactory factory) = 0;
  // The current generation's communicator, as the factory built it (downcast it to your type);
  // nullptr before Start(), without a factory, after CloseCommunicator(), and after a recover()
  // that failed. Valid until the next recover() or CloseCommunicator().
  virtual Communicator* communicator() const = 0;
  // Aborts and destroys the communicator now. Call it before freeing buffers that a failed
  // collective of it may still write into (the trainer's exit path). The next recover() builds a
  // new one.
  virtual void CloseCommunicator() = 0;

  // Makes this rank ready to run its first step and returns that step; resume_step() agrees. Call
  // it once, after registering the state (state()) and setting the factory. Collective: every rank
  // of the generation calls it (survivors of a replacement are inside recover() meanwhile).
  //   - When checkpointing is configured, restores the newest committed checkpoint
  //     (RestoreCheckpoint); "nothing committed" is not an error, any other restore failure is
  //     (the job never silently starts over while committed state exists).
  //   - Builds the communicator (with a factory); when that fails because a rank died meanwhile,
  //     meets the ranks in the next generation and tries again (bounded).
  //   - When no checkpoint was restored and the recovery plan names a state source (a standby that
  //     took over), broadcasts every registered buffer and blob from it: a standby that takes over
  //     before the first commit starts at the survivors' step with their state, never at 0.
  // FailedPrecondition when called twice, or when every rank of the generation is new and nothing
  // is committed (the job's state is lost: it is not restarted from step 0 behind the user's back;
  // the reason is published as job/stop).
  virtual absl::StatusOr<int64_t> Start() = 0;

  // Appends an event to the rank's event file, filling in time (if unset), rank and generation.
  virtual absl::Status EmitEvent(Event event) = 0;

  // Adds an observer of step boundaries. REQUIRES: no guard is active; `observer` outlives the
  // Runtime.
  virtual void AddObserver(StepObserver* observer) = 0;

  // Carries out the recovery for a step result and returns the step to run next, or an error when
  // this process cannot go on (the trainer should then exit non-zero). The policy, per action:
  //
  //   kContinue: result.step + 1.
  //   kSkip: result.step + 1, unless more than max_consecutive_step_failures steps in a row failed:
  //     then a rollback when checkpointing, else the job stops (see below).
  //   kRollback, or kSkip past the limit when checkpointing: restores the newest committed
  //     checkpoint (RestoreCheckpoint) and returns its step; without checkpointing, Unimplemented.
  //     A fault that recurs after a rollback (the replay fails again before it gets past the step
  //     that failed) and would roll back to the same committed step more than
  //     max_rollbacks_per_step times is repeated: with repeated_fault_action "skip", the first time
  //     it resumes after the step where the failures began (the batches from the committed step to
  //     it are skipped, state as committed); otherwise the job stops. Nothing committed yet: the
  //     job stops too.
  //   Stopping the job: FailedPrecondition with one line "rank R: ..." naming the step and the
  //     limit, also published (first writer wins) as the store key job/stop, which tells a launcher
  //     to stop the job instead of replacing ranks. Only these give-ups write it: a dead rank or a
  //     fatal device error is a machine's fault, and its replacement can go on.
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
  //     step". With a communicator factory, the old communicator is aborted and destroyed before
  //     anything else (peers blocked in it fail at once), and after the agreement the next one is
  //     built and the state broadcast from state_source_rank; when that fails (a rank died
  //     meanwhile), recover() meets the ranks in the next generation and tries again, up to
  //     kMaxGenerationAttempts generations, then fails naming each attempt's error.
  //   kReRendezvous, static job (no store): Unavailable; restart the job.
  //   kFatal: the fault's status. After a fatal device error the Runtime also rejects every later
  //     guard (see fatal()).
  //
  // Each decision is written as a kRecoveryDecision event.
  virtual absl::StatusOr<int64_t> recover(const StepResult& result) = 0;

  // True after a guarded step failed with FaultKind::kFatalDeviceError, or after this process
  // learnt that it was replaced: guards are rejected from then on.
  virtual bool fatal() const = 0;

  // Generations Start() and recover() try to build a communicator in before they give up.
  static constexpr int kMaxGenerationAttempts = 4;
  // The store key a rank that stops the job writes its reason under (see recover()).
  static constexpr char kJobStopKey[] = "job/stop";
  // The exit status of a process whose step outlived its generation by
  // Options::superseded_step_exit_ms (EX_TEMPFAIL): the launcher replaces it like any dead rank.
  static constexpr int kSupersededStepExitCode = 75;

 protected:
  // Only Create() makes a Runtime (sdk/runtime/runtime_impl.h implements it); the guard relies on
  // that.
  Runtime() = default;
};

}  // namespace trainguard

#endif  // TRAINGUARD_RUNTIME_H_
