// Persist and restore throughput of checkpoint shards (sdk/checkpoint/persister.h), against a
// plain O_DIRECT pwrite loop of the same bytes, in the same chunks, into the same directory.
//
//   TG_BENCH_DIR=/mnt/nvme/tg build/bench/bench_checkpoint
//   --benchmark_filter='^BM_(Persist|PlainODirect|RestoreVerified)'
//
// The directory defaults to /tmp (use one on the device you care about); TG_BENCH_MIB sets the
// payload size (default 256 MiB). Every write ends in fdatasync, so the numbers are durable
// bytes per second, not page-cache bytes.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "sdk/checkpoint/persister.h"
#include "trainguard/env.h"

namespace {

size_t PayloadBytes() {
  const char* mib = std::getenv("TG_BENCH_MIB");
  return (mib != nullptr ? std::strtoull(mib, nullptr, 10) : 256) << 20;
}

// A fresh directory under TG_BENCH_DIR (or /tmp), removed with its contents at the end.
class BenchDir {
 public:
  BenchDir() {
    const char* base = std::getenv("TG_BENCH_DIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/tg-bench-persist-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~BenchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string& Payload() {
  static const std::string payload = [] {
    std::string p(PayloadBytes(), '\0');
    std::mt19937_64 rng(1);
    for (size_t i = 0; i + 8 <= p.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(p.data() + i, &v, 8);
    }
    return p;
  }();
  return payload;
}

std::vector<uint64_t> Checksums(const std::string& payload, size_t chunk) {
  std::vector<uint64_t> sums;
  for (size_t at = 0; at < payload.size(); at += chunk) {
    sums.push_back(XXH3_64bits(payload.data() + at, std::min(chunk, payload.size() - at)));
  }
  return sums;
}

// Args: chunk MiB, queue depth.
void PersistBenchmark(benchmark::State& state, bool io_uring) {
  BenchDir dir;
  trainguard::PersisterOptions options;
  options.dir = dir.path();
  options.chunk_bytes = static_cast<size_t>(state.range(0)) << 20;
  options.queue_depth = static_cast<int>(state.range(1));
  options.use_io_uring = io_uring;
  options.keep_last = 1;
  auto persister = trainguard::Persister::Create(options);
  if (!persister.ok()) {
    state.SkipWithError(std::string(persister.status().message()).c_str());
    return;
  }
  const std::string& payload = Payload();
  const std::vector<uint64_t> sums = Checksums(payload, options.chunk_bytes);
  int64_t step = 0;
  for (auto _ : state) {
    auto record = (*persister)->Persist(++step, 0, 1, 0, payload, sums);
    if (!record.ok()) {
      state.SkipWithError(std::string(record.status().message()).c_str());
      return;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload.size()));
  state.SetLabel((*persister)->using_io_uring() ? "io_uring" : "pwritev");
}

void BM_PersistIoUring(benchmark::State& state) { PersistBenchmark(state, true); }
void BM_PersistPwritev(benchmark::State& state) { PersistBenchmark(state, false); }

// The baseline: the payload already in one aligned buffer, written chunk by chunk with pwrite on
// an O_DIRECT descriptor, then fdatasync; no checksums, no header, no manifest.
void BM_PlainODirectPwrite(benchmark::State& state) {
  BenchDir dir;
  const size_t chunk = static_cast<size_t>(state.range(0)) << 20;
  const std::string& payload = Payload();
  const size_t bytes = (payload.size() + 4095) / 4096 * 4096;
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, bytes) != 0) {
    state.SkipWithError("posix_memalign");
    return;
  }
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(raw), &std::free);
  std::memset(buffer.get(), 0, bytes);
  std::memcpy(buffer.get(), payload.data(), payload.size());
  int n = 0;
  for (auto _ : state) {
    const std::string path = absl::StrFormat("%s/plain-%d", dir.path(), ++n);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) {
      state.SkipWithError(absl::StrFormat("open %s: %s", path, std::strerror(errno)).c_str());
      return;
    }
    for (size_t at = 0; at < bytes; at += chunk) {
      const size_t length = std::min(chunk, bytes - at);
      if (::pwrite(fd, buffer.get() + at, length, static_cast<off_t>(at)) !=
          static_cast<ssize_t>(length)) {
        state.SkipWithError("pwrite failed or was short");
        ::close(fd);
        return;
      }
    }
    ::fdatasync(fd);
    ::close(fd);
    ::unlink(absl::StrFormat("%s/plain-%d", dir.path(), n - 1).c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload.size()));
}

// ReadShardPayload: O_DIRECT reads, every chunk checksummed, the header and trailer checked.
void BM_RestoreVerified(benchmark::State& state) {
  BenchDir dir;
  trainguard::PersisterOptions options;
  options.dir = dir.path();
  options.chunk_bytes = static_cast<size_t>(state.range(0)) << 20;
  auto persister = trainguard::Persister::Create(options);
  const std::string& payload = Payload();
  absl::StatusOr<trainguard::ShardRecord> record =
      persister.ok()
          ? (*persister)->Persist(1, 0, 1, 0, payload, Checksums(payload, options.chunk_bytes))
          : persister.status();
  if (!record.ok()) {
    state.SkipWithError(std::string(record.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<std::string> back =
        trainguard::ReadShardPayload(trainguard::Env::Default(), *record);
    if (!back.ok() || back->size() != payload.size()) {
      state.SkipWithError("restore failed");
      return;
    }
    benchmark::DoNotOptimize(back->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload.size()));
}

// The restore baseline: the same shard file read with O_DIRECT in 32 MiB reads into one aligned
// buffer; no checksums, no copy out.
void BM_PlainODirectRead(benchmark::State& state) {
  BenchDir dir;
  trainguard::PersisterOptions options;
  options.dir = dir.path();
  auto persister = trainguard::Persister::Create(options);
  const std::string& payload = Payload();
  absl::StatusOr<trainguard::ShardRecord> record =
      persister.ok()
          ? (*persister)->Persist(1, 0, 1, 0, payload, Checksums(payload, options.chunk_bytes))
          : persister.status();
  if (!record.ok()) {
    state.SkipWithError(std::string(record.status().message()).c_str());
    return;
  }
  constexpr size_t kRead = 32 << 20;
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, kRead) != 0) return;
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(raw), &std::free);
  for (auto _ : state) {
    const int fd = ::open(record->shard_path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      state.SkipWithError("open");
      return;
    }
    for (off_t at = 0; ::pread(fd, buffer.get(), kRead, at) > 0; at += kRead) {
    }
    ::close(fd);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * payload.size()));
}

BENCHMARK(BM_PersistIoUring)
    ->Args({1, 16})
    ->Args({4, 4})
    ->Args({4, 16})
    ->Args({8, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_PersistPwritev)->Args({4, 1})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PlainODirectPwrite)
    ->Arg(1)
    ->Arg(4)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_RestoreVerified)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PlainODirectRead)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
