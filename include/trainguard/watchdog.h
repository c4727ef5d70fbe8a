// Watchdog: finds a rank that stopped making progress, without false alarms on phases that are
// long but healthy (RL generation, checkpoint saves, the first step), and says where it stopped.
//
//     auto wd = sdk::Watchdog::Create(sdk::WatchdogOptions::FromOptions(options));
//     (*wd)->SetStep(step);
//     {
//       sdk::ScopedPhase phase(wd->get(), "generate");
//       for (...) { decode(); (*wd)->Tick(tokens); }   // progress inside a long phase
//     }
//     if (std::optional<sdk::HangReport> hang = (*wd)->TakeHang()) { ... }
//
// The training thread declares phases (BeginPhase/EndPhase or ScopedPhase; nested up to kMaxDepth)
// and ticks inside long ones. A monitor thread owned by the Watchdog (pure C++: it keeps running
// while a Python trainer holds the GIL) polls every poll_period. Each phase name learns two bounds
// from its recent completed instances:
//
//   duration bound: how long an instance runs, begin to end;
//   tick-gap bound: the longest silence of an instance while it was the innermost phase (begin to
//                   first tick, tick to tick, last tick to end, and the stretches before, between
//                   and after its nested phases).
//
// Both follow one rule (Options keys watchdog_*): until watchdog_warmup_samples instances have
// completed, the bound is watchdog_warmup_bound_ms; then it is max(watchdog_floor_ms,
// watchdog_bound_factor_pct/100 x the longest of the last watchdog_history instances). The
// maximum of the window is the high quantile: with 200 samples an estimated p99 lies between the
// two largest samples anyway, and the maximum never sits below a healthy instance in the window.
// Instances reported hung are kept out of the history.
//
// The innermost open phase is hung when it has run longer than its duration bound AND its last
// progress (its begin, its last tick, or the end of its last nested phase) is older than its
// tick-gap bound. For a phase that neither ticks nor nests, the longest silence is its duration,
// so its tick-gap bound is its duration bound. Ticks in a nested phase are progress of the
// enclosing ones: an enclosing phase is not judged while a nested one is open (the nested phase,
// with its own history, answers for that time) and the nested phase's end is progress. That is
// why a "checkpoint" phase inside a step, or any phase of the first step, never raises an alarm.
// A collective (collectives.h) in flight longer than its op's bound is a hang too, inside any
// phase. Each hang is reported once per phase instance (or once per collective outside phases).
//
// Waiting is not hanging. A rank whose collective (or the phase around it) runs past its bound may
// simply be waiting for a peer that is still busy: in RL post-training every rank generates for a
// heavy-tailed time and the fast ones wait in the next collective for the slowest, so a bound
// learned from this rank's own waits is exceeded now and then by a healthy job. Before declaring
// such a hang the monitor asks WatchdogOptions::peer_progress whether a peer that has not entered
// the collective is still making progress; if one is, the hang is postponed (hangs_postponed()),
// the collective is excused so that its duration teaches the bound when it completes, and the
// question is asked again every peer_recheck. The peer itself stays judged by its own watchdog,
// and once it stops progressing the waiting ranks declare the hang too. A phase silent with no
// collective in flight is this rank's own stall and is never postponed.
//
// On a hang, on the monitor thread, in this order: a kHang record to the FlightRecorder (if given);
// the hang handlers; the abort hooks; the tracker's communicator abort functions (ncclCommAbort,
// closing a gloo context), once per registration. The pending report waits for TakeHang(). The
// watchdog never aborts, signals or exits the process: what happens after a hang is decided by the
// handlers and hooks its owner registered, and by the training thread.
//
// A hang may be withdrawn while its handlers run. A machine-wide stall (another job's build, a
// burst of swapping) stretches every rank's step at once, past any bound low enough to catch real
// hangs quickly. A handler that waits (bounded) before the abort, as the Runtime's does for the
// peers' dumps, calls WithdrawHangIfEnded(): once the wait that was declared a hang has ended by
// itself (the collective the report names completed, or the training thread began, ended or ticked
// a phase since the hung phase's last progress), the hang is withdrawn: the later handlers, the
// abort hooks and the communicator aborts do not run, TakeHang() never returns it, its phase
// instance is judged again and teaches its bounds, and hangs_withdrawn() counts it. TakeHang()
// called on another thread while handlers run waits for them (up to 10 s) so that a hang about to
// be withdrawn is not taken.
//
// Cost: BeginPhase/EndPhase/Tick allocate nothing and never wait for the monitor: the open phases
// are a fixed array of atomics written by the training thread alone, read by the monitor under a
// per-frame sequence number. There is no lock on the path: the FlightRecorder append of
// BeginPhase/EndPhase (when a recorder is given) is lock-free, and the monitor's rare appends to
// the same recorder never make it wait. Ticks are not written to the recorder (they would flood the
// ring).
//
// Misuse (nesting deeper than kMaxDepth, EndPhase without a phase, more phase names than
// max_phase_names) never crashes: the call is ignored or degraded, counted in usage_errors() and
// the first one is kept in usage_status().
//
// Thread safety: SetStep, BeginPhase, Tick, EndPhase and ScopedPhase from one thread at a time (the
// training thread). Everything else from any thread. Handlers and hooks run on the monitor thread
// (or the thread calling PollOnce) and must be quick; they may call TakeHang() but not PollOnce().
#ifndef TRAINGUARD_WATCHDOG_H_
#define TRAINGUARD_WATCHDOG_H_

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
#include "trainguard/collectives.h"

namespace trainguard {

class Clock;
class FlightRecorder;
struct Options;

struct WatchdogOptions {
  // The monitor thread's period. Zero: no thread; the owner calls PollOnce() (tests).
  absl::Duration poll_period = absl::Milliseconds(100);
  // The learned-bound rule of phase durations and tick gaps (see the header comment).
  LearnedBoundOptions bound;
  // Distinct phase names; further names share one "<other phases>" history (a usage error).
  int max_phase_names = 64;

  // nullptr: Clock::Real(). Not owned; must outlive the Watchdog.
  Clock* clock = nullptr;
  // kPhaseBegin/kPhaseEnd/kHang records go here; nullptr: nowhere. Not owned.
  FlightRecorder* recorder = nullptr;
  // Polled by the monitor thread: overdue collectives are hangs, GPU collectives complete there.
  // Not owned; must outlive the Watchdog. Use the same clock for both.
  CollectiveTracker* tracker = nullptr;

  // Asked before a hang is declared while this rank waits in a collective (an overdue collective,
  // or a phase silent past its bounds with a collective in flight): is the wait explained by a
  // peer rank that has not entered that collective yet and is still making progress? It returns
  // what that peer is doing, which postpones the hang, or nullopt, which lets it be declared. While
  // the hang stays pending it is asked again at most every peer_recheck. It runs on the monitor
  // thread and may block briefly (the Runtime reads its peers' progress records from the store
  // with a short deadline); it must not call PollOnce. Empty: never asked (a job without a store).
  std::function<std::optional<std::string>(const InFlightCollective&)> peer_progress;
  absl::Duration peer_recheck = absl::Milliseconds(250);

  // The watchdog_* keys of `options` (watchdog_poll_ms 0: no thread), and options.clock.
  static WatchdogOptions FromOptions(const Options& options);
  // Errors name the field.
  absl::Status Validate() const;
};

// What the watchdog saw when it declared a hang.
struct HangReport {
  enum class Cause {
    kPhase,       // the innermost phase ran past its bounds without ticking
    kCollective,  // a collective was in flight past its op's bound
  };
  Cause cause = Cause::kPhase;
  // The open phases, outermost first, e.g. "step/forward_backward"; "" when none was open.
  std::string phase;
  int64_t step = -1;  // as last set by SetStep
  // The innermost phase: how long it has run and its duration bound; how long since its last
  // progress and its tick-gap bound; the ticks in it. Zero when no phase was open.
  absl::Duration elapsed;
  absl::Duration bound;
  absl::Duration since_last_tick;
  absl::Duration tick_bound;
  int64_t ticks = 0;
  int64_t progress = 0;  // the sum of the tick amounts
  // kCollective: the overdue collective; kPhase: the oldest collective in flight, if any.
  std::optional<InFlightCollective> collective;
  // Further evidence, ordered: "cause", "rule", "duration_samples", "tick_gap_samples",
  // "in_flight_collectives", "comm/<name>" -> "begun=N completed=M", ...
  std::vector<std::pair<std::string, std::string>> evidence;
  absl::Time time;  // wall time of the declaration

  // The value of evidence `key`, or "" when absent.
  std::string_view Evidence(std::string_view key) const;
  // One line for logs, naming the phase, step, times and the collective.
  std::string ToString() const;
};

// A phase name's bounds as the monitor applies them now.
struct PhaseBounds {
  absl::Duration duration;
  absl::Duration tick_gap;
  int64_t duration_samples = 0;
  int64_t tick_gap_samples = 0;
};

// The time spent in one phase name's completed phases (Watchdog::PhaseTotals).
struct PhaseTotal {
  std::string name;
  absl::Duration total;
};

class Watchdog {
 public:
  // Open phases tracked; deeper ones are a usage error (ignored, still balanced by EndPhase).
  static constexpr int kMaxDepth = 8;

  // Validates the options and starts the monitor thread (unless poll_period is zero).
  static absl::StatusOr<std::unique_ptr<Watchdog>> Create(const WatchdogOptions& options);
  // Stops and joins the monitor thread (waiting for a poll in progress, including its handlers).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The step named in records and reports (also passed on to the tracker).
  void SetStep(int64_t step);

  // Opens a phase nested in the open ones. `name` is copied (up to 63 bytes) on first sight.
  void BeginPhase(std::string_view name);
  // Progress in the innermost phase (and so in the enclosing ones, see above). `amount` (tokens,
  // samples, bytes) is summed into HangReport::progress.
  void Tick(int64_t amount = 1);
  // Closes the innermost phase and teaches its name's bounds.
  void EndPhase();
  // Per phase name, the durations of its completed phases summed (names never completed are left
  // out; names past max_phase_names share "<other phases>"): the fail-slow metrics' phase times
  // (docs/GUIDE.md). Any thread; allocates, so not for the training thread's hot path.
  std::vector<PhaseTotal> PhaseTotals() const;

  void AddHangHandler(std::function<void(const HangReport&)> handler);
  // Called on each hang (once per hang), after the handlers. `name` identifies it in errors.
  void AddAbortHook(std::string name, std::function<void()> hook);

  // The oldest hang not yet taken, once; nullopt when none is pending. Lock-free when none is.
  // While a hang's handlers run (on another thread), waits up to 10 s for them: see above.
  std::optional<HangReport> TakeHang();
  // The same without waiting for the handlers: a hang they are still deciding on is taken as it
  // stands. For a caller whose step failed by itself, which no withdrawal would make succeed.
  std::optional<HangReport> TakeHangNow();

  // From a hang handler, on its thread: true when the wait declared a hang has ended since (the
  // collective the report names is no longer in flight, or the training thread made progress), and
  // the hang is then withdrawn (see above); false otherwise, and outside a handler.
  bool WithdrawHangIfEnded();

  // One monitor pass at the clock's current time: polls the tracker, checks the innermost phase
  // and the collectives, declares at most one hang. Returns the number declared (0 or 1).
  int PollOnce();

  PhaseBounds BoundsFor(std::string_view phase) const;
  // The kernel thread id (gettid) of the thread that last opened an outermost phase: the training
  // thread, whose stack is the one to compare across ranks in a hang (DiagnoseHang). 0 before the
  // first BeginPhase.
  int phase_thread_id() const;
  int64_t hangs_declared() const;
  // Hangs postponed because peer_progress named a peer still working towards the collective this
  // rank waits in; each collective is counted once however long it stays postponed.
  int64_t hangs_postponed() const;
  // Hangs declared and then withdrawn by a handler (WithdrawHangIfEnded); hangs_declared() counts
  // them too.
  int64_t hangs_withdrawn() const;
  // The clock's MonotonicNanos() at the training thread's last BeginPhase, Tick or EndPhase (its
  // last sign of progress, published to peers by the Runtime); 0 before the first.
  int64_t last_progress_ns() const;
  int64_t usage_errors() const;
  // The first usage error, or OK.
  absl::Status usage_status() const;

 private:
  class Impl;  // sdk/watchdog/watchdog_impl.h
  explicit Watchdog(std::unique_ptr<Impl> impl);
  const std::unique_ptr<Impl> impl_;
};

// BeginPhase in the constructor, EndPhase in the destructor (also when the body throws). A null
// watchdog makes it a no-op, so trainers can run without one.
class ScopedPhase {
 public:
  ScopedPhase(Watchdog* watchdog, std::string_view name) : watchdog_(watchdog) {
    if (watchdog_ != nullptr) watchdog_->BeginPhase(name);
  }
  ~ScopedPhase() {
    if (watchdog_ != nullptr) watchdog_->EndPhase();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Watchdog* const watchdog_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_WATCHDOG_H_
