// The Snapshotter's costs: how long the training thread is blocked per snapshot (Begin), the
// throughput of a whole snapshot (Begin + Fence, checksums included) next to a plain memcpy of the
// same bytes in the same process, and the throughput of a restore (verify every chunk, copy back).
//
//   build/default/bench/bench_checkpoint --benchmark_filter=Snapshot
//
// State sizes: 64 MiB, 1 GiB, 4 GiB, in 16 host buffers; copy_threads 1 and 4 (Begin, Begin +
// Fence). A size whose state plus two arena slots (and, for the memcpy baseline, a destination)
// does not fit in the available memory is skipped.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "sdk/checkpoint/replica_check.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/health/compute_canary.h"
#include "trainguard/checkpoint.h"

namespace {

using trainguard::DType;
using trainguard::Snapshotter;
using trainguard::SnapshotterOptions;
using trainguard::StateBuffer;
using trainguard::StateRegistry;

constexpr int kBuffers = 16;
constexpr absl::Duration kFenceTimeout = absl::Minutes(2);

uint64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// `bytes` of host state in kBuffers page-aligned, touched buffers.
class HostState {
 public:
  // `replicated`: every buffer is StateBuffer::replicated (compared across data-parallel replicas:
  // the snapshot takes their replica digests while it checksums them).
  explicit HostState(size_t bytes, bool replicated = false) : bytes_per_buffer_(bytes / kBuffers) {
    for (int b = 0; b < kBuffers; ++b) {
      void* p = mmap(nullptr, bytes_per_buffer_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return;
      std::memset(p, b + 1, bytes_per_buffer_);
      buffers_.push_back(static_cast<char*>(p));
    }
    for (int b = 0; b < kBuffers; ++b) {
      (void)registry_.Register(StateBuffer{absl::StrFormat("layer%d.weight", b),
                                           "model",
                                           buffers_[b],
                                           bytes_per_buffer_,
                                           DType::kU8,
                                           {static_cast<int64_t>(bytes_per_buffer_)},
                                           {},
                                           replicated});
    }
  }
  ~HostState() {
    for (char* p : buffers_) munmap(p, bytes_per_buffer_);
  }
  bool ok() const { return static_cast<int>(buffers_.size()) == kBuffers; }
  StateRegistry* registry() { return &registry_; }
  char* buffer(int b) { return buffers_[b]; }
  size_t bytes_per_buffer() const { return bytes_per_buffer_; }

 private:
  const size_t bytes_per_buffer_;
  std::vector<char*> buffers_;
  StateRegistry registry_;
};

// Sets up state and a Snapshotter of `state.range(0)` bytes, or skips the benchmark.
struct Setup {
  Setup(benchmark::State& state, double copies, bool replicated = false) : bytes(state.range(0)) {
    const uint64_t needed = static_cast<uint64_t>(copies * static_cast<double>(bytes));
    const uint64_t available = AvailableMemoryBytes();
    if (needed > available * 9 / 10) {
      state.SkipWithError(
          absl::StrFormat("needs %d MiB, %d MiB available", needed >> 20, available >> 20).c_str());
      return;
    }
    host = std::make_unique<HostState>(bytes, replicated);
    if (!host->ok()) {
      state.SkipWithError("cannot allocate the state");
      return;
    }
    options.job_id = absl::StrFormat("bench-%d", getpid());
    options.rank = static_cast<int>(state.range(1));
    options.copy_threads = static_cast<int>(state.range(2));
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(host->registry(), options);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    snapshotter = *std::move(s);
  }
  ~Setup() {
    snapshotter.reset();
    (void)Snapshotter::RemoveArena(options.job_id, options.rank);
  }
  bool ok() const { return snapshotter != nullptr; }

  const size_t bytes;
  SnapshotterOptions options;
  std::unique_ptr<HostState> host;
  std::unique_ptr<Snapshotter> snapshotter;
};

// Creating the arena (allocated, populated; once per process): fresh, then re-opened by a restarted
// rank.
void BM_SnapshotterCreate(benchmark::State& state) {
  const size_t bytes = state.range(0);
  if (3 * bytes > AvailableMemoryBytes() * 9 / 10) {
    state.SkipWithError("not enough memory");
    return;
  }
  HostState host(bytes);
  SnapshotterOptions options;
  options.job_id = absl::StrFormat("bench-create-%d", getpid());
  const bool reopen = state.range(1) != 0;
  if (reopen) (void)Snapshotter::Create(host.registry(), options);  // what the dead rank left
  for (auto _ : state) {
    state.PauseTiming();
    if (!reopen) (void)Snapshotter::RemoveArena(options.job_id, options.rank);
    state.ResumeTiming();
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(host.registry(), options);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      break;
    }
    state.PauseTiming();
    s->reset();
    state.ResumeTiming();
  }
  (void)Snapshotter::RemoveArena(options.job_id, options.rank);
}

// (a) The time the training thread is blocked per snapshot: Begin() alone.
void BM_SnapshotBegin(benchmark::State& state) {
  Setup setup(state, 3);
  if (!setup.ok()) return;
  int64_t step = 0;
  std::vector<double> seconds;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status began = setup.snapshotter->Begin(++step);
    const auto end = std::chrono::steady_clock::now();
    seconds.push_back(std::chrono::duration<double>(end - start).count());
    state.SetIterationTime(seconds.back());
    if (!began.ok() || !setup.snapshotter->Fence(kFenceTimeout).ok()) {
      state.SkipWithError("snapshot failed");
      return;
    }
  }
  // The mean hides what matters here: the usual cost and the worst stall.
  std::sort(seconds.begin(), seconds.end());
  state.counters["p50_us"] = seconds[seconds.size() / 2] * 1e6;
  state.counters["max_us"] = seconds.back() * 1e6;
}

// Whole snapshots (Begin + Fence), one per iteration; false when one failed (the benchmark is
// then marked so).
bool TakeSnapshots(benchmark::State& state, Setup& setup) {
  int64_t step = 0;
  for (auto _ : state) {
    if (!setup.snapshotter->Begin(++step).ok() || !setup.snapshotter->Fence(kFenceTimeout).ok()) {
      state.SkipWithError("snapshot failed");
      return false;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(setup.bytes));
  return true;
}

// (b) A whole snapshot: copy and checksum of every byte into the arena.
void BM_SnapshotBeginToFence(benchmark::State& state) {
  Setup setup(state, 3);
  if (setup.ok()) (void)TakeSnapshots(state, setup);
}

// Silent data corruption: a whole snapshot of replicated buffers (the replica digests taken on the
// way, streamed with the chunk checksums) next to the same snapshot of unmarked buffers, in the
// same process: the comparison's cost to the snapshot.
void BM_SnapshotReplicated(benchmark::State& state) {
  Setup setup(state, 3, state.range(3) != 0);
  if (!setup.ok() || !TakeSnapshots(state, setup)) return;
  absl::StatusOr<Snapshotter::View> view = setup.snapshotter->LatestView();
  state.counters["digests"] = view.ok() ? static_cast<double>(view->replica_digests.size()) : -1;
}

// Silent data corruption: what the rank that completes a snapshot ballot adds to it, per snapshot:
// decoding every rank's replica part and judging every data-parallel group (8 replicas each, all
// agreeing: the usual case), next to the work the ballot did before (joining every rank's
// fingerprint into the commit record), in the same process.
void BM_JudgeBallot(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const bool judge = state.range(1) != 0;
  std::vector<std::string> votes;
  for (int r = 0; r < ranks; ++r) {
    votes.push_back(absl::StrFormat("%016x", 0x1234567890abcdefull + r) +
                    trainguard::EncodeReplicaVote({r, absl::StrFormat("tp%d.cp0.pp0", r / 8 % 64),
                                                   absl::StrFormat("node-%05d", r / 8),
                                                   0xfeedfacecafebeefull + r % 8 / 8}));
  }
  for (auto _ : state) {
    std::vector<std::string> fingerprints;
    std::vector<trainguard::ReplicaReport> reports;
    for (int r = 0; r < ranks; ++r) {
      fingerprints.push_back(votes[r].substr(0, votes[r].find(' ')));
      if (!judge) continue;
      absl::StatusOr<std::optional<trainguard::ReplicaReport>> report =
          trainguard::DecodeReplicaVote(r, votes[r]);
      if (report.ok() && report->has_value()) reports.push_back(**report);
    }
    std::string record = absl::StrJoin(fingerprints, ",");
    benchmark::DoNotOptimize(record);
    if (judge) {
      std::vector<trainguard::ReplicaDisagreement> judged = trainguard::JudgeReplicas(reports);
      if (!judged.empty()) {
        state.SkipWithError("replicas that agree were judged to disagree");
        return;
      }
    }
  }
}

// The compute canary each rank runs at every snapshot, on the checkpointer's worker thread: the
// fixed 96 x 96 product and its fingerprint.
void BM_ComputeCanary(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(trainguard::ComputeCanary());
}

// (b) The baseline: one thread memcpy's the same buffers into a same-size, pre-faulted destination.
void BM_MemcpyBaseline(benchmark::State& state) {
  const size_t bytes = state.range(0);
  if (2 * bytes > AvailableMemoryBytes() * 9 / 10) {
    state.SkipWithError("not enough memory");
    return;
  }
  HostState host(bytes);
  void* dst = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!host.ok() || dst == MAP_FAILED) {
    state.SkipWithError("cannot allocate");
    return;
  }
  std::memset(dst, 0, bytes);
  for (auto _ : state) {
    char* out = static_cast<char*>(dst);
    for (int b = 0; b < kBuffers; ++b) {
      std::memcpy(out, host.buffer(b), host.bytes_per_buffer());
      out += host.bytes_per_buffer();
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  munmap(dst, bytes);
}

// (d) Restore from the arena. changed:1, the buffers changed everywhere since the snapshot (a
// byte of every page, untimed: state training rewrites at every step, or a replacement's fresh
// buffers): every chunk verified and copied back. changed:0, they did not (a survivor rolling back
// to the snapshot it took, of state training did not write since): every chunk of the buffers
// compared, nothing copied.
void BM_SnapshotRestore(benchmark::State& state) {
  Setup setup(state, 3);
  if (!setup.ok()) return;
  if (!setup.snapshotter->Begin(1).ok() || !setup.snapshotter->Fence(kFenceTimeout).ok()) {
    state.SkipWithError("snapshot failed");
    return;
  }
  const bool changed = state.range(3) != 0;
  for (auto _ : state) {
    if (changed) {
      state.PauseTiming();
      for (int b = 0; b < kBuffers; ++b) {
        for (size_t i = 0; i < setup.host->bytes_per_buffer(); i += 4096)
          setup.host->buffer(b)[i] ^= 1;
      }
      state.ResumeTiming();
    }
    if (!setup.snapshotter->RestoreLatest(setup.host->registry()).ok()) {
      state.SkipWithError("restore failed");
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(setup.bytes));
}

// {bytes, rank (a distinct arena per size), copy_threads}.
void Sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "rank", "copy_threads"});
  for (int threads : {1, 4}) {
    b->Args({64 << 20, 0, threads})
        ->Args({int64_t{1} << 30, 1, threads})
        ->Args({int64_t{4} << 30, 2, threads});
  }
  b->Unit(benchmark::kMillisecond);
}

// Real (wall-clock) time throughout: the copies run on the Snapshotter's threads, not this one.
BENCHMARK(BM_SnapshotterCreate)
    ->ArgNames({"bytes", "reopen"})
    ->Args({int64_t{1} << 30, 0})
    ->Args({int64_t{1} << 30, 1})
    ->Args({int64_t{4} << 30, 0})
    ->Args({int64_t{4} << 30, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK(BM_SnapshotBegin)->Apply(Sizes)->UseManualTime()->Iterations(20);
BENCHMARK(BM_SnapshotBeginToFence)->Apply(Sizes)->UseRealTime()->Iterations(5);
BENCHMARK(BM_ComputeCanary)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_JudgeBallot)
    ->ArgNames({"ranks", "judge"})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Args({16384, 0})
    ->Args({16384, 1})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SnapshotReplicated)
    ->ArgNames({"bytes", "rank", "copy_threads", "replicated"})
    ->Args({256 << 20, 3, 2, 0})
    ->Args({256 << 20, 3, 2, 1})
    ->Args({int64_t{1} << 30, 3, 2, 0})
    ->Args({int64_t{1} << 30, 3, 2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(10);
BENCHMARK(BM_MemcpyBaseline)
    ->Args({64 << 20})
    ->Args({int64_t{1} << 30})
    ->Args({int64_t{4} << 30})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);
BENCHMARK(BM_SnapshotRestore)
    ->ArgNames({"bytes", "rank", "copy_threads", "changed"})
    ->Args({64 << 20, 0, 4, 1})
    ->Args({int64_t{1} << 30, 1, 4, 1})
    ->Args({int64_t{4} << 30, 2, 4, 1})
    ->Args({int64_t{1} << 30, 1, 4, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
