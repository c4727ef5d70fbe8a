// Watchdog::Impl: the Watchdog's state (include/trainguard/watchdog.h documents the behaviour).
// Private to trainguard; the thread contract is the Watchdog's.
#ifndef TRAINGUARD_SDK_WATCHDOG_WATCHDOG_IMPL_H_
#define TRAINGUARD_SDK_WATCHDOG_WATCHDOG_IMPL_H_

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

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "sdk/core/mutex.h"
#include "sdk/watchdog/learned_bound.h"
#include "sdk/watchdog/name_table.h"
#include "trainguard/collectives.h"
#include "trainguard/watchdog.h"

namespace trainguard {

class Watchdog::Impl {
 public:
  static constexpr int kMaxDepth = Watchdog::kMaxDepth;

  explicit Impl(const WatchdogOptions& options);
  // Stops and joins the monitor thread.
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Starts the monitor thread (Create(), when poll_period is not zero).
  void StartMonitor();

  void SetStep(int64_t step);
  void BeginPhase(std::string_view name);
  void Tick(int64_t amount = 1);
  void EndPhase();
  std::vector<PhaseTotal> PhaseTotals() const;
  void AddHangHandler(std::function<void(const HangReport&)> handler);
  void AddAbortHook(std::string name, std::function<void()> hook);
  std::optional<HangReport> TakeHang(bool wait);
  bool WithdrawHangIfEnded();
  int PollOnce();
  PhaseBounds BoundsFor(std::string_view phase) const;
  int phase_thread_id() const { return phase_thread_.load(std::memory_order_relaxed); }
  int64_t hangs_declared() const { return hangs_declared_.load(std::memory_order_relaxed); }
  int64_t hangs_postponed() const { return hangs_postponed_.load(std::memory_order_relaxed); }
  int64_t hangs_withdrawn() const { return hangs_withdrawn_.load(std::memory_order_relaxed); }
  int64_t last_progress_ns() const { return last_progress_ns_.load(std::memory_order_relaxed); }
  int64_t usage_errors() const { return usage_errors_.load(std::memory_order_relaxed); }
  absl::Status usage_status() const;

 private:
  struct Frame;
  struct FrameView;

  void MonitorLoop();
  int PhaseIndex(std::string_view name);
  void UsageError(std::string message);
  // A consistent copy of the innermost open frame; nullopt when none or while it changes.
  std::optional<FrameView> ReadInnermost() const;
  std::string PhasePath(int depth) const;
  // A wait the monitor excused because a peer was still making progress.
  struct Postponement {
    uint64_t collective = 0;  // InFlightCollective::instance of the collective waited in
    int64_t since_ns = 0;     // when it was first excused
    int64_t recheck_ns = 0;   // when to ask peer_progress again
    std::string peer;         // what peer_progress answered last
  };
  // True when the hang about to be declared while waiting in `waiting_in` is postponed (see the
  // header comment): a postponement still fresh, or peer_progress naming a peer.
  bool Postpone(const InFlightCollective& waiting_in, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_);
  int Declare(HangReport::Cause cause, const std::optional<FrameView>& frame, int64_t now_ns,
              const CollectivePoll& collectives, const InFlightCollective* overdue,
              const std::optional<Postponement>& postponed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_);
  void RecordPhase(bool end, int name, int64_t now_ns, int64_t duration_ns);

  const WatchdogOptions options_;
  Clock* const clock_;
  FlightRecorder* const recorder_;
  CollectiveTracker* const tracker_;
  std::unique_ptr<const watchdog_internal::BoundRule> rule_;
  std::unique_ptr<watchdog_internal::NameTable> phases_;
  std::vector<std::unique_ptr<watchdog_internal::SampleWindow>> durations_;
  std::vector<std::unique_ptr<watchdog_internal::SampleWindow>> gaps_;
  // Per phase name: completed durations summed (the phase thread adds, any thread reads).
  std::unique_ptr<std::atomic<int64_t>[]> phase_total_ns_;

  // Training thread.
  std::unique_ptr<Frame[]> frames_;
  int open_ = 0;  // open phases, including untracked ones past kMaxDepth
  uint64_t next_instance_ = 1;
  std::atomic<int> depth_{0};  // tracked open phases, published to the monitor
  std::atomic<int64_t> step_{-1};
  std::atomic<int> phase_thread_{0};

  std::atomic<int64_t> last_progress_ns_{0};

  std::atomic<int64_t> hangs_declared_{0};
  std::atomic<int64_t> hangs_postponed_{0};
  std::atomic<int64_t> hangs_withdrawn_{0};
  std::atomic<int64_t> usage_errors_{0};
  mutable Mutex usage_mu_;
  absl::Status first_usage_error_ ABSL_GUARDED_BY(usage_mu_);

  Mutex poll_mu_;  // one monitor pass at a time
  std::optional<Postponement> postponed_ ABSL_GUARDED_BY(poll_mu_);

  Mutex hooks_mu_;
  std::vector<std::function<void(const HangReport&)>> handlers_ ABSL_GUARDED_BY(hooks_mu_);
  std::vector<std::pair<std::string, std::function<void()>>> abort_hooks_
      ABSL_GUARDED_BY(hooks_mu_);

  // The hang whose handlers run now (Declare), and what tells that its wait ended: the collective
  // it names no longer in flight, or the training thread's progress past the hung frame's.
  struct Declaring {
    std::thread::id thread;              // the one running the handlers
    std::optional<uint64_t> collective;  // HangReport::collective's InFlightCollective::instance
    int64_t progress_ns = 0;             // the hung frame's last progress
    int frame_depth = 0;                 // the frame marked hung (0: none)
    uint64_t frame_instance = 0;
    bool withdrawn = false;
  };
  // Declaring::withdrawn, read and cleared by Declare after the handlers.
  bool FinishDeclaring(bool stored_pending);

  Mutex pending_mu_;
  std::optional<HangReport> pending_ ABSL_GUARDED_BY(pending_mu_);
  std::optional<Declaring> declaring_ ABSL_GUARDED_BY(pending_mu_);
  std::atomic<bool> has_pending_{false};

  Mutex thread_mu_;
  bool stop_ ABSL_GUARDED_BY(thread_mu_) = false;
  std::thread monitor_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_WATCHDOG_IMPL_H_
