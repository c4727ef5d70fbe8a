// Replication throughput: a snapshot pushed to a BackupService in this process over 127.0.0.1
// (the holder receives straight into its shared-memory arena and verifies every chunk; the push
// waits for the holder's acknowledgement), next to a plain loopback TCP socket sending the same
// bytes in the same run (send() into a socket with default options, a receiver thread recv()ing
// into a buffer of the same size, then one byte back). Each iteration does one of each; the
// reported time is the push's.
//
//   build/default/bench/bench_replication --benchmark_filter=Replication
//
// Counters: push_MBps, loopback_MBps and ratio (push / loopback; the target is >= 0.8).
// Sizes: 64 MiB and 256 MiB, in 4 MiB chunks, no rate limit.
//
// BM_TrainingThreadStall/<peers>: what replication costs the training thread. Two ranks (one per
// "host") checkpoint 64 MiB each through their Checkpointers and an in-process store; rank 0's
// training thread, per iteration, calls Save() and then Fence() (what the guard does before the
// next step: the copy into the arena) and then runs a fixed amount of "compute" (XXH64 over a
// 64 MiB buffer, twice) while the save's background work (vote, and with peers:1 the push to
// rank 1's BackupService) goes on. Counters: stall_ms (Save + Fence) and compute_ms, per
// iteration; peers:0 is the baseline without replication, in the same run. Both ranks share this
// 2-core machine, so with peers the holder's receive competes with the compute too (on real hosts
// it runs on the other host).
//
// BM_PeerRestore/<bytes>: a replacement's restore of a peer backup, from the holder's reply to the
// registry's buffers: `into` (what PeerBackups::Restore does: FetchBackupInto, the payload received
// straight into the arena's free slot and checked as it lands, then RestoreStep) next to `string`
// (the path before it, in the same iteration: FetchBackup into a string, Install into the arena,
// RestoreStep). Counters: into_ms, string_ms and ratio (string / into). The holder is in this
// process over 127.0.0.1.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/loopback_sink.h"
#include "benchmark/benchmark.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/checkpoint.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"

namespace {

using trainguard::BackupService;
using trainguard::BackupServiceOptions;
using trainguard::PushBackup;
using trainguard::PushRequest;
using trainguard::Snapshotter;
using trainguard::bench::LoopbackSink;

constexpr uint64_t kChunk = 4 << 20;
constexpr int kSource = 0;
void BM_ReplicationVsLoopback(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::string payload(bytes, '\0');
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = i * 0x9e3779b97f4a7c15ULL;
    std::memcpy(payload.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  Snapshotter::View view;
  view.payload = payload;
  for (size_t at = 0; at < bytes; at += kChunk) {
    view.chunk_checksums.push_back(
        XXH3_64bits(payload.data() + at, std::min<size_t>(kChunk, bytes - at)));
  }
  view.info.layout_hash = 0xbe7c4;
  view.info.bytes = bytes;

  BackupServiceOptions options;
  options.job_id = absl::StrFormat("bench-replication-%d", getpid());
  auto service = BackupService::Start(options);
  if (!service.ok()) {
    state.SkipWithError(service.status().ToString().c_str());
    return;
  }
  LoopbackSink sink(bytes);
  if (!sink.ok()) {
    state.SkipWithError("cannot listen on 127.0.0.1");
    return;
  }
  PushRequest request;
  request.holder_address = (*service)->address();
  request.job_id = options.job_id;
  request.source_rank = kSource;
  request.view = &view;
  request.chunk_bytes = kChunk;
  request.payload_capacity = bytes;
  int64_t step = 0;
  // Each push a new step (a new fingerprint), so that none is answered "already held".
  auto push = [&]() -> bool {
    view.info.step = ++step;
    view.info.fingerprint = trainguard::SnapshotFingerprint(view.info.step, view.info.layout_hash,
                                                            bytes, view.chunk_checksums);
    request.deadline = absl::Now() + absl::Minutes(2);
    auto result = PushBackup(request);
    if (!result.ok()) state.SkipWithError(result.status().ToString().c_str());
    return result.ok() && !result->already_held;
  };
  // Warm-up outside the timing: the holder's arena is created (and populated) by the first push.
  if (!push() || !sink.Transfer(payload.data(), bytes)) return;

  double push_seconds = 0, loopback_seconds = 0;
  for (auto _ : state) {
    absl::Time start = absl::Now();
    if (!push()) break;
    const double pushed = absl::ToDoubleSeconds(absl::Now() - start);
    start = absl::Now();
    if (!sink.Transfer(payload.data(), bytes)) {
      state.SkipWithError("the loopback transfer failed");
      break;
    }
    loopback_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    push_seconds += pushed;
    state.SetIterationTime(pushed);
  }
  const double megabytes =
      static_cast<double>(bytes) * static_cast<double>(state.iterations()) / 1e6;
  if (push_seconds > 0 && loopback_seconds > 0) {
    state.counters["push_MBps"] = megabytes / push_seconds;
    state.counters["loopback_MBps"] = megabytes / loopback_seconds;
    state.counters["ratio"] = loopback_seconds / push_seconds;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  service->reset();
  (void)BackupService::RemoveArenas(options.job_id, {kSource});
}
BENCHMARK(BM_ReplicationVsLoopback)
    ->Arg(64 << 20)
    ->Arg(256 << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_PeerRestore(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const std::string job = absl::StrFormat("bench-restore-%d", getpid());
  const std::string restorer_job = job + "-r";
  std::vector<char> weights(bytes), restored(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = i * 0x9e3779b97f4a7c15ULL;
    std::memcpy(weights.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  trainguard::StateRegistry source_registry, restorer_registry;
  (void)source_registry.Register({"w", "", weights.data(), bytes, trainguard::DType::kU8,
                                  {static_cast<int64_t>(bytes)}, {}});
  (void)restorer_registry.Register({"w", "", restored.data(), bytes, trainguard::DType::kU8,
                                    {static_cast<int64_t>(bytes)}, {}});
  trainguard::SnapshotterOptions so;
  so.job_id = job;
  so.rank = kSource;
  so.chunk_bytes = kChunk;
  auto source = Snapshotter::Create(&source_registry, so);
  so.job_id = restorer_job;
  auto restorer = Snapshotter::Create(&restorer_registry, so);
  BackupServiceOptions options;
  options.job_id = job;
  auto service = BackupService::Start(options);
  if (!source.ok() || !restorer.ok() || !service.ok()) {
    state.SkipWithError("cannot create the arenas or the holder");
    return;
  }
  constexpr int64_t kStep = 7;
  absl::StatusOr<Snapshotter::View> view;
  if (!(*source)->Begin(kStep).ok() || !(*source)->Fence(absl::Minutes(1)).ok() ||
      !(view = (*source)->ViewOf(kStep)).ok()) {
    state.SkipWithError("cannot snapshot the source");
    return;
  }
  PushRequest push;
  push.holder_address = (*service)->address();
  push.job_id = job;
  push.source_rank = kSource;
  push.view = &*view;
  push.chunk_bytes = kChunk;
  push.payload_capacity = (*source)->payload_capacity();
  push.deadline = absl::Now() + absl::Minutes(2);
  if (auto pushed = PushBackup(push); !pushed.ok()) {
    state.SkipWithError(pushed.status().ToString().c_str());
    return;
  }
  trainguard::FetchRequest fetch;
  fetch.holder_address = (*service)->address();
  fetch.job_id = job;
  fetch.source_rank = kSource;
  fetch.step = kStep;
  fetch.fingerprint = view->info.fingerprint;
  auto restore_into = [&]() -> bool {
    fetch.deadline = absl::Now() + absl::Minutes(2);
    return trainguard::FetchBackupInto(fetch, restorer->get()).ok() &&
           (*restorer)->RestoreStep(&restorer_registry, kStep).ok();
  };
  auto restore_via_string = [&]() -> bool {
    fetch.deadline = absl::Now() + absl::Minutes(2);
    auto fetched = trainguard::FetchBackup(fetch);
    return fetched.ok() &&
           (*restorer)
               ->Install(fetched->step, fetched->generation, fetched->payload,
                         fetched->chunk_checksums)
               .ok() &&
           (*restorer)->RestoreStep(&restorer_registry, kStep).ok();
  };
  // Warm-up outside the timing: both arena slots are populated once.
  if (!restore_into() || !restore_via_string()) {
    state.SkipWithError("a warm-up restore failed");
    return;
  }
  double into_s = 0, string_s = 0;
  // A replacement's buffers hold its fresh state, not the snapshot's (which a restore would find
  // already there and not copy): reset before each restore, untimed.
  auto fresh = [&] { std::fill(restored.begin(), restored.end(), 0); };
  for (auto _ : state) {
    fresh();
    absl::Time start = absl::Now();
    if (!restore_into()) {
      state.SkipWithError("FetchBackupInto failed");
      break;
    }
    const double into = absl::ToDoubleSeconds(absl::Now() - start);
    fresh();
    start = absl::Now();
    if (!restore_via_string()) {
      state.SkipWithError("FetchBackup + Install failed");
      break;
    }
    string_s += absl::ToDoubleSeconds(absl::Now() - start);
    into_s += into;
    state.SetIterationTime(into);
  }
  if (restored != weights) state.SkipWithError("the restored bytes differ");
  const double n = static_cast<double>(state.iterations());
  if (into_s > 0) {
    state.counters["into_ms"] = into_s / n * 1e3;
    state.counters["string_ms"] = string_s / n * 1e3;
    state.counters["ratio"] = string_s / into_s;
  }
  service->reset();
  source->reset();
  restorer->reset();
  (void)BackupService::RemoveArenas(job, {kSource});
  (void)Snapshotter::RemoveArena(job, kSource);
  (void)Snapshotter::RemoveArena(restorer_job, kSource);
}
BENCHMARK(BM_PeerRestore)
    ->Arg(64 << 20)
    ->Arg(256 << 20)
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

void BM_TrainingThreadStall(benchmark::State& state) {
  const bool peers = state.range(0) != 0;
  constexpr size_t kBytes = 64 << 20;
  constexpr int kRanks = 2;
  const std::string job = absl::StrFormat("bench-stall-%d-%d", getpid(), peers ? 1 : 0);
  trainguard::InMemoryStore store;
  std::vector<std::vector<char>> state_bytes(kRanks, std::vector<char>(kBytes, 1));
  std::vector<trainguard::StateRegistry> registries(kRanks);
  std::vector<std::unique_ptr<trainguard::Store>> clients;
  for (int r = 0; r < kRanks; ++r) {
    (void)registries[r].Register({"optimizer", "", state_bytes[r].data(), kBytes,
                                  trainguard::DType::kU8, {static_cast<int64_t>(kBytes)}, {}});
    clients.push_back(store.NewClient());
  }
  absl::StatusOr<trainguard::Topology> topology =
      trainguard::Topology::Create({.world_size = kRanks, .ranks_per_host = 1});
  absl::StatusOr<trainguard::BackupPlacement> placement =
      trainguard::BackupPlacement::Place({.topology = *topology, .copies = 2});
  if (!placement.ok()) {
    state.SkipWithError(placement.status().ToString().c_str());
    return;
  }
  std::vector<std::unique_ptr<trainguard::Checkpointer>> ranks(kRanks);
  std::vector<absl::Status> created(kRanks);
  std::vector<std::thread> starting;
  for (int r = 0; r < kRanks; ++r) {
    starting.emplace_back([&, r] {
      trainguard::CheckpointerOptions o;
      o.job_id = job;
      o.rank = r;
      o.world_size = kRanks;
      o.store = clients[r].get();
      o.timeout = absl::Minutes(1);
      if (peers) {
        trainguard::PeerBackupsOptions p;
        p.job_id = job;
        p.rank = r;
        p.placement = *placement;
        p.host_addr = "127.0.0.1";
        p.host_name = absl::StrCat("host", r);
        o.peer_backups = p;
      }
      auto c = trainguard::Checkpointer::Create(&registries[r], o);
      created[r] = c.status();
      if (c.ok()) ranks[r] = *std::move(c);
    });
  }
  for (std::thread& t : starting) t.join();
  for (const absl::Status& s : created) {
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  std::vector<char> work(kBytes, 3);
  uint64_t sink = 0;
  double stall_s = 0, compute_s = 0;
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    absl::Time start = absl::Now();
    // Rank 1 saves too (so that the step commits), off the measured thread's clock.
    if (!ranks[1]->Save(step).ok() || !ranks[0]->Save(step).ok() ||
        !ranks[0]->Fence(absl::Minutes(1)).ok()) {
      state.SkipWithError("save or fence failed");
      break;
    }
    const double stall = absl::ToDoubleSeconds(absl::Now() - start);
    start = absl::Now();
    for (int k = 0; k < 2; ++k) sink += XXH64(work.data(), work.size(), sink);
    const double compute = absl::ToDoubleSeconds(absl::Now() - start);
    benchmark::DoNotOptimize(sink);
    stall_s += stall;
    compute_s += compute;
    state.SetIterationTime(stall + compute);
    for (auto& c : ranks) (void)c->WaitIdle(absl::Minutes(1));
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["stall_ms"] = stall_s / n * 1e3;
  state.counters["compute_ms"] = compute_s / n * 1e3;
  ranks.clear();
  for (int r = 0; r < kRanks; ++r) {
    (void)Snapshotter::RemoveArena(job, r);
    (void)BackupService::RemoveArenas(job, {r});
  }
}
BENCHMARK(BM_TrainingThreadStall)
    ->ArgName("peers")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
