// Restore throughput from peer memory: a replacement fetches a rank's backup from its holders
// (BackupServices in this process, over the real TCP transport on 127.0.0.1) into its own arena,
// then restores the registry's buffers from it, next to a plain loopback TCP socket moving the
// same bytes in the same run (bench/loopback_sink.h). Each iteration does one of each.
//
//   build/default/bench/bench_restore --benchmark_repetitions=3
//
// BM_RestoreVsLoopback/<bytes>/holders:<n>: `fetch` is FetchBackupFromHolders from n holders at
// once (each sends a share of the chunks over its own connection, received into the arena's free
// slot, every chunk checked as it lands, the slot installed); `restore_after` is that fetch plus
// RestoreStep (the arena copied into the registry's buffers once the fetch is complete);
// `restore` is FetchBackupFromHolders with the registry to restore into, each chunk copied into
// the buffers as it lands, which is what PeerBackups::Restore and the Checkpointer do for a
// replacement. The second holder keeps its arena under another shared-memory name
// (tests/support/shm_suffix_env.h), as another host would. Counters: fetch_MBps, restore_MBps,
// loopback_MBps, fetch_ratio, restore_after_ratio and restore_ratio (loopback time / fetch or
// restore time: 1.0 is the plain socket's speed). The reported time is the restore's. Sizes: 64
// MiB, 256 MiB and 1 GiB in 4 MiB chunks, from one holder and from two; the 1 GiB cases need about
// 8 GiB (one holder) and 10 GiB (two) of memory: the holders' arenas, the restorer's arena and
// buffer, the loopback buffer.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/loopback_sink.h"
#include "benchmark/benchmark.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/snapshotter.h"
#include "tests/support/shm_suffix_env.h"
#include "trainguard/checkpoint.h"

namespace {

using trainguard::BackupService;
using trainguard::BackupServiceOptions;
using trainguard::Snapshotter;
using trainguard::bench::LoopbackSink;

constexpr uint64_t kChunk = 4 << 20;
constexpr int kSource = 0;
constexpr int64_t kStep = 7;

trainguard::StateRegistry RegistryOf(std::vector<char>& buffer) {
  trainguard::StateRegistry registry;
  (void)registry.Register({"w",
                           "",
                           buffer.data(),
                           buffer.size(),
                           trainguard::DType::kU8,
                           {static_cast<int64_t>(buffer.size())},
                           {}});
  return registry;
}

// Snapshots `bytes` of deterministic state in a source rank's arena and pushes it to every
// holder; the source's arena is gone again on return. Returns the committed fingerprint, or 0.
uint64_t PushSnapshot(const std::string& job, size_t bytes, const std::vector<std::string>& holders,
                      std::string* error) {
  std::vector<char> weights(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = i * 0x9e3779b97f4a7c15ULL;
    std::memcpy(weights.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  trainguard::StateRegistry registry = RegistryOf(weights);
  trainguard::SnapshotterOptions so;
  so.job_id = job + "-source";
  so.rank = kSource;
  so.chunk_bytes = kChunk;
  uint64_t fingerprint = 0;
  {
    auto source = Snapshotter::Create(&registry, so);
    absl::StatusOr<Snapshotter::View> view;
    if (!source.ok() || !(*source)->Begin(kStep).ok() || !(*source)->Fence(absl::Minutes(1)).ok() ||
        !(view = (*source)->ViewOf(kStep)).ok()) {
      *error = "cannot snapshot the source";
    } else {
      trainguard::PushRequest push;
      push.job_id = job;
      push.source_rank = kSource;
      push.view = &*view;
      push.chunk_bytes = kChunk;
      push.payload_capacity = (*source)->payload_capacity();
      fingerprint = view->info.fingerprint;
      for (const std::string& holder : holders) {
        push.holder_address = holder;
        push.deadline = absl::Now() + absl::Minutes(2);
        if (auto pushed = trainguard::PushBackup(push); !pushed.ok()) {
          *error = pushed.status().ToString();
          fingerprint = 0;
        }
      }
    }
  }
  (void)Snapshotter::RemoveArena(so.job_id, kSource);
  return fingerprint;
}

void BM_RestoreVsLoopback(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int holders = static_cast<int>(state.range(1));
  const std::string job = absl::StrFormat("bench-restore-%d", getpid());
  const std::string restorer_job = job + "-replacement";
  trainguard::testing::ShmSuffixEnv other_host(".other-host");
  std::vector<std::unique_ptr<BackupService>> services;
  std::vector<std::string> addresses;
  for (int h = 0; h < holders; ++h) {
    BackupServiceOptions options;
    options.job_id = job;
    options.rank = h;
    options.env = h == 0 ? nullptr : &other_host;
    auto service = BackupService::Start(options);
    if (!service.ok()) {
      state.SkipWithError(service.status().ToString().c_str());
      return;
    }
    addresses.push_back((*service)->address());
    services.push_back(*std::move(service));
  }
  auto remove_arenas = [&] {
    services.clear();
    (void)BackupService::RemoveArenas(job, {kSource});
    (void)BackupService::RemoveArenas(job, {kSource}, &other_host);
    (void)Snapshotter::RemoveArena(restorer_job, kSource);
  };
  absl::Cleanup removed = remove_arenas;  // runs after the restorer (declared below) is gone
  std::string error;
  const uint64_t fingerprint = PushSnapshot(job, bytes, addresses, &error);
  if (fingerprint == 0) {
    state.SkipWithError(error.c_str());
    return;
  }
  std::vector<char> restored(bytes, 0);
  trainguard::StateRegistry registry = RegistryOf(restored);
  trainguard::SnapshotterOptions so;
  so.job_id = restorer_job;
  so.rank = kSource;
  so.chunk_bytes = kChunk;
  auto restorer = Snapshotter::Create(&registry, so);
  LoopbackSink sink(bytes + (2 << 20));
  if (!restorer.ok() || !sink.ok()) {
    state.SkipWithError("cannot create the restorer's arena or listen on 127.0.0.1");
    return;
  }
  trainguard::FetchRequest fetch;
  fetch.job_id = job;
  fetch.source_rank = kSource;
  fetch.step = kStep;
  fetch.fingerprint = fingerprint;
  auto fetch_into = [&]() -> bool {
    fetch.deadline = absl::Now() + absl::Minutes(2);
    absl::StatusOr<trainguard::FetchedFromHolders> installed =
        trainguard::FetchBackupFromHolders(fetch, addresses, restorer->get());
    if (!installed.ok()) state.SkipWithError(installed.status().ToString().c_str());
    return installed.ok();
  };
  auto restore = [&]() -> bool {
    absl::StatusOr<trainguard::SnapshotInfo> r = (*restorer)->RestoreStep(&registry, kStep);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
    return r.ok();
  };
  auto restore_as_it_lands = [&]() -> bool {
    fetch.deadline = absl::Now() + absl::Minutes(2);
    absl::StatusOr<trainguard::FetchedFromHolders> restored =
        trainguard::FetchBackupFromHolders(fetch, addresses, restorer->get(), &registry);
    if (!restored.ok()) state.SkipWithError(restored.status().ToString().c_str());
    return restored.ok();
  };
  // The plain socket moves the payload the fetch moved (the arena's copy of it).
  auto loopback = [&]() -> bool {
    absl::StatusOr<Snapshotter::View> view = (*restorer)->ViewOf(kStep);
    if (!view.ok() || !sink.Transfer(view->payload.data(), view->payload.size())) {
      state.SkipWithError("the loopback transfer failed");
      return false;
    }
    return true;
  };
  // Warm-up outside the timing: both slots of the restorer's arena are written once.
  for (int i = 0; i < 2; ++i) {
    if (!fetch_into() || !restore() || !restore_as_it_lands() || !loopback()) return;
  }
  std::vector<char> expected(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = i * 0x9e3779b97f4a7c15ULL;
    std::memcpy(expected.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  double fetch_s = 0, restore_after_s = 0, restore_s = 0, loopback_s = 0;
  for (auto _ : state) {
    // A replacement's buffers hold its fresh state, not the snapshot's (which a restore would
    // find already there and not copy): zeroed, untimed, before each restore.
    std::fill(restored.begin(), restored.end(), 0);
    absl::Time start = absl::Now();
    if (!fetch_into()) break;
    const double fetched = absl::ToDoubleSeconds(absl::Now() - start);
    start = absl::Now();
    if (!restore()) break;
    const double copied = absl::ToDoubleSeconds(absl::Now() - start);
    if (restored != expected) {
      state.SkipWithError("the bytes restored after the fetch differ from the source's");
      break;
    }
    std::fill(restored.begin(), restored.end(), 0);
    start = absl::Now();
    if (!restore_as_it_lands()) break;
    const double landed = absl::ToDoubleSeconds(absl::Now() - start);
    start = absl::Now();
    if (!loopback()) break;
    loopback_s += absl::ToDoubleSeconds(absl::Now() - start);
    fetch_s += fetched;
    restore_after_s += fetched + copied;
    restore_s += landed;
    state.SetIterationTime(landed);
  }
  if (!state.error_occurred() && restored != expected) {
    state.SkipWithError("the bytes restored as they landed differ from the source's");
  }
  const double megabytes =
      static_cast<double>(bytes) * static_cast<double>(state.iterations()) / 1e6;
  if (fetch_s > 0 && loopback_s > 0) {
    state.counters["fetch_MBps"] = megabytes / fetch_s;
    state.counters["restore_MBps"] = megabytes / restore_s;
    state.counters["loopback_MBps"] = megabytes / loopback_s;
    state.counters["fetch_ratio"] = loopback_s / fetch_s;
    state.counters["restore_after_ratio"] = loopback_s / restore_after_s;
    state.counters["restore_ratio"] = loopback_s / restore_s;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_RestoreVsLoopback)
    ->ArgNames({"bytes", "holders"})
    ->ArgsProduct({{64 << 20, 256 << 20, 1 << 30}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
