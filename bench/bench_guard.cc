// The cost of sdk::guard on the happy path, next to a bare call of the same lambda in the same
// binary.
//
//   build/default/bench/bench_guard [--benchmark_repetitions=5 ...]
//
// Prints Google Benchmark's table (with an allocs_per_step counter: this binary counts every global
// operator new), then one summary line per variant:
//   guard_overhead: <variant> <ns per step> - bare <ns per step> = <difference> ns/step (CPU time)
// The standard flags hold: with --benchmark_format=json (or csv) stdout is that document alone and
// the summary lines go to stderr.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "tests/support/allocation_counter.h"
#include "trainguard/sdk.h"

namespace {

// One Runtime for every benchmark, in a run dir of its own that goes with it at exit.
class BenchRuntime {
 public:
  BenchRuntime() {
    char dir[] = "/tmp/trainguard-bench-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    dir_ = dir;
    sdk::Options options;
    options.job_id = absl::StrCat("bench-guard-", getpid());  // two runs at once do not collide
    options.run_dir = dir_;
    absl::StatusOr<std::unique_ptr<sdk::Runtime>> rt = sdk::Runtime::Create(options);
    if (!rt.ok()) {
      std::fprintf(stderr, "bench_guard: %s\n", rt.status().ToString().c_str());
      std::abort();
    }
    runtime_ = *std::move(rt);
  }
  ~BenchRuntime() {
    runtime_.reset();  // it writes its last events into dir_
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  BenchRuntime(const BenchRuntime&) = delete;
  BenchRuntime& operator=(const BenchRuntime&) = delete;

  sdk::Runtime& runtime() { return *runtime_; }

 private:
  std::string dir_;
  std::unique_ptr<sdk::Runtime> runtime_;
};

sdk::Runtime& SharedRuntime() {
  static BenchRuntime shared;
  return shared.runtime();
}

// The "train step": small enough that the guard's cost dominates, opaque to the optimiser.
struct Body {
  int64_t* counter;
  void operator()() const { benchmark::DoNotOptimize(++*counter); }
};

void ReportAllocations(benchmark::State& state, int64_t allocations_before) {
  state.counters["allocs_per_step"] = benchmark::Counter(
      static_cast<double>(trainguard::testing::AllocationCount() - allocations_before),
      benchmark::Counter::kAvgIterations);
}

void BM_BareCall(benchmark::State& state) {
  int64_t counter = 0;
  Body body{&counter};
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) body();
  ReportAllocations(state, before);
}
BENCHMARK(BM_BareCall);

void BM_Guard(benchmark::State& state) {
  sdk::Runtime& rt = SharedRuntime();
  int64_t counter = 0;
  Body body{&counter};
  int64_t step = 0;
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) {
    sdk::StepResult r = sdk::guard(rt, step++, body);
    benchmark::DoNotOptimize(r);
  }
  ReportAllocations(state, before);
  if (counter != step) state.SkipWithError("the guarded body did not run once per step");
}
BENCHMARK(BM_Guard);

void BM_GuardWithStepHandle(benchmark::State& state) {
  sdk::Runtime& rt = SharedRuntime();
  int64_t counter = 0;
  int64_t step = 0;
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) {
    sdk::StepResult r = sdk::guard(
        rt, step++, [&](sdk::Step& s) { benchmark::DoNotOptimize(counter += s.number()); });
    benchmark::DoNotOptimize(r);
  }
  ReportAllocations(state, before);
}
BENCHMARK(BM_GuardWithStepHandle);

void BM_StepScope(benchmark::State& state) {
  sdk::Runtime& rt = SharedRuntime();
  int64_t counter = 0;
  Body body{&counter};
  int64_t step = 0;
  const int64_t before = trainguard::testing::AllocationCount();
  for (auto _ : state) {
    sdk::StepScope scope(rt, step++);
    if (scope.active()) body();
    sdk::StepResult r = scope.Finish();
    benchmark::DoNotOptimize(r);
  }
  ReportAllocations(state, before);
}
BENCHMARK(BM_StepScope);

// Keeps the CPU time per iteration of each run (the last repetition, or the mean when aggregated)
// so main() can print guard - bare, and hands every call on to the display reporter the standard
// flags chose (--benchmark_format=console|json|csv).
class DifferenceReporter : public benchmark::BenchmarkReporter {
 public:
  // REQUIRES: `display` outlives this reporter.
  explicit DifferenceReporter(benchmark::BenchmarkReporter* display) : display_(display) {}

  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "mean") continue;
      ns_per_step_[run.run_name.function_name] = run.GetAdjustedCPUTime();
    }
    display_->ReportRuns(runs);
  }
  void Finalize() override { display_->Finalize(); }

  const std::map<std::string, double>& ns_per_step() const { return ns_per_step_; }

 private:
  benchmark::BenchmarkReporter* const display_;
  std::map<std::string, double> ns_per_step_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The library's own display reporter for --benchmark_format (it owns it). --benchmark_out and
  // --benchmark_out_format are handled by RunSpecifiedBenchmarks itself.
  benchmark::BenchmarkReporter* display = benchmark::CreateDefaultDisplayReporter();
  DifferenceReporter reporter(display);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const auto& ns = reporter.ns_per_step();
  auto bare = ns.find("BM_BareCall");
  if (bare == ns.end()) return 0;
  // The summary follows the table on stdout; JSON or CSV on stdout must stay parseable, so there
  // it goes to stderr.
  FILE* summary = dynamic_cast<benchmark::ConsoleReporter*>(display) != nullptr ? stdout : stderr;
  for (const auto& [name, value] : ns) {
    if (name == "BM_BareCall") continue;
    std::fprintf(summary, "guard_overhead: %s %.1f - bare %.1f = %.1f ns/step (CPU time)\n",
                 name.c_str(), value, bare->second, value - bare->second);
  }
  return 0;
}
