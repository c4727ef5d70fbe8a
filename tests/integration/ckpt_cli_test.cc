// Specification of `trainguard ckpt list|inspect|verify`: run as a real process on a directory the
// Persister wrote, with real corruption in it.
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/persister.h"
#include "tests/support/temp_dir.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string out;
};

// Runs the CLI with stdout captured (stderr, with the progress display, is left alone).
Result RunCli(const std::string& args) {
  Result r;
  FILE* pipe = popen((std::string(TRAINGUARD_CLI_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
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

TEST(CkptCliUsage, BadArgumentsExitWithTwo) {
  EXPECT_EQ(RunCli("ckpt frobnicate /tmp").exit_code, 2);
  EXPECT_EQ(RunCli("ckpt list").exit_code, 2);
}

}  // namespace
}  // namespace trainguard
