// Checkpointer: global commit through the store, restore of the newest step every rank can restore,
// arena before disk, fallback past corruption, generation fencing. Ranks are threads here, each
// with its own registry, arena and store client; tests/integration/ kills real processes.
#include "sdk/checkpoint/checkpointer.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/backup_service.h"
#include "sdk/checkpoint/in_memory_backup_transport.h"
#include "sdk/checkpoint/persister.h"
#include "sdk/core/mutex.h"
#include "tests/support/temp_dir.h"
#include "trainguard/store.h"
#include "trainguard/topology.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::trainguard::testing::TempDir;

constexpr size_t kFloats = 3000;  // 12 KB: several 4 KiB chunks per rank
constexpr absl::Duration kTimeout = absl::Seconds(30);

// One rank: its model (two buffers and a blob), registry and checkpointer.
struct Rank {
  std::vector<float> weights = std::vector<float>(kFloats);
  std::vector<float> moments = std::vector<float>(kFloats / 3);
  StateRegistry registry;
  std::unique_ptr<Store> client;
  std::unique_ptr<Checkpointer> checkpointer;
  std::vector<SaveOutcome> outcomes;

  // The state of "step" s: every value is derived from the rank and the step.
  void Fill(int rank, int64_t s) {
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = rank * 1000.0f + s + i * 1e-3f;
    for (size_t i = 0; i < moments.size(); ++i) moments[i] = -(rank * 1000.0f + s) - i;
    ASSERT_TRUE(registry.SetBlob("rng", absl::StrCat("rank", rank, "step", s)).ok());
  }
  bool Holds(int rank, int64_t s) const {
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i] != rank * 1000.0f + s + i * 1e-3f) return false;
    }
    for (size_t i = 0; i < moments.size(); ++i) {
      if (moments[i] != -(rank * 1000.0f + s) - i) return false;
    }
    absl::StatusOr<std::string> rng = registry.GetBlob("rng");
    return rng.ok() && *rng == absl::StrCat("rank", rank, "step", s);
  }
};

class CheckpointerTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 3;

  void SetUp() override {
    job_ = absl::StrCat("ckpt-test-", getpid(), "-", ++counter_);
    for (int r = 0; r < kWorld; ++r) {
      ranks_.push_back(std::make_unique<Rank>());
      Rank& rank = *ranks_.back();
      ASSERT_TRUE(rank.registry
                      .Register({"weights",
                                 "model",
                                 rank.weights.data(),
                                 rank.weights.size() * sizeof(float),
                                 DType::kF32,
                                 {static_cast<int64_t>(rank.weights.size())},
                                 Device::Host()})
                      .ok());
      ASSERT_TRUE(rank.registry
                      .Register({"exp_avg",
                                 "optimizer",
                                 rank.moments.data(),
                                 rank.moments.size() * sizeof(float),
                                 DType::kF32,
                                 {static_cast<int64_t>(rank.moments.size())},
                                 Device::Host()})
                      .ok());
      ASSERT_TRUE(rank.registry.SetBlob("rng", "").ok());
      rank.client = store_.NewClient();
    }
    // Concurrently, as processes start: with peer backups each rank's start-up waits for the arena
    // sizes of the ranks whose backups its host holds.
    std::vector<absl::Status> started(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] { started[r] = Create(r, /*generation=*/0); });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(started[r].ok()) << "rank " << r << ": " << started[r];
  }

  void TearDown() override {
    for (auto& rank : ranks_) rank->checkpointer.reset();
    for (int r = 0; r < kWorld; ++r) (void)Snapshotter::RemoveArena(job_, r);
    for (int r = 0; r < kWorld; ++r) (void)BackupService::RemoveArenas(job_, {r});
  }

  CheckpointerOptions OptionsFor(int r, int64_t generation) {
    CheckpointerOptions o;
    o.job_id = job_;
    o.rank = r;
    o.world_size = kWorld;
    o.generation = generation;
    o.dir = dir_.path();
    o.chunk_bytes = 4096;
    o.copy_threads = 2;
    o.keep_last = 3;
    o.store = ranks_[r]->client.get();
    o.timeout = kTimeout;
    o.superseded = superseded_;
    if (peer_copies_ > 1) {
      // Every rank is a host of its own; its backups go to the next rank(s) (see
      // BackupPlacement), each served on 127.0.0.1.
      absl::StatusOr<Topology> topology =
          Topology::Create({.world_size = kWorld, .ranks_per_host = 1});
      EXPECT_TRUE(topology.ok()) << topology.status();
      absl::StatusOr<BackupPlacement> placement =
          BackupPlacement::Place({.topology = *topology, .copies = peer_copies_});
      EXPECT_TRUE(placement.ok()) << placement.status();
      PeerBackupsOptions p;
      p.job_id = job_;
      p.rank = r;
      p.placement = *placement;
      p.host_addr = "127.0.0.1";
      p.host_name = absl::StrCat("host", r);
      p.memory_budget_bytes = peer_budget_;
      p.timeout = kTimeout;
      p.transport = transport_;
      o.peer_backups = p;
    }
    return o;
  }

  // (Re)creates rank r's checkpointer, as a (re)started process would.
  absl::Status Create(int r, int64_t generation) {
    Rank& rank = *ranks_[r];
    rank.checkpointer.reset();
    absl::StatusOr<std::unique_ptr<Checkpointer>> c =
        Checkpointer::Create(&rank.registry, OptionsFor(r, generation));
    if (!c.ok()) return c.status();
    rank.checkpointer = *std::move(c);
    rank.checkpointer->set_observer([&rank](const SaveOutcome& o) { rank.outcomes.push_back(o); });
    return absl::OkStatus();
  }
  void Start(int r, int64_t generation) { ASSERT_EQ(Create(r, generation), absl::OkStatus()); }

  // Every rank fills the state of step s and saves it; waits until every save is processed.
  void SaveAll(int64_t s, const std::vector<int>& which = {0, 1, 2}) {
    for (int r : which) {
      ranks_[r]->Fill(r, s);
      ASSERT_TRUE(ranks_[r]->checkpointer->Save(s).ok());
    }
    for (int r : which) {
      ASSERT_TRUE(ranks_[r]->checkpointer->WaitIdle(kTimeout).ok());
      ASSERT_FALSE(ranks_[r]->outcomes.empty());
      ASSERT_TRUE(ranks_[r]->outcomes.back().status.ok()) << ranks_[r]->outcomes.back().status;
    }
  }

  // Flips one payload byte of `rank`'s committed shard of `step` on disk; returns its path.
  std::string CorruptShard(int64_t step, int rank) {
    absl::StatusOr<std::vector<ShardRecord>> shards = ListCommittedShards(nullptr, dir_.path());
    EXPECT_TRUE(shards.ok()) << shards.status();
    std::string path;
    for (const ShardRecord& s : shards.ok() ? *shards : std::vector<ShardRecord>{}) {
      if (s.step == step && s.rank == rank) path = s.shard_path;
    }
    EXPECT_FALSE(path.empty()) << "no shard of step " << step << " rank " << rank;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 5000);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x40;
    f.seekp(4096 + 5000);
    f.write(&c, 1);
    EXPECT_TRUE(f.good()) << path;
    return path;
  }

  // A commit that stalls: step 10 is committed and every rank learns it (the last voter at once,
  // the others from the store); then rank 0 saves nothing more, and ranks 1 and 2 save 15 and 20
  // in memory, neither ever committed.
  void CommitTenThenStall() {
    ASSERT_NO_FATAL_FAILURE(SaveAll(10));
    for (int r = 0; r < kWorld; ++r) {
      const absl::Time deadline = absl::Now() + kTimeout;
      while (ranks_[r]->checkpointer->known_committed() != 10 && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      ASSERT_EQ(ranks_[r]->checkpointer->known_committed(), 10) << "rank " << r;
    }
    for (int64_t s : {15, 20}) {
      for (int r : {1, 2}) {
        ranks_[r]->Fill(r, s);
        ASSERT_TRUE(ranks_[r]->checkpointer->Save(s, /*persist=*/false).ok());
      }
      for (int r : {1, 2}) ASSERT_TRUE(ranks_[r]->checkpointer->WaitIdle(kTimeout).ok());
    }
  }

  // Every rank restores concurrently (the call is collective).
  std::vector<absl::StatusOr<RestoreResult>> RestoreAll() {
    std::vector<absl::StatusOr<RestoreResult>> results(kWorld, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back(
          [&, r] { results[r] = ranks_[r]->checkpointer->RestoreNewestCommitted(); });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  static inline int counter_ = 0;
  int peer_copies_ = 1;         // > 1: peer backups (set before SetUp, in a derived fixture)
  uint64_t peer_budget_ = 0;
  BackupTransport* transport_ = nullptr;  // the peer backups' (nullptr: TCP)
  std::function<bool()> superseded_;  // CheckpointerOptions::superseded of every rank
  std::string job_;
  TempDir dir_;
  InMemoryStore store_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

TEST_F(CheckpointerTest, AStepIsCommittedOnlyWhenEveryRanksSnapshotAndShardAreRecorded) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10, {0, 1}));
  absl::StatusOr<std::vector<int64_t>> steps = ranks_[0]->checkpointer->CommittedSteps();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_TRUE(steps->empty()) << "two of three ranks must not commit step 10";

  ASSERT_NO_FATAL_FAILURE(SaveAll(10, {2}));
  EXPECT_TRUE(ranks_[2]->outcomes.back().committed);
  EXPECT_TRUE(ranks_[2]->outcomes.back().persisted);
  EXPECT_TRUE(ranks_[2]->outcomes.back().durable_committed);
  steps = ranks_[1]->checkpointer->CommittedSteps();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, std::vector<int64_t>{10});
  // Every rank's shard is on disk and listed.
  absl::StatusOr<std::vector<ShardRecord>> shards = ListCommittedShards(nullptr, dir_.path());
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(shards->size(), 3u);
}

TEST_F(CheckpointerTest, RestoreGivesEveryRankTheNewestCommittedStepFromItsArena) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  ASSERT_NO_FATAL_FAILURE(SaveAll(30, {0, 2}));             // rank 1 "died" before saving 30
  for (int r = 0; r < kWorld; ++r) ranks_[r]->Fill(r, 99);  // training went on

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 20);
    EXPECT_EQ(results[r]->source, "arena");
    EXPECT_TRUE(ranks_[r]->Holds(r, 20)) << "rank " << r;
  }
}

// The worker wakes while idle (every 200 ms, every 20 ms while a commit is unknown): it must not
// process anything then. Over several of its idle polls, each rank reports exactly the one save
// it was given. (A slow machine can only make this pass without testing much, never fail it.)
TEST_F(CheckpointerTest, AnIdleWorkerReportsNothingBeyondTheSavesItWasGiven) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  absl::SleepFor(absl::Milliseconds(700));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ranks_[r]->checkpointer->WaitIdle(kTimeout).ok());  // synchronises with the worker
    ASSERT_EQ(ranks_[r]->outcomes.size(), 1u) << "rank " << r;
    EXPECT_EQ(ranks_[r]->outcomes[0].step, 10);
  }
}

// One rank's save stalls (its backup push to a dead host is pending), so no newer step is
// committed while the others go on saving: they keep the committed snapshot in their arenas, and
// every rank restores it from memory, not from disk.
TEST_F(CheckpointerTest, WhileACommitStallsTheOtherRanksKeepTheCommittedSnapshotInMemory) {
  ASSERT_NO_FATAL_FAILURE(CommitTenThenStall());
  std::filesystem::remove_all(dir_.path());  // only memory can serve 10
  std::filesystem::create_directories(dir_.path());
  for (int r = 0; r < kWorld; ++r) ranks_[r]->Fill(r, 99);
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 10) << "rank " << r;
    EXPECT_EQ(results[r]->source, "arena") << "rank " << r;
    EXPECT_TRUE(ranks_[r]->Holds(r, 10)) << "rank " << r;
  }
}

// After a rollback to an older step, the commits of the abandoned newer steps must not crowd out
// the new timeline's: a fault soon after the rollback restores the new timeline's snapshot from
// memory, not the older one from disk.
TEST_F(CheckpointerTest, AfterARollbackTheNewTimelinesSnapshotIsRestoredFromTheArena) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  ASSERT_NO_FATAL_FAILURE(SaveAll(30));
  // Rank 1 comes back without its arena, and its shards of 20 and 30 are gone: the job rolls
  // back to 10, from disk.
  ranks_[1]->checkpointer.reset();
  ASSERT_TRUE(Snapshotter::RemoveArena(job_, 1).ok());
  absl::StatusOr<std::vector<ShardRecord>> shards = ListCommittedShards(nullptr, dir_.path());
  ASSERT_TRUE(shards.ok()) << shards.status();
  for (const ShardRecord& s : *shards) {
    if (s.rank == 1 && s.step > 10) {
      ASSERT_TRUE(std::filesystem::remove(s.shard_path));
    }
  }
  ASSERT_NO_FATAL_FAILURE(Start(1, /*generation=*/1));
  ranks_[0]->checkpointer->SetGeneration(1);
  ranks_[2]->checkpointer->SetGeneration(1);
  for (const absl::StatusOr<RestoreResult>& result : RestoreAll()) {
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->step, 10);
    ASSERT_EQ(result->source, "disk");
  }
  // The new timeline commits step 15 in memory only, then a fault rolls the job back again.
  for (int r = 0; r < kWorld; ++r) {
    ranks_[r]->Fill(r, 15);
    ASSERT_TRUE(ranks_[r]->checkpointer->Save(15, /*persist=*/false).ok());
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ranks_[r]->checkpointer->WaitIdle(kTimeout).ok());
    ASSERT_TRUE(ranks_[r]->outcomes.back().status.ok()) << ranks_[r]->outcomes.back().status;
    ranks_[r]->Fill(r, 99);  // training went on
  }
  absl::StatusOr<std::vector<int64_t>> steps = ranks_[0]->checkpointer->CommittedSteps();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_THAT(*steps, ::testing::Contains(15));
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 15)
        << "rank " << r << ": " << absl::StrJoin(results[r]->skipped, " / ");
    EXPECT_EQ(results[r]->source, "arena") << "rank " << r;
    EXPECT_TRUE(ranks_[r]->Holds(r, 15)) << "rank " << r;
  }
}

// A rank dies while the ranks restore together (a replacement killed during its takeover): it
// never votes, and a newer generation is published. The others give up with Aborted (then meet in
// the newer generation) instead of waiting out the timeout for it.
TEST_F(CheckpointerTest, ARestoreThatARankNeverJoinsIsAbortedOnceTheGenerationIsSuperseded) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  std::atomic<bool> superseded{true};
  superseded_ = [&superseded] { return superseded.load(); };
  for (int r : {0, 1}) ASSERT_NO_FATAL_FAILURE(Start(r, /*generation=*/1));
  std::vector<absl::StatusOr<RestoreResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {
    threads.emplace_back([&, r] { results[r] = ranks_[r]->checkpointer->RestoreNewestCommitted(); });
  }
  for (std::thread& t : threads) t.join();
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kAborted)
        << "rank " << r << ": " << results[r].status();
    EXPECT_THAT(results[r].status().message(), HasSubstr("a newer generation was published"));
  }
  // In the newer generation every rank takes part, and the restore succeeds.
  superseded = false;
  for (int r = 0; r < kWorld; ++r) ASSERT_NO_FATAL_FAILURE(Start(r, /*generation=*/2));
  for (const absl::StatusOr<RestoreResult>& result : RestoreAll()) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step, 10);
  }
}

TEST_F(CheckpointerTest, AReplacementRestoresTheDeadRanksArenaWithoutDisk) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  // Rank 1's process dies (its arena stays in /dev/shm) and a new process takes its id in
  // generation 1; the disk copy is gone, so only the arena can serve it.
  ranks_[1]->checkpointer.reset();
  std::filesystem::remove_all(dir_.path());
  ranks_[1]->Fill(1, -1);  // the new process starts with garbage
  ASSERT_NO_FATAL_FAILURE(Start(1, /*generation=*/1));
  ranks_[0]->checkpointer->SetGeneration(1);
  ranks_[2]->checkpointer->SetGeneration(1);

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 10);
    EXPECT_EQ(results[r]->source, "arena");
    EXPECT_TRUE(ranks_[r]->Holds(r, 10));
  }
}

TEST_F(CheckpointerTest, RanksWithoutArenasRestoreFromDiskEvenWithAnEmptyStore) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  // The whole job restarts on fresh machines: no arenas, a new store; only the disk remains.
  InMemoryStore fresh;
  for (int r = 0; r < kWorld; ++r) {
    ranks_[r]->checkpointer.reset();
    ASSERT_TRUE(Snapshotter::RemoveArena(job_, r).ok());
    ranks_[r]->client = fresh.NewClient();
    ranks_[r]->Fill(r, -1);
    ASSERT_NO_FATAL_FAILURE(Start(r, 0));
  }
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 20);
    EXPECT_EQ(results[r]->source, "disk");
    EXPECT_TRUE(ranks_[r]->Holds(r, 20));
  }
}

TEST_F(CheckpointerTest, ACorruptShardOnOneRankMovesEveryRankToTheNextOlderStep) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  for (int r = 0; r < kWorld; ++r) {
    ranks_[r]->checkpointer.reset();
    ASSERT_TRUE(Snapshotter::RemoveArena(job_, r).ok());
  }
  // Flip one payload byte of rank 1's shard of step 20.
  std::string victim;
  ASSERT_NO_FATAL_FAILURE(victim = CorruptShard(20, 1));
  for (int r = 0; r < kWorld; ++r) ASSERT_NO_FATAL_FAILURE(Start(r, 0));

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 10) << "rank " << r;
    EXPECT_TRUE(ranks_[r]->Holds(r, 10)) << "rank " << r;
    ASSERT_EQ(results[r]->skipped.size(), 1u);
    // The reason names the step, the rank, the file and the offset.
    EXPECT_THAT(results[r]->skipped[0], HasSubstr("step 20"));
    EXPECT_THAT(results[r]->skipped[0], HasSubstr("rank 1"));
    EXPECT_THAT(results[r]->skipped[0], HasSubstr(victim));
    EXPECT_THAT(results[r]->skipped[0], HasSubstr("offset"));
  }
}

// While the ranks join the restore, ranks 0 and 2 copy step 20 (the newest committed in their
// arenas) back ahead of the agreement; rank 1 lost its arena and its shard of step 20 is corrupt,
// so the ranks agree on step 10, and 0 and 2 restore that over their early copy.
TEST_F(CheckpointerTest, ACopyMadeAheadOfTheAgreementGivesWayToTheStepTheRanksAgreeOn) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  ranks_[1]->checkpointer.reset();
  ASSERT_TRUE(Snapshotter::RemoveArena(job_, 1).ok());
  ASSERT_NO_FATAL_FAILURE(CorruptShard(20, 1));
  ASSERT_NO_FATAL_FAILURE(Start(1, 0));
  for (int r = 0; r < kWorld; ++r) ranks_[r]->Fill(r, 99);

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    EXPECT_EQ(results[r]->step, 10) << "rank " << r;
    EXPECT_EQ(results[r]->source, r == 1 ? "disk" : "arena") << "rank " << r;
    EXPECT_FALSE(results[r]->copied_ahead) << "rank " << r;
    EXPECT_TRUE(ranks_[r]->Holds(r, 10)) << "rank " << r;
  }
}

TEST_F(CheckpointerTest, WithNothingCommittedRestoreIsNotFoundOnEveryRank) {
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(results[r].status().code(), absl::StatusCode::kNotFound) << results[r].status();
  }
}

TEST_F(CheckpointerTest, AZombieRankOfAnOldGenerationCannotVote) {
  ASSERT_TRUE(store_.RaiseFence(1, kTimeout).ok());
  ranks_[0]->client->SetWriterGeneration(0);  // a rank that missed the re-rendezvous
  ranks_[0]->Fill(0, 10);
  ASSERT_TRUE(ranks_[0]->checkpointer->Save(10).ok());
  ASSERT_TRUE(ranks_[0]->checkpointer->WaitIdle(kTimeout).ok());
  ASSERT_FALSE(ranks_[0]->outcomes.empty());
  const absl::Status& status = ranks_[0]->outcomes.back().status;
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("step 10"));
}

TEST_F(CheckpointerTest, ASecondSaveWhileTheFirstIsInFlightIsRefusedAndTheFirstCompletes) {
  // The observer runs on the worker before the save counts as finished: holding it until the
  // second Save has been tried keeps the first in flight, so the refusal is certain rather than a
  // race with the worker (which a fast machine lost and the test then asserted nothing).
  Rank& rank = *ranks_[0];
  Notification second_tried;
  rank.checkpointer->set_observer([&](const SaveOutcome& o) {
    (void)second_tried.WaitForNotificationWithTimeout(kTimeout);
    rank.outcomes.push_back(o);
  });
  rank.Fill(0, 10);
  ASSERT_TRUE(rank.checkpointer->Save(10).ok());
  const absl::Status second = rank.checkpointer->Save(11);
  second_tried.Notify();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("step 10"));
  ASSERT_TRUE(rank.checkpointer->WaitIdle(kTimeout).ok());
  ASSERT_EQ(rank.outcomes.size(), 1u) << "the refused save must not run";
  EXPECT_EQ(rank.outcomes[0].step, 10);
  EXPECT_TRUE(rank.outcomes[0].status.ok()) << rank.outcomes[0].status;
}

// ---- peer backups: three ranks, each a host of its own, two copies of every snapshot ----

class CheckpointerPeerTest : public CheckpointerTest {
 protected:
  CheckpointerPeerTest() { peer_copies_ = 2; }

  // Rank r's host is lost: its process, its arena and the backups it held are gone.
  void LoseHost(int r) {
    ranks_[r]->checkpointer.reset();
    ASSERT_TRUE(Snapshotter::RemoveArena(job_, r).ok());
    const std::vector<int> held = OptionsFor(r, 0).peer_backups->placement.SourceRanks(r);
    ASSERT_TRUE(BackupService::RemoveArenas(job_, held).ok());
  }

  // Rank r's replacement starts in `generation`, its buffers holding no saved step, and the
  // survivors move to that generation.
  void StartReplacement(int r, int64_t generation) {
    ranks_[r]->Fill(r, -1);
    ASSERT_NO_FATAL_FAILURE(Start(r, generation));
    for (int other = 0; other < kWorld; ++other) {
      if (other != r) ranks_[other]->checkpointer->SetGeneration(generation);
    }
  }

  // Every rank restored `step` and holds it: rank `replaced` from `source`, the others from their
  // arenas.
  void ExpectRestored(const std::vector<absl::StatusOr<RestoreResult>>& results, int64_t step,
                      int replaced, const std::string& source) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->step, step) << "rank " << r;
      EXPECT_EQ(results[r]->source, r == replaced ? source : "arena") << "rank " << r;
      EXPECT_TRUE(ranks_[r]->Holds(r, step)) << "rank " << r;
    }
  }
};

// Issue 36: a rank that fails at start-up before it publishes its arena size (its host's
// /dev/shm too small) left the ranks holding its backups waiting for it in the memory-budget check
// until their timeout, past the newer generation that replaced it. Rank 0 holds rank 2's backups;
// in a store where rank 2 never published, rank 0's start-up gives up once its generation is
// superseded, naming rank 2.
TEST_F(CheckpointerPeerTest, AStartUpWaitingForARankThatNeverPublishedItsSizeEndsWithANewerGeneration) {
  InMemoryStore fresh;  // rank 2 never got as far as publishing its size here
  ranks_[0]->checkpointer.reset();
  ranks_[0]->client = fresh.NewClient();
  superseded_ = [] { return true; };
  const absl::Status started = Create(0, /*generation=*/1);
  EXPECT_EQ(started.code(), absl::StatusCode::kAborted) << started;
  EXPECT_THAT(started.message(), HasSubstr("a newer generation was published meanwhile"));
  EXPECT_THAT(started.message(), HasSubstr("rank(s) 2 never published theirs"));
}

TEST_F(CheckpointerPeerTest, AStepIsCommittedInMemoryOnlyWithEveryRanksBackupsComplete) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(ranks_[r]->outcomes.back().replicated) << "rank " << r;
  }
  // Rank 1 holds rank 0's backups (host slot 0 -> 1); with rank 1 gone, rank 0's save of step 20
  // cannot be backed up, so it does not vote and step 20 is never committed in memory.
  ranks_[1]->checkpointer.reset();
  ranks_[0]->Fill(0, 20);
  ASSERT_TRUE(ranks_[0]->checkpointer->Save(20).ok());
  ASSERT_TRUE(ranks_[0]->checkpointer->WaitIdle(kTimeout).ok());
  const SaveOutcome& outcome = ranks_[0]->outcomes.back();
  EXPECT_FALSE(outcome.replicated);
  EXPECT_FALSE(outcome.committed);
  EXPECT_THAT(std::string(outcome.status.message()), HasSubstr("the backup of step 20 to rank 1"));
  // Persistence is unchanged: the shard is on disk all the same.
  EXPECT_TRUE(outcome.persisted);
}

TEST_F(CheckpointerPeerTest, AReplacementForALostHostRestoresFromItsHolderWithoutDisk) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  ASSERT_NO_FATAL_FAILURE(LoseHost(1));
  std::filesystem::remove_all(dir_.path());  // no disk either: only rank 2's memory can serve it
  ASSERT_NO_FATAL_FAILURE(StartReplacement(1, /*generation=*/1));
  for (int r = 0; r < kWorld; ++r) ranks_[r]->Fill(r, 99);

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  ASSERT_NO_FATAL_FAILURE(ExpectRestored(results, 20, 1, "peer host host2"));
  // The placement is whole again: every rank pushed its restored snapshot to its holders (rank 1
  // received rank 0's), and the last one recorded the job protected in the new epoch.
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(ranks_[r]->checkpointer->WaitIdle(kTimeout).ok());
  int protected_again = 0;
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(ranks_[r]->outcomes.empty());
    const SaveOutcome& o = ranks_[r]->outcomes.back();
    EXPECT_TRUE(o.reprotect) << "rank " << r;
    EXPECT_TRUE(o.status.ok()) << "rank " << r << ": " << o.status;
    protected_again += o.protected_again ? 1 : 0;
  }
  EXPECT_EQ(protected_again, 1);
  absl::StatusOr<std::string> mark = store_.Get("ckpt/protected", kTimeout);
  ASSERT_TRUE(mark.ok()) << mark.status();
  EXPECT_THAT(*mark, ::testing::StartsWith("20 g1."));
  // Rank 0's backup is on the new rank 1 again: losing rank 0's host now is survivable.
  ASSERT_NO_FATAL_FAILURE(LoseHost(0));
  ASSERT_NO_FATAL_FAILURE(Start(0, /*generation=*/2));
  ranks_[1]->checkpointer->SetGeneration(2);
  ranks_[2]->checkpointer->SetGeneration(2);
  results = RestoreAll();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[0]->source, "peer host host1");
}

// A commit that stalls (rank 0 saves nothing after step 10; ranks 1 and 2 save 15 and 20, never
// committed) must not cost step 10 its backups: each push names the committed step it keeps, and
// the holders overwrite the uncommitted backup instead. Rank 1's host is then lost, and with no
// disk its replacement restores step 10 from rank 2's memory. Rank 0, which trained no further,
// finds its buffers holding step 10 and copies nothing of them.
TEST_F(CheckpointerPeerTest, WhileACommitStallsTheHoldersKeepTheCommittedStepsBackups) {
  ASSERT_NO_FATAL_FAILURE(CommitTenThenStall());
  for (int r : {1, 2}) {
    for (const SaveOutcome& o : {ranks_[r]->outcomes.end()[-2], ranks_[r]->outcomes.back()}) {
      EXPECT_TRUE(o.replicated) << "rank " << r << " step " << o.step;
      EXPECT_FALSE(o.committed) << "rank " << r << " step " << o.step;
    }
  }
  ASSERT_NO_FATAL_FAILURE(LoseHost(1));
  std::filesystem::remove_all(dir_.path());  // only memory can serve step 10
  std::filesystem::create_directories(dir_.path());
  ASSERT_NO_FATAL_FAILURE(StartReplacement(1, /*generation=*/1));
  ranks_[2]->Fill(2, 99);
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  ASSERT_NO_FATAL_FAILURE(ExpectRestored(results, 10, 1, "peer host host2"));
  EXPECT_EQ(results[0]->bytes_held, 2 * 4096u);  // the weights' two whole chunks
  EXPECT_EQ(results[2]->bytes_held, 0u);
  // Both survivors copied step 10 back while rank 1 joined the restore, before the agreement.
  EXPECT_TRUE(results[0]->copied_ahead);
  EXPECT_TRUE(results[2]->copied_ahead);
  EXPECT_FALSE(results[1]->copied_ahead);
}

TEST_F(CheckpointerPeerTest, ACorruptBackupIsNeverRestoredAndTheDiskServesInstead) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ranks_[1]->checkpointer.reset();
  ASSERT_TRUE(Snapshotter::RemoveArena(job_, 1).ok());
  {
    // Rank 1's backup, held by rank 2: flip the first payload byte of both slots.
    const std::string path = absl::StrCat("/dev/shm/trainguard.", job_, ".backup.rank1");
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    uint64_t capacity = 0, slot_header = 0;
    f.seekg(32);
    f.read(reinterpret_cast<char*>(&capacity), 8);
    f.seekg(48);
    f.read(reinterpret_cast<char*>(&slot_header), 8);
    for (uint64_t off : {4096 + 2 * slot_header, 4096 + 2 * slot_header + capacity}) {
      char c = 0;
      f.seekg(static_cast<std::streamoff>(off));
      f.read(&c, 1);
      c = static_cast<char>(~c);
      f.seekp(static_cast<std::streamoff>(off));
      f.write(&c, 1);
    }
    ASSERT_TRUE(f.good());
  }
  ranks_[1]->Fill(1, -1);
  ASSERT_NO_FATAL_FAILURE(Start(1, /*generation=*/1));
  ranks_[0]->checkpointer->SetGeneration(1);
  ranks_[2]->checkpointer->SetGeneration(1);
  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[1]->source, "disk");
  EXPECT_TRUE(ranks_[1]->Holds(1, 10));
}

// The same, every backup service and fetch on one in-memory transport, whose connections a test
// can drop in the middle of a transfer.
class CheckpointerPeerDropTest : public CheckpointerPeerTest {
 protected:
  CheckpointerPeerDropTest() { transport_ = &in_memory_; }
  InMemoryBackupTransport in_memory_{4096};
};

// The only holder of rank 1's backups (rank 2) dies in the middle of the replacement's fetch: its
// connection drops after the reply and two and a half chunks. Nothing of the fetch is installed,
// the replacement restores the same step from disk, verified, and says why the peers' memory did
// not serve it; the survivors restore from their arenas.
TEST_F(CheckpointerPeerDropTest, AHolderThatDiesMidFetchLeavesTheRestoreToTheDisk) {
  ASSERT_NO_FATAL_FAILURE(SaveAll(10));
  ASSERT_NO_FATAL_FAILURE(SaveAll(20));
  ASSERT_NO_FATAL_FAILURE(LoseHost(1));
  InMemoryStreamFaults drop;
  drop.drop_after_received_bytes = 4096 + 4096 * 2 + 2048;  // the reply is well under 4 KiB
  in_memory_.set_faults(drop);
  ASSERT_NO_FATAL_FAILURE(StartReplacement(1, /*generation=*/1));
  for (int r = 0; r < kWorld; ++r) ranks_[r]->Fill(r, 99);

  std::vector<absl::StatusOr<RestoreResult>> results = RestoreAll();
  ASSERT_NO_FATAL_FAILURE(ExpectRestored(results, 20, 1, "disk"));
  const std::string skipped = absl::StrJoin(results[1]->skipped, "; ");
  EXPECT_THAT(skipped, HasSubstr("step 20 from peer memory"));
  EXPECT_THAT(skipped, HasSubstr("holder rank(s) 2 on host(s) host2"));
  EXPECT_THAT(skipped, HasSubstr("connection dropped"));
}

class CheckpointerBudgetTest : public CheckpointerTest {
 protected:
  CheckpointerBudgetTest() {
    peer_copies_ = 2;
    peer_budget_ = 1;  // one byte: nothing fits
  }
  void SetUp() override {}  // Create must fail: the test drives it
};

TEST_F(CheckpointerBudgetTest, AHostWhoseArenasAndBackupsExceedTheBudgetIsRefusedAtStart) {
  ranks_.push_back(std::make_unique<Rank>());
  Rank& rank = *ranks_.back();
  ASSERT_TRUE(rank.registry
                  .Register({"weights", "model", rank.weights.data(),
                             rank.weights.size() * sizeof(float), DType::kF32,
                             {static_cast<int64_t>(rank.weights.size())}, Device::Host()})
                  .ok());
  rank.client = store_.NewClient();
  // The other ranks' arena sizes, as they would have published them.
  for (int r = 1; r < kWorld; ++r) {
    ASSERT_TRUE(store_.Set(absl::StrCat("ckpt/backup/size/", r), "1048576", kTimeout).ok());
  }
  job_ = absl::StrCat("ckpt-budget-", getpid());
  absl::StatusOr<std::unique_ptr<Checkpointer>> c =
      Checkpointer::Create(&rank.registry, OptionsFor(0, 0));
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("host slot 0 needs"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("backup_memory_budget_mib"));
}

TEST(CheckpointerStatic, ASingleRankJobWithoutAStoreRestoresFromItsArenaThenFromDisk) {
  TempDir dir;
  const std::string job = absl::StrCat("ckpt-static-", getpid());
  std::vector<float> w(2000);
  StateRegistry registry;
  ASSERT_TRUE(registry.Register({"w", "", w.data(), w.size() * 4, DType::kF32, {2000}, {}}).ok());
  CheckpointerOptions o;
  o.job_id = job;
  o.dir = dir.path();
  o.chunk_bytes = 4096;
  {
    absl::StatusOr<std::unique_ptr<Checkpointer>> c = Checkpointer::Create(&registry, o);
    ASSERT_TRUE(c.ok()) << c.status();
    std::fill(w.begin(), w.end(), 7.0f);
    ASSERT_TRUE((*c)->Save(5).ok());
    ASSERT_TRUE((*c)->WaitIdle(kTimeout).ok());
    std::fill(w.begin(), w.end(), 0.0f);
    absl::StatusOr<RestoreResult> r = (*c)->RestoreNewestCommitted();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 5);
    EXPECT_EQ(r->source, "arena");
    EXPECT_EQ(w[1999], 7.0f);
  }
  ASSERT_TRUE(Snapshotter::RemoveArena(job, 0).ok());  // a new machine
  std::fill(w.begin(), w.end(), 0.0f);
  absl::StatusOr<std::unique_ptr<Checkpointer>> c = Checkpointer::Create(&registry, o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<RestoreResult> r = (*c)->RestoreNewestCommitted();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 5);
  EXPECT_EQ(r->source, "disk");
  EXPECT_EQ(w[0], 7.0f);
  c->reset();
  (void)Snapshotter::RemoveArena(job, 0);
}

}  // namespace
}  // namespace trainguard
