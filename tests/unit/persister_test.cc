// Specification of the Persister: committed shards survive crashes, full disks and I/O errors;
// every corrupted byte is detected; retention keeps the newest steps.
#include "sdk/checkpoint/persister.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/direct_writer.h"
#include "sdk/checkpoint/payload_layout.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::SignalOwnProcess;
using testing::TempDir;

constexpr size_t kChunk = 64 << 10;

std::string MakePayload(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string payload(bytes, '\0');
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(payload.data() + i, &v, 8);
  }
  for (size_t i = bytes / 8 * 8; i < bytes; ++i) payload[i] = static_cast<char>(rng());
  return payload;
}

std::vector<uint64_t> Checksums(std::string_view payload, size_t chunk = kChunk) {
  std::vector<uint64_t> sums;
  for (size_t at = 0; at < payload.size(); at += chunk) {
    sums.push_back(XXH3_64bits(payload.data() + at, std::min(chunk, payload.size() - at)));
  }
  return sums;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

PersisterOptions Options(const std::string& dir, bool io_uring = true) {
  PersisterOptions o;
  o.dir = dir;
  o.chunk_bytes = kChunk;
  o.queue_depth = 4;
  o.use_io_uring = io_uring;
  return o;
}

std::unique_ptr<Persister> MustCreate(const PersisterOptions& options) {
  absl::StatusOr<std::unique_ptr<Persister>> p = Persister::Create(options);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

absl::StatusOr<ShardRecord> PersistStep(Persister& p, int64_t step, const std::string& payload,
                                        int rank = 0, int64_t generation = 1) {
  return p.Persist(step, rank, generation, /*layout_hash=*/0xC0FFEE, payload, Checksums(payload));
}

// The newest committed step of rank 0, or -1.
int64_t LatestStep(const std::string& dir) {
  absl::StatusOr<std::vector<ShardRecord>> shards = ListCommittedShards(Env::Default(), dir);
  return shards.ok() && !shards->empty() ? shards->back().step : -1;
}

// A payload of 3 full chunks and a ragged tail, so the last chunk is padded.
const size_t kPayloadBytes = 3 * kChunk + 1234;

TEST(Persister, PersistedShardReadsBackByteExactlyAndVerifiesClean) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->using_io_uring());  // this machine allows io_uring
  const std::string payload = MakePayload(kPayloadBytes, 7);
  absl::StatusOr<ShardRecord> record = PersistStep(*p, 42, payload, /*rank=*/3, /*gen=*/5);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->shard_path, dir.path() + "/step-000000000042/rank-00003.shard");

  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const ShardRecord& r = listed->front();
  EXPECT_EQ(r.step, 42);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.generation, 5);
  EXPECT_EQ(r.layout_hash, 0xC0FFEEu);
  EXPECT_EQ(r.payload_bytes, kPayloadBytes);
  EXPECT_EQ(r.chunk_checksums, Checksums(payload));
  EXPECT_EQ(r.shard_path, record->shard_path);

  absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), r);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == payload);
  uint64_t last_progress = 0;
  absl::StatusOr<std::vector<CorruptChunk>> corrupt =
      VerifyShard(Env::Default(), r, [&](uint64_t done, uint64_t total) {
        EXPECT_EQ(total, kPayloadBytes);
        last_progress = done;
      });
  ASSERT_TRUE(corrupt.ok()) << corrupt.status();
  EXPECT_TRUE(corrupt->empty());
  EXPECT_EQ(last_progress, kPayloadBytes);
  EXPECT_EQ(std::filesystem::file_size(r.shard_path) % 4096, 0u);
}

// `trainguard ckpt export` names a shard's bytes by the layout its manifest records.
TEST(Persister, TheManifestRecordsThePayloadLayoutGivenAndListingReturnsIt) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(p);
  float weights[6] = {};
  int64_t counter = 0;
  StateRegistry registry;
  const StateBuffer buffers[] = {
      {"model.w", "model", weights, sizeof(weights), DType::kF32, {2, 3}, Device::Host()},
      {"optimizer.step", "optimizer", &counter, sizeof(counter), DType::kI64, {}, Device::Host()}};
  for (const StateBuffer& b : buffers) ASSERT_TRUE(registry.Register(b).ok()) << b.name;
  const PayloadLayout layout = LayoutOf(registry);
  EXPECT_EQ(layout.offsets, (std::vector<uint64_t>{0, 4096}));
  EXPECT_EQ(layout.blob_offset, 8192u);
  EXPECT_EQ(LayoutHashOf(layout.buffers), registry.LayoutHash());
  const std::string blobs = SerializeBlobArea({{"rng", std::string("\0\1", 2)}, {"extra", "{}"}});
  const std::string payload = std::string(8192, 'x') + blobs;
  ASSERT_TRUE(
      p->Persist(3, 0, 1, registry.LayoutHash(), payload, Checksums(payload), &layout).ok());
  ASSERT_TRUE(PersistStep(*p, 4, payload).ok());  // without a layout

  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  ASSERT_TRUE((*listed)[0].layout.has_value());
  const PayloadLayout& back = *(*listed)[0].layout;
  EXPECT_EQ(back.offsets, layout.offsets);
  EXPECT_EQ(back.blob_offset, layout.blob_offset);
  ASSERT_EQ(back.buffers.size(), 2u);
  EXPECT_EQ(back.buffers[0].name, "model.w");
  EXPECT_EQ(back.buffers[0].group, "model");
  EXPECT_EQ(back.buffers[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back.buffers[1].dtype, DType::kI64);
  EXPECT_EQ(back.buffers[1].bytes, 8u);
  EXPECT_EQ(LayoutHashOf(back.buffers), registry.LayoutHash());
  EXPECT_FALSE((*listed)[1].layout.has_value());
  auto parsed = ParseBlobArea(std::string_view(payload).substr(back.blob_offset));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::vector<std::pair<std::string, std::string>>{
                         {"rng", std::string("\0\1", 2)}, {"extra", "{}"}}));
  EXPECT_EQ(ParseBlobArea(std::string_view(blobs).substr(0, blobs.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

// Readers fetch 32 MiB per read; a payload over several such reads, in small chunks.
TEST(Persister, AManyChunkPayloadReadsBackAndACorruptChunkIsNamedByItsOffset) {
  TempDir dir;
  PersisterOptions o = Options(dir.path());
  o.chunk_bytes = 4096;
  auto p = MustCreate(o);
  ASSERT_TRUE(p);
  const std::string payload = MakePayload((40 << 20) + 5, 21);
  absl::StatusOr<ShardRecord> record = p->Persist(1, 0, 1, 0, payload, Checksums(payload, 4096));
  ASSERT_TRUE(record.ok()) << record.status();
  absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), *record);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == payload);
  const uint64_t corrupt_offset = (36 << 20) + 4096 * 3;  // in the second read
  const int fd = ::open(record->shard_path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "!", 1, static_cast<off_t>(4096 + corrupt_offset + 100)), 1);
  ::close(fd);
  absl::StatusOr<std::vector<CorruptChunk>> corrupt = VerifyShard(Env::Default(), *record);
  ASSERT_TRUE(corrupt.ok());
  ASSERT_EQ(corrupt->size(), 1u);
  EXPECT_EQ(corrupt->front().offset, corrupt_offset);
  EXPECT_THAT(ReadShardPayload(Env::Default(), *record).status().message(),
              HasSubstr(absl::StrFormat("at payload offset %d", corrupt_offset)));
}

TEST(Persister, EmptyPayloadRoundTrips) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(p);
  absl::StatusOr<ShardRecord> record = PersistStep(*p, 1, "");
  ASSERT_TRUE(record.ok()) << record.status();
  absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), *record);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->empty());
}

TEST(Persister, IoUringAndPwritevPathsWriteIdenticalFiles) {
  TempDir uring_dir, pwritev_dir;
  auto uring = MustCreate(Options(uring_dir.path(), true));
  auto pwritev = MustCreate(Options(pwritev_dir.path(), false));
  ASSERT_TRUE(uring && pwritev);
  EXPECT_TRUE(uring->using_io_uring());
  EXPECT_FALSE(pwritev->using_io_uring());
  const std::string payload = MakePayload(kPayloadBytes, 11);
  absl::StatusOr<ShardRecord> a = PersistStep(*uring, 9, payload);
  absl::StatusOr<ShardRecord> b = PersistStep(*pwritev, 9, payload);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_TRUE(ReadFile(a->shard_path) == ReadFile(b->shard_path));
  EXPECT_EQ(ReadFile(uring_dir.File("step-000000000009/rank-00000.manifest")),
            ReadFile(pwritev_dir.File("step-000000000009/rank-00000.manifest")));
}

TEST(Persister, PayloadThatDoesNotMatchItsChecksumsIsRefusedBeforeWriting) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(p);
  const std::string payload = MakePayload(kPayloadBytes, 1);
  std::vector<uint64_t> sums = Checksums(payload);
  sums[2] ^= 1;
  absl::StatusOr<ShardRecord> r = p->Persist(1, 0, 1, 0, payload, sums);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("chunk 2"));
  sums.pop_back();
  EXPECT_EQ(p->Persist(1, 0, 1, 0, payload, sums).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LatestStep(dir.path()), -1);
}

TEST(Persister, InvalidOptionsAreRejected) {
  TempDir dir;
  PersisterOptions o = Options(dir.path());
  o.chunk_bytes = 1000;
  EXPECT_EQ(Persister::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(dir.path());
  o.keep_last = 0;
  EXPECT_EQ(Persister::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A ring set up with SINGLE_ISSUER belongs to its creating thread; the Persister must still work
// when it is created on one thread and used on another (one at a time), e.g. a persist thread.
TEST(Persister, ACreatedPersisterCanBeUsedFromAnotherThread) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(p);
  const std::string payload = MakePayload(kPayloadBytes, 8);
  for (int64_t step = 1; step <= 2; ++step) {
    absl::Status status;
    std::thread([&] { status = PersistStep(*p, step, payload).status(); }).join();
    ASSERT_TRUE(status.ok()) << status;
  }
  ASSERT_TRUE(PersistStep(*p, 3, payload).ok());
  EXPECT_TRUE(p->using_io_uring());
  EXPECT_EQ(LatestStep(dir.path()), 3);
}

// --- The data-path seam: short writes and I/O errors from pwritev.

TEST(Persister, ShortWritesAreResubmittedAndProduceTheSameFile) {
  TempDir dir, reference_dir;
  const std::string payload = MakePayload(kPayloadBytes, 3);
  std::atomic<int> short_writes{0};
  {
    checkpoint::ScopedDirectWriterFactoryForTesting seam(
        [&](const checkpoint::DirectWriterOptions& o) {
          return checkpoint::NewPwritevWriter(
              o, [&](int fd, const struct iovec* iov, int, off_t offset) -> ssize_t {
                // Writes at most one 4 KiB block per call, as a device under pressure may.
                struct iovec first = {iov->iov_base, std::min<size_t>(iov->iov_len, 4096)};
                if (first.iov_len < iov->iov_len) ++short_writes;
                return ::pwritev(fd, &first, 1, offset);
              });
        });
    auto p = MustCreate(Options(dir.path()));
    ASSERT_TRUE(p);
    ASSERT_TRUE(PersistStep(*p, 1, payload).ok());
  }
  EXPECT_GT(short_writes.load(), 10);
  auto reference = MustCreate(Options(reference_dir.path()));
  ASSERT_TRUE(PersistStep(*reference, 1, payload).ok());
  EXPECT_TRUE(ReadFile(dir.File("step-000000000001/rank-00000.shard")) ==
              ReadFile(reference_dir.File("step-000000000001/rank-00000.shard")));
}

TEST(Persister, EioFromTheDataPathFailsThePersistAndThePreviousStepStaysLatest) {
  TempDir dir;
  const std::string previous = MakePayload(kPayloadBytes, 1);
  {
    auto p = MustCreate(Options(dir.path()));
    ASSERT_TRUE(PersistStep(*p, 1, previous).ok());
  }
  std::atomic<int> calls{0};
  checkpoint::ScopedDirectWriterFactoryForTesting seam(
      [&](const checkpoint::DirectWriterOptions& o) {
        return checkpoint::NewPwritevWriter(
            o, [&](int fd, const struct iovec* iov, int n, off_t offset) -> ssize_t {
              if (++calls == 3) {  // the second payload chunk
                errno = EIO;
                return -1;
              }
              return ::pwritev(fd, iov, n, offset);
            });
      });
  auto p = MustCreate(Options(dir.path()));
  absl::StatusOr<ShardRecord> failed = PersistStep(*p, 2, MakePayload(kPayloadBytes, 2));
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("step-000000000002/rank-00000.shard"));
  EXPECT_THAT(failed.status().message(), HasSubstr("offset 69632"));  // 4096 + 64 KiB
  EXPECT_THAT(failed.status().message(), HasSubstr("Input/output error"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("step-000000000002/rank-00000.shard")));
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->back().step, 1);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->back()) == previous);
}

// --- The Env seam: failures while committing the manifest.

class FailingEnv : public EnvWrapper {
 public:
  enum class Fault { kNone, kManifestSync, kManifestRename, kStepDirSync };
  explicit FailingEnv(Fault fault) : EnvWrapper(Env::Default()), fault_(fault) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = target()->NewWritableFile(path);
    if (!file.ok() || fault_ != Fault::kManifestSync || !path.ends_with(".manifest.tmp")) {
      return file;
    }
    return std::unique_ptr<WritableFile>(new FailingSyncFile(*std::move(file)));
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (fault_ == Fault::kManifestRename && to.ends_with(".manifest")) {
      return absl::InternalError("rename " + from + ": Input/output error (injected)");
    }
    return target()->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (fault_ == Fault::kStepDirSync && dir.find("step-") != std::string::npos) {
      return absl::InternalError("fsync " + dir + ": Input/output error (injected)");
    }
    return target()->SyncDir(dir);
  }

 private:
  class FailingSyncFile : public WritableFile {
   public:
    explicit FailingSyncFile(std::unique_ptr<WritableFile> f) : f_(std::move(f)) {}
    absl::Status Append(absl::string_view data) override { return f_->Append(data); }
    absl::Status Sync() override {
      return absl::InternalError("fdatasync " + f_->path() + ": Input/output error (injected)");
    }
    absl::Status Close() override { return f_->Close(); }
    const std::string& path() const override { return f_->path(); }

   private:
    std::unique_ptr<WritableFile> f_;
  };
  const Fault fault_;
};

class ManifestFault : public ::testing::TestWithParam<FailingEnv::Fault> {};

TEST_P(ManifestFault, FailsThePersistAndLeavesThePreviousStepLatest) {
  TempDir dir;
  const std::string previous = MakePayload(kPayloadBytes, 1);
  {
    auto p = MustCreate(Options(dir.path()));
    ASSERT_TRUE(PersistStep(*p, 1, previous).ok());
  }
  FailingEnv env(GetParam());
  PersisterOptions o = Options(dir.path());
  o.env = &env;
  auto p = MustCreate(o);
  absl::StatusOr<ShardRecord> failed = PersistStep(*p, 2, MakePayload(kPayloadBytes, 2));
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("step-000000000002"));
  EXPECT_THAT(failed.status().message(), HasSubstr("injected"));
  EXPECT_EQ(LatestStep(dir.path()), 1);
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->back()) == previous);
  for (const char* leftover : {"rank-00000.shard", "rank-00000.manifest.tmp"}) {
    EXPECT_FALSE(std::filesystem::exists(dir.File("step-000000000002/") + leftover)) << leftover;
  }
}

INSTANTIATE_TEST_SUITE_P(Persister, ManifestFault,
                         ::testing::Values(FailingEnv::Fault::kManifestSync,
                                           FailingEnv::Fault::kManifestRename,
                                           FailingEnv::Fault::kStepDirSync));

// --- Crashes: a writer killed with SIGKILL at random points.

TEST(Persister, SigkillDuringPersistenceNeverExposesAPartialStep) {
  TempDir dir;
  constexpr int kTrials = 24;
  constexpr size_t kBytes = 16 * kChunk + 4000;
  std::mt19937 rng(20261122);
  int64_t next_step = 1;
  int64_t kills_after_progress = 0;
  int64_t kills_mid_persist = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int64_t first = next_step;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      PersisterOptions o = Options(dir.path(), trial % 2 == 0);
      o.keep_last = 2;
      absl::StatusOr<std::unique_ptr<Persister>> p = Persister::Create(o);
      if (!p.ok()) _exit(3);
      for (int64_t step = first;; ++step) {
        const std::string payload = MakePayload(kBytes, static_cast<uint64_t>(step));
        if (!(*p)->Persist(step, 0, 1, 0, payload, Checksums(payload)).ok()) _exit(4);
      }
    }
    // Every third writer is killed only once it committed a step of its own (bounded polling),
    // so that some kills land after progress however loaded the machine is; every writer then
    // dies at a random instant.
    if (trial % 3 == 0) {
      for (absl::Time end = absl::Now() + absl::Seconds(60); absl::Now() < end;) {
        absl::StatusOr<std::vector<ShardRecord>> committed =
            ListCommittedShards(Env::Default(), dir.path());
        if (committed.ok() && !committed->empty() && committed->back().step >= first) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 40'000)(rng)));
    ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited on its own with " << status;

    absl::StatusOr<std::vector<ShardRecord>> listed =
        ListCommittedShards(Env::Default(), dir.path());
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const ShardRecord& r : *listed) {  // every committed step, the newest included
      absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), r);
      ASSERT_TRUE(back.ok()) << "trial " << trial << ": " << back.status();
      ASSERT_TRUE(*back == MakePayload(kBytes, static_cast<uint64_t>(r.step)))
          << "trial " << trial << " step " << r.step;
    }
    if (!listed->empty() && listed->back().step >= first) ++kills_after_progress;
    // A shard file of a step newer than the newest commit: the kill landed mid-persist.
    const int64_t newest = listed->empty() ? -1 : listed->back().step;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      int64_t step = -1;
      if (std::sscanf(entry.path().filename().c_str(), "step-%ld", &step) == 1 &&
          step >= first && step > newest &&
          std::filesystem::exists(entry.path() / "rank-00000.shard")) {
        ++kills_mid_persist;  // this trial's writer's (an earlier one's leftovers are older)
        break;
      }
    }
    next_step = (listed->empty() ? first : std::max(first, listed->back().step + 1)) + 1000;
  }
  // The random delays must also have let some writers commit before dying.
  EXPECT_GT(kills_after_progress, 0);
  RecordProperty("kills_mid_persist", static_cast<int>(kills_mid_persist));
  std::printf("%d of %d kills landed mid-persist (a half-written shard was left)\n",
              static_cast<int>(kills_mid_persist), kTrials);
}

// --- Corruption: every flipped byte of a shard or a manifest is detected.

TEST(Persister, EveryFlippedByteOfAShardIsDetectedAndNeverReturned) {
  TempDir dir;
  PersisterOptions o = Options(dir.path());
  o.chunk_bytes = 8192;
  auto p = MustCreate(o);
  const std::string payload = MakePayload(3 * 8192 + 100, 5);
  absl::StatusOr<ShardRecord> record = p->Persist(1, 0, 1, 77, payload, Checksums(payload, 8192));
  ASSERT_TRUE(record.ok()) << record.status();
  const std::string original = ReadFile(record->shard_path);
  std::mt19937_64 rng(99);
  const int fd = ::open(record->shard_path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  constexpr int kTrials = 1000;
  for (int trial = 0; trial < kTrials; ++trial) {
    const size_t at = std::uniform_int_distribution<size_t>(0, original.size() - 1)(rng);
    const char flipped =
        static_cast<char>(original[at] ^ std::uniform_int_distribution<int>(1, 255)(rng));
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(at)), 1);
    absl::StatusOr<std::vector<CorruptChunk>> corrupt = VerifyShard(Env::Default(), *record);
    ASSERT_TRUE(corrupt.ok()) << corrupt.status();
    ASSERT_FALSE(corrupt->empty()) << "flip at file offset " << at << " went unnoticed";
    absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), *record);
    ASSERT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << "flip at " << at;
    ASSERT_THAT(back.status().message(), HasSubstr(record->shard_path));
    ASSERT_THAT(back.status().message(), HasSubstr("rank 0, step 1"));
    ASSERT_EQ(::pwrite(fd, &original[at], 1, static_cast<off_t>(at)), 1);
  }
  ::close(fd);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), *record) == payload);
}

TEST(Persister, AManifestWithAnyFlippedByteIsNotListed) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(PersistStep(*p, 1, MakePayload(kPayloadBytes, 1)).ok());
  ASSERT_TRUE(PersistStep(*p, 2, MakePayload(kPayloadBytes, 2)).ok());
  const std::string path = dir.File("step-000000000002/rank-00000.manifest");
  const std::string original = ReadFile(path);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = original;
    const size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng);
    bytes[at] = static_cast<char>(bytes[at] ^ std::uniform_int_distribution<int>(1, 255)(rng));
    WriteFile(path, bytes);
    ASSERT_EQ(LatestStep(dir.path()), 1) << "flip at manifest offset " << at;
  }
  for (size_t keep : {size_t{0}, size_t{10}, original.size() - 1}) {  // torn manifests
    WriteFile(path, original.substr(0, keep));
    ASSERT_EQ(LatestStep(dir.path()), 1) << "manifest torn at " << keep;
  }
  WriteFile(path, original);
  EXPECT_EQ(LatestStep(dir.path()), 2);
}

TEST(Persister, ATruncatedShardIsReportedAndNotReturned) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  absl::StatusOr<ShardRecord> record = PersistStep(*p, 1, MakePayload(kPayloadBytes, 1));
  ASSERT_TRUE(record.ok());
  const uint64_t full = std::filesystem::file_size(record->shard_path);
  for (uint64_t size : {full - 4096, 4096 + kChunk + 10, uint64_t{100}, uint64_t{0}}) {
    std::filesystem::resize_file(record->shard_path, size);
    absl::StatusOr<std::vector<CorruptChunk>> corrupt = VerifyShard(Env::Default(), *record);
    ASSERT_TRUE(corrupt.ok()) << corrupt.status();
    ASSERT_FALSE(corrupt->empty());
    EXPECT_THAT(corrupt->front().what, HasSubstr("truncated")) << size;
    EXPECT_EQ(ReadShardPayload(Env::Default(), *record).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(Persister, AMissingShardIsStillListedButCannotBeReadOrVerified) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  absl::StatusOr<ShardRecord> record = PersistStep(*p, 1, MakePayload(kPayloadBytes, 1));
  ASSERT_TRUE(record.ok());
  std::filesystem::remove(record->shard_path);
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_EQ(listed->size(), 1u);  // the manifest is the commit; the reader finds the gap
  EXPECT_EQ(VerifyShard(Env::Default(), *record).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::string> back = ReadShardPayload(Env::Default(), *record);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(back.status().message(), HasSubstr(record->shard_path));
}

// The Persister does not fence generations: a shard committed by an older incarnation is listed
// with its generation, and the caller (the recovery flow) decides whether it may be used.
TEST(Persister, AShardOfAnOlderGenerationIsListedWithItsGeneration) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(PersistStep(*p, 5, MakePayload(1000, 5), 0, /*generation=*/1).ok());
  ASSERT_TRUE(PersistStep(*p, 6, MakePayload(1000, 6), 0, /*generation=*/2).ok());
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].generation, 1);
  EXPECT_EQ((*listed)[1].generation, 2);
  // A header whose generation disagrees with its manifest is corruption, though.
  EXPECT_TRUE(ReadShardPayload(Env::Default(), (*listed)[0]).ok());
  ShardRecord forged = (*listed)[0];
  forged.generation = 2;
  EXPECT_EQ(ReadShardPayload(Env::Default(), forged).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Persister, RetentionKeepsTheLastKCommittedStepsAndRemovesOlderLeftovers) {
  TempDir dir;
  PersisterOptions o = Options(dir.path());
  o.keep_last = 2;
  auto p = MustCreate(o);
  std::filesystem::create_directories(dir.File("step-000000000000"));
  WriteFile(dir.File("step-000000000000/rank-00000.shard"), "uncommitted leftover");
  std::filesystem::create_directories(dir.File("step-000000000099"));
  WriteFile(dir.File("step-000000000099/rank-00000.shard"), "newer than any commit");
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(PersistStep(*p, step, MakePayload(1000, step)).ok());
    ASSERT_TRUE(PersistStep(*p, step, MakePayload(1000, step), /*rank=*/1).ok());
  }
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  std::vector<std::pair<int64_t, int>> kept;
  for (const ShardRecord& r : *listed) kept.emplace_back(r.step, r.rank);
  EXPECT_EQ(kept, (std::vector<std::pair<int64_t, int>>{{4, 0}, {4, 1}, {5, 0}, {5, 1}}));
  for (const char* gone : {"step-000000000000", "step-000000000001", "step-000000000003"}) {
    EXPECT_FALSE(std::filesystem::exists(dir.File(gone))) << gone;
  }
  EXPECT_TRUE(std::filesystem::exists(dir.File("step-000000000099/rank-00000.shard")));
}

TEST(Persister, PersistingACommittedStepAgainReplacesIt) {
  TempDir dir;
  auto p = MustCreate(Options(dir.path()));
  ASSERT_TRUE(PersistStep(*p, 3, MakePayload(kPayloadBytes, 1)).ok());
  const std::string second = MakePayload(1000, 2);
  ASSERT_TRUE(PersistStep(*p, 3, second).ok());
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->front()) == second);
}

// --- A full disk: a small tmpfs mounted by the test.

class SmallTmpfs : public ::testing::Test {
 protected:
  void SetUp() override {
    mount_point_ = dir_.File("tmpfs");
    std::filesystem::create_directories(mount_point_);
    // The same fault as AFullDiskFromTheEnv... above, from a real file system. Needs root or
    // CAP_SYS_ADMIN (CI runs as root); the Env test covers every other machine.
    if (::mount("tmpfs", mount_point_.c_str(), "tmpfs", 0, "size=2m") != 0) {
      GTEST_SKIP() << "cannot mount a 2 MiB tmpfs (" << std::strerror(errno)
                   << "): needs root or CAP_SYS_ADMIN";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mount_point_.c_str(), MNT_DETACH);
  }
  TempDir dir_;
  std::string mount_point_;
  bool mounted_ = false;
};

TEST_F(SmallTmpfs, AFullDiskFailsWithResourceExhaustedAndKeepsThePreviousStep) {
  auto p = MustCreate(Options(mount_point_));
  ASSERT_TRUE(p);
  const std::string previous = MakePayload(512 << 10, 1);
  ASSERT_TRUE(PersistStep(*p, 1, previous).ok());
  absl::StatusOr<ShardRecord> failed = PersistStep(*p, 2, MakePayload(3 << 20, 2));
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("step-000000000002/rank-00000.shard"));
  EXPECT_EQ(LatestStep(mount_point_), 1);
  absl::StatusOr<std::vector<ShardRecord>> listed =
      ListCommittedShards(Env::Default(), mount_point_);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->back()) == previous);
  // The space is given back: the next, smaller step commits.
  EXPECT_TRUE(PersistStep(*p, 3, MakePayload(512 << 10, 3)).ok());
}

// --- A full disk through the Env seam: no root, no mount. The Env gives the checkpoint directory a
// capacity; a shard whose preallocation would pass it fails as the POSIX Env reports ENOSPC.

class FullDiskEnv : public EnvWrapper {
 public:
  explicit FullDiskEnv(uint64_t capacity) : EnvWrapper(Env::Default()), capacity_(capacity) {}

  absl::StatusOr<OpenedFile> OpenForPreallocatedWrite(const std::string& path,
                                                      uint64_t bytes) override {
    if (used_ + bytes > capacity_) {
      ++refusals_;
      return ErrnoToStatus(ENOSPC, "fallocate " + path + " (" + std::to_string(bytes) + " bytes)");
    }
    used_ += bytes;
    return target()->OpenForPreallocatedWrite(path, bytes);
  }
  absl::Status RemoveFile(const std::string& path) override {
    absl::StatusOr<uint64_t> size = target()->GetFileSize(path);
    absl::Status s = target()->RemoveFile(path);
    if (s.ok() && size.ok()) used_ -= std::min(used_, *size);
    return s;
  }
  int refusals() const { return refusals_; }

 private:
  const uint64_t capacity_;
  uint64_t used_ = 0;
  int refusals_ = 0;
};

TEST(Persister, AFullDiskFromTheEnvFailsWithResourceExhaustedAndKeepsThePreviousStep) {
  TempDir dir;
  FullDiskEnv env(/*capacity=*/2 << 20);
  PersisterOptions options = Options(dir.path());
  options.env = &env;
  auto p = MustCreate(options);
  ASSERT_TRUE(p);
  const std::string previous = MakePayload(512 << 10, 1);
  ASSERT_TRUE(PersistStep(*p, 1, previous).ok());
  absl::StatusOr<ShardRecord> failed = PersistStep(*p, 2, MakePayload(3 << 20, 2));
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("step-000000000002/rank-00000.shard"));
  EXPECT_EQ(env.refusals(), 1);
  EXPECT_EQ(LatestStep(dir.path()), 1);
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->back()) == previous);
  // Nothing of the failed step is left behind to be mistaken for a shard.
  EXPECT_FALSE(std::filesystem::exists(dir.File("step-000000000002/rank-00000.shard")));
}

// --- A kernel or container profile that refuses io_uring (seccomp, as Docker's default does).

TEST(Persister, WhereIoUringIsRefusedThePwritevPathIsTakenWithAWarning) {
  TempDir dir;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      _exit(2);
    }
    absl::StatusOr<std::unique_ptr<Persister>> p = Persister::Create(Options(dir.path()));
    if (!p.ok()) _exit(3);
    if ((*p)->using_io_uring()) _exit(4);
    const std::string payload = MakePayload(kPayloadBytes, 1);
    if (!PersistStep(**p, 1, payload).ok()) _exit(5);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  absl::StatusOr<std::vector<ShardRecord>> listed = ListCommittedShards(Env::Default(), dir.path());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE(*ReadShardPayload(Env::Default(), listed->front()) == MakePayload(kPayloadBytes, 1));
}

}  // namespace
}  // namespace trainguard
