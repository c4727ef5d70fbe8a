// Specification of `trainguard ckpt list|inspect|verify|export`: run as a real process on a
// directory the Persister wrote, with real corruption in it.
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/payload_layout.h"
#include "sdk/checkpoint/persister.h"
#include "sdk/checkpoint/snapshotter.h"
#include "tests/support/temp_dir.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string out;
};

// Runs the CLI with stdout captured (stderr, with the progress display, is dropped; with
// `with_stderr`, it is captured too).
Result RunCli(const std::string& args, bool with_stderr = false) {
  Result r;
  const char* redirect = with_stderr ? " 2>&1" : " 2>/dev/null";
  FILE* pipe = popen((std::string(TRAINGUARD_CLI_PATH) + " " + args + redirect).c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The file names in `dir` (no temporary file may remain after a failed export).
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

class CkptCli : public ::testing::Test {
 protected:
  void SetUp() override {
    PersisterOptions o;
    o.dir = dir_.path();
    o.chunk_bytes = 8192;
    auto p = Persister::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    for (int64_t step : {10, 20}) {
      for (int rank : {0, 1}) {
        const std::string payload(3 * 8192 + 5, static_cast<char>('a' + rank + step));
        std::vector<uint64_t> sums;
        for (size_t at = 0; at < payload.size(); at += 8192) {
          sums.push_back(
              XXH3_64bits(payload.data() + at, std::min<size_t>(8192, payload.size() - at)));
        }
        ASSERT_TRUE((*p)->Persist(step, rank, /*generation=*/4, 0xABCD, payload, sums).ok());
      }
    }
  }
  TempDir dir_;
};

TEST_F(CkptCli, ListShowsEveryCommittedStepWithItsRanksAndSize) {
  Result r = RunCli("ckpt list " + dir_.path());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("step 10: 2 shards, ranks 0,1"));
  EXPECT_THAT(r.out, HasSubstr("step 20: 2 shards, ranks 0,1"));
  r = RunCli("ckpt list --json " + dir_.path());
  // proto3 JSON (docs/FORMATS.md): 64-bit integers are strings; every field is printed.
  EXPECT_THAT(r.out, HasSubstr(R"({"step":"20","ranks":[0,1],"payload_bytes":"49162",)"
                               R"("complete":true,"missing_ranks":[]})"));
}

TEST_F(CkptCli, InspectShowsTheNewestStepsShards) {
  Result r = RunCli("ckpt inspect " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr(R"("step":"20")"));
  EXPECT_THAT(r.out, HasSubstr(R"("rank":1,"generation":"4","layout_hash":"000000000000abcd")"));
  EXPECT_THAT(r.out, HasSubstr(R"("chunk_count":4)"));
  r = RunCli("ckpt inspect " + dir_.path() + " --step 10");
  EXPECT_THAT(r.out, HasSubstr("step 10"));
}

TEST_F(CkptCli, VerifyPassesAnIntactDirectoryAndNamesEachCorruptChunk) {
  EXPECT_EQ(RunCli("ckpt verify " + dir_.path()).exit_code, 0);
  const std::string shard = dir_.File("step-000000000020/rank-00001.shard");
  const int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "X", 1, 4096 + 8192 + 17), 1);  // inside the second chunk
  ::close(fd);
  std::filesystem::remove(dir_.File("step-000000000010/rank-00000.shard"));

  Result r = RunCli("ckpt verify " + dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("CORRUPT " + shard +
                               " payload offset 8192 (file offset 12288) "
                               "rank 1 step 20: checksum mismatch"));
  EXPECT_THAT(r.out,
              HasSubstr("step-000000000010/rank-00000.shard payload offset 0 (file offset 4096) "
                        "rank 0 step 10"));
  EXPECT_THAT(r.out, HasSubstr("FAILED: 4 shards"));
  r = RunCli("ckpt verify --json --step 20 " + dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr(R"("ok":false)"));
  EXPECT_THAT(r.out,
              HasSubstr(R"("payload_offset":"8192","file_offset":"12288","rank":1,"step":"20")"));
}

// A rank's write failed (a full disk) or its save was skipped: the step has the other ranks'
// committed shards only, and must never pass for a checkpoint that can be restored.
TEST_F(CkptCli, AStepMissingARanksShardIsMarkedIncompleteAndFailsVerify) {
  PersisterOptions o;
  o.dir = dir_.path();
  o.chunk_bytes = 8192;
  o.world_size = 2;  // recorded in the manifest
  auto p = Persister::Create(o);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string payload(8192, 'z');
  ASSERT_TRUE((*p)->Persist(30, 0, 4, 0xABCD, payload, {XXH3_64bits(payload.data(), 8192)}).ok());

  Result r = RunCli("ckpt list " + dir_.path());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out,
              HasSubstr("step 30: 1 shard, ranks 0, 8.00 KiB, INCOMPLETE: no shard of rank 1"));
  EXPECT_THAT(r.out, HasSubstr("step 20: 2 shards, ranks 0,1, 48.01 KiB\n"));
  r = RunCli("ckpt list --json " + dir_.path());
  EXPECT_THAT(r.out, HasSubstr(R"({"step":"30","ranks":[0],"payload_bytes":"8192",)"
                               R"("complete":false,"missing_ranks":[1]})"));

  r = RunCli("ckpt verify " + dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("MISSING " + dir_.File("step-000000000030/rank-00001.shard") +
                               " rank 1 step 30: no committed shard (the step is incomplete)"));
  EXPECT_THAT(r.out, HasSubstr("FAILED: 5 shards, 104.02 KiB checked, 0 corrupt, 1 missing"));
  EXPECT_EQ(RunCli("ckpt verify --step 20 " + dir_.path()).exit_code, 0);

  // Without --step, inspect shows the newest step a restore could use.
  r = RunCli("ckpt inspect " + dir_.path());
  EXPECT_THAT(r.out, HasSubstr("step 20\n"));
  r = RunCli("ckpt inspect --step 30 " + dir_.path());
  EXPECT_THAT(r.out, HasSubstr("step 30 (INCOMPLETE: no shard of rank 1)"));
}

// Manifests written before the world size was recorded: the highest rank in the directory decides.
TEST_F(CkptCli, WithoutARecordedWorldSizeTheRanksOfTheDirectoryDecideCompleteness) {
  std::filesystem::remove(dir_.File("step-000000000020/rank-00001.manifest"));
  Result r = RunCli("ckpt list " + dir_.path());
  EXPECT_THAT(r.out,
              HasSubstr("step 20: 1 shard, ranks 0, 24.00 KiB, INCOMPLETE: no shard of rank 1"));
  EXPECT_THAT(r.out, HasSubstr("step 10: 2 shards, ranks 0,1, 48.01 KiB\n"));
  r = RunCli("ckpt verify " + dir_.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("rank-00001.shard rank 1 step 20: no committed shard"));
}

// `trainguard ckpt export` on shards a real Snapshotter laid out and the Persister wrote with their
// layout: two ranks of step 7 holding different values of the same registry.
class CkptExport : public ::testing::Test {
 protected:
  void SetUp() override {
    const StateBuffer buffers[] = {
        {"model.w", "model", weights_, sizeof(weights_), DType::kF32, {2, 3}, Device::Host()},
        {"model.half", "model", half_, sizeof(half_), DType::kF16, {3}, Device::Host()},
        {"optimizer.state.0.step",
         "optimizer",
         &counter_,
         sizeof(counter_),
         DType::kI64,
         {},
         Device::Host()}};
    for (const StateBuffer& b : buffers) ASSERT_TRUE(registry_.Register(b).ok()) << b.name;
    ASSERT_TRUE(registry_.SetBlob("optimizer.param_groups", std::string("pick\0led", 8)).ok());
    ASSERT_TRUE(registry_.SetBlob("extra", "{}").ok());
    SnapshotterOptions so;
    so.job_id = absl::StrFormat("ckpt-export-%d", ::getpid());
    so.chunk_bytes = 8192;
    auto snapshotter = Snapshotter::Create(&registry_, so);
    ASSERT_TRUE(snapshotter.ok()) << snapshotter.status();
    PersisterOptions po;
    po.dir = dir_.path();
    po.chunk_bytes = 8192;
    po.world_size = 2;
    auto persister = Persister::Create(po);
    ASSERT_TRUE(persister.ok()) << persister.status();
    const PayloadLayout layout = LayoutOf(registry_);
    for (int rank : {0, 1}) {
      for (int i = 0; i < 6; ++i) weights_[i] = 0.5f * i + rank;
      for (int i = 0; i < 3; ++i) half_[i] = static_cast<uint16_t>(0x3C00 + i + 16 * rank);
      counter_ = 41 + rank;
      ASSERT_TRUE((*snapshotter)->Begin(7).ok());
      ASSERT_TRUE((*snapshotter)->Fence(absl::Seconds(30)).ok());
      auto view = (*snapshotter)->LatestView();
      ASSERT_TRUE(view.ok()) << view.status();
      auto record = (*persister)
                        ->Persist(7, rank, /*generation=*/2, view->info.layout_hash, view->payload,
                                  view->chunk_checksums, &layout);
      ASSERT_TRUE(record.ok()) << record.status();
    }
    snapshotter->reset();
    (void)Snapshotter::RemoveArena(so.job_id, 0);
  }

  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Bytes of the file's data section in [begin, end), as the header's data_offsets give them.
  static std::string Data(const std::string& file, size_t begin, size_t end) {
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, file.data(), 8);
    return file.substr(8 + header_bytes + begin, end - begin);
  }
  template <typename T>
  static std::string Bytes(const T& value) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
  }

  StateRegistry registry_;
  float weights_[6] = {};
  uint16_t half_[3] = {};
  int64_t counter_ = 0;
  TempDir dir_;
  TempDir out_dir_;
};

TEST_F(CkptExport, WritesEveryBufferAndBlobOfRankZeroBytesExactAsSafetensors) {
  const std::string out = out_dir_.File("model.safetensors");
  Result r = RunCli("ckpt export " + dir_.path() + " --out " + out, /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("exported step 7 rank 0 of 2 (3 tensors, 2 blobs"));
  const std::string file = ReadAll(out);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  const std::string header = file.substr(8, header_bytes);
  // Wider elements first, then registry order; blobs last as U8 under "__blob__/".
  EXPECT_THAT(header, HasSubstr(R"("optimizer.state.0.step":{"dtype":"I64","shape":[],)"
                                R"("data_offsets":[0,8]})"));
  EXPECT_THAT(header,
              HasSubstr(R"("model.w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]})"));
  EXPECT_THAT(header,
              HasSubstr(R"("model.half":{"dtype":"F16","shape":[3],"data_offsets":[32,38]})"));
  EXPECT_THAT(header, HasSubstr(R"("__blob__/optimizer.param_groups":{"dtype":"U8","shape":[8],)"
                                R"("data_offsets":[38,46]})"));
  EXPECT_THAT(header, HasSubstr(R"("__blob__/extra":{"dtype":"U8","shape":[2],)"
                                R"("data_offsets":[46,48]})"));
  EXPECT_THAT(header, HasSubstr(R"("trainguard_step":"7","trainguard_rank":"0",)"
                                R"("trainguard_world_size":"2")"));
  EXPECT_EQ(file.size(), 8 + header_bytes + 48);
  const float weights[6] = {0, 0.5f, 1, 1.5f, 2, 2.5f};
  const uint16_t half[3] = {0x3C00, 0x3C01, 0x3C02};
  EXPECT_EQ(Data(file, 0, 8), Bytes(int64_t{41}));
  EXPECT_EQ(Data(file, 8, 32), Bytes(weights));
  EXPECT_EQ(Data(file, 32, 38), Bytes(half));
  EXPECT_EQ(Data(file, 38, 46), std::string("pick\0led", 8));
  EXPECT_EQ(Data(file, 46, 48), "{}");
  EXPECT_THAT(Names(out_dir_.path()), ::testing::ElementsAre("model.safetensors"));
}

TEST_F(CkptExport, RankChoosesWhoseShardIsWritten) {
  const std::string out = out_dir_.File("rank1.safetensors");
  ASSERT_EQ(RunCli("ckpt export " + dir_.path() + " --rank 1 --step 7 --out " + out).exit_code, 0);
  const std::string file = ReadAll(out);
  EXPECT_EQ(Data(file, 0, 8), Bytes(int64_t{42}));
  const float weights[6] = {1, 1.5f, 2, 2.5f, 3, 3.5f};
  EXPECT_EQ(Data(file, 8, 32), Bytes(weights));

  Result r = RunCli("ckpt export " + dir_.path() + " --rank 2 --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("step 7 in " + dir_.path() + " has no rank 2 (world size 2)"));
}

TEST_F(CkptExport, AFlippedByteFailsNamingTheShardAndLeavesNoFile) {
  const std::string shard = dir_.File("step-000000000007/rank-00000.shard");
  const int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, 4096 + 9), 1);  // inside model.w
  byte ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &byte, 1, 4096 + 9), 1);
  ::close(fd);
  const std::string out = out_dir_.File("model.safetensors");
  Result r = RunCli("ckpt export " + dir_.path() + " --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("trainguard ckpt export: shard " + shard +
                               " (rank 0, step 7): checksum mismatch at payload offset 0"));
  EXPECT_THAT(Names(out_dir_.path()), ::testing::IsEmpty());
  // Rank 1's shard is intact and still exports.
  EXPECT_EQ(RunCli("ckpt export " + dir_.path() + " --rank 1 --out " + out).exit_code, 0);
}

TEST_F(CkptExport, AMissingOrIncompleteStepFailsClearly) {
  const std::string out = out_dir_.File("model.safetensors");
  Result r = RunCli("ckpt export " + dir_.path() + " --step 8 --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("trainguard ckpt export: no committed shard of step 8 in " +
                               dir_.path() + " (committed steps: 7)"));
  std::filesystem::remove(dir_.File("step-000000000007/rank-00001.manifest"));
  r = RunCli("ckpt export " + dir_.path() + " --step 7 --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("step 7 in " + dir_.path() + " is incomplete: no committed " +
                               dir_.File("step-000000000007/rank-00001.shard")));
  r = RunCli("ckpt export " + dir_.path() + " --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("no complete committed step in " + dir_.path()));
  EXPECT_THAT(Names(out_dir_.path()), ::testing::IsEmpty());
}

TEST_F(CkptExport, AnUnwritableOutputFailsNamingIt) {
  const std::string out = out_dir_.File("no-such-dir/model.safetensors");
  Result r = RunCli("ckpt export " + dir_.path() + " --out " + out, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("trainguard ckpt export: writing " + out + ": "));
  EXPECT_THAT(Names(out_dir_.path()), ::testing::IsEmpty());
}

// Shards persisted without a layout (the CkptCli fixture's, or a trainguard from before export).
TEST_F(CkptCli, ExportOfAShardWithoutARecordedLayoutFailsNamingIt) {
  TempDir out_dir;
  Result r = RunCli("ckpt export " + dir_.path() + " --out " + out_dir.File("x.safetensors"), true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("step-000000000020/rank-00000.shard (rank 0, step 20): its "
                               "manifest records no payload layout"));
  EXPECT_THAT(Names(out_dir.path()), ::testing::IsEmpty());
}

TEST(CkptCliUsage, BadArgumentsExitWithTwo) {
  EXPECT_EQ(RunCli("ckpt frobnicate /tmp").exit_code, 2);
  EXPECT_EQ(RunCli("ckpt list").exit_code, 2);
  EXPECT_EQ(RunCli("ckpt export /tmp").exit_code, 2);                 // no --out
  EXPECT_EQ(RunCli("ckpt export /tmp --out x --json").exit_code, 2);  // no JSON
  EXPECT_EQ(RunCli("ckpt verify /tmp --out x").exit_code, 2);         // export's flag
  EXPECT_EQ(RunCli("ckpt verify /tmp --rank 1").exit_code, 2);
  EXPECT_EQ(RunCli("ckpt export --help").exit_code, 0);
}

}  // namespace
}  // namespace trainguard
