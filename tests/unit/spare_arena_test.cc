// SpareArena: the memory a parked standby prepares for the arena of the rank it will take. It is
// adopted under the rank's arena name only when the rank has no arena here and the sizes agree;
// otherwise it changes nothing and goes away.
#include "sdk/checkpoint/spare_arena.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/peer_backups.h"
#include "sdk/checkpoint/snapshotter.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

bool SegmentExists(const std::string& name) {
  struct stat st;
  return stat(absl::StrCat("/dev/shm", name).c_str(), &st) == 0;
}

class SpareArenaTest : public ::testing::Test {
 protected:
  SpareArenaTest() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    options_.job_id = absl::StrFormat("spare-%d-%s", getpid(), info->name());
    options_.rank = 3;
    options_.chunk_bytes = 1 << 20;
    options_.max_blob_bytes = 4096;
    state_.assign(3 * (1 << 20) / sizeof(float) + 5, 0.0f);
    EXPECT_TRUE(registry_
                    .Register(StateBuffer{"w", "model", state_.data(),
                                          state_.size() * sizeof(float), DType::kF32,
                                          {static_cast<int64_t>(state_.size())}, Device::Host()})
                    .ok());
  }
  ~SpareArenaTest() override {
    (void)Snapshotter::RemoveArena(options_.job_id, options_.rank);
    (void)Env::Default()->RemoveSharedMemory(spare_name());
  }
  std::string spare_name() const { return SpareArena::Name(options_.job_id, getpid()); }
  std::string arena_name() const { return Snapshotter::ArenaName(options_.job_id, options_.rank); }
  // The arena's size for this registry, from a Snapshotter made and removed for the purpose.
  uint64_t ArenaBytes() {
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry_, options_);
    EXPECT_TRUE(s.ok()) << s.status();
    const uint64_t bytes = s.ok() ? (*s)->arena_bytes() : 0;
    s->reset();
    (void)Snapshotter::RemoveArena(options_.job_id, options_.rank);
    return bytes;
  }

  SnapshotterOptions options_;
  std::vector<float> state_;
  StateRegistry registry_;
};

TEST(ChooseSpareArenaBytes, TakesTheSizeMostRanksPublishedAndTheLargerOfATie) {
  EXPECT_EQ(ChooseSpareArenaBytes({100, 200, 100, std::nullopt}), std::optional<uint64_t>(100));
  EXPECT_EQ(ChooseSpareArenaBytes({100, 200}), std::optional<uint64_t>(200));
  EXPECT_EQ(ChooseSpareArenaBytes({std::nullopt, std::nullopt}), std::nullopt);
  EXPECT_EQ(ChooseSpareArenaBytes({}), std::nullopt);
}

TEST_F(SpareArenaTest, IsNamedAfterTheJobAndTheStandbysPid) {
  EXPECT_EQ(SpareArena::Name("llama", 4242), "/trainguard.llama.spare.pid4242");
}

TEST_F(SpareArenaTest, ARankWithoutAnArenaAdoptsASpareOfItsSizeAndItsSnapshotsRestore) {
  const uint64_t bytes = ArenaBytes();
  absl::StatusOr<std::unique_ptr<SpareArena>> spare =
      SpareArena::Create(Env::Default(), spare_name(), bytes);
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_TRUE(SegmentExists(spare_name()));
  ASSERT_FALSE(SegmentExists(arena_name()));
  SnapshotterOptions options = options_;
  options.spare_arena = spare->get();
  absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry_, options);
  ASSERT_TRUE(s.ok()) << s.status();
  // Renamed, not copied: the spare's name is gone and its owner no longer removes anything.
  EXPECT_FALSE(SegmentExists(spare_name()));
  EXPECT_TRUE(SegmentExists(arena_name()));
  spare->reset();
  EXPECT_TRUE(SegmentExists(arena_name()));

  for (size_t i = 0; i < state_.size(); ++i) state_[i] = static_cast<float>(i % 977);
  ASSERT_TRUE((*s)->Begin(7).ok());
  ASSERT_TRUE((*s)->Fence(absl::Seconds(30)).ok());
  std::fill(state_.begin(), state_.end(), -1.0f);
  absl::StatusOr<SnapshotInfo> restored = (*s)->RestoreStep(&registry_, 7);
  ASSERT_TRUE(restored.ok()) << restored.status();
  for (size_t i = 0; i < state_.size(); ++i) {
    ASSERT_EQ(state_[i], static_cast<float>(i % 977)) << "at float " << i;
  }
  // And a later process of the rank (a restart on this host) reopens it as an arena of its own.
  s->reset();
  absl::StatusOr<std::unique_ptr<Snapshotter>> reopened = Snapshotter::Create(&registry_, options_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_TRUE((*reopened)->LatestComplete().has_value());
  EXPECT_EQ((*reopened)->LatestComplete()->step, 7);
}

TEST_F(SpareArenaTest, ASpareOfAnotherSizeIsNotAdoptedAndIsRemovedByItsOwner) {
  const uint64_t bytes = ArenaBytes();
  absl::StatusOr<std::unique_ptr<SpareArena>> spare =
      SpareArena::Create(Env::Default(), spare_name(), bytes + 4096);
  ASSERT_TRUE(spare.ok()) << spare.status();
  SnapshotterOptions options = options_;
  options.spare_arena = spare->get();
  absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry_, options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->arena_bytes(), bytes);
  EXPECT_TRUE(SegmentExists(spare_name()));
  spare->reset();
  EXPECT_FALSE(SegmentExists(spare_name()));
  EXPECT_TRUE(SegmentExists(arena_name()));
}

TEST_F(SpareArenaTest, ARankThatHasAnArenaHereKeepsItsSnapshotAndLeavesTheSpare) {
  const uint64_t bytes = ArenaBytes();
  std::fill(state_.begin(), state_.end(), 3.0f);
  {
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry_, options_);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Begin(5).ok());
    ASSERT_TRUE((*s)->Fence(absl::Seconds(30)).ok());
  }
  absl::StatusOr<std::unique_ptr<SpareArena>> spare =
      SpareArena::Create(Env::Default(), spare_name(), bytes);
  ASSERT_TRUE(spare.ok()) << spare.status();
  SnapshotterOptions options = options_;
  options.spare_arena = spare->get();
  absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry_, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->LatestComplete().has_value());
  EXPECT_EQ((*s)->LatestComplete()->step, 5);
  EXPECT_TRUE(SegmentExists(spare_name()));
}

TEST_F(SpareArenaTest, ThePreparerMakesTheSpareOnceEveryRankPublishedItsSize) {
  InMemoryStore store;
  PrefixStore ckpt("ckpt", &store);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(ckpt.Set(PeerBackups::ArenaSizeKey(r), "1056768", absl::Seconds(1)).ok());
  }
  SpareArenaPreparer preparer(&store, {.job_id = options_.job_id,
                                       .world_size = 4,
                                       .env = nullptr,
                                       .name = spare_name(),
                                       .poll = absl::Milliseconds(10)});
  preparer.Stop();  // the sizes were there: the creation under way completes
  ASSERT_TRUE(preparer.status().ok()) << preparer.status();
  std::unique_ptr<SpareArena> spare = preparer.Take();
  ASSERT_NE(spare, nullptr);
  EXPECT_EQ(spare->bytes(), 1056768u);
  EXPECT_TRUE(SegmentExists(spare_name()));
  spare.reset();
  EXPECT_FALSE(SegmentExists(spare_name()));
}

// An Env that, once a segment exists and is locked, says so on `ready_fd` and never reserves its
// memory: a standby caught making its spare.
class StallingReserveEnv : public EnvWrapper {
 public:
  explicit StallingReserveEnv(int ready_fd) : EnvWrapper(Env::Default()), ready_fd_(ready_fd) {}
  absl::Status ReserveSharedMemory(int, const std::string&, uint64_t) override {
    const char byte = 1;
    (void)!write(ready_fd_, &byte, 1);
    while (true) pause();  // until the test kills this process
  }

 private:
  const int ready_fd_;
};

// A standby killed while it makes its spare leaves the segment behind, and nobody holds its lock:
// the next standby's preparer on the host removes it before making its own, so the dead one's
// memory is not kept from the rank that needs it. A live standby's spare is left alone.
TEST_F(SpareArenaTest, AStandbyKilledWhileMakingItsSpareLeavesASegmentTheNextStandbyRemoves) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    StallingReserveEnv env(ready[1]);
    (void)SpareArena::Create(&env, SpareArena::Name(options_.job_id, getpid()), 64 << 20);
    _exit(1);
  }
  close(ready[1]);
  const std::string dead = SpareArena::Name(options_.job_id, child);
  struct pollfd p = {ready[0], POLLIN, 0};
  char byte = 0;
  const bool stalled = poll(&p, 1, 30'000) == 1 && read(ready[0], &byte, 1) == 1;
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(stalled) << "the standby never got as far as its segment";
  ASSERT_TRUE(SegmentExists(dead));

  // Another live standby's spare of the same job: locked, kept.
  absl::StatusOr<std::unique_ptr<SpareArena>> live =
      SpareArena::Create(Env::Default(), SpareArena::Name(options_.job_id, 1), 1 << 20);
  ASSERT_TRUE(live.ok()) << live.status();

  InMemoryStore store;
  PrefixStore ckpt("ckpt", &store);
  ASSERT_TRUE(ckpt.Set(PeerBackups::ArenaSizeKey(0), "1056768", absl::Seconds(1)).ok());
  SpareArenaPreparer preparer(&store, {.job_id = options_.job_id,
                                       .world_size = 1,
                                       .env = nullptr,
                                       .name = spare_name(),
                                       .poll = absl::Milliseconds(10)});
  preparer.Stop();
  ASSERT_TRUE(preparer.status().ok()) << preparer.status();
  EXPECT_NE(preparer.Take(), nullptr);
  EXPECT_FALSE(SegmentExists(dead));
  EXPECT_TRUE(SegmentExists((*live)->name()));
}

TEST_F(SpareArenaTest, ThePreparerStoppedBeforeEveryRankPublishedMakesNothing) {
  InMemoryStore store;
  PrefixStore ckpt("ckpt", &store);
  ASSERT_TRUE(ckpt.Set(PeerBackups::ArenaSizeKey(0), "1056768", absl::Seconds(1)).ok());
  SpareArenaPreparer preparer(&store, {.job_id = options_.job_id,
                                       .world_size = 2,
                                       .env = nullptr,
                                       .name = spare_name(),
                                       .poll = absl::Milliseconds(10)});
  preparer.Stop();
  EXPECT_EQ(preparer.Take(), nullptr);
  EXPECT_FALSE(SegmentExists(spare_name()));
}

}  // namespace
}  // namespace trainguard
