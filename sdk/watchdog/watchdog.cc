#include "trainguard/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
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
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/learned_bound.h"
#include "sdk/watchdog/name_table.h"
#include "sdk/watchdog/recorder_append.h"
#include "sdk/watchdog/watchdog_impl.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/options.h"

namespace trainguard {

using watchdog_internal::BoundRule;
using watchdog_internal::NameTable;
using watchdog_internal::SampleWindow;

// NameTable::CopyPadded fills FlightRecord::name whole, NULs included.
static_assert(sizeof(FlightRecord::name) == NameTable::kMaxNameBytes + 1);

namespace {

constexpr std::string_view kOtherPhases = "<other phases>";

// How long TakeHang waits for the handlers of a hang being declared, which may withdraw it.
constexpr absl::Duration kHandlersWait = absl::Seconds(10);

std::string Pretty(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

// One open phase. Written by the training thread only; the monitor reads it concurrently, so every
// field it reads is an atomic. `version` is a sequence lock around BeginPhase's rewrite (odd while
// rewriting): the monitor drops what it read when the version moved. Ticks only move
// last_progress_ns/ticks/progress forward, and either value is a valid reading.
//
// Silence is accounted only while a frame is the innermost: BeginPhase of a nested phase closes the
// enclosing frame's current silence, and the nested phase's EndPhase is progress of the enclosing
// frame. So ticks inside nested phases keep the enclosing ones alive (they are not judged while the
// nested phase is open), and a "step" that only wraps other phases learns a small tick-gap bound
// from its own short stretches of code. For a phase that neither ticks nor nests, the longest
// silence is its duration, so its tick-gap bound is its duration bound.
struct Watchdog::Impl::Frame {
  std::atomic<uint64_t> version{0};
  std::atomic<int32_t> name{-1};
  std::atomic<uint64_t> instance{0};
  std::atomic<int64_t> begin_ns{0};
  // Its last progress: its begin, its last tick, or the end of its last nested phase.
  std::atomic<int64_t> last_progress_ns{0};
  std::atomic<int64_t> ticks{0};
  std::atomic<int64_t> progress{0};
  // The instance the monitor reported hung; instances are unique, so it never needs a reset.
  std::atomic<uint64_t> hung_instance{0};
  // Training thread only: its longest silence so far while it was the innermost phase.
  int64_t max_gap_ns = 0;
};

struct Watchdog::Impl::FrameView {
  int depth = 0;  // this frame is frames_[depth - 1]
  int name = -1;
  uint64_t instance = 0;
  int64_t begin_ns = 0;
  int64_t last_progress_ns = 0;
  int64_t ticks = 0;
  int64_t progress = 0;
  bool reported = false;
};

WatchdogOptions WatchdogOptions::FromOptions(const Options& options) {
  WatchdogOptions o;
  o.poll_period = absl::Milliseconds(options.watchdog_poll_ms);
  o.bound = LearnedBoundOptions::FromOptions(options);
  o.clock = options.clock;
  return o;
}

absl::Status WatchdogOptions::Validate() const {
  auto bad = [](std::string_view field, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("watchdog options: %s %s", field, why));
  };
  if (poll_period < absl::ZeroDuration()) return bad("poll_period", "must be >= 0");
  if (peer_recheck < absl::ZeroDuration()) return bad("peer_recheck", "must be >= 0");
  if (max_phase_names < 1) return bad("max_phase_names", "must be >= 1");
  return bound.Validate("watchdog options");
}

std::string_view HangReport::Evidence(std::string_view key) const {
  for (const auto& [k, v] : evidence) {
    if (k == key) return v;
  }
  return {};
}

std::string HangReport::ToString() const {
  std::string out = absl::StrFormat(
      "hang (%s) at step %d in phase \"%s\": running %s (bound %s), no progress for %s (tick "
      "bound %s, %d ticks)",
      cause == Cause::kPhase ? "phase" : "collective", step, phase, Pretty(elapsed), Pretty(bound),
      Pretty(since_last_tick), Pretty(tick_bound), ticks);
  if (collective.has_value()) {
    const InFlightCollective& c = *collective;
    out += absl::StrFormat(
        "; %s %s on comm \"%s\" (id %d) seq %d, %d bytes%s, step %d, in flight %s (bound %s)%s",
        cause == Cause::kCollective ? "overdue" : "oldest in flight", c.op, c.comm_name, c.comm_id,
        c.comm_seq, c.bytes, c.peer >= 0 ? absl::StrFormat(", peer %d", c.peer) : "", c.step,
        Pretty(c.age), Pretty(c.bound), c.on_gpu ? " on GPU" : "");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Watchdog>> Watchdog::Create(const WatchdogOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>(options);
  if (options.poll_period > absl::ZeroDuration()) impl->StartMonitor();
  return std::unique_ptr<Watchdog>(new Watchdog(std::move(impl)));
}

Watchdog::Watchdog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Watchdog::~Watchdog() = default;

// The public face forwards to the Impl: one pointer hop, no virtual call, no allocation.
void Watchdog::SetStep(int64_t step) { impl_->SetStep(step); }
void Watchdog::BeginPhase(std::string_view name) { impl_->BeginPhase(name); }
void Watchdog::Tick(int64_t amount) { impl_->Tick(amount); }
void Watchdog::EndPhase() { impl_->EndPhase(); }
std::vector<PhaseTotal> Watchdog::PhaseTotals() const { return impl_->PhaseTotals(); }
void Watchdog::AddHangHandler(std::function<void(const HangReport&)> handler) {
  impl_->AddHangHandler(std::move(handler));
}
void Watchdog::AddAbortHook(std::string name, std::function<void()> hook) {
  impl_->AddAbortHook(std::move(name), std::move(hook));
}
std::optional<HangReport> Watchdog::TakeHang() { return impl_->TakeHang(/*wait=*/true); }
std::optional<HangReport> Watchdog::TakeHangNow() { return impl_->TakeHang(/*wait=*/false); }
int Watchdog::PollOnce() { return impl_->PollOnce(); }
PhaseBounds Watchdog::BoundsFor(std::string_view phase) const { return impl_->BoundsFor(phase); }
int Watchdog::phase_thread_id() const { return impl_->phase_thread_id(); }
int64_t Watchdog::hangs_declared() const { return impl_->hangs_declared(); }
int64_t Watchdog::hangs_postponed() const { return impl_->hangs_postponed(); }
int64_t Watchdog::hangs_withdrawn() const { return impl_->hangs_withdrawn(); }
bool Watchdog::WithdrawHangIfEnded() { return impl_->WithdrawHangIfEnded(); }
int64_t Watchdog::last_progress_ns() const { return impl_->last_progress_ns(); }
int64_t Watchdog::usage_errors() const { return impl_->usage_errors(); }
absl::Status Watchdog::usage_status() const { return impl_->usage_status(); }

void Watchdog::Impl::StartMonitor() {
  monitor_ = std::thread([this] { MonitorLoop(); });
}

Watchdog::Impl::Impl(const WatchdogOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      recorder_(options.recorder),
      tracker_(options.tracker),
      rule_(std::make_unique<BoundRule>(options.bound)),
      phases_(std::make_unique<NameTable>(options.max_phase_names + 1)),
      phase_total_ns_(new std::atomic<int64_t>[options.max_phase_names + 1]()),
      frames_(new Frame[kMaxDepth]) {
  // Index 0 collects the names that do not fit.
  phases_->FindOrAdd(kOtherPhases);
  durations_.reserve(options.max_phase_names + 1);
  gaps_.reserve(options.max_phase_names + 1);
  for (int i = 0; i <= options.max_phase_names; ++i) {
    durations_.push_back(std::make_unique<SampleWindow>(options.bound.history));
    gaps_.push_back(std::make_unique<SampleWindow>(options.bound.history));
  }
}

Watchdog::Impl::~Impl() {
  {
    MutexLock lock(&thread_mu_);
    stop_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

void Watchdog::Impl::MonitorLoop() {
  for (;;) {
    {
      MutexLock lock(&thread_mu_);
      // The deadline is the poll period; stop_ ends the wait early.
      if (thread_mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; },
                                      options_.poll_period)) {
        return;
      }
    }
    PollOnce();
  }
}

void Watchdog::Impl::UsageError(std::string message) {
  usage_errors_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&usage_mu_);
  if (first_usage_error_.ok()) {
    std::fprintf(stderr, "trainguard: watchdog: %s\n", message.c_str());
    first_usage_error_ = absl::FailedPreconditionError(message);
  }
}

absl::Status Watchdog::Impl::usage_status() const {
  MutexLock lock(&usage_mu_);
  return first_usage_error_;
}

void Watchdog::Impl::SetStep(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  if (tracker_ != nullptr) tracker_->SetStep(step);
}

int Watchdog::Impl::PhaseIndex(std::string_view name) {
  const int index = phases_->FindOrAdd(name);
  if (index >= 0) return index;
  UsageError(absl::StrFormat("phase \"%s\" does not fit (max_phase_names %d); it shares \"%s\"",
                             name, options_.max_phase_names, kOtherPhases));
  return 0;
}

void Watchdog::Impl::RecordPhase(bool end, int name, int64_t now_ns, int64_t duration_ns) {
  if (recorder_ == nullptr) return;
  FlightRecord r;
  r.time_ns = now_ns;
  r.step = step_.load(std::memory_order_relaxed);
  r.type = end ? FlightRecordType::kPhaseEnd : FlightRecordType::kPhaseBegin;
  r.value = duration_ns;
  phases_->CopyPadded(name, r.name);
  recorder_->Append(r);
}

void Watchdog::Impl::BeginPhase(std::string_view name) {
  if (open_ >= kMaxDepth) {
    ++open_;
    UsageError(absl::StrFormat("phase \"%s\" is nested %d deep (at most %d are tracked)", name,
                               open_, kMaxDepth));
    return;
  }
  const int index = PhaseIndex(name);
  const int64_t now = clock_->MonotonicNanos();
  if (open_ == 0) {
    static thread_local const int this_thread = static_cast<int>(gettid());
    phase_thread_.store(this_thread, std::memory_order_relaxed);
  }
  if (open_ > 0) {
    // The enclosing phase's own silence ends here; the nested phase answers for what follows.
    Frame& parent = frames_[open_ - 1];
    parent.max_gap_ns =
        std::max(parent.max_gap_ns, now - parent.last_progress_ns.load(std::memory_order_relaxed));
  }
  Frame& f = frames_[open_];
  // Sequence lock without fences (ThreadSanitizer does not model them): the odd version first, the
  // fields with release stores (each carries the odd version with it, so a reader that sees any new
  // field sees the version move), then the even version.
  const uint64_t version = f.version.load(std::memory_order_relaxed);
  f.version.store(version + 1, std::memory_order_relaxed);
  f.name.store(index, std::memory_order_release);
  f.instance.store(next_instance_++, std::memory_order_release);
  f.begin_ns.store(now, std::memory_order_release);
  f.last_progress_ns.store(now, std::memory_order_release);
  f.ticks.store(0, std::memory_order_release);
  f.progress.store(0, std::memory_order_release);
  f.version.store(version + 2, std::memory_order_release);
  f.max_gap_ns = 0;
  ++open_;
  depth_.store(open_, std::memory_order_release);
  last_progress_ns_.store(now, std::memory_order_relaxed);
  RecordPhase(/*end=*/false, index, now, 0);
}

void Watchdog::Impl::Tick(int64_t amount) {
  if (open_ == 0) return;  // outside any phase: nothing to credit
  // Past kMaxDepth, the deepest tracked phase is the one the monitor judges: credit it.
  Frame& f = frames_[std::min(open_, kMaxDepth) - 1];
  const int64_t now = clock_->MonotonicNanos();
  f.max_gap_ns = std::max(f.max_gap_ns, now - f.last_progress_ns.load(std::memory_order_relaxed));
  f.last_progress_ns.store(now, std::memory_order_relaxed);
  last_progress_ns_.store(now, std::memory_order_relaxed);
  f.ticks.store(f.ticks.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  f.progress.store(f.progress.load(std::memory_order_relaxed) + amount, std::memory_order_relaxed);
}

void Watchdog::Impl::EndPhase() {
  if (open_ == 0) {
    UsageError("EndPhase without an open phase");
    return;
  }
  --open_;
  if (open_ >= kMaxDepth) return;  // it was too deep to be tracked
  Frame& f = frames_[open_];
  const int64_t now = clock_->MonotonicNanos();
  const int name = f.name.load(std::memory_order_relaxed);
  const int64_t duration = now - f.begin_ns.load(std::memory_order_relaxed);
  // One writer (the phase thread): a load and a store, no read-modify-write on the hot path.
  phase_total_ns_[name].store(phase_total_ns_[name].load(std::memory_order_relaxed) + duration,
                              std::memory_order_relaxed);
  if (f.hung_instance.load(std::memory_order_acquire) !=
      f.instance.load(std::memory_order_relaxed)) {
    durations_[name]->Add(duration);
    // The trailing silence counts: a phase that finishes with a long stretch without ticks
    // (gathering results after its last tick) must not be declared hung there next time.
    gaps_[name]->Add(
        std::max(f.max_gap_ns, now - f.last_progress_ns.load(std::memory_order_relaxed)));
  }
  if (open_ > 0) {
    // A nested phase that finished is progress of the enclosing one.
    frames_[open_ - 1].last_progress_ns.store(now, std::memory_order_relaxed);
  }
  depth_.store(open_, std::memory_order_release);
  last_progress_ns_.store(now, std::memory_order_relaxed);
  RecordPhase(/*end=*/true, name, now, duration);
}

std::vector<PhaseTotal> Watchdog::Impl::PhaseTotals() const {
  std::vector<PhaseTotal> totals;
  const int names = phases_->size();
  for (int i = 0; i < names; ++i) {
    const int64_t ns = phase_total_ns_[i].load(std::memory_order_relaxed);
    if (ns > 0) totals.push_back({std::string(phases_->Name(i)), absl::Nanoseconds(ns)});
  }
  return totals;
}

void Watchdog::Impl::AddHangHandler(std::function<void(const HangReport&)> handler) {
  MutexLock lock(&hooks_mu_);
  handlers_.push_back(std::move(handler));
}

void Watchdog::Impl::AddAbortHook(std::string name, std::function<void()> hook) {
  MutexLock lock(&hooks_mu_);
  abort_hooks_.emplace_back(std::move(name), std::move(hook));
}

std::optional<HangReport> Watchdog::Impl::TakeHang(bool wait) {
  if (!has_pending_.load(std::memory_order_acquire)) return std::nullopt;
  MutexLock lock(&pending_mu_);
  // A hang whose handlers still run may yet be withdrawn: wait for them (bounded; a handler that
  // outlasts the wait leaves the hang standing), unless this is their thread.
  if (wait && declaring_.has_value() && declaring_->thread != std::this_thread::get_id()) {
    pending_mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !declaring_.has_value(); }, kHandlersWait);
  }
  std::optional<HangReport> taken = std::move(pending_);
  pending_.reset();
  has_pending_.store(false, std::memory_order_release);
  return taken;
}

bool Watchdog::Impl::WithdrawHangIfEnded() {
  Declaring d;
  {
    MutexLock lock(&pending_mu_);
    if (!declaring_.has_value() || declaring_->thread != std::this_thread::get_id()) return false;
    if (declaring_->withdrawn) return true;
    d = *declaring_;
  }
  // The tracker's lock is not taken under pending_mu_.
  const bool ended =
      (d.collective.has_value() && !tracker_->InFlight(*d.collective)) ||
      (d.frame_depth > 0 && last_progress_ns_.load(std::memory_order_relaxed) > d.progress_ns);
  if (!ended) return false;
  MutexLock lock(&pending_mu_);
  declaring_->withdrawn = true;
  return true;
}

bool Watchdog::Impl::FinishDeclaring(bool stored_pending) {
  MutexLock lock(&pending_mu_);
  const Declaring d = *std::move(declaring_);
  declaring_.reset();
  if (!d.withdrawn) return false;
  // Never taken: a handler could have taken it (then it stays taken).
  if (stored_pending && pending_.has_value()) {
    pending_.reset();
    has_pending_.store(false, std::memory_order_release);
  }
  // The phase instance is judged again, and its duration teaches its bounds when it ends.
  if (d.frame_depth > 0) {
    uint64_t instance = d.frame_instance;
    frames_[d.frame_depth - 1].hung_instance.compare_exchange_strong(instance, 0,
                                                                     std::memory_order_acq_rel);
  }
  hangs_withdrawn_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::optional<Watchdog::Impl::FrameView> Watchdog::Impl::ReadInnermost() const {
  const int depth = depth_.load(std::memory_order_acquire);
  if (depth == 0) return std::nullopt;
  const Frame& f = frames_[depth - 1];
  FrameView v;
  v.depth = depth;
  const uint64_t version = f.version.load(std::memory_order_acquire);
  if (version % 2 != 0) return std::nullopt;  // being rewritten: the phase is moving
  v.name = f.name.load(std::memory_order_acquire);
  v.instance = f.instance.load(std::memory_order_acquire);
  v.begin_ns = f.begin_ns.load(std::memory_order_acquire);
  v.last_progress_ns = f.last_progress_ns.load(std::memory_order_acquire);
  v.ticks = f.ticks.load(std::memory_order_acquire);
  v.progress = f.progress.load(std::memory_order_acquire);
  v.reported = f.hung_instance.load(std::memory_order_acquire) == v.instance;
  if (f.version.load(std::memory_order_relaxed) != version) return std::nullopt;
  // Closed (and maybe reopened elsewhere) while we read: not hung.
  if (depth_.load(std::memory_order_acquire) != depth) return std::nullopt;
  return v;
}

std::string Watchdog::Impl::PhasePath(int depth) const {
  std::string path;
  for (int i = 0; i < depth; ++i) {
    const int name = frames_[i].name.load(std::memory_order_relaxed);
    if (i > 0) path += '/';
    path += phases_->Name(name);
  }
  return path;
}

PhaseBounds Watchdog::Impl::BoundsFor(std::string_view phase) const {
  PhaseBounds b;
  const int index = phases_->Find(phase);
  if (index < 0) {
    b.duration = b.tick_gap = absl::Nanoseconds(rule_->warmup_bound_ns);
    return b;
  }
  const SampleWindow& durations = *durations_[index];
  const SampleWindow& gaps = *gaps_[index];
  b.duration_samples = durations.count();
  b.tick_gap_samples = gaps.count();
  b.duration = absl::Nanoseconds(durations.Bound(*rule_));
  b.tick_gap = absl::Nanoseconds(gaps.Bound(*rule_));
  return b;
}

int Watchdog::Impl::PollOnce() {
  MutexLock lock(&poll_mu_);
  const int64_t now = clock_->MonotonicNanos();
  CollectivePoll collectives;
  if (tracker_ != nullptr) collectives = tracker_->Poll(now);
  const std::optional<FrameView> frame = ReadInnermost();

  std::optional<HangReport::Cause> cause;
  const InFlightCollective* overdue = nullptr;
  if (frame.has_value() && !frame->reported) {
    const SampleWindow& durations = *durations_[frame->name];
    const SampleWindow& gaps = *gaps_[frame->name];
    const int64_t bound = durations.Bound(*rule_);
    const int64_t tick_bound = gaps.Bound(*rule_);
    if (now - frame->begin_ns > bound && now - frame->last_progress_ns > tick_bound) {
      cause = HangReport::Cause::kPhase;
    }
  }
  // One hang per phase instance: a stuck collective inside a phase already reported is part of
  // that hang (its report names the oldest collective in flight).
  if (!cause.has_value() && !collectives.overdue.empty() &&
      !(frame.has_value() && frame->reported)) {
    cause = HangReport::Cause::kCollective;
    overdue = &collectives.overdue.front();
  }
  if (!cause.has_value()) {
    postponed_.reset();
    return 0;
  }
  const InFlightCollective* waiting_in =
      overdue != nullptr ? overdue
                         : (collectives.oldest.has_value() ? &*collectives.oldest : nullptr);
  if (waiting_in != nullptr && options_.peer_progress) {
    bool waiting = Postpone(*waiting_in, now);
    if (!waiting) {
      // Asking the peers took time (a store round trip), and the wait may have ended meanwhile:
      // the last peer entered, the collective completed, the step moved on. What was judged must
      // still be there, or there is no hang to declare (the next poll judges what is there now).
      const std::optional<FrameView> now_frame = ReadInnermost();
      const bool same_frame = frame.has_value() == now_frame.has_value() &&
                              (!frame.has_value() || frame->instance == now_frame->instance);
      waiting = !tracker_->InFlight(waiting_in->instance) || !same_frame;
      if (waiting) postponed_.reset();
    }
    if (waiting) {
      // Reported again by the next poll, and learnt from if they complete: they were waits.
      for (const InFlightCollective& c : collectives.overdue) tracker_->ExcuseOverdue(c.instance);
      return 0;
    }
  }
  // The postponement of this very wait, if any, is evidence of the hang.
  std::optional<Postponement> postponed;
  if (postponed_.has_value() && waiting_in != nullptr &&
      postponed_->collective == waiting_in->instance) {
    postponed = std::move(postponed_);
  }
  postponed_.reset();
  return Declare(*cause, frame, now, collectives, overdue, postponed);
}

bool Watchdog::Impl::Postpone(const InFlightCollective& waiting_in, int64_t now_ns) {
  const bool same = postponed_.has_value() && postponed_->collective == waiting_in.instance;
  if (same && now_ns < postponed_->recheck_ns) return true;
  std::optional<std::string> peer;
  try {
    peer = options_.peer_progress(waiting_in);
  } catch (const std::exception& e) {
    UsageError(absl::StrFormat("peer_progress threw: %s", e.what()));
  } catch (...) {
    UsageError("peer_progress threw");
  }
  if (!peer.has_value()) return false;
  if (!same) {
    hangs_postponed_.fetch_add(1, std::memory_order_relaxed);
    postponed_ = Postponement{waiting_in.instance, now_ns, 0, {}};
  }
  postponed_->recheck_ns = now_ns + absl::ToInt64Nanoseconds(options_.peer_recheck);
  postponed_->peer = *std::move(peer);
  return true;
}

int Watchdog::Impl::Declare(HangReport::Cause cause, const std::optional<FrameView>& frame,
                            int64_t now_ns, const CollectivePoll& collectives,
                            const InFlightCollective* overdue,
                            const std::optional<Postponement>& postponed) {
  HangReport report;
  report.cause = cause;
  report.step = step_.load(std::memory_order_relaxed);
  report.time = clock_->Now();
  std::string_view rule = "collective in flight longer than its op's bound";
  if (frame.has_value()) {
    // Mark first: from here on its duration stays out of the history and it is not reported again.
    frames_[frame->depth - 1].hung_instance.store(frame->instance, std::memory_order_release);
    report.phase = PhasePath(frame->depth);
    const SampleWindow& durations = *durations_[frame->name];
    const SampleWindow& gaps = *gaps_[frame->name];
    const int64_t bound = durations.Bound(*rule_);
    report.elapsed = absl::Nanoseconds(now_ns - frame->begin_ns);
    report.bound = absl::Nanoseconds(bound);
    report.since_last_tick = absl::Nanoseconds(now_ns - frame->last_progress_ns);
    report.tick_bound = absl::Nanoseconds(gaps.Bound(*rule_));
    report.ticks = frame->ticks;
    report.progress = frame->progress;
    if (cause == HangReport::Cause::kPhase) {
      rule = "elapsed > bound and since_last_tick > tick_bound";
    }
    report.evidence.emplace_back("hung_phase", std::string(phases_->Name(frame->name)));
    report.evidence.emplace_back("duration_samples", absl::StrFormat("%d", durations.count()));
    report.evidence.emplace_back("tick_gap_samples", absl::StrFormat("%d", gaps.count()));
  }
  report.evidence.insert(report.evidence.begin(),
                         {{"cause", cause == HangReport::Cause::kPhase ? "phase" : "collective"},
                          {"rule", std::string(rule)}});
  if (postponed.has_value()) {
    // The wait was excused for a while because a peer was progressing; that peer has stopped.
    report.evidence.emplace_back("postponed_ms",
                                 absl::StrFormat("%d", (now_ns - postponed->since_ns) / 1'000'000));
    report.evidence.emplace_back("postponed_for", postponed->peer);
  }
  if (overdue != nullptr) {
    report.collective = *overdue;
  } else {
    report.collective = collectives.oldest;
  }
  // The communicators this hang aborts: those registered now (AbortCommunicators).
  std::vector<uint64_t> hung_comms;
  if (tracker_ != nullptr) {
    report.evidence.emplace_back("in_flight_collectives",
                                 absl::StrFormat("%d", collectives.in_flight));
    report.evidence.emplace_back("overdue_collectives",
                                 absl::StrFormat("%d", collectives.overdue.size()));
    for (const CommunicatorProgress& p : tracker_->Progress()) {
      report.evidence.emplace_back(absl::StrFormat("comm/%s", p.name),
                                   absl::StrFormat("begun=%d completed=%d", p.begun, p.completed));
      hung_comms.push_back(p.comm_id);
    }
  }

  if (recorder_ != nullptr) {
    FlightRecord r;
    r.time_ns = now_ns;
    r.step = report.step;
    r.type = FlightRecordType::kHang;
    r.flags = cause == HangReport::Cause::kCollective ? 1 : 0;
    if (report.collective.has_value()) {
      r.comm_id = report.collective->comm_id;
      r.comm_seq = report.collective->comm_seq;
      r.bytes = report.collective->bytes;
      r.peer = report.collective->peer;
    }
    if (cause == HangReport::Cause::kCollective) {
      r.value = absl::ToInt64Nanoseconds(report.collective->age);
      watchdog_internal::SetRecordName(r, report.collective->op);
    } else {
      r.value = absl::ToInt64Nanoseconds(report.elapsed);
      watchdog_internal::SetRecordName(r, report.phase);
    }
    recorder_->Append(r);
  }
  hangs_declared_.fetch_add(1, std::memory_order_relaxed);
  bool stored_pending = false;
  {
    MutexLock lock(&pending_mu_);
    if (!pending_.has_value()) {
      pending_ = report;
      stored_pending = true;
    }
    has_pending_.store(true, std::memory_order_release);
    Declaring d;
    d.thread = std::this_thread::get_id();
    if (report.collective.has_value()) d.collective = report.collective->instance;
    if (frame.has_value()) {
      d.progress_ns = frame->last_progress_ns;
      d.frame_depth = frame->depth;
      d.frame_instance = frame->instance;
    }
    declaring_ = d;
  }

  // User code runs without any of our locks but poll_mu_ held (it serialises hangs), so it may call
  // TakeHang, add hooks or read bounds.
  std::vector<std::function<void(const HangReport&)>> handlers;
  std::vector<std::pair<std::string, std::function<void()>>> hooks;
  {
    MutexLock lock(&hooks_mu_);
    handlers = handlers_;
    hooks = abort_hooks_;
  }
  auto guarded = [this](std::string_view what, const std::function<void()>& call) {
    try {
      call();
    } catch (const std::exception& e) {
      UsageError(absl::StrFormat("%s threw: %s", what, e.what()));
    } catch (...) {
      UsageError(absl::StrFormat("%s threw", what));
    }
  };
  for (const auto& handler : handlers) {
    guarded("a hang handler", [&] { handler(report); });
    bool withdrawn = false;
    {
      MutexLock lock(&pending_mu_);
      withdrawn = declaring_->withdrawn;
    }
    if (withdrawn) break;  // the later handlers are not told of a hang that is no more
  }
  if (FinishDeclaring(stored_pending)) return 1;
  for (const auto& [name, hook] : hooks) {
    guarded(absl::StrFormat("abort hook \"%s\"", name), hook);
  }
  if (tracker_ != nullptr) tracker_->AbortCommunicators(hung_comms);
  return 1;
}

}  // namespace trainguard
