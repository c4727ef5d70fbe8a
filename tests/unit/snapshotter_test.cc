// Snapshotter: snapshots into a shared-memory arena while the trainer goes on, survives the death
// of its process, and never restores bytes it cannot vouch for.
#include "sdk/checkpoint/snapshotter.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/snapshot_arena.h"
#include "sdk/core/human_bytes.h"
#include "tests/support/full_shm_env.h"
#include "tests/support/own_process.h"
#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

using checkpoint_internal::ArenaHeader;
using checkpoint_internal::kArenaAlignment;
using checkpoint_internal::kSlotComplete;
using checkpoint_internal::kSlotWriting;
using checkpoint_internal::SlotHeader;
using ::testing::HasSubstr;
using ::trainguard::testing::SignalOwnProcess;

constexpr absl::Duration kFenceTimeout = absl::Seconds(30);
constexpr size_t kChunk = 1 << 20;

// The deterministic content of buffer `b` at training step `step`.
char Pattern(int b, int64_t step, size_t i) {
  return static_cast<char>((i * 31 + static_cast<size_t>(b) * 7 + static_cast<size_t>(step) * 13) ^
                           (i >> 9));
}

// A toy trainer's state: three buffers of awkward sizes (one not a multiple of the page or chunk
// size) in memory the test controls, plus blobs.
class TrainerState {
 public:
  static constexpr size_t kSizes[3] = {3 * kChunk, 5 * kChunk + 12, 8};
  static constexpr const char* kNames[3] = {"layer0.weight", "layer1.weight", "optimizer.step"};

  TrainerState() {
    for (int b = 0; b < 3; ++b) {
      // Page-aligned mmap'ed memory, so a test can mprotect part of a buffer.
      const size_t mapped = checkpoint_internal::AlignUp(kSizes[b], 4096);
      void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      data_[b] = static_cast<char*>(p);
      mapped_[b] = mapped;
    }
  }
  ~TrainerState() {
    for (int b = 0; b < 3; ++b) munmap(data_[b], mapped_[b]);
  }
  TrainerState(const TrainerState&) = delete;
  TrainerState& operator=(const TrainerState&) = delete;

  StateRegistry MakeRegistry() const {
    StateRegistry registry;
    for (int b = 0; b < 3; ++b) {
      StateBuffer buffer;
      buffer.name = kNames[b];
      buffer.group = b < 2 ? "model" : "optimizer";
      buffer.data = data_[b];
      buffer.bytes = kSizes[b];
      buffer.dtype = b < 2 ? DType::kF32 : DType::kI64;
      buffer.shape = {static_cast<int64_t>(kSizes[b] / DTypeSize(buffer.dtype))};
      EXPECT_TRUE(registry.Register(std::move(buffer)).ok());
    }
    return registry;
  }

  void Fill(int b, int64_t step) {
    for (size_t i = 0; i < kSizes[b]; ++i) data_[b][i] = Pattern(b, step, i);
  }
  void FillAll(int64_t step) {
    for (int b = 0; b < 3; ++b) Fill(b, step);
  }
  // The first byte of buffer `b` that differs from step `step`'s content, or -1.
  int64_t FirstDifference(int b, int64_t step) const {
    for (size_t i = 0; i < kSizes[b]; ++i) {
      if (data_[b][i] != Pattern(b, step, i)) return static_cast<int64_t>(i);
    }
    return -1;
  }
  bool Holds(int64_t step) const {
    for (int b = 0; b < 3; ++b) {
      if (FirstDifference(b, step) != -1) return false;
    }
    return true;
  }
  char* data(int b) { return data_[b]; }

 private:
  char* data_[3];
  size_t mapped_[3];
};

// A second, independent mapping of a rank's arena: what another process would see.
class ArenaMapping {
 public:
  explicit ArenaMapping(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    EXPECT_GE(fd, 0) << name << ": " << std::strerror(errno);
    struct stat st;
    fstat(fd, &st);
    size_ = static_cast<size_t>(st.st_size);
    base_ = static_cast<char*>(mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~ArenaMapping() { munmap(base_, size_); }
  const ArenaHeader& header() const { return *reinterpret_cast<const ArenaHeader*>(base_); }
  SlotHeader* slot(int i) const {
    return reinterpret_cast<SlotHeader*>(base_ + kArenaAlignment + i * header().slot_header_bytes);
  }
  char* payload(int i) const {
    return base_ + kArenaAlignment + 2 * header().slot_header_bytes + i * header().payload_capacity;
  }
  // The slot holding the newest complete snapshot, or -1.
  int LatestCompleteSlot() const {
    int latest = -1;
    for (int i = 0; i < 2; ++i) {
      if (slot(i)->state != kSlotComplete) continue;
      if (latest < 0 || slot(i)->sequence > slot(latest)->sequence) latest = i;
    }
    return latest;
  }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

class SnapshotterTest : public ::testing::Test {
 protected:
  SnapshotterTest() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    options_.job_id = absl::StrFormat("test-%d-%s", getpid(), info->name());
    options_.rank = 2;
    options_.generation = 3;
    options_.copy_threads = 3;
    options_.chunk_bytes = kChunk;
    options_.max_blob_bytes = 4096;
  }
  ~SnapshotterTest() override {
    absl::Status removed = Snapshotter::RemoveArena(options_.job_id, options_.rank);
    EXPECT_TRUE(removed.ok() || absl::IsNotFound(removed)) << removed;
  }
  std::string arena_name() const { return Snapshotter::ArenaName(options_.job_id, options_.rank); }

  // Step 3 of `registry` snapshotted into the arena, then `other_registry` given another layout (one
  // 16-float buffer `other` under the same first name), as a rerun with another model has it.
  void SnapshotStep3ThenRegisterAnotherLayout(StateRegistry& registry, std::vector<float>& other,
                                              StateRegistry& other_registry) {
    {
      std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
      ASSERT_NE(snapshotter, nullptr);
      ASSERT_TRUE(snapshotter->Begin(3).ok());
      ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
    }
    ASSERT_TRUE(
        other_registry
            .Register(StateBuffer{
                "layer0.weight", "model", other.data(), 64, DType::kF32, {16}, Device::Host()})
            .ok());
  }

  // A Snapshotter of `registry` holding step `step` of `state` (filled for it), taken and fenced.
  std::unique_ptr<Snapshotter> SnapshotOf(int64_t step, TrainerState& state,
                                          const StateRegistry& registry) {
    state.FillAll(step);
    std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
    if (snapshotter == nullptr) return nullptr;
    EXPECT_TRUE(snapshotter->Begin(step).ok());
    EXPECT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
    return snapshotter;
  }

  // SnapshotOf(3, ...), and the snapshot's payload and chunk checksums copied out (what a peer
  // would send): `*payload` and `*checksums`.
  std::unique_ptr<Snapshotter> SnapshotOf3WithPayload(TrainerState& state,
                                                      const StateRegistry& registry,
                                                      std::string* payload,
                                                      std::vector<uint64_t>* checksums) {
    std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
    if (snapshotter == nullptr) return nullptr;
    absl::StatusOr<Snapshotter::View> view = snapshotter->ViewOf(3);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return nullptr;
    payload->assign(view->payload);
    *checksums = view->chunk_checksums;
    return snapshotter;
  }

  std::unique_ptr<Snapshotter> MustCreate(const StateRegistry* registry) {
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(registry, options_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Bit rot (or a stray write from another process): flips the bits `mask` of the bytes at
  // `offsets` of the latest complete slot's payload.
  void FlipInLatestSlot(std::initializer_list<size_t> offsets, char mask) {
    ArenaMapping arena(arena_name());
    const int latest = arena.LatestCompleteSlot();
    ASSERT_GE(latest, 0);
    for (size_t offset : offsets) arena.payload(latest)[offset] ^= mask;
  }

  SnapshotterOptions options_;
};

TEST_F(SnapshotterTest, ArenaIsNamedAfterJobAndRank) {
  EXPECT_EQ(Snapshotter::ArenaName("llama-70b", 12), "/trainguard.llama-70b.rank12");
}

TEST_F(SnapshotterTest, AFullDevShmFailsCreateWithResourceExhaustedNamingTheArenaAndItsSize) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  testing::FullShmEnv env(/*capacity=*/1 << 20);  // less than the two slots of ~8 MiB need
  SnapshotterOptions options = options_;
  options.env = &env;
  absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry, options);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  ASSERT_EQ(env.refusals(), 1);
  const uint64_t asked = env.last_refused_bytes();
  // What the arena needs as a person reads it, then the Env's own error with the bytes asked for.
  const std::string arena = Snapshotter::ArenaName(options.job_id, options.rank);
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("snapshot arena ", arena, " needs ",
                                                           HumanBytes(asked), " (two slots of ")));
  EXPECT_THAT(s.status().message(),
              HasSubstr(absl::StrCat("posix_fallocate of ", asked,
                                     " bytes for shared-memory segment ", arena)));
  EXPECT_THAT(s.status().message(), HasSubstr("No space left on device"));
  EXPECT_THAT(env.left_behind(), ::testing::IsEmpty());  // no half-made segment stays behind
}

TEST_F(SnapshotterTest, RejectsOptionsThatCannotNameOrChunkAnArena) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  SnapshotterOptions bad = options_;
  bad.job_id = "a/b";
  EXPECT_EQ(Snapshotter::Create(&registry, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = options_;
  bad.chunk_bytes = 1000;
  EXPECT_EQ(Snapshotter::Create(&registry, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = options_;
  bad.copy_threads = 0;
  EXPECT_EQ(Snapshotter::Create(&registry, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SnapshotterTest, RestoreGivesTheStateOfTheSnapshotStepWhileTheTrainerMutatedFencedBuffers) {
  TrainerState state;
  state.FillAll(5);
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  EXPECT_FALSE(snapshotter->LatestComplete().has_value());

  ASSERT_TRUE(snapshotter->Begin(5).ok());
  // The trainer goes on: each buffer is overwritten as soon as its own copy is fenced, while the
  // copies of the others may still run.
  for (int b : {2, 0, 1}) {
    ASSERT_TRUE(snapshotter->FenceBuffer(TrainerState::kNames[b], kFenceTimeout).ok());
    state.Fill(b, 6);
  }
  ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
  ASSERT_TRUE(state.Holds(6));

  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 5);
  EXPECT_EQ(restored->generation, 3);
  EXPECT_EQ(restored->layout_hash, registry.LayoutHash());
  EXPECT_TRUE(state.Holds(5));
}

TEST_F(SnapshotterTest, LatestViewExposesThePayloadAndTheChecksumOfEachChunk) {
  TrainerState state;
  state.FillAll(9);
  StateRegistry registry = state.MakeRegistry();
  ASSERT_TRUE(registry.SetBlob("rng", "seed=1").ok());
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  EXPECT_EQ(snapshotter->LatestView().status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(snapshotter->Begin(9).ok());
  ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());

  absl::StatusOr<Snapshotter::View> view = snapshotter->LatestView();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->info.step, 9);
  EXPECT_EQ(view->payload.size(), view->info.bytes);
  // Buffers at 4096-aligned offsets in registry order: layer1.weight right after layer0.weight.
  EXPECT_EQ(std::memcmp(view->payload.data() + 3 * kChunk, state.data(1), 5 * kChunk + 12), 0);
  ASSERT_EQ(view->chunk_checksums.size(), (view->payload.size() + kChunk - 1) / kChunk);
  EXPECT_NE(view->payload.find("seed=1"), std::string_view::npos);
}

TEST_F(SnapshotterTest, BlobsRoundTripAndAnOversizedBlobIsRefused) {
  TrainerState state;
  state.FillAll(1);
  StateRegistry registry = state.MakeRegistry();
  const std::string rng("\x00\x01\xff rng state", 14);
  ASSERT_TRUE(registry.SetBlob("rng", rng).ok());
  ASSERT_TRUE(registry.SetBlob("loader", "shard=3 offset=1200").ok());
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  ASSERT_TRUE(snapshotter->Begin(1).ok());
  ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());

  ASSERT_TRUE(registry.SetBlob("rng", "later").ok());
  ASSERT_TRUE(registry.SetBlob("loader", "shard=4 offset=0").ok());
  ASSERT_TRUE(snapshotter->RestoreLatest(&registry).ok());
  EXPECT_EQ(*registry.GetBlob("rng"), rng);
  EXPECT_EQ(*registry.GetBlob("loader"), "shard=3 offset=1200");

  ASSERT_TRUE(registry.SetBlob("huge", std::string(64 << 10, 'x')).ok());
  absl::Status refused = snapshotter->Begin(2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("max_blob_bytes"));
  EXPECT_EQ(snapshotter->LatestComplete()->step, 1);  // the refused one damaged nothing
}

TEST_F(SnapshotterTest, SnapshotsAlternateSlotsAndTheNewestCompleteOneIsRestored) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  for (int64_t step : {10, 20, 30}) {
    state.FillAll(step);
    ASSERT_TRUE(snapshotter->Begin(step).ok());
    ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
    EXPECT_EQ(snapshotter->LatestComplete()->step, step);
  }
  ArenaMapping arena(arena_name());
  const int latest = arena.LatestCompleteSlot();
  ASSERT_GE(latest, 0);
  EXPECT_EQ(arena.slot(latest)->step, 30);
  EXPECT_EQ(arena.slot(1 - latest)->step, 20);  // the previous snapshot, still complete
  EXPECT_EQ(arena.slot(1 - latest)->state, kSlotComplete);

  state.FillAll(31);
  ASSERT_TRUE(snapshotter->RestoreLatest(&registry).ok());
  EXPECT_TRUE(state.Holds(30));
}

// A commit that stalls (one rank's backup push to a dead host still pending) must not cost the
// other ranks the committed snapshot: with `keep`, the copies go on overwriting the uncommitted
// newer slot, and the committed one stays restorable.
TEST_F(SnapshotterTest, ASnapshotKeepsTheCommittedSlotAndOverwritesTheUncommittedOne) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  auto snapshot = [&](int64_t step, std::optional<int64_t> keep) {
    state.FillAll(step);
    ASSERT_TRUE(snapshotter->Begin(step, keep).ok());
    ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
  };
  auto steps = [&] {
    std::vector<int64_t> out;
    for (const SnapshotInfo& info : snapshotter->CompleteSnapshots()) out.push_back(info.step);
    return out;
  };
  ASSERT_NO_FATAL_FAILURE(snapshot(10, std::nullopt));
  ASSERT_NO_FATAL_FAILURE(snapshot(15, 10));  // the newer slot holds 10: the older is written
  EXPECT_THAT(steps(), ::testing::ElementsAre(15, 10));
  ASSERT_NO_FATAL_FAILURE(snapshot(20, 10));  // 15 was never committed: 20 overwrites it
  EXPECT_THAT(steps(), ::testing::ElementsAre(20, 10));
  ASSERT_NO_FATAL_FAILURE(snapshot(25, 10));
  EXPECT_THAT(steps(), ::testing::ElementsAre(25, 10));
  // While the newer slot is written, the committed one is the latest complete snapshot (never
  // the slot being overwritten, 25); once the copy is done, the new one is.
  state.FillAll(30);
  ASSERT_TRUE(snapshotter->Begin(30, 10).ok());
  EXPECT_THAT(snapshotter->LatestComplete()->step, ::testing::AnyOf(10, 30));
  ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
  state.FillAll(99);
  ASSERT_TRUE(snapshotter->RestoreStep(&registry, 10).ok());
  EXPECT_TRUE(state.Holds(10));
  // Once 30 is committed, the older slot (10) is written again.
  ASSERT_NO_FATAL_FAILURE(snapshot(35, 30));
  EXPECT_THAT(steps(), ::testing::ElementsAre(35, 30));
}

// A restore that installs candidates from elsewhere (disk, a peer) one after another must not
// evict a snapshot that a later candidate needs: the install writes the slot holding no step the
// restore still wants, and a failed install leaves the other slot restorable.
TEST_F(SnapshotterTest, AnInstallOverwritesTheSlotWhoseStepIsNotKept) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  for (int64_t step : {10, 15}) {
    state.FillAll(step);
    ASSERT_TRUE(snapshotter->Begin(step).ok());
    ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
  }
  absl::StatusOr<Snapshotter::View> view = snapshotter->ViewOf(15);
  ASSERT_TRUE(view.ok()) << view.status();
  const std::string payload(view->payload);
  const std::vector<uint64_t> checksums = view->chunk_checksums;
  auto steps = [&] {
    std::vector<int64_t> out;
    for (const SnapshotInfo& info : snapshotter->CompleteSnapshots()) out.push_back(info.step);
    return out;
  };
  // Step 15 is still wanted: installing 30 overwrites the newer slot (15) without it, and keeps 15
  // with it.
  snapshotter->set_install_keep({15, 10});
  ASSERT_TRUE(snapshotter->Install(30, 3, payload, checksums).ok());
  EXPECT_THAT(steps(), ::testing::ElementsAre(30, 15));
  snapshotter->set_install_keep({15});
  ASSERT_TRUE(snapshotter->Install(20, 3, payload, checksums).ok());  // 30 is not wanted: evicted
  EXPECT_THAT(steps(), ::testing::ElementsAre(20, 15));
  // A failed install into the newer slot leaves the older one as the latest, restorable.
  std::vector<uint64_t> wrong = checksums;
  wrong[0] ^= 1;
  snapshotter->set_install_keep({15});
  EXPECT_EQ(snapshotter->Install(25, 3, payload, wrong).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_THAT(steps(), ::testing::ElementsAre(15));
  state.FillAll(99);
  ASSERT_TRUE(snapshotter->RestoreStep(&registry, 15).ok());
  EXPECT_TRUE(state.Holds(15));
  // Without a keep list an install overwrites the older slot.
  snapshotter->set_install_keep({});
  ASSERT_TRUE(snapshotter->Install(40, 3, payload, checksums).ok());
  EXPECT_THAT(steps(), ::testing::ElementsAre(40, 15));
  ASSERT_TRUE(snapshotter->Install(50, 3, payload, checksums).ok());
  EXPECT_THAT(steps(), ::testing::ElementsAre(50, 40));
}

TEST_F(SnapshotterTest, AFlippedByteInTheArenaFailsRestoreWithDataLossAndLeavesBuffersAlone) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
  ASSERT_NE(snapshotter, nullptr);
  state.FillAll(4);

  // In layer1.weight, 1.5 MiB into it.
  ASSERT_NO_FATAL_FAILURE(FlipInLatestSlot({3 * kChunk + kChunk + kChunk / 2}, 0x20));
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("buffer \"layer1.weight\" offset 1048576"));
  EXPECT_THAT(restored.status().message(), HasSubstr("step 3"));
  EXPECT_THAT(restored.status().message(), HasSubstr("rank 2"));
  EXPECT_TRUE(state.Holds(4)) << "a failed restore must not touch the buffers";
}

// A restore verifies its chunks on several threads (here 2: 9 chunks, at least 4 each), each
// stopping at its first corrupt chunk: the error names the lowest corrupt chunk whichever thread
// finishes first.
TEST_F(SnapshotterTest, CorruptChunksInEveryVerifyingThreadsRangeNameTheFirstOfThem) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
  ASSERT_NE(snapshotter, nullptr);
  state.FillAll(4);  // the trainer went on: every chunk must come from the arena
  // In layer1.weight's last full chunk, then in layer0.weight's second chunk.
  ASSERT_NO_FATAL_FAILURE(FlipInLatestSlot({7 * kChunk + 100, 1 * kChunk + 5}, 0x01));
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("chunk 1 (payload offset 1048576"));
  EXPECT_THAT(restored.status().message(), HasSubstr("buffer \"layer0.weight\" offset 1048576"));
  EXPECT_TRUE(state.Holds(4));
}

// A survivor rolling back to the snapshot it took: the chunks its buffers still hold (their bytes
// hash to the snapshot's checksums) are left as they are, neither copied nor read from the arena
// (a flipped byte in the arena's copy of one does not matter); the others are checked and copied.
TEST_F(SnapshotterTest, ARestoreLeavesTheChunksTheBuffersStillHoldAndCopiesTheRest) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
  ASSERT_NE(snapshotter, nullptr);
  state.Fill(1, 4);
  state.Fill(2, 4);
  // layer0.weight (chunks 0-2) is unchanged; its arena copy rots.
  ASSERT_NO_FATAL_FAILURE(FlipInLatestSlot({1 * kChunk + 5}, 0x01));
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(state.Holds(3));
  EXPECT_EQ(restored->restored_bytes_held, 3 * kChunk);

  // A changed chunk is still checked: rot in layer1.weight's copy fails the restore, and leaves
  // the buffers as they were.
  state.Fill(1, 5);
  ASSERT_NO_FATAL_FAILURE(FlipInLatestSlot({4 * kChunk + 7}, 0x01));
  restored = snapshotter->RestoreLatest(&registry);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("buffer \"layer1.weight\" offset 1048576"));
  EXPECT_EQ(state.FirstDifference(1, 5), -1);
}

// The first restore of an installed slot (its chunks checked as they landed) copies without
// comparing: the hash that could spare a copy costs as much as the copy. A later restore of it
// verifies, and then compares.
TEST_F(SnapshotterTest, TheFirstRestoreOfAnInstalledSnapshotCopiesWithoutComparing) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::string payload;
  std::vector<uint64_t> checksums;
  std::unique_ptr<Snapshotter> snapshotter =
      SnapshotOf3WithPayload(state, registry, &payload, &checksums);
  ASSERT_NE(snapshotter, nullptr);
  ASSERT_TRUE(snapshotter->Install(7, 3, payload, checksums).ok());
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreStep(&registry, 7);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->restored_bytes_held, 0u);
  EXPECT_TRUE(state.Holds(3));
  restored = snapshotter->RestoreStep(&registry, 7);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->restored_bytes_held, 8 * kChunk);  // every chunk but the mixed last one
}

// A fetched backup is restored into the buffers as its chunks land: a chunk the fill tells the
// sink about is in its buffer before the fill goes on (here layer1.weight's first five chunks
// while layer0.weight, not written yet, still holds the trainer's own bytes); the chunks it did not
// tell, and the blobs, are restored once it returns. No RestoreStep is needed after.
TEST_F(SnapshotterTest, AnInstallAndRestoreCopiesEachChunkIntoTheBuffersAsItLands) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  ASSERT_TRUE(registry.SetBlob("rng", "step 3").ok());
  std::string payload;
  std::vector<uint64_t> checksums;
  std::unique_ptr<Snapshotter> snapshotter =
      SnapshotOf3WithPayload(state, registry, &payload, &checksums);
  ASSERT_NE(snapshotter, nullptr);
  state.FillAll(99);  // the replacement's fresh state
  ASSERT_TRUE(registry.SetBlob("rng", "fresh").ok());
  const SnapshotInfo source = *snapshotter->LatestComplete();
  const uint64_t fingerprint =
      SnapshotFingerprint(7, source.layout_hash, payload.size(), checksums);
  absl::StatusOr<SnapshotInfo> restored = snapshotter->InstallAndRestoreWith(
      &registry, 7, 3, payload.size(), checksums, fingerprint,
      [&](char* dst, Snapshotter::ChunkSink* sink) -> absl::Status {
        EXPECT_NE(sink, nullptr);
        auto write = [&](uint64_t k) {
          const uint64_t begin = k * kChunk;
          std::memcpy(dst + begin, payload.data() + begin,
                      std::min<uint64_t>(kChunk, payload.size() - begin));
        };
        // layer1.weight's chunks 3-7 (all of it but the 12 bytes in chunk 8), each told.
        for (uint64_t k = 3; k < 8; ++k) {
          write(k);
          sink->Landed(k);
        }
        sink->Landed(5);  // told twice: taken once
        EXPECT_EQ(state.FirstDifference(1, 3), static_cast<int64_t>(5 * kChunk));
        EXPECT_EQ(state.FirstDifference(0, 99), -1);  // not landed: untouched
        // The rest written, not told.
        for (uint64_t k = 0; k < 3; ++k) write(k);
        for (uint64_t k = 8; k < checksums.size(); ++k) write(k);
        return absl::OkStatus();
      });
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 7);
  EXPECT_EQ(restored->fingerprint, fingerprint);
  EXPECT_TRUE(state.Holds(3));
  EXPECT_EQ(*registry.GetBlob("rng"), "step 3");
  // The slot is installed: a later restore of it checks every chunk and finds them all held.
  absl::StatusOr<SnapshotInfo> again = snapshotter->RestoreStep(&registry, 7);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->restored_bytes_held, 8 * kChunk);
}

// An install and restore whose fill fails leaves no restorable slot (the buffers may hold what
// landed: the caller restores them from elsewhere); one into a registry of another layout is
// refused before a byte is written.
TEST_F(SnapshotterTest, AFailedInstallAndRestoreInstallsNothingAndAnotherLayoutIsRefused) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::string payload;
  std::vector<uint64_t> checksums;
  std::unique_ptr<Snapshotter> snapshotter =
      SnapshotOf3WithPayload(state, registry, &payload, &checksums);
  ASSERT_NE(snapshotter, nullptr);
  const uint64_t fingerprint =
      SnapshotFingerprint(8, snapshotter->LatestComplete()->layout_hash, payload.size(), checksums);
  absl::StatusOr<SnapshotInfo> failed = snapshotter->InstallAndRestoreWith(
      &registry, 8, 3, payload.size(), checksums, fingerprint,
      [&](char* dst, Snapshotter::ChunkSink* sink) -> absl::Status {
        std::memcpy(dst, payload.data(), kChunk);
        sink->Landed(0);
        return absl::UnavailableError("holder 127.0.0.1:1 dropped the connection");
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("installing step 8"));
  ASSERT_EQ(snapshotter->CompleteSnapshots().size(), 1u);
  EXPECT_EQ(snapshotter->CompleteSnapshots()[0].step, 3);

  std::vector<float> other(16, 1.0f);
  StateRegistry other_registry;
  ASSERT_TRUE(
      other_registry
          .Register(StateBuffer{
              "layer0.weight", "model", other.data(), 64, DType::kF32, {4, 4}, Device::Host()})
          .ok());
  bool filled = false;
  absl::StatusOr<SnapshotInfo> refused =
      snapshotter->InstallAndRestoreWith(&other_registry, 8, 3, payload.size(), checksums,
                                         fingerprint, [&](char*, Snapshotter::ChunkSink*) {
                                           filled = true;
                                           return absl::OkStatus();
                                         });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("layout hash"));
  EXPECT_FALSE(filled);
  EXPECT_EQ(other, std::vector<float>(16, 1.0f));
}

// State that training rewrites costs the comparison two chunk hashes a buffer, not a pass: along
// a buffer, once the chunks that differed outnumber those that matched by two, the rest of it is
// copied without being compared (here layer1.weight's first two chunks differ; its last three,
// unchanged, are copied all the same). One thread, so that one range walks the whole buffer.
TEST_F(SnapshotterTest, ARestoreStopsComparingABufferWhoseChunksKeepDiffering) {
  options_.copy_threads = 1;
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
  ASSERT_NE(snapshotter, nullptr);
  for (size_t i = 0; i < 2 * kChunk; ++i) state.data(1)[i] ^= 0x5a;
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(state.Holds(3));
  EXPECT_EQ(restored->restored_bytes_held, 3 * kChunk);  // layer0.weight's three chunks only
}

TEST_F(SnapshotterTest, RestoringIntoARegistryOfAnotherLayoutIsRefused) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = SnapshotOf(3, state, registry);
  ASSERT_NE(snapshotter, nullptr);

  std::vector<float> other(16, 1.0f);
  StateRegistry other_registry;
  ASSERT_TRUE(
      other_registry
          .Register(StateBuffer{
              "layer0.weight", "model", other.data(), 64, DType::kF32, {4, 4}, Device::Host()})
          .ok());
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&other_registry);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(restored.status().message(), HasSubstr("layout hash"));
  EXPECT_EQ(other, std::vector<float>(16, 1.0f));
}

TEST_F(SnapshotterTest, AnArenaOfAnotherLayoutIsReplacedNotRestored) {
  TrainerState state;
  state.FillAll(3);
  StateRegistry registry = state.MakeRegistry();
  std::vector<float> other(16, 1.0f);
  StateRegistry other_registry;
  ASSERT_NO_FATAL_FAILURE(SnapshotStep3ThenRegisterAnotherLayout(registry, other, other_registry));
  std::unique_ptr<Snapshotter> replaced = MustCreate(&other_registry);
  ASSERT_NE(replaced, nullptr);
  EXPECT_FALSE(replaced->LatestComplete().has_value());
  absl::StatusOr<SnapshotInfo> restored = replaced->RestoreLatest(&other_registry);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(restored.status().message(), HasSubstr("replaced"));
  EXPECT_THAT(restored.status().message(), HasSubstr("layout hash"));
}

// The Runtime's own arena: another model under the same job id must not silently start over.
TEST_F(SnapshotterTest, AnArenaOfAnotherLayoutIsKeptAndBothLayoutsNamedWhenAsked) {
  TrainerState state;
  state.FillAll(3);
  StateRegistry registry = state.MakeRegistry();
  std::vector<float> other(16, 1.0f);
  StateRegistry other_registry;
  ASSERT_NO_FATAL_FAILURE(SnapshotStep3ThenRegisterAnotherLayout(registry, other, other_registry));
  SnapshotterOptions keep = options_;
  keep.keep_arena_of_other_layout = true;
  absl::StatusOr<std::unique_ptr<Snapshotter>> refused =
      Snapshotter::Create(&other_registry, keep);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrFormat("holds the state of layout hash %016x, the registry has "
                                        "layout hash %016x (1 buffers, 64 bytes: layer0.weight",
                                        registry.LayoutHash(), other_registry.LayoutHash())));
  EXPECT_THAT(refused.status().message(), HasSubstr("trainguard shm remove --job"));
  // The old state is still there and restores into a registry of its own layout.
  std::unique_ptr<Snapshotter> again = MustCreate(&registry);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->LatestComplete().has_value());
  EXPECT_EQ(again->LatestComplete()->step, 3);
}

TEST_F(SnapshotterTest, ASecondLiveSnapshotterForTheSameRankIsRefused) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> first = MustCreate(&registry);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<Snapshotter>> second = Snapshotter::Create(&registry, options_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST_F(SnapshotterTest, FencingAnUnknownBufferIsNotFound) {
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  EXPECT_EQ(snapshotter->FenceBuffer("layer9.weight", kFenceTimeout).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(snapshotter->Fence(kFenceTimeout).ok());  // nothing in flight
}

// --- Real restarts: a trainer process is forked, snapshots, and is killed with SIGKILL.

// The child's report channel: one byte, 'R' (ready to be killed) or 'E' followed by a message.
int g_report_fd = -1;

void Report(char what, const std::string& message = "") {
  std::string out(1, what);
  out += message;
  [[maybe_unused]] ssize_t n = write(g_report_fd, out.data(), out.size());
}

void ChildCheck(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  Report('E', absl::StrFormat("%s: %s", what, status.ToString()));
  _exit(2);
}

// A worker that touches a protected page stops there, says so, and waits to be killed: a process
// that dies in the middle of a copy, deterministically.
void StuckMidCopy(int) {
  Report('M');
  for (;;) pause();
}

// Forks a trainer running `body` (which reports, then sleeps) and waits (bounded) for its report;
// `*pid` is the trainer's (-1 when the fork failed). Returns the report.
std::string StartTrainer(const std::function<void()>& body, pid_t* pid) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  *pid = fork();
  if (*pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return "";
  }
  if (*pid == 0) {
    close(fds[0]);
    g_report_fd = fds[1];
    body();  // reports, then waits to be killed
    _exit(3);
  }
  close(fds[1]);
  std::string report;
  pollfd p{fds[0], POLLIN, 0};
  if (poll(&p, 1, 60'000) == 1) {
    char buffer[512];
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n > 0) report.assign(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  return report;
}

// SIGKILLs the trainer `pid` and reaps it.
void KillTrainer(pid_t pid, const std::string& report) {
  if (pid <= 0) return;
  EXPECT_EQ(SignalOwnProcess(pid, SIGKILL), absl::OkStatus());
  int wstatus = 0;
  EXPECT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "report: " << report;
}

// StartTrainer, then KillTrainer. Returns the report.
std::string RunAndKillTrainer(const std::function<void()>& body) {
  pid_t pid = -1;
  std::string report = StartTrainer(body, &pid);
  KillTrainer(pid, report);
  return report;
}

TEST_F(SnapshotterTest, ARestartedRankRestoresTheKilledProcesssSnapshotWithoutDisk) {
  const std::string report = RunAndKillTrainer([this] {
    TrainerState state;
    state.FillAll(7);
    StateRegistry registry = state.MakeRegistry();
    ChildCheck(registry.SetBlob("rng", "rng@7"), "SetBlob");
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry, options_);
    ChildCheck(s.status(), "Create");
    ChildCheck((*s)->Begin(7), "Begin");
    ChildCheck((*s)->Fence(kFenceTimeout), "Fence");
    state.FillAll(8);  // training went on after the snapshot
    Report('R');
    sleep(60);  // killed long before, with the Snapshotter alive
  });
  ASSERT_EQ(report, "R");

  // The restarted rank: same job and rank, fresh memory.
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  options_.generation = 4;
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  ASSERT_TRUE(snapshotter->LatestComplete().has_value());
  EXPECT_EQ(snapshotter->LatestComplete()->step, 7);
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 7);
  EXPECT_EQ(restored->generation, 3);  // written by the previous incarnation
  for (int b = 0; b < 3; ++b) EXPECT_EQ(state.FirstDifference(b, 7), -1) << TrainerState::kNames[b];
  EXPECT_EQ(*registry.GetBlob("rng"), "rng@7");

  // And it goes on snapshotting into the same arena.
  state.FillAll(8);
  ASSERT_TRUE(snapshotter->Begin(8).ok());
  ASSERT_TRUE(snapshotter->Fence(kFenceTimeout).ok());
  EXPECT_EQ(snapshotter->LatestComplete()->step, 8);
}

// A replacement that starts while the rank's previous process still holds the arena (it has not
// exited yet) waits for it, bounded by SnapshotterOptions::arena_lock_wait, and then takes the
// arena with its snapshot; without a wait, or once the wait runs out, it is refused, naming why.
TEST_F(SnapshotterTest, AReplacementWaitsForThePreviousProcessToReleaseTheArenaThenRestoresIt) {
  pid_t pid = -1;
  const std::string report = StartTrainer(
      [this] {
        TrainerState state;
        state.FillAll(7);
        StateRegistry registry = state.MakeRegistry();
        absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry, options_);
        ChildCheck(s.status(), "Create");
        ChildCheck((*s)->Begin(7), "Begin");
        ChildCheck((*s)->Fence(kFenceTimeout), "Fence");
        Report('R');
        sleep(60);  // killed long before, with the Snapshotter alive
      },
      &pid);
  ASSERT_EQ(report, "R");
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  absl::StatusOr<std::unique_ptr<Snapshotter>> refused = Snapshotter::Create(&registry, options_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("in use"));
  options_.arena_lock_wait = absl::Milliseconds(30);
  refused = Snapshotter::Create(&registry, options_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("waited 30ms for it to exit"));

  options_.arena_lock_wait = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Snapshotter>> replacement;
  std::thread start([&] { replacement = Snapshotter::Create(&registry, options_); });
  KillTrainer(pid, report);
  start.join();
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  absl::StatusOr<SnapshotInfo> restored = (*replacement)->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 7);
  EXPECT_TRUE(state.Holds(7));
}

TEST_F(SnapshotterTest, AProcessKilledMidSnapshotLeavesThePreviousSnapshotRestorable) {
  const std::string report = RunAndKillTrainer([this] {
    TrainerState state;
    state.FillAll(1);
    StateRegistry registry = state.MakeRegistry();
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry, options_);
    ChildCheck(s.status(), "Create");
    ChildCheck((*s)->Begin(1), "Begin(1)");
    ChildCheck((*s)->Fence(kFenceTimeout), "Fence(1)");
    // Step 2: new values everywhere, and a page in the middle of layer1.weight the copy cannot
    // read, so the process is in the middle of copying step 2 when it is killed.
    state.FillAll(2);
    struct sigaction action = {};
    action.sa_handler = StuckMidCopy;
    sigaction(SIGSEGV, &action, nullptr);
    mprotect(state.data(1) + 2 * kChunk, 4096, PROT_NONE);
    ChildCheck((*s)->Begin(2), "Begin(2)");
    sleep(60);  // the worker reports 'M' from the signal handler
  });
  ASSERT_EQ(report, "M");

  {
    ArenaMapping arena(arena_name());
    const int latest = arena.LatestCompleteSlot();
    ASSERT_GE(latest, 0);
    EXPECT_EQ(arena.slot(latest)->step, 1);
    EXPECT_EQ(arena.slot(1 - latest)->state, kSlotWriting);  // step 2, never completed
    EXPECT_EQ(arena.slot(1 - latest)->step, 2);
  }
  TrainerState state;
  StateRegistry registry = state.MakeRegistry();
  std::unique_ptr<Snapshotter> snapshotter = MustCreate(&registry);
  ASSERT_NE(snapshotter, nullptr);
  EXPECT_EQ(snapshotter->LatestComplete()->step, 1);
  absl::StatusOr<SnapshotInfo> restored = snapshotter->RestoreLatest(&registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 1);
  EXPECT_TRUE(state.Holds(1));
}

}  // namespace
}  // namespace trainguard
