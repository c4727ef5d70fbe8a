// The cost of hang detection on the training thread: a phase opened and closed, a tick, and a
// collective entered and left, with the monitor thread polling at its default period and, in the
// "/1" variants, a shared-memory flight recorder taking the records (the "/0" variants have none).
// Target: well under 100 ns per pair (a pair is two clock reads).
//
//   build/default/bench/bench_detection --benchmark_filter='Phase|Tick|Tracker'
//   [--benchmark_repetitions=5]
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "sdk/watchdog/flight_recorder.h"
#include "trainguard/collectives.h"
#include "trainguard/watchdog.h"

namespace {

using trainguard::CollectiveHandle;
using trainguard::CollectiveTracker;
using trainguard::CollectiveTrackerOptions;
using trainguard::FlightRecorder;
using trainguard::Watchdog;
using trainguard::WatchdogOptions;

// The detection stack of one rank: a recorder (when `with_recorder`), a tracker with one
// communicator, and a watchdog whose monitor thread polls every 100 ms (the default).
struct Detection {
  explicit Detection(bool with_recorder) {
    if (with_recorder) {
      recorder = *FlightRecorder::Create(absl::StrFormat("bench-wd-%d", getpid()), 0, 4096);
    }
    CollectiveTrackerOptions t;
    t.recorder = recorder.get();
    tracker = *CollectiveTracker::Create(t);
    (void)tracker->RegisterCommunicator(1, "dp", nullptr);
    WatchdogOptions w;
    w.recorder = recorder.get();
    w.tracker = tracker.get();
    watchdog = *Watchdog::Create(w);
  }
  std::unique_ptr<FlightRecorder> recorder;
  std::unique_ptr<CollectiveTracker> tracker;
  std::unique_ptr<Watchdog> watchdog;
};

void BM_PhaseBeginEnd(benchmark::State& state) {
  Detection d(state.range(0) != 0);
  d.watchdog->BeginPhase("step");  // nested in a step, as in a trainer
  for (auto _ : state) {
    d.watchdog->BeginPhase("forward_backward");
    d.watchdog->EndPhase();
  }
  d.watchdog->EndPhase();
  if (d.watchdog->usage_errors() != 0) state.SkipWithError("usage errors");
}
BENCHMARK(BM_PhaseBeginEnd)->Arg(0)->Arg(1);

void BM_Tick(benchmark::State& state) {
  Detection d(false);
  d.watchdog->BeginPhase("generate");
  for (auto _ : state) d.watchdog->Tick(16);
  d.watchdog->EndPhase();
}
BENCHMARK(BM_Tick);

void BM_TrackerBeginEnd(benchmark::State& state) {
  Detection d(state.range(0) != 0);
  for (auto _ : state) {
    CollectiveHandle h = d.tracker->Begin("all_reduce", 1, 1 << 20);
    benchmark::DoNotOptimize(h);
    d.tracker->End(h);
  }
  if (d.tracker->usage_errors() != 0) state.SkipWithError("usage errors");
}
BENCHMARK(BM_TrackerBeginEnd)->Arg(0)->Arg(1);

}  // namespace
