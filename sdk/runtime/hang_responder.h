// HangResponder: what a rank does when a hang is declared (private to sdk/runtime), its own or a
// peer's, through the hang protocol's store keys (sdk/core/store_keys.h):
//
//   its own (OnOwnHang: the watchdog's hang handler) -> captures its evidence, publishes
//       hang/gen<G> (the declaration), writes its dump and its `hang` event, then waits (bounded
//       by dump_wait) while the peers dump. When the wait declared a hang ends by itself meanwhile
//       and its step ends ok, the hang is withdrawn (hang/gen<G>/withdrawn/<rank>, a hang_withdrawn
//       event): nothing is aborted. Otherwise it stands (hang/gen<G>/aborted/<rank>) and the
//       watchdog aborts the communicators when OnOwnHang returns.
//   a peer's (OnHangKey: what the generation watcher read from hang/gen<G> of the rank's current
//       generation) -> writes this rank's dump and a `hang` event (remote=true) once per
//       generation; once more only after the hang was withdrawn (its key deleted, and seen absent
//       by a read sent after it was seen present). The key of a generation older than the rank's
//       current one is ignored: the rank no longer waits where that hang found it.
//   a superseded generation's (OnSuperseded: the generation watcher) -> a peer's hang the rank has
//       not dumped is captured while the rank still waits where the hang found it, before the
//       trainer's superseded handlers let it go, and written after them.
//   a static job's communication failure (DumpCommunicationFailure) and SIGUSR2 (DumpOnDemand).
//
// It has no thread of its own: the watchdog's thread, the generation watcher's, the duty thread and
// the training thread call it, and the instants that order its store requests against the watcher's
// reads come from its Clock. One dump is captured and written at a time, and a generation's hang is
// dumped once, whichever thread sees it first.
//
// Thread safety: every method may be called from any thread. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_HANG_RESPONDER_H_
#define TRAINGUARD_SDK_RUNTIME_HANG_RESPONDER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/runtime/hang_evidence.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"
#include "trainguard/watchdog.h"

namespace trainguard {

struct HangResponderOptions {
  int rank = 0;
  // The job's store; nullptr for a static job, which has no hang protocol: a peer's hang reaches
  // this rank as a failed collective (DumpCommunicationFailure).
  Store* store = nullptr;
  HangEvidenceSource* evidence = nullptr;
  // Stamps this rank's store requests (compared with the instants of the watcher's reads), times
  // the capture and the dump, and bounds the wait for the peers' dumps.
  Clock* clock = nullptr;
  // The rank's current generation.
  std::function<int64_t()> generation;
  // The step the rank is at: the step of a peer's hang's event and of a dump on demand.
  std::function<int64_t()> step;
  // Writes `event` as an event of `generation` (the rank's event file).
  std::function<void(int64_t generation, Event event)> emit;
  // Watchdog::WithdrawHangIfEnded, called from OnOwnHang on the watchdog's thread.
  std::function<bool()> withdraw_hang_if_ended;
  // How long OnOwnHang waits for the peers' dumps (Options::hang_dump_wait_ms).
  absl::Duration dump_wait = absl::Seconds(5);
};

class HangResponder {
 public:
  // REQUIRES: evidence and clock set, the callbacks set, and all of them (and the store) outlive
  // the responder.
  explicit HangResponder(HangResponderOptions options);
  HangResponder(const HangResponder&) = delete;
  HangResponder& operator=(const HangResponder&) = delete;

  // The step in progress, as the guard sees it: begun, then ending ok or failed (before the guard
  // takes the watchdog's hang). OnOwnHang's wait looks at them.
  void NoteStepBegun() { step_ending_.store(kStepRunning, std::memory_order_release); }
  void NoteStepEnding(bool failed) {
    if (failed) steps_failed_.fetch_add(1, std::memory_order_acq_rel);
    step_ending_.store(failed ? kStepEndingFailed : kStepEndingOk, std::memory_order_release);
  }

  // This rank's watchdog declared `report` in `generation` (see above). Returns once the hang is
  // withdrawn or stands: at the latest dump_wait after the declaration, or at Stop().
  void OnOwnHang(const HangReport& report, int64_t generation);
  // The generation watcher read hang/gen<generation>, in a request sent at `asked`: the
  // declaration's value, NotFound when no hang is declared (or it was withdrawn), or the store's
  // error (nothing is decided on it).
  void OnHangKey(int64_t generation, const absl::StatusOr<std::string>& declared_by,
                 absl::Time asked);
  // On the generation watcher's thread: `generation` was superseded. Reads its hang key; when a
  // peer declared a hang this rank has not dumped, captures the evidence, calls `let_go` (the
  // superseded handlers) and then writes the dump; otherwise just calls `let_go`.
  void OnSuperseded(int64_t generation, absl::FunctionRef<void()> let_go);
  // A static job's step failed in a collective in `generation` (`what`: the failure): the path of
  // this rank's dump, once per generation; nullopt when the generation's was written already.
  std::optional<std::string> DumpCommunicationFailure(int64_t generation, absl::string_view what);
  // SIGUSR2: dumps now, whatever was dumped before, and writes an evidence_dumped event.
  void DumpOnDemand();
  // Ends OnOwnHang's wait for the peers' dumps (the hang stands), now and from now on. The owner
  // calls it before it stops the threads that call in.
  void Stop();

 private:
  static constexpr int kStepRunning = 0;
  static constexpr int kStepEndingOk = 1;
  static constexpr int kStepEndingFailed = 2;

  // Writes this rank's dump of a peer's hang that `declared_by` (the hang key's value) declared
  // in `generation`, and its `hang` event (`how` is appended to the message).
  void WritePeerHangDump(const CapturedEvidence& captured, int64_t generation,
                         const std::string& declared_by, absl::string_view how)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dump_mu_);
  // OnOwnHang's wait (bounded polling, by dump_wait) while the peers dump: true when the hang is
  // withdrawn (the wait ended by itself and its step ends ok); false when the deadline passed, the
  // step ended failed (a peer died: the hang stands), or at Stop(). `steps_failed`: steps_failed_
  // as the hang was declared.
  bool AwaitHangEnd(int64_t steps_failed);
  bool stopped();

  const HangResponderOptions options_;
  Mutex dump_mu_;  // one dump at a time (the watchdog's, the watchers', the training thread's)
  // The generation whose hang this rank dumped last: a generation's hang is dumped once.
  int64_t dumped_generation_ ABSL_GUARDED_BY(dump_mu_) = -1;
  // When the hang key of dumped_generation_ was last known to exist (this rank's own: once
  // written). Its absence afterwards means the hang was withdrawn.
  absl::Time hang_key_seen_ ABSL_GUARDED_BY(dump_mu_) = absl::InfinitePast();
  // The step in progress: running, or ending ok or failed.
  std::atomic<int> step_ending_{kStepRunning};
  // Steps that ended failed: one since a hang's declaration means its step failed, whatever
  // step_ending_ says by the time the verdict is looked for (a dump that outlives the step, its
  // recovery and the next step's success).
  std::atomic<int64_t> steps_failed_{0};
  Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_HANG_RESPONDER_H_
