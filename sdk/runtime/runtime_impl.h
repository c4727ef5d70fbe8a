// RuntimeImpl: the Runtime (include/trainguard/runtime.h) itself. Private to trainguard: the guard
// (sdk/guard) drives a step through the methods under "For the guard", and the tools and tests
// reach the subsystems a trainer does not see (the checkpointer, the flight-recorder ring).
//
// Thread safety: as Runtime; the guard's methods belong to the training thread.
#ifndef TRAINGUARD_SDK_RUNTIME_RUNTIME_IMPL_H_
#define TRAINGUARD_SDK_RUNTIME_RUNTIME_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/checkpoint/replica_check.h"
#include "sdk/checkpoint/spare_arena.h"
#include "sdk/core/duty_thread.h"
#include "sdk/core/event_log.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/runtime/generation_entry.h"
#include "sdk/runtime/generation_watcher.h"
#include "sdk/runtime/hang_evidence.h"
#include "sdk/runtime/hang_responder.h"
#include "sdk/runtime/launcher_watch.h"
#include "sdk/runtime/rank_publisher.h"
#include "sdk/runtime/recovery_policy.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/stack_trace.h"
#include "trainguard/health.h"
#include "trainguard/runtime.h"
#include "trainguard/watchdog.h"

namespace trainguard {

class RuntimeImpl final : public Runtime {
 public:
  // Runtime::Create().
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Options& options);
  // Create() is the only caller.
  RuntimeImpl(Options options, Topology topology, std::string run_dir);
  ~RuntimeImpl() override;

  // The Runtime's public face; documented in runtime.h.
  const Options& options() const override { return options_; }
  const Topology& topology() const override { return topology_; }
  // The peer-backup options of the checkpointer: nullopt for a single-host job, without a store or
  // with backup_copies 1. An error names an infeasible placement (fewer hosts than copies, a bad
  // class or rack list).
  absl::StatusOr<std::optional<PeerBackupsOptions>> PeerBackupOptions();
  int rank() const override { return rank_; }
  int world_size() const override { return options_.world_size; }
  const std::optional<RecoveryPlan>& recovery_plan() const override { return current_.plan(); }
  const Membership& membership() const override;
  Store* store() const override { return store_; }
  const std::string& run_dir() const override { return run_dir_; }
  Env& env() const override { return *env_; }
  Clock& clock() const override { return *clock_; }
  const Heartbeat& heartbeat() const override { return heartbeat_; }
  StateRegistry& state() override { return state_; }
  absl::Status Checkpoint(int64_t resume_step) override;
  absl::Status WaitForCheckpoints(absl::Duration timeout) override;
  absl::Status FenceStateBuffer(const std::string& name, absl::Duration timeout) override;
  bool checkpointing() const override { return checkpointing_; }
  bool CheckpointDueAfter(int64_t step) const override;
  const std::string& last_restore_source() const override { return last_restore_source_; }
  std::string LossWindowState() override;
  absl::Status LoadLossWindow(std::string_view state) override;
  Checkpointer* checkpointer() const { return checkpointer_.get(); }
  FlightRecorder* flight_recorder() const { return flight_recorder_.get(); }
  CollectiveTracker* collectives() const override { return collectives_.get(); }
  Watchdog* watchdog() const override { return watchdog_.get(); }
  void SetCommunicatorFactory(CommunicatorFactory factory) override;
  Communicator* communicator() const override {
    return entry_ == nullptr ? nullptr : entry_->communicator();
  }
  void CloseCommunicator() override;
  absl::Status EmitEvent(Event event) override;
  // EmitEvent for an event of `generation` rather than the current one: a hang's event is written
  // after its dump, by when the job may have moved on to the next generation.
  absl::Status EmitEventOf(int64_t generation, Event event);
  void AddObserver(StepObserver* observer) override;
  bool fatal() const override { return fatal_.load(std::memory_order_acquire); }
  int64_t generation() const override { return current_.generation(); }
  int64_t superseded_generation() const override {
    return member_ == nullptr ? -1 : member_->superseded_generation();
  }
  void AddSupersededHandler(std::function<void(int64_t generation)> handler) override;
  int64_t resume_step() const override { return resume_step_; }
  absl::StatusOr<int64_t> RestoreCheckpoint() override;
  int64_t hang_dumps() const override {
    return hang_evidence_ == nullptr ? 0 : hang_evidence_->dumps();
  }
  absl::StatusOr<int64_t> Start() override;
  absl::StatusOr<int64_t> recover(const StepResult& result) override;

  // The rank's Runtime behind `runtime`. REQUIRES: `runtime` came from Runtime::Create(), the only
  // maker of Runtimes.
  static RuntimeImpl& Of(Runtime& runtime) { return static_cast<RuntimeImpl&>(runtime); }

  // For the guard (sdk/guard), on the training thread.
  // Guard internals, called by StepScope.
  bool TryBeginStep();
  void EndStep();
  // StepScope::Finish, before it takes the watchdog's hang: whether the step ends failed by itself
  // (an exception, a fault reported). A hang being declared meanwhile waits for it
  // (HangResponder::OnOwnHang).
  void NoteStepEnding(bool failed) { hang_responder_->NoteStepEnding(failed); }
  // After a successful step: the first one of each generation is announced in the store
  // (rdzv/gen/<g>/resumed/<rank>), which is how a launcher times a recovery. One compare otherwise.
  void NoteStepSucceeded(int64_t step) {
    recovery_policy_.OnStepSucceeded(step);
    if (announced_generation_ != current_.generation()) AnnounceResumed(step);
  }
  // Checkpoint policy, on the training thread: after a successful step, and at a guard's entry
  // (fences a snapshot still being copied).
  void MaybeCheckpoint(int64_t step) {
    if (options_.checkpoint_every_steps > 0 || options_.checkpoint_every_seconds > 0) {
      MaybeCheckpointSlow(step);
    }
    if (options_.silent_corruption_every_steps > 0 &&
        (step + 1) % options_.silent_corruption_every_steps == 0) {
      CompareReplicasBetweenSnapshots(step);
    }
  }
  // silent_corruption_every_steps: the replicated host buffers' fingerprint compared across the
  // group (CheckReplicatedFingerprint), unless this step started a snapshot (compared anyway).
  void CompareReplicasBetweenSnapshots(int64_t step);
  void MaybeCheckpointSlow(int64_t step);
  void FenceSnapshot() {
    if (snapshot_unfenced_) FenceSnapshotSlow();
  }
  void FenceSnapshotSlow();
  FiniteChecker* finite_checker();
  // The detector behind Step::CheckLoss (created at the first call, from the loss_spike_* options).
  LossSpikeDetector& loss_spike_detector();
  // Step::CheckLoss found `loss` no spike: it enters the detector's window if the step succeeds
  // (SettleLosses), so the replay of a failed step is judged against the window its first try saw.
  void NoteLossAccepted(double loss) { accepted_losses_.push_back(loss); }
  // At the end of every step: the losses noted in it enter the window when `succeeded`, before the
  // snapshot that step may start; dropped otherwise.
  void SettleLosses(bool succeeded) {
    if (accepted_losses_.empty()) return;
    if (succeeded) {
      for (double loss : accepted_losses_) loss_spike_detector().Accept(loss);
    }
    accepted_losses_.clear();
  }
  // Writes the kStepFault event of a failed step; marks the runtime fatal after a fatal device
  // error.
  void RecordStepFault(const StepResult& result);
  const std::string& fatal_reason() const { return fatal_reason_; }
  // Silent data corruption with silent_corruption=repair: the checkpointer's observer asks, the
  // next guard takes the request (once) and fails its step without running it, so that recover()
  // takes every rank to a new generation, where each restores the last committed snapshot.
  // `stop`: not a repair but the end of the job (a host named twice): recover() stops the job
  // with it.
  void RequestRepair(std::string why, std::string stop = {});
  // Step::CheckReplicated: publishes the buffer's fingerprint under the step and this rank's
  // data-parallel group; the group's last rank judges the group and removes its keys.
  absl::Status CheckReplicated(int64_t step, std::string_view name, const void* data, size_t bytes);
  absl::Status CheckReplicatedFingerprint(int64_t step, std::string_view name,
                                          uint64_t fingerprint);
  std::optional<std::string> TakeRepairRequest() {
    if (!repair_requested_.load(std::memory_order_acquire)) return std::nullopt;
    return TakeRepairRequestSlow();
  }
  std::optional<std::string> TakeRepairRequestSlow();

  Heartbeat& mutable_heartbeat() { return heartbeat_; }
  const std::vector<StepObserver*>& observers() const { return observers_; }
  // The checker of Step::CheckFinite's device buffers, if one was created (nullptr otherwise).
  FiniteChecker* existing_finite_checker() const { return finite_checker_.get(); }

 private:
  // The parts of Create() after construction.
  absl::Status ConnectStore();
  absl::Status JoinRendezvous();
  absl::Status OpenEvents();
  // Creates entry_, once the store, the member, the tracker and the event file exist.
  void CreateGenerationEntry();
  // After a restore: the detector's window as the restored snapshot saved it (empty when it saved
  // none). DataLoss naming the blob and the step when the saved bytes cannot be read.
  absl::Status RestoreLossWindow(int64_t step);
  // Returns the FailedPrecondition of a give-up that stops the job, after publishing `reason` as
  // job/stop (first writer wins; best effort).
  absl::Status StopJob(const std::string& reason, RecoveryReport& report);
  absl::StatusOr<int64_t> RecoverOnce(const StepResult& result, RecoveryReport& report);
  void ReportRecovery(const StepResult* result, RecoveryReport& report);
  void MarkFatal(std::string reason);

  void AnnounceResumed(int64_t step);
  absl::Status EnsureCheckpointer();
  // A snapshot's replicas disagreed (this rank judged the ballot): the silent_corruption events,
  // and with silent_corruption=repair the request for a rollback (RequestRepair).
  void OnSilentCorruption(int64_t step, const std::vector<ReplicaDisagreement>& disagreements);
  // This rank's data-parallel group (its model-parallel coordinates) and the name of its host in
  // verdicts.
  std::string ReplicaGroup() const;
  std::string ReplicaHost() const;
  // RestoreCheckpoint's work, with where the state came from: generation entry's restore hook.
  absl::StatusOr<RestoreResult> RestoreNewestCommitted();
  // Restores the newest committed checkpoint for the failure `result` (the policy's kRollback
  // verdict) and carries out the policy's verdict on it. `first_failed_step`: the verdict's.
  absl::StatusOr<int64_t> Rollback(const StepResult& result, int64_t first_failed_step,
                                   RecoveryReport& report);
  // Detection internals.
  absl::Status StartDetection();
  // The watchdog's hang handler: this rank's response (HangResponder::OnOwnHang).
  void OnHang(const HangReport& report);
  // The duty thread's duties, every period: publishes this rank's records, exits when a step
  // outlives its generation, and dumps the evidence on SIGUSR2.
  void RunWatcherDuties();
  // On the generation watcher's thread, once per superseded generation: calls the superseded
  // handlers and writes the event generation_superseded.
  void OnSuperseded(int64_t generation);
  // On the duty thread: exits the process (Runtime::kSupersededStepExitCode) once one step
  // has gone on for superseded_step_exit_ms while this rank's generation is superseded.
  void ExitIfStepOutlivesGeneration();
  // The duty thread's period (shorter when watchdog_peer_progress_ms is).
  static constexpr absl::Duration kDutyPeriod = absl::Milliseconds(250);
  // The watchdog's peer_progress question (watchdog.h), answered from the peers' records.
  std::optional<std::string> ExplainPeerWait(const InFlightCollective& waiting_in);
  const Options options_;
  const Topology topology_;
  const std::string run_dir_;
  Env* const env_;
  Clock* const clock_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<Store> owned_store_;
  Store* store_ = nullptr;
  std::unique_ptr<RendezvousMember> member_;
  // The generation this rank holds: JoinRendezvous adopts the first, entry_ every later one.
  RankGeneration current_;
  int rank_ = 0;
  int64_t resume_step_ = 0;
  int64_t announced_generation_ = -1;  // training thread only
  Heartbeat heartbeat_;
  std::vector<StepObserver*> observers_;
  std::atomic<bool> step_active_{false};
  std::atomic<bool> fatal_{false};
  std::string fatal_reason_;  // written once before fatal_ is set
  std::atomic<bool> repair_requested_{false};
  Mutex repair_mu_;
  std::string repair_why_ ABSL_GUARDED_BY(repair_mu_);
  std::string repair_stop_ ABSL_GUARDED_BY(repair_mu_);
  // What recover() does about a failed step, and the failures and rollbacks it counts (training
  // thread only).
  RecoveryPolicy recovery_policy_;
  bool started_ = false;
  StateRegistry state_;
  bool checkpointing_ = false;
  bool snapshot_unfenced_ = false;  // training thread only
  int64_t last_checkpoint_ns_ = 0;
  std::string last_restore_source_;
  std::vector<std::string> last_restore_skipped_;
  std::unique_ptr<FlightRecorder> flight_recorder_;
  std::unique_ptr<CollectiveTracker> collectives_;
  // Enters each generation (Start, recover's re-rendezvous) and owns its communicator, whose abort
  // hook is registered in collectives_: declared after it, destroyed before it. Null until Create
  // has started detection.
  std::unique_ptr<GenerationEntry> entry_;
  std::unique_ptr<FiniteChecker> finite_checker_;         // created at the first device check
  std::optional<LossSpikeDetector> loss_spike_detector_;  // created at the first CheckLoss
  std::vector<double> accepted_losses_;  // NoteLossAccepted's, until SettleLosses (reserved)
  std::atomic<int64_t> steps_begun_{0};  // TryBeginStep's successes
  // Watcher thread only (ExitIfStepOutlivesGeneration): since when (clock_'s monotonic ns, -1:
  // not) which step (steps_begun_) has been running in a superseded generation.
  int64_t superseded_step_since_ns_ = -1;
  int64_t superseded_step_ = -1;
  // Watcher thread only: writes this rank's progress and work records (set in StartDetection).
  std::unique_ptr<RankPublisher> rank_publisher_;
  // Watchdog thread only: the collective whose postponement was last written as an event.
  uint64_t excused_collective_ = 0;
  // Watchdog thread only: the generation whose peers ExplainPeerWait asked for their progress
  // records (hang/gen<G>/progress_wanted), and when they were first asked (by any rank).
  struct ProgressQuestion {
    int64_t generation = -1;
    absl::Time asked = absl::InfinitePast();
  };
  ProgressQuestion progress_question_;
  // This rank's dumps, and what it does when a hang is declared (set in StartDetection, before
  // any step). Called by the watchdog's, the generation watcher's and the duty thread, declared
  // before them.
  std::unique_ptr<FlightRecorderEvidence> hang_evidence_;
  std::unique_ptr<HangResponder> hang_responder_;
  // With a watchdog: runs RunWatcherDuties on its thread, which uses everything above. Without
  // one, in a job with a store: runs ExitIfStepOutlivesGeneration only.
  std::unique_ptr<DutyThread> duty_thread_;
  Mutex superseded_handlers_mu_;
  std::vector<std::function<void(int64_t)>> superseded_handlers_
      ABSL_GUARDED_BY(superseded_handlers_mu_);
  // With a store: calls OnSuperseded, and (with a watchdog) hands the hang key to hang_responder_,
  // on its thread, which uses everything above. ~Runtime ends its parked wait with the wake key.
  std::unique_ptr<GenerationWatcher> generation_watcher_;
  // One parked wait per rank per kGenerationWatchPark while nothing happens: the rank's request
  // rate for the next generation and a peer's hang together. Also the longest ~Runtime waits for
  // the watcher when the store cannot be reached to write the wake key.
  static constexpr absl::Duration kGenerationWatchPark = absl::Seconds(5);
  // While a peer's hang of the rank's generation stands: how often its key is read again, to see
  // it withdrawn.
  static constexpr absl::Duration kHangRecheckPeriod = absl::Milliseconds(250);
  // Its thread calls OnHang, which uses everything above: destroyed before them.
  std::unique_ptr<Watchdog> watchdog_;
  // watchdog_.get(), set once before the hang callbacks are registered: they read it on the
  // watchdog's own thread, also while ~Runtime is resetting watchdog_ (which joins that thread).
  Watchdog* phase_watchdog_ = nullptr;
  // A standby's prepared arena memory (spare_arena.h), made while it was parked; handed to the
  // checkpointer it creates once it has a rank, then dropped (adopted, or removed).
  std::unique_ptr<SpareArena> spare_arena_;
  // A standby's takeover, for its first `restored` event: when it was assigned a rank, when the
  // ranks agreed on the resume step, when Create returned (the rest is the trainer's own set-up
  // before Start). Training thread only; cleared by the first restore.
  struct TakeoverTimes {
    absl::Time assigned;
    absl::Time agreed;
    absl::Time created;
  };
  std::optional<TakeoverTimes> takeover_;
  // Last: its worker thread uses the store and the event log, so it is destroyed first.
  std::unique_ptr<Checkpointer> checkpointer_;
  std::string store_token_;  // the job's shared token (also guards the peer-backup connections)
  // Under `trainguard run`: ends this process when the launcher is gone (sdk/runtime/
  // launcher_watch.h). Reset first in ~RuntimeImpl: its observer writes an event.
  std::unique_ptr<LauncherWatch> launcher_watch_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_RUNTIME_IMPL_H_
