// The Watchdog: learned per-phase bounds, progress ticks, and hangs reported once. Almost every
// test drives a ManualClock and calls PollOnce() with the monitor thread off, so time is exact and
// nothing depends on how fast the machine is.
#include "trainguard/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/learned_bound.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/options.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using watchdog_internal::BoundRule;
using watchdog_internal::SampleWindow;

constexpr int64_t kSecond = 1'000'000'000;

// --- The learned-bound rule on its own.

BoundRule DefaultRule() {
  BoundRule rule;
  rule.warmup_samples = 5;
  rule.warmup_bound_ns = 600 * kSecond;
  rule.factor_pct = 300;
  rule.floor_ns = 2 * kSecond;
  return rule;
}

TEST(LearnedBound, IsTheWarmUpBoundUntilEnoughSamplesExist) {
  SampleWindow window(200);
  for (int i = 0; i < 4; ++i) window.Add(kSecond);
  EXPECT_EQ(window.Bound(DefaultRule()), 600 * kSecond);
  window.Add(kSecond);
  EXPECT_EQ(window.Bound(DefaultRule()), 3 * kSecond);
}

TEST(LearnedBound, IsTheFactorTimesTheLongestRecentSampleButNeverBelowTheFloor) {
  SampleWindow window(200);
  for (int i = 0; i < 10; ++i) window.Add(kSecond / 10);
  EXPECT_EQ(window.Bound(DefaultRule()), 2 * kSecond) << "3 x 100 ms is below the 2 s floor";
  window.Add(7 * kSecond);
  EXPECT_EQ(window.Bound(DefaultRule()), 21 * kSecond);
}

TEST(LearnedBound, ForgetsSamplesOlderThanTheWindow) {
  SampleWindow window(3);
  window.Add(10 * kSecond);
  window.Add(kSecond);
  window.Add(kSecond);
  EXPECT_EQ(window.Max(), 10 * kSecond);
  window.Add(kSecond);
  EXPECT_EQ(window.Max(), kSecond);
  EXPECT_EQ(window.count(), 4);
}

TEST(LearnedBound, SaturatesInsteadOfOverflowing) {
  BoundRule rule = DefaultRule();
  EXPECT_EQ(rule.Bound(10, INT64_MAX / 2), INT64_MAX);
}

// --- The Watchdog with a manual clock and no thread.

struct Harness {
  explicit Harness(WatchdogOptions options = {}) {
    options.poll_period = absl::ZeroDuration();
    options.clock = &clock;
    auto created = Watchdog::Create(options);
    EXPECT_TRUE(created.ok()) << created.status();
    wd = *std::move(created);
  }
  void Advance(absl::Duration d) { clock.Advance(d); }
  // Advances by `step` and polls until a hang is declared or `limit` has passed; returns the time
  // advanced at the declaration, or nullopt.
  std::optional<absl::Duration> RunUntilHang(absl::Duration step, absl::Duration limit) {
    for (absl::Duration t = absl::ZeroDuration(); t < limit;) {
      Advance(step);
      t += step;
      if (wd->PollOnce() > 0) return t;
    }
    return std::nullopt;
  }
  // A phase of `length` with a tick every `tick` (none when zero), polling every `poll`. Returns
  // the hangs declared meanwhile.
  int Phase(std::string_view name, absl::Duration length, absl::Duration tick = {},
            absl::Duration poll = absl::Milliseconds(100)) {
    int hangs = 0;
    wd->BeginPhase(name);
    absl::Duration since_poll, since_tick;
    const absl::Duration quantum = tick > absl::ZeroDuration() ? std::min(tick, poll) : poll;
    for (absl::Duration t = absl::ZeroDuration(); t < length;) {
      const absl::Duration d = std::min(quantum, length - t);
      Advance(d);
      t += d;
      since_poll += d;
      since_tick += d;
      if (tick > absl::ZeroDuration() && since_tick >= tick) {
        wd->Tick();
        since_tick = absl::ZeroDuration();
      }
      if (since_poll >= poll) {
        hangs += wd->PollOnce();
        since_poll = absl::ZeroDuration();
      }
    }
    wd->EndPhase();
    return hangs;
  }

  ManualClock clock;
  std::unique_ptr<Watchdog> wd;
};

TEST(Watchdog, LearnsABoundPerPhaseNameFromItsCompletedInstances) {
  Harness h;
  for (int i = 0; i < 5; ++i) {
    h.Phase("forward_backward", absl::Seconds(1));
    h.Phase("optimizer", absl::Milliseconds(100));
  }
  PhaseBounds fb = h.wd->BoundsFor("forward_backward");
  EXPECT_EQ(fb.duration_samples, 5);
  EXPECT_EQ(fb.duration, absl::Seconds(3));
  EXPECT_EQ(fb.tick_gap, absl::Seconds(3)) << "a phase that never ticks: its duration bound";
  EXPECT_EQ(h.wd->BoundsFor("optimizer").duration, absl::Seconds(2)) << "the floor";
  EXPECT_EQ(h.wd->BoundsFor("never_seen").duration, absl::Minutes(10)) << "the warm-up bound";
  EXPECT_EQ(h.wd->hangs_declared(), 0);
}

TEST(Watchdog, PhaseTotalsSumTheCompletedPhasesOfEachName) {
  Harness h;
  EXPECT_TRUE(h.wd->PhaseTotals().empty());
  for (int i = 0; i < 3; ++i) {
    h.Phase("forward_backward", absl::Milliseconds(300));
    h.Phase("optimizer", absl::Milliseconds(40));
  }
  h.wd->BeginPhase("checkpoint");  // open: not counted until it ends
  h.Advance(absl::Seconds(1));
  std::vector<std::pair<std::string, absl::Duration>> totals;
  for (const PhaseTotal& p : h.wd->PhaseTotals()) totals.emplace_back(p.name, p.total);
  EXPECT_THAT(totals, ::testing::UnorderedElementsAre(
                          ::testing::Pair("forward_backward", absl::Milliseconds(900)),
                          ::testing::Pair("optimizer", absl::Milliseconds(120))));
  h.wd->EndPhase();
}

TEST(Watchdog, APhaseThatStopsTickingIsDetectedOnceWithItsBoundsInTheReport) {
  Harness h;
  h.wd->SetStep(0);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(h.Phase("generate", absl::Seconds(4), absl::Milliseconds(10)), 0);
  }
  const PhaseBounds b = h.wd->BoundsFor("generate");
  ASSERT_EQ(b.duration, absl::Seconds(12));
  ASSERT_EQ(b.tick_gap, absl::Seconds(2)) << "3 x 10 ms is below the floor";

  h.wd->SetStep(11);
  h.wd->BeginPhase("generate");
  for (int i = 0; i < 50; ++i) {
    h.Advance(absl::Milliseconds(10));
    h.wd->Tick(16);
  }
  // Silent from here (0.5 s into the phase): hung once both bounds are exceeded, at 12 s.
  std::optional<absl::Duration> at = h.RunUntilHang(absl::Milliseconds(100), absl::Minutes(20));
  ASSERT_TRUE(at.has_value());
  std::optional<HangReport> hang = h.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->cause, HangReport::Cause::kPhase);
  EXPECT_EQ(hang->phase, "generate");
  EXPECT_EQ(hang->step, 11);
  EXPECT_EQ(hang->bound, absl::Seconds(12));
  EXPECT_EQ(hang->tick_bound, absl::Seconds(2));
  EXPECT_GT(hang->elapsed, hang->bound);
  EXPECT_LE(hang->elapsed, hang->bound + absl::Milliseconds(100)) << "declared at the first poll";
  EXPECT_GT(hang->since_last_tick, hang->tick_bound);
  EXPECT_EQ(hang->ticks, 50);
  EXPECT_EQ(hang->progress, 800);
  EXPECT_EQ(hang->Evidence("cause"), "phase");
  EXPECT_EQ(hang->Evidence("duration_samples"), "10");
  EXPECT_THAT(hang->ToString(), HasSubstr("\"generate\""));

  EXPECT_FALSE(h.wd->TakeHang().has_value()) << "taken once";
  EXPECT_FALSE(h.RunUntilHang(absl::Seconds(1), absl::Minutes(30)).has_value())
      << "the same phase instance is reported once";
  EXPECT_EQ(h.wd->hangs_declared(), 1);
  h.wd->EndPhase();
  EXPECT_EQ(h.wd->BoundsFor("generate").duration_samples, 10)
      << "the hung instance stays out of the history";
}

TEST(Watchdog, ALongPhaseThatKeepsTickingIsNotAHang) {
  Harness h;
  for (int i = 0; i < 5; ++i) h.Phase("generate", absl::Seconds(1), absl::Milliseconds(50));
  ASSERT_EQ(h.wd->BoundsFor("generate").duration, absl::Seconds(3));
  // 100 x its duration bound, ticking every 50 ms throughout.
  EXPECT_EQ(h.Phase("generate", absl::Minutes(5), absl::Milliseconds(50)), 0);
  EXPECT_EQ(h.wd->hangs_declared(), 0);
}

TEST(Watchdog, TheFirstStepIsJudgedByTheWarmUpBoundAndNeverFalseAlarms) {
  Harness h;
  // Compiling, loading and the first all-gathers: 9 minutes without a tick, under the 10 min bound.
  EXPECT_EQ(h.Phase("step", absl::Minutes(9)), 0);
  // A first phase silent for longer than the warm-up bound is a hang, learned or not.
  h.wd->BeginPhase("load_data");
  std::optional<absl::Duration> at = h.RunUntilHang(absl::Seconds(1), absl::Minutes(20));
  ASSERT_TRUE(at.has_value());
  EXPECT_GT(*at, absl::Minutes(10));
  EXPECT_LE(*at, absl::Minutes(10) + absl::Seconds(1));
}

TEST(Watchdog, ALongCheckpointPhaseInsideAStepDoesNotAlarm) {
  Harness h;
  for (int i = 0; i < 20; ++i) h.Phase("step", absl::Milliseconds(500));
  ASSERT_EQ(h.wd->BoundsFor("step").duration, absl::Seconds(2));
  for (int round = 0; round < 8; ++round) {
    h.wd->BeginPhase("step");
    h.Advance(absl::Milliseconds(400));
    // The first saves take 4 minutes (warm-up bound), later ones 2-4 minutes (learned: 12 min).
    EXPECT_EQ(h.Phase("checkpoint", absl::Minutes(round == 0 ? 4 : 2 + round % 3)), 0);
    EXPECT_EQ(h.wd->PollOnce(), 0);
    h.wd->EndPhase();
  }
  EXPECT_EQ(h.wd->hangs_declared(), 0);
  EXPECT_EQ(h.wd->BoundsFor("step").duration_samples, 28);
}

TEST(Watchdog, TicksInANestedPhaseCountForTheEnclosingOnesAndTheReportNamesThePath) {
  Harness h;
  for (int i = 0; i < 5; ++i) {
    h.wd->BeginPhase("step");
    ASSERT_EQ(h.Phase("rollout", absl::Seconds(10), absl::Milliseconds(100)), 0);
    h.Advance(absl::Milliseconds(500));  // bookkeeping after the rollout, in "step" itself
    h.wd->EndPhase();
  }
  const PhaseBounds step = h.wd->BoundsFor("step");
  EXPECT_EQ(step.tick_gap_samples, 5);
  EXPECT_EQ(step.tick_gap, absl::Seconds(2))
      << "step's own silences: none before the rollout, 500 ms after it (x 3 < the floor)";
  EXPECT_EQ(step.duration, absl::Seconds(3 * 10.5));

  h.wd->BeginPhase("step");
  h.wd->BeginPhase("rollout");
  h.wd->BeginPhase("decode");
  std::optional<absl::Duration> at = h.RunUntilHang(absl::Seconds(1), absl::Minutes(20));
  ASSERT_TRUE(at.has_value());
  std::optional<HangReport> hang = h.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->phase, "step/rollout/decode");
  EXPECT_EQ(hang->Evidence("hung_phase"), "decode");
  EXPECT_EQ(hang->bound, absl::Minutes(10)) << "decode has no history: the warm-up bound";
}

TEST(Watchdog, AnEnclosingPhaseIsJudgedAgainWhenItsNestedPhaseEnds) {
  Harness h;
  for (int i = 0; i < 5; ++i) {
    h.wd->BeginPhase("step");
    h.Phase("forward_backward", absl::Milliseconds(300));
    h.wd->EndPhase();
  }
  h.wd->BeginPhase("step");
  h.Phase("forward_backward", absl::Milliseconds(300));
  // Stuck in the step's own code after its last nested phase: step's bound is the floor, 2 s.
  std::optional<absl::Duration> at = h.RunUntilHang(absl::Milliseconds(100), absl::Minutes(1));
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(h.wd->TakeHang()->phase, "step");
}

TEST(Watchdog, NestingDeeperThanTheMaximumIsAUsageErrorNotACrash) {
  Harness h;
  for (int i = 0; i < Watchdog::kMaxDepth + 2; ++i) h.wd->BeginPhase(absl::StrCat("level", i));
  EXPECT_EQ(h.wd->usage_errors(), 2);
  EXPECT_THAT(std::string(h.wd->usage_status().message()), HasSubstr("level8"));
  h.wd->Tick();
  for (int i = 0; i < Watchdog::kMaxDepth + 2; ++i) h.wd->EndPhase();
  EXPECT_EQ(h.wd->BoundsFor("level7").duration_samples, 1) << "the tracked levels stay balanced";
  EXPECT_EQ(h.wd->BoundsFor("level8").duration_samples, 0);
  h.wd->EndPhase();
  EXPECT_EQ(h.wd->usage_errors(), 3) << "EndPhase without a phase";
  EXPECT_EQ(h.wd->PollOnce(), 0);
}

TEST(Watchdog, TooManyPhaseNamesShareOneHistoryInsteadOfFailing) {
  WatchdogOptions options;
  options.max_phase_names = 2;
  Harness h(options);
  h.Phase("a", absl::Seconds(1));
  h.Phase("b", absl::Seconds(1));
  h.Phase("c", absl::Seconds(1));
  h.Phase("d", absl::Seconds(1));
  EXPECT_EQ(h.wd->usage_errors(), 2);
  EXPECT_EQ(h.wd->BoundsFor("<other phases>").duration_samples, 2);
}

TEST(Watchdog, HandlersAndAbortHooksRunOncePerHangAndTakeHangOnce) {
  Harness h;
  std::vector<std::string> calls;
  h.wd->AddHangHandler([&](const HangReport& r) { calls.push_back("handler:" + r.phase); });
  h.wd->AddAbortHook("nccl", [&] { calls.push_back("abort:nccl"); });
  h.wd->AddAbortHook("throws", [&] {
    calls.push_back("abort:throws");
    throw std::runtime_error("boom");
  });
  h.wd->BeginPhase("stuck");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  EXPECT_THAT(calls, ::testing::ElementsAre("handler:stuck", "abort:nccl", "abort:throws"));
  EXPECT_THAT(std::string(h.wd->usage_status().message()), HasSubstr("boom"));
  h.Advance(absl::Hours(1));
  EXPECT_EQ(h.wd->PollOnce(), 0);
  EXPECT_EQ(calls.size(), 3u);
  h.wd->EndPhase();

  // A second, separate hang calls every hook again, once.
  h.wd->BeginPhase("stuck");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  EXPECT_EQ(calls.size(), 6u);
  EXPECT_EQ(h.wd->hangs_declared(), 2);
  // The first report waits until taken; the second does not replace it.
  std::optional<HangReport> first = h.wd->TakeHang();
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(h.wd->TakeHang().has_value());
}

TEST(Watchdog, AHandlerMayTakeTheHangItIsToldAbout) {
  Harness h;
  std::optional<HangReport> seen;
  h.wd->AddHangHandler([&](const HangReport&) { seen = h.wd->TakeHang(); });
  h.wd->BeginPhase("stuck");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->phase, "stuck");
  EXPECT_FALSE(h.wd->TakeHang().has_value());
}

// A machine-wide stall ends while the declaring handler waits: the training thread ticks again
// (here, inside the handler, which runs on the polling thread). The hang is withdrawn: the later
// handlers and the abort hooks are not run, TakeHang never returns it. The phase instance is
// judged again: when it then stops for good, the hang is declared and stands.
TEST(Watchdog, AHangWhoseWaitEndsWhileAHandlerRunsIsWithdrawnAndAbortsNothing) {
  Harness h;
  std::vector<std::string> calls;
  bool stall_ends = true;
  h.wd->AddHangHandler([&](const HangReport&) {
    EXPECT_FALSE(h.wd->WithdrawHangIfEnded()) << "no progress since the declaration";
    if (stall_ends) h.wd->Tick();
    calls.push_back(h.wd->WithdrawHangIfEnded() ? "withdrawn" : "stands");
  });
  h.wd->AddHangHandler([&](const HangReport&) { calls.push_back("second handler"); });
  h.wd->AddAbortHook("nccl", [&] { calls.push_back("abort"); });
  h.wd->BeginPhase("stalled");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  EXPECT_THAT(calls, ::testing::ElementsAre("withdrawn"));
  EXPECT_FALSE(h.wd->TakeHang().has_value());
  EXPECT_EQ(h.wd->hangs_declared(), 1);
  EXPECT_EQ(h.wd->hangs_withdrawn(), 1);

  stall_ends = false;
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value())
      << "the same phase instance, silent again past its bounds";
  EXPECT_THAT(calls, ::testing::ElementsAre("withdrawn", "stands", "second handler", "abort"));
  std::optional<HangReport> hang = h.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->phase, "stalled");
  EXPECT_EQ(h.wd->hangs_withdrawn(), 1);
  h.wd->EndPhase();
}

TEST(Watchdog, WithdrawHangIfEndedOutsideAHandlerWithdrawsNothing) {
  Harness h;
  EXPECT_FALSE(h.wd->WithdrawHangIfEnded());
  h.wd->BeginPhase("stuck");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  h.wd->Tick();
  EXPECT_FALSE(h.wd->WithdrawHangIfEnded()) << "the declaration is over";
  EXPECT_TRUE(h.wd->TakeHang().has_value());
  EXPECT_EQ(h.wd->hangs_withdrawn(), 0);
  h.wd->EndPhase();
}

// TakeHang on another thread while the handlers run gets their verdict: nothing when they
// withdraw the hang, the report when it stands.
TEST(Watchdog, TakeHangOnAnotherThreadDuringTheHandlersGetsTheirVerdict) {
  for (const bool withdraw : {true, false}) {
    Harness h;
    std::optional<HangReport> taken;
    std::thread training;
    h.wd->AddHangHandler([&](const HangReport&) {
      training = std::thread([&] { taken = h.wd->TakeHang(); });
      if (withdraw) h.wd->Tick();
      EXPECT_EQ(h.wd->WithdrawHangIfEnded(), withdraw);
    });
    h.wd->BeginPhase("stalled");
    ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
    training.join();
    EXPECT_EQ(taken.has_value(), !withdraw) << (withdraw ? "withdrawn" : "stands");
    h.wd->EndPhase();
  }
}

// TakeHangNow takes a hang its handlers are still deciding on, as it stands (a step that failed by
// itself); the handlers' withdrawal then finds it taken and aborts nothing either.
TEST(Watchdog, TakeHangNowDuringTheHandlersTakesTheHangAsItStands) {
  Harness h;
  std::optional<HangReport> taken;
  int aborts = 0;
  h.wd->AddAbortHook("nccl", [&] { ++aborts; });
  h.wd->AddHangHandler([&](const HangReport&) {
    std::thread training([&] { taken = h.wd->TakeHangNow(); });
    training.join();
    h.wd->Tick();
    EXPECT_TRUE(h.wd->WithdrawHangIfEnded());
  });
  h.wd->BeginPhase("stalled");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->phase, "stalled");
  EXPECT_EQ(aborts, 0);
  EXPECT_FALSE(h.wd->TakeHang().has_value()) << "taken once";
  h.wd->EndPhase();
}

// The RL shape of section 6.2 of the detection notes: generation whose length is heavy-tailed
// (lognormal, p99/median = 10) and ticks every few ms, a fixed-size training phase without ticks,
// and a checkpoint every 250 steps. A "k x median" timeout would fire; the learned bounds must
// not, and a generation that stops ticking must still be caught.
TEST(Watchdog, RlStepsWithHeavyTailedGenerationRaiseNoFalseAlarmAndAStalledGenerationIsCaught) {
  Harness h;
  std::mt19937_64 rng(20250101);
  const double sigma = std::log(10.0) / 2.326;  // p99 / median = exp(2.326 sigma) = 10
  std::lognormal_distribution<double> generate_seconds(std::log(1.0), sigma);
  std::uniform_int_distribution<int> tick_ms(1, 6);
  std::uniform_int_distribution<int> train_ms(300, 700);
  std::vector<double> lengths;
  constexpr int kSteps = 2000;
  int alarms = 0;
  for (int step = 0; step < kSteps; ++step) {
    h.wd->SetStep(step);
    h.wd->BeginPhase("step");
    const double length = generate_seconds(rng);
    lengths.push_back(length);
    const absl::Duration generate = absl::Seconds(length);
    h.wd->BeginPhase("generate");
    absl::Duration since_poll;
    for (absl::Duration t; t < generate;) {
      const absl::Duration d = absl::Milliseconds(tick_ms(rng));
      h.Advance(d);
      t += d;
      since_poll += d;
      h.wd->Tick(8);  // tokens
      if (since_poll >= absl::Milliseconds(100)) {
        alarms += h.wd->PollOnce();
        since_poll = absl::ZeroDuration();
      }
    }
    h.wd->EndPhase();
    alarms += h.Phase("train", absl::Milliseconds(train_ms(rng)));
    if (step % 250 == 249) alarms += h.Phase("checkpoint", absl::Seconds(90));
    h.wd->EndPhase();
  }
  std::sort(lengths.begin(), lengths.end());
  const double median = lengths[kSteps / 2];
  const double p99 = lengths[kSteps * 99 / 100];
  std::printf("generate: median %.2f s, p99 %.2f s (p99/median %.1f), max %.1f s\n", median, p99,
              p99 / median, lengths.back());
  EXPECT_GT(p99 / median, 6.0) << "the workload is heavy-tailed as intended";
  EXPECT_EQ(alarms, 0);
  EXPECT_EQ(h.wd->hangs_declared(), 0);

  const PhaseBounds b = h.wd->BoundsFor("generate");
  h.wd->SetStep(kSteps);
  h.wd->BeginPhase("step");
  h.wd->BeginPhase("generate");
  for (int i = 0; i < 100; ++i) {
    h.Advance(absl::Milliseconds(3));
    h.wd->Tick(8);
  }
  std::optional<absl::Duration> at = h.RunUntilHang(absl::Milliseconds(100), absl::Hours(1));
  ASSERT_TRUE(at.has_value()) << "a generation that stopped ticking";
  std::optional<HangReport> hang = h.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->phase, "step/generate");
  EXPECT_EQ(hang->step, kSteps);
  EXPECT_EQ(hang->bound, b.duration);
  std::printf(
      "stalled generate detected %s after its last tick (duration bound %s, tick bound %s)\n",
      absl::FormatDuration(hang->since_last_tick).c_str(), absl::FormatDuration(b.duration).c_str(),
      absl::FormatDuration(b.tick_gap).c_str());
}

TEST(Watchdog, PhasesAndHangsAreWrittenToTheFlightRecorder) {
  const std::string job = absl::StrCat("wd-test-", getpid());
  auto recorder = FlightRecorder::Create(job, 0, 64);
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  WatchdogOptions options;
  options.recorder = recorder->get();
  Harness h(options);
  h.wd->SetStep(3);
  h.Phase("forward", absl::Seconds(1), absl::Milliseconds(100));
  h.wd->BeginPhase("stuck");
  ASSERT_TRUE(h.RunUntilHang(absl::Minutes(1), absl::Hours(1)).has_value());
  std::vector<FlightRecord> records = (*recorder)->Snapshot();
  ASSERT_EQ(records.size(), 4u) << "ticks are not recorded";
  EXPECT_EQ(records[0].type, FlightRecordType::kPhaseBegin);
  EXPECT_EQ(records[0].Name(), "forward");
  EXPECT_EQ(records[0].step, 3);
  EXPECT_EQ(records[1].type, FlightRecordType::kPhaseEnd);
  EXPECT_EQ(records[1].value, kSecond);
  EXPECT_EQ(records[2].type, FlightRecordType::kPhaseBegin);
  EXPECT_EQ(records[3].type, FlightRecordType::kHang);
  EXPECT_EQ(records[3].Name(), "stuck");
  EXPECT_GT(records[3].value, 600 * kSecond);
}

TEST(Watchdog, OptionsComeFromTheWatchdogKeys) {
  Options options;
  options.watchdog_poll_ms = 0;
  options.watchdog_warmup_samples = 7;
  options.watchdog_warmup_bound_ms = 1'000;
  options.watchdog_bound_factor_pct = 250;
  options.watchdog_floor_ms = 50;
  options.watchdog_history = 10;
  WatchdogOptions w = WatchdogOptions::FromOptions(options);
  EXPECT_EQ(w.poll_period, absl::ZeroDuration());
  EXPECT_EQ(w.bound.warmup_samples, 7);
  EXPECT_EQ(w.bound.warmup_bound, absl::Seconds(1));
  EXPECT_EQ(w.bound.bound_factor_pct, 250);
  EXPECT_EQ(w.bound.floor, absl::Milliseconds(50));
  EXPECT_EQ(w.bound.history, 10);
  CollectiveTrackerOptions t = CollectiveTrackerOptions::FromOptions(options);
  EXPECT_EQ(t.bound.warmup_bound, absl::Seconds(1));
  EXPECT_EQ(t.bound.history, 10);
}

TEST(Watchdog, InvalidOptionsAreRejectedNamingTheField) {
  WatchdogOptions options;
  options.bound.bound_factor_pct = 50;
  auto wd = Watchdog::Create(options);
  ASSERT_FALSE(wd.ok());
  EXPECT_THAT(std::string(wd.status().message()), HasSubstr("bound_factor_pct"));
  options = WatchdogOptions{};
  options.bound.history = 0;
  EXPECT_THAT(std::string(Watchdog::Create(options).status().message()), HasSubstr("history"));
}

// --- The real monitor thread.

TEST(WatchdogThread, DetectsAPhaseThatStopsTickingOnItsOwnThread) {
  WatchdogOptions options;
  options.poll_period = absl::Milliseconds(5);
  options.bound.warmup_samples = 3;
  options.bound.warmup_bound = absl::Seconds(30);
  options.bound.floor = absl::Milliseconds(50);
  // Declared before the watchdog, so they outlive its monitor thread (joined by its destructor).
  Notification hung;
  std::atomic<int64_t> detected_ns{0};
  auto created = Watchdog::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Watchdog> wd = *std::move(created);
  wd->AddHangHandler([&](const HangReport&) {
    detected_ns.store(Clock::Real()->MonotonicNanos());
    hung.Notify();
  });
  for (int i = 0; i < 3; ++i) {
    ScopedPhase phase(wd.get(), "decode");
    for (int t = 0; t < 5; ++t) {
      absl::SleepFor(absl::Milliseconds(2));
      wd->Tick();
    }
  }
  ASSERT_EQ(wd->hangs_declared(), 0);
  const PhaseBounds b = wd->BoundsFor("decode");
  wd->BeginPhase("decode");
  const int64_t stalled_ns = Clock::Real()->MonotonicNanos();
  ASSERT_TRUE(hung.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::optional<HangReport> hang = wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->phase, "decode");
  const absl::Duration latency = absl::Nanoseconds(detected_ns.load() - stalled_ns);
  std::printf("real thread: stall detected after %s (duration bound %s, poll 5ms)\n",
              absl::FormatDuration(latency).c_str(), absl::FormatDuration(b.duration).c_str());
  wd->EndPhase();
}

TEST(WatchdogThread, TheDestructorStopsAnIdleMonitorPromptly) {
  WatchdogOptions options;
  options.poll_period = absl::Hours(1);
  auto wd = Watchdog::Create(options);
  ASSERT_TRUE(wd.ok());
  wd->reset();  // returns although the next poll is an hour away
}

// The training thread opens, ticks and closes phases and collectives as fast as it can while the
// monitor polls every millisecond: run under ThreadSanitizer, this is the data-race check of the
// lock-free frames and slots.
TEST(WatchdogThread, TrainingAndMonitorThreadsRaceCleanly) {
  CollectiveTrackerOptions tracker_options;
  tracker_options.max_in_flight = 8;
  auto tracker = CollectiveTracker::Create(tracker_options);
  ASSERT_TRUE(tracker.ok());
  ASSERT_TRUE((*tracker)->RegisterCommunicator(1, "dp", nullptr).ok());
  WatchdogOptions options;
  options.poll_period = absl::Milliseconds(1);
  options.tracker = tracker->get();
  auto created = Watchdog::Create(options);
  ASSERT_TRUE(created.ok());
  std::unique_ptr<Watchdog> wd = *std::move(created);
  // At least 20,000 steps and at least 300 ms, so the monitor polls a few hundred times.
  int64_t steps = 0;
  const absl::Time start = absl::Now();
  std::thread training([&] {
    for (int step = 0; step < 20'000 || absl::Now() - start < absl::Milliseconds(300); ++step) {
      ++steps;
      wd->SetStep(step);
      ScopedPhase s(wd.get(), "step");
      {
        ScopedPhase p(wd.get(), step % 2 == 0 ? "forward" : "backward");
        wd->Tick();
        ScopedCollective c(tracker->get(), "all_reduce", 1, 4096);
        wd->Tick(2);
      }
      (void)wd->TakeHang();
    }
  });
  training.join();
  EXPECT_EQ(wd->hangs_declared(), 0);
  EXPECT_EQ(wd->usage_errors(), 0);
  EXPECT_EQ((*tracker)->Progress()[0].completed, steps);
  EXPECT_EQ(wd->BoundsFor("step").duration_samples, steps);
}

}  // namespace
}  // namespace trainguard
