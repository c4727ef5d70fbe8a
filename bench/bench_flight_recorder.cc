// The cost of the flight recorder on the training thread: FlightRecorder::Append, with the time
// read by the recorder (the usual case) and given by the caller, and what a reader pays to copy a
// ring.
//
//   build/default/bench/bench_detection --benchmark_filter=FlightRecorder
//   [--benchmark_repetitions=5]
//
// This binary counts every global operator new (tests/support/allocation_counter.h): the
// allocs_per_op counter of the Append benchmarks must be 0. Other sources of bench_detection must
// not include that header again.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/allocation_counter.h"

namespace {

using trainguard::FlightRecord;
using trainguard::FlightRecorder;
using trainguard::FlightRecordType;

std::unique_ptr<FlightRecorder> NewRecorder(int capacity) {
  absl::StatusOr<std::unique_ptr<FlightRecorder>> fr =
      FlightRecorder::Create(absl::StrFormat("bench-%d", getpid()), 0, capacity);
  if (!fr.ok()) {
    std::fprintf(stderr, "bench_flight_recorder: %s\n", fr.status().ToString().c_str());
    std::abort();
  }
  return *std::move(fr);
}

FlightRecord CollectiveRecord() {
  FlightRecord r;
  r.type = FlightRecordType::kCollectiveBegin;
  r.step = 1000;
  r.comm_id = 0xC0FFEE;
  r.bytes = 64 << 20;
  std::snprintf(r.name, sizeof(r.name), "allreduce.grads.bucket7");
  return r;
}

void ReportAllocations(benchmark::State& state, int64_t before) {
  state.counters["allocs_per_op"] =
      benchmark::Counter(static_cast<double>(trainguard::testing::AllocationCount() - before),
                         benchmark::Counter::kAvgIterations);
}

// The recorder reads CLOCK_MONOTONIC (vDSO) for every record.
void BM_FlightRecorderAppend(benchmark::State& state) {
  std::unique_ptr<FlightRecorder> fr = NewRecorder(static_cast<int>(state.range(0)));
  FlightRecord r = CollectiveRecord();
  int64_t seq = 0;
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) {
    r.comm_seq = seq++;
    fr->Append(r);
  }
  ReportAllocations(state, before);
}
BENCHMARK(BM_FlightRecorderAppend)->Arg(4096)->Arg(1 << 16);

// The caller supplies the time (e.g. one clock read shared by a begin and an end record).
void BM_FlightRecorderAppendGivenTime(benchmark::State& state) {
  std::unique_ptr<FlightRecorder> fr = NewRecorder(4096);
  FlightRecord r = CollectiveRecord();
  int64_t seq = 0;
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) {
    r.comm_seq = seq;
    r.time_ns = ++seq;
    fr->Append(r);
  }
  ReportAllocations(state, before);
}
BENCHMARK(BM_FlightRecorderAppendGivenTime);

// What a reader (the watchdog, `trainguard flight-recorder show`) pays to copy a full ring.
void BM_FlightRecorderSnapshot(benchmark::State& state) {
  const int capacity = static_cast<int>(state.range(0));
  std::unique_ptr<FlightRecorder> fr = NewRecorder(capacity);
  FlightRecord r = CollectiveRecord();
  for (int i = 0; i < capacity; ++i) fr->Append(r);
  for (auto _ : state) benchmark::DoNotOptimize(fr->Snapshot());
  state.SetItemsProcessed(state.iterations() * capacity);
}
BENCHMARK(BM_FlightRecorderSnapshot)->Arg(4096);

}  // namespace

BENCHMARK_MAIN();
