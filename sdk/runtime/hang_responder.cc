#include "sdk/runtime/hang_responder.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "sdk/core/store_keys.h"

namespace trainguard {

HangResponder::HangResponder(HangResponderOptions options) : options_(std::move(options)) {}

void HangResponder::Stop() {
  MutexLock lock(&stop_mu_);
  stopped_ = true;
}

bool HangResponder::stopped() {
  MutexLock lock(&stop_mu_);
  return stopped_;
}

void HangResponder::OnOwnHang(const HangReport& report, int64_t generation) {
  Clock& clock = *options_.clock;
  Store* const store = options_.store;
  const int rank = options_.rank;
  const int64_t steps_failed = steps_failed_.load(std::memory_order_acquire);
  const int64_t dump_begin_ns = clock.MonotonicNanos();
  CapturedEvidence captured;
  {
    MutexLock lock(&dump_mu_);
    captured = options_.evidence->Capture();
    dumped_generation_ = generation;
    hang_key_seen_ = absl::InfiniteFuture();  // until this rank's hang key is written
  }
  const int64_t capture_ms = (clock.MonotonicNanos() - dump_begin_ns) / 1'000'000;
  // The hang key goes out once the stacks and the ring are captured, before they are symbolised
  // and written: the launcher can replace a stopped peer meanwhile, and this rank's dump still
  // shows where its threads were when it declared the hang. Every other rank dumps its ring and
  // stacks too when it sees the key, for a diagnosis across ranks.
  const std::string key = store_keys::Hang(generation);
  absl::Time declared = absl::InfiniteFuture();
  if (store != nullptr) {
    (void)store->Set(key, store_keys::EncodeHangDeclaration({rank, report.ToString()}),
                     absl::Seconds(2));
    declared = clock.Now();
    MutexLock lock(&dump_mu_);
    hang_key_seen_ = declared;
  }
  std::string stacks;
  int64_t symbolize_ms = 0;
  const std::string path = options_.evidence->Write(
      captured, absl::StrCat("hang: ", report.ToString()), generation, &stacks, &symbolize_ms);
  // The event goes out once the dump is written: its time is the declaration's plus this.
  const int64_t dump_ms = (clock.MonotonicNanos() - dump_begin_ns) / 1'000'000;
  Event event;
  event.type = EventType::kHang;
  event.step = report.step;
  event.message = report.ToString();
  event.attributes = {
      {"phase", report.phase},
      {"cause", report.cause == HangReport::Cause::kCollective ? "collective" : "phase"},
      {"elapsed_ms", absl::StrCat(absl::ToInt64Milliseconds(report.elapsed))},
      {"bound_ms", absl::StrCat(absl::ToInt64Milliseconds(report.bound))},
      {"dump", path},
      {"capture_ms", absl::StrCat(capture_ms)},
      {"symbolize_ms", absl::StrCat(symbolize_ms)},
      {"dump_ms", absl::StrCat(dump_ms)}};
  if (report.collective.has_value()) {
    event.attributes.emplace_back("collective", report.collective->op);
    event.attributes.emplace_back("comm_seq", absl::StrCat(report.collective->comm_seq));
  }
  event.attributes.insert(event.attributes.end(), report.evidence.begin(), report.evidence.end());
  event.attributes.emplace_back("stacks", stacks);
  options_.emit(generation, std::move(event));
  if (store == nullptr) return;
  // The watchdog aborts the communicators when this returns, which wakes the other ranks' blocked
  // collectives: wait (bounded) for their dumps first, so that their stacks show where they were
  // blocked. A wait that ends by itself meanwhile (the whole machine stalled, and caught up)
  // withdraws the hang: nothing is aborted, and the launcher replaces no one.
  if (!AwaitHangEnd(steps_failed)) {
    (void)store->Set(store_keys::HangAborted(generation, rank), absl::StrCat("rank ", rank),
                     absl::Seconds(2));
    return;
  }
  const absl::Duration waited_for = clock.Now() - declared;
  const std::string waited = absl::FormatDuration(absl::Trunc(waited_for, absl::Milliseconds(1)));
  (void)store->Set(store_keys::HangWithdrawn(generation, rank),
                   absl::StrCat("rank ", rank, ": its wait ended ", waited, " after the hang"),
                   absl::Seconds(2));
  Event withdrawn = EventOfKind(EventKind::kHangWithdrawn,
                                absl::StrCat("hang withdrawn: the wait ended by itself ", waited,
                                             " after it was declared; nothing aborted"));
  withdrawn.step = report.step;
  withdrawn.attributes.emplace_back("waited_ms",
                                    absl::StrCat(absl::ToInt64Milliseconds(waited_for)));
  options_.emit(generation, std::move(withdrawn));
}

bool HangResponder::AwaitHangEnd(int64_t steps_failed) {
  // The deadline is the clock's; the polling between two looks is a bounded real-time wait.
  const absl::Time deadline = options_.clock->Now() + options_.dump_wait;
  while (true) {
    // A hang is withdrawn on evidence that the step went on by itself: its wait ended and the step
    // ends ok (StepScope::Finish then waits in TakeHang for this verdict). A wait ended by a
    // failure (the collective broke when a dead peer's connections closed) is no such evidence,
    // and neither is a later step's success once the hung one failed: the dump can outlive the
    // failed step, its recovery and the next step (the launcher kills a stopped peer without
    // waiting for this rank's dump).
    const int ending = step_ending_.load(std::memory_order_acquire);
    if (ending == kStepEndingFailed ||
        steps_failed_.load(std::memory_order_acquire) != steps_failed) {
      return false;
    }
    if (ending == kStepEndingOk && options_.withdraw_hang_if_ended()) return true;
    const absl::Time now = options_.clock->Now();
    if (now >= deadline) return false;
    MutexLock lock(&stop_mu_);
    stop_mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopped_; },
                              std::min(absl::Milliseconds(20), deadline - now));
    if (stopped_) return false;
  }
}

void HangResponder::OnHangKey(int64_t generation, const absl::StatusOr<std::string>& declared_by,
                              absl::Time asked) {
  MutexLock lock(&dump_mu_);
  if (!declared_by.ok()) {
    // The launcher deletes the key of a hang withdrawn (OnOwnHang): a later hang of the same
    // generation is dumped again. A Get sent before the key was seen proves nothing.
    if (absl::IsNotFound(declared_by.status()) && dumped_generation_ == generation &&
        asked > hang_key_seen_) {
      dumped_generation_ = -1;
    }
    return;  // NotFound: no hang; anything else: try again later
  }
  if (dumped_generation_ == generation) return;  // this hang is dumped already
  // The rank has moved on (the read was sent before it adopted a newer generation): it no longer
  // waits where that hang found it, and a dump now would show the newer generation's threads.
  if (generation < options_.generation()) return;
  dumped_generation_ = generation;
  hang_key_seen_ = asked;
  WritePeerHangDump(options_.evidence->Capture(), generation, *declared_by, "");
}

void HangResponder::OnSuperseded(int64_t generation, absl::FunctionRef<void()> let_go) {
  // A peer declared a hang in this generation, and this rank has not dumped it (its own bound had
  // not run out, and the hang watcher reads the key of the rank's current generation only, which
  // is about to be the next one): its evidence is captured now, while it still waits where the
  // hang found it, and written once the handlers have let it go, so that the launcher's diagnosis
  // has every rank's dump (it waits for them, HangArbiterOptions::dump_grace at most).
  std::optional<CapturedEvidence> captured;
  std::string declared_by;
  if (options_.store != nullptr) {
    const absl::Time asked = options_.clock->Now();
    absl::StatusOr<std::string> who =
        options_.store->Get(store_keys::Hang(generation), absl::Seconds(2));
    MutexLock lock(&dump_mu_);
    if (who.ok() && dumped_generation_ != generation) {
      dumped_generation_ = generation;
      hang_key_seen_ = asked;
      declared_by = *who;
      captured = options_.evidence->Capture();
    }
  }
  let_go();
  if (captured.has_value()) {
    MutexLock lock(&dump_mu_);
    WritePeerHangDump(*captured, generation, declared_by,
                      " (dumped as its generation was superseded)");
  }
}

void HangResponder::WritePeerHangDump(const CapturedEvidence& captured, int64_t generation,
                                      const std::string& declared_by, absl::string_view how) {
  const std::string reason = absl::StrCat("a peer declared a hang: ", declared_by);
  const std::string path = options_.evidence->Write(captured, reason, generation, nullptr, nullptr);
  Event event;
  event.type = EventType::kHang;
  event.step = options_.step();
  event.message = absl::StrCat(reason, how);
  event.attributes = {{"remote", "true"}, {"dump", path}};
  options_.emit(generation, std::move(event));
}

std::optional<std::string> HangResponder::DumpCommunicationFailure(int64_t generation,
                                                                   absl::string_view what) {
  MutexLock lock(&dump_mu_);
  if (dumped_generation_ == generation) return std::nullopt;
  dumped_generation_ = generation;
  return options_.evidence->Write(options_.evidence->Capture(),
                                  absl::StrCat("communication failure: ", what), generation,
                                  nullptr, nullptr);
}

void HangResponder::DumpOnDemand() {
  MutexLock lock(&dump_mu_);
  const int64_t generation = options_.generation();
  const std::string path = options_.evidence->Write(
      options_.evidence->Capture(), "SIGUSR2 (dump on demand)", generation, nullptr, nullptr);
  Event event = EventOfKind(EventKind::kEvidenceDumped,
                            absl::StrCat("flight recorder and stacks dumped on SIGUSR2 to ", path));
  event.step = options_.step();
  event.attributes.emplace_back("dump", path);
  options_.emit(generation, std::move(event));
}

}  // namespace trainguard
