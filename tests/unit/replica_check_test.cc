// Silent data corruption (sdk/checkpoint/replica_check.h): the verdict on a ballot as a pure
// function, the replica digests the Snapshotter takes while it checksums a snapshot, and the
// Checkpointer's judged ballot with ranks as threads over the in-memory store (a bit flipped in one
// rank's replicated buffer: named, never committed, never persisted, never restored).
// tests/integration/launcher_test.cc flips a bit in a real trainer process.
#include "sdk/checkpoint/replica_check.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/checkpoint/payload_layout.h"
#include "sdk/checkpoint/persister.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/core/mutex.h"
#include "sdk/health/compute_canary.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ReplicaReport Report(int rank, std::string group, uint64_t fingerprint) {
  return ReplicaReport{rank, std::move(group), absl::StrCat("host", rank), fingerprint};
}

// ---- the verdict, a pure function ----

TEST(JudgeReplicasTest, ReplicasThatAgreeAndRanksAloneInTheirGroupAreNotJudged) {
  EXPECT_TRUE(JudgeReplicas({Report(0, "tp0", 7), Report(1, "tp1", 8), Report(2, "tp0", 7),
                             Report(3, "tp1", 8), Report(4, "tp2", 9)})
                  .empty());
  EXPECT_TRUE(JudgeReplicas({}).empty());
}

TEST(JudgeReplicasTest, TheMinorityOfAGroupIsNamedWithTheMajoritysFingerprintAndAReference) {
  const std::vector<ReplicaDisagreement> judged =
      JudgeReplicas({Report(0, "tp0", 7), Report(1, "tp1", 8), Report(2, "tp0", 6),
                     Report(3, "tp1", 8), Report(4, "tp0", 7), Report(5, "tp1", 8)});
  ASSERT_EQ(judged.size(), 1u);
  const ReplicaDisagreement& d = judged[0];
  EXPECT_EQ(d.group, "tp0");
  EXPECT_THAT(d.ranks, ElementsAre(0, 2, 4));
  EXPECT_THAT(d.hosts, ElementsAre("host0", "host2", "host4"));
  EXPECT_THAT(d.fingerprints, ElementsAre(7, 6, 7));
  ASSERT_TRUE(d.majority.has_value());
  EXPECT_EQ(*d.majority, 7u);
  EXPECT_THAT(d.minority, ElementsAre(2));
  EXPECT_EQ(d.reference, 0);
}

TEST(JudgeReplicasTest, TwoReplicasThatDisagreeAreUndecidableAndNobodyIsNamed) {
  const std::vector<ReplicaDisagreement> judged =
      JudgeReplicas({Report(1, "g", 5), Report(0, "g", 4)});
  ASSERT_EQ(judged.size(), 1u);
  EXPECT_FALSE(judged[0].majority.has_value());
  EXPECT_TRUE(judged[0].minority.empty());
  EXPECT_EQ(judged[0].reference, -1);
  EXPECT_THAT(judged[0].ranks, ElementsAre(0, 1));
  EXPECT_THAT(DescribeDisagreement(12, judged[0]),
              HasSubstr("its 2 replicas disagree and no majority decides"));
}

TEST(JudgeReplicasTest, HalfAgainstHalfAndAllDifferentAreUndecidableToo) {
  for (const std::vector<ReplicaReport>& reports :
       {std::vector<ReplicaReport>{Report(0, "g", 1), Report(1, "g", 1), Report(2, "g", 2),
                                   Report(3, "g", 2)},
        std::vector<ReplicaReport>{Report(0, "g", 1), Report(1, "g", 2), Report(2, "g", 3)}}) {
    const std::vector<ReplicaDisagreement> judged = JudgeReplicas(reports);
    ASSERT_EQ(judged.size(), 1u);
    EXPECT_FALSE(judged[0].majority.has_value());
    EXPECT_TRUE(judged[0].minority.empty());
  }
}

TEST(JudgeReplicasTest, TwoCorruptRanksOfFiveAreBothNamed) {
  const std::vector<ReplicaDisagreement> judged =
      JudgeReplicas({Report(0, "g", 1), Report(1, "g", 2), Report(2, "g", 1), Report(3, "g", 3),
                     Report(4, "g", 1)});
  ASSERT_EQ(judged.size(), 1u);
  EXPECT_THAT(judged[0].minority, ElementsAre(1, 3));
  EXPECT_EQ(judged[0].reference, 0);
}

TEST(ReplicaVoteTest, TheReplicaPartOfAVoteRoundTripsAndAVoteWithoutOneHasNone) {
  const std::string vote =
      "00000000000000aa" + EncodeReplicaVote({3, "tp1.cp0.pp2", "node-7", 0x1234abcd});
  absl::StatusOr<std::optional<ReplicaReport>> r = DecodeReplicaVote(3, vote);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->rank, 3);
  EXPECT_EQ((*r)->group, "tp1.cp0.pp2");
  EXPECT_EQ((*r)->host, "node-7");
  EXPECT_EQ((*r)->fingerprint, 0x1234abcdu);
  absl::StatusOr<std::optional<ReplicaReport>> none = DecodeReplicaVote(0, "00000000000000aa");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ReplicaVoteTest, SeparatorsInAGroupOrHostAreReplacedSoTheVoteStillParses) {
  absl::StatusOr<std::optional<ReplicaReport>> r =
      DecodeReplicaVote(0, EncodeReplicaVote({0, "a b:c", "h@st:1", 9}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->group, "a_b_c");
  EXPECT_EQ((*r)->host, "h_st_1");
}

TEST(ReplicaVoteTest, AMalformedReplicaPartIsAnErrorNamingTheRank) {
  for (const std::string vote :
       {"ff replica=g:12@h", "ff replica=g", "ff replica=g:zzzzzzzzzzzzzzzz@h"}) {
    absl::StatusOr<std::optional<ReplicaReport>> r = DecodeReplicaVote(4, vote);
    ASSERT_FALSE(r.ok()) << vote;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("rank 4"));
  }
}

TEST(ReplicaVoteTest, AVoteWithAReplicaAndACanaryPartDecodesBoth) {
  const std::string vote = "00000000000000aa" + EncodeReplicaVote({2, "tp0.cp0.pp0", "node-1", 5}) +
                           EncodeCanaryVote(0xabcdef, "node-1");
  absl::StatusOr<std::optional<ReplicaReport>> replica = DecodeReplicaVote(2, vote);
  absl::StatusOr<std::optional<ReplicaReport>> canary = DecodeCanaryVote(2, vote);
  ASSERT_TRUE(replica.ok() && replica->has_value()) << replica.status();
  ASSERT_TRUE(canary.ok() && canary->has_value()) << canary.status();
  EXPECT_EQ((*replica)->host, "node-1");
  EXPECT_EQ((*replica)->fingerprint, 5u);
  EXPECT_EQ((*canary)->group, kCanaryGroup);
  EXPECT_EQ((*canary)->host, "node-1");
  EXPECT_EQ((*canary)->fingerprint, 0xabcdefu);
  EXPECT_FALSE(DecodeCanaryVote(0, "ff canary=123@h").ok());
  EXPECT_FALSE(DecodeCanaryVote(0, "ff")->has_value());
}

TEST(JudgeReplicasTest, ACanaryThatDiffersNamesTheRankAndItsHostAsWrongArithmetic) {
  const std::vector<ReplicaDisagreement> judged =
      JudgeReplicas({Report(0, kCanaryGroup, 7), Report(1, kCanaryGroup, 7),
                     Report(2, kCanaryGroup, 7), Report(3, kCanaryGroup, 8)});
  ASSERT_EQ(judged.size(), 1u);
  EXPECT_THAT(judged[0].minority, ElementsAre(3));
  EXPECT_EQ(DescribeDisagreement(9, judged[0]),
            "step 9: compute canary: rank 3 (host host3) computed 0000000000000008, the job's "
            "majority 0000000000000007 (rank 0): its arithmetic is wrong");
}

TEST(ReplicaDigestsTest, DigestsRoundTripAndMalformedTextIsRefused) {
  const std::vector<uint64_t> d = {0, 1, 0xffffffffffffffffull, 0x0123456789abcdefull};
  absl::StatusOr<std::vector<uint64_t>> back = DecodeDigests(EncodeDigests(d));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, d);
  EXPECT_TRUE(DecodeDigests("")->empty());
  EXPECT_FALSE(DecodeDigests("0123,45").ok());
}

TEST(DifferingBuffersTest, TheFirstDifferingPieceOfEachChunkIsNamedEachBufferOnce) {
  // Chunk 0: a, b; chunk 1: b (continued), c; chunk 2: c (continued).
  const std::vector<Snapshotter::ReplicaPiece> pieces = {
      {"a", 0, 0, 10}, {"b", 0, 0, 20}, {"b", 1, 20, 5}, {"c", 1, 0, 8}, {"c", 2, 8, 8}};
  const std::vector<uint64_t> ok = {1, 2, 3, 4, 5};
  EXPECT_TRUE(DifferingBuffers(pieces, ok, ok).empty());
  // a differs: b's digest in chunk 0 covers a too, so it differs without being named.
  EXPECT_THAT(DifferingBuffers(pieces, ok, {9, 9, 3, 4, 5}), ElementsAre("a"));
  // b differs in chunk 0 only.
  EXPECT_THAT(DifferingBuffers(pieces, ok, {1, 9, 3, 4, 5}), ElementsAre("b"));
  // b in chunk 1 (and so c after it) and c in chunk 2.
  EXPECT_THAT(DifferingBuffers(pieces, ok, {1, 2, 9, 9, 9}), ElementsAre("b", "c"));
  // Digests of another layout name nothing.
  EXPECT_TRUE(DifferingBuffers(pieces, ok, {1, 2}).empty());
}

// ---- the compute canary ----

TEST(ComputeCanaryTest, TheProductIsAMatrixProductAndItsFingerprintIsTheSameEveryTime) {
  const std::vector<float> c = CanaryProduct();
  ASSERT_EQ(c.size(), static_cast<size_t>(kCanaryDim * kCanaryDim));
  EXPECT_EQ(CanaryProduct(), c);
  EXPECT_EQ(ComputeCanary(), ComputeCanary());
  // Entries of a product of [-1, 1) inputs: finite, of the order of sqrt(96), not all alike.
  float lowest = c[0], highest = c[0];
  for (float v : c) {
    ASSERT_TRUE(std::isfinite(v));
    lowest = std::min(lowest, v);
    highest = std::max(highest, v);
  }
  EXPECT_LT(lowest, -1.0f);
  EXPECT_GT(highest, 1.0f);
  EXPECT_LT(highest, 40.0f);
}

// ---- the replica digests a snapshot takes ----

constexpr size_t kChunk = 8192;

// One replica: a small replicated buffer "a" (sharing a chunk with "b"), a replicated buffer "b"
// that spans chunks, and a non-replicated "own" registered between them, with values of its own,
// which (with the blobs) lies in the last chunk of the replicated region.
struct Replica {
  std::vector<float> a = std::vector<float>(300, 1.5f);
  std::vector<uint16_t> b = std::vector<uint16_t>(3000, 0x3f80);  // bf16 ones
  std::vector<float> own;
  StateRegistry registry;
  std::unique_ptr<Snapshotter> snapshotter;

  Replica(const std::string& job, int rank, size_t chunk_bytes = kChunk) : own(1000, rank + 0.5f) {
    EXPECT_TRUE(registry
                    .Register({"a",
                               "model",
                               a.data(),
                               a.size() * 4,
                               DType::kF32,
                               {static_cast<int64_t>(a.size())},
                               Device::Host(),
                               true})
                    .ok());
    EXPECT_TRUE(registry
                    .Register({"own",
                               "optimizer",
                               own.data(),
                               own.size() * 4,
                               DType::kF32,
                               {static_cast<int64_t>(own.size())},
                               Device::Host()})
                    .ok());
    EXPECT_TRUE(registry
                    .Register({"b",
                               "model",
                               b.data(),
                               b.size() * 2,
                               DType::kBF16,
                               {static_cast<int64_t>(b.size())},
                               Device::Host(),
                               true})
                    .ok());
    EXPECT_TRUE(registry.SetBlob("rng", absl::StrCat("rank", rank)).ok());
    SnapshotterOptions o;
    o.job_id = job;
    o.rank = rank;
    o.chunk_bytes = chunk_bytes;
    o.copy_threads = 2;
    absl::StatusOr<std::unique_ptr<Snapshotter>> s = Snapshotter::Create(&registry, o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) snapshotter = *std::move(s);
  }

  std::vector<uint64_t> Snapshot(int64_t step) {
    EXPECT_TRUE(snapshotter->Begin(step).ok());
    EXPECT_TRUE(snapshotter->Fence(absl::Seconds(30)).ok());
    absl::StatusOr<Snapshotter::View> view = snapshotter->LatestView();
    EXPECT_TRUE(view.ok()) << view.status();
    return view.ok() ? view->replica_digests : std::vector<uint64_t>{};
  }
};

class ReplicaDigestsSnapshotTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (int r = 0; r < 2; ++r) (void)Snapshotter::RemoveArena(job_, r);
  }
  const std::string job_ = absl::StrCat("replica-digests-", getpid());
};

TEST_F(ReplicaDigestsSnapshotTest, ReplicatedBuffersLieFirstAndTheLayoutHashSaysSo) {
  Replica r(job_, 0);
  const PayloadLayout layout = LayoutOf(r.registry);
  // a at 0, b after it (4096-aligned), own after the replicated region.
  EXPECT_EQ(layout.offsets[0], 0u);
  EXPECT_EQ(layout.offsets[2], 4096u);
  EXPECT_EQ(layout.replicated_bytes, 4096u + 8192u);
  EXPECT_EQ(layout.offsets[1], layout.replicated_bytes);
  EXPECT_EQ(LayoutHashOf(layout.buffers), r.registry.LayoutHash());
  StateRegistry plain;
  for (StateBuffer b : r.registry.buffers()) {
    b.replicated = false;
    ASSERT_TRUE(plain.Register(b).ok());
  }
  EXPECT_NE(plain.LayoutHash(), r.registry.LayoutHash());
  EXPECT_EQ(LayoutOf(plain).replicated_bytes, 0u);
  EXPECT_EQ(LayoutOf(plain).offsets[1], 4096u);  // registry order, as always
}

TEST_F(ReplicaDigestsSnapshotTest, ReplicasWithTheSameReplicatedBytesHaveTheSameDigests) {
  Replica r0(job_, 0), r1(job_, 1);  // "own" differs
  const std::vector<Snapshotter::ReplicaPiece>& pieces = r0.snapshotter->replica_pieces();
  // a in chunk 0; b in chunks 0 and 1 (from 4096, 6000 bytes); own after them in chunk 1.
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].buffer, "a");
  EXPECT_EQ(pieces[1].buffer, "b");
  EXPECT_EQ(pieces[2].chunk, 1);
  const std::vector<uint64_t> d0 = r0.Snapshot(5);
  const std::vector<uint64_t> d1 = r1.Snapshot(5);
  ASSERT_EQ(d0.size(), pieces.size());
  EXPECT_EQ(d0, d1);
  EXPECT_EQ(ReplicaFingerprint(d0), ReplicaFingerprint(d1));
  // The whole snapshots differ ("own"); each restores (its streamed chunk checksums are the
  // chunks' XXH3-64, as every restore checks them).
  EXPECT_NE(r0.snapshotter->LatestComplete()->fingerprint,
            r1.snapshotter->LatestComplete()->fingerprint);
  EXPECT_TRUE(r1.snapshotter->RestoreLatest(&r1.registry).ok());
}

// The non-replicated buffer and the blob area in the region's (only) chunk are copied as they
// are: the digests take nothing from them and zero only the padding between buffers.
TEST_F(ReplicaDigestsSnapshotTest, EveryByteOfTheRegionsLastChunkRestores) {
  Replica r0(job_, 0, /*chunk_bytes=*/32768);
  ASSERT_EQ(r0.snapshotter->replicated_chunks(), 1);
  EXPECT_FALSE(r0.Snapshot(5).empty());
  std::fill(r0.a.begin(), r0.a.end(), 0.0f);
  std::fill(r0.b.begin(), r0.b.end(), 0);
  std::fill(r0.own.begin(), r0.own.end(), -1.0f);
  ASSERT_TRUE(r0.registry.SetBlob("rng", "changed").ok());
  ASSERT_TRUE(r0.snapshotter->RestoreLatest(&r0.registry).ok());
  EXPECT_EQ(r0.a, std::vector<float>(300, 1.5f));
  EXPECT_EQ(r0.b, std::vector<uint16_t>(3000, 0x3f80));
  EXPECT_EQ(r0.own, std::vector<float>(1000, 0.5f));
  EXPECT_EQ(*r0.registry.GetBlob("rng"), "rank0");
}

TEST_F(ReplicaDigestsSnapshotTest, OneFlippedBitNamesItsBufferAndOnlyItsBuffer) {
  Replica r0(job_, 0), r1(job_, 1);
  const std::vector<Snapshotter::ReplicaPiece>& pieces = r0.snapshotter->replica_pieces();
  const std::vector<uint64_t> clean = r0.Snapshot(1);
  // A bit of b, in its second chunk.
  r1.b[2500] ^= 1u << 4;
  EXPECT_THAT(DifferingBuffers(pieces, clean, r1.Snapshot(1)), ElementsAre("b"));
  r1.b[2500] ^= 1u << 4;
  // A bit of a, which shares chunk 0 with b: a is named, not b.
  uint32_t bits;
  std::memcpy(&bits, &r1.a[100], 4);
  bits ^= 1u;
  std::memcpy(&r1.a[100], &bits, 4);
  EXPECT_THAT(DifferingBuffers(pieces, clean, r1.Snapshot(2)), ElementsAre("a"));
  // Non-replicated state never enters the digests.
  std::memcpy(&r1.a[100], &r0.a[100], 4);
  r1.own[3] = 42.0f;
  EXPECT_EQ(r1.Snapshot(3), clean);
}

TEST_F(ReplicaDigestsSnapshotTest, ASnapshotNotCopiedByThisProcessHasNoDigests) {
  {
    Replica first(job_, 0);
    EXPECT_FALSE(first.Snapshot(4).empty());
  }
  Replica again(job_, 0);  // reopens the arena the first left
  absl::StatusOr<Snapshotter::View> view = again.snapshotter->LatestView();
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->info.step, 4);
  EXPECT_TRUE(view->replica_digests.empty());
}

// ---- the judged ballot: ranks as threads over the in-memory store ----

class SilentCorruptionTest : public ::testing::Test {
 protected:
  struct Rank {
    std::vector<float> weights = std::vector<float>(3000);
    std::vector<uint16_t> half = std::vector<uint16_t>(2000);  // fp16 state
    std::vector<float> own = std::vector<float>(500);
    StateRegistry registry;
    std::unique_ptr<Store> client;
    std::unique_ptr<Checkpointer> checkpointer;
    Mutex mu;
    std::vector<SaveOutcome> outcomes;
  };

  // `canary`: each rank's compute canary (none when empty).
  void Start(int world, std::function<uint64_t(int rank)> canary = nullptr) {
    world_ = world;
    job_ = absl::StrCat("sdc-test-", getpid(), "-", ++counter_);
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(std::make_unique<Rank>());
      Rank& rank = *ranks_.back();
      ASSERT_TRUE(rank.registry
                      .Register({"weights",
                                 "model",
                                 rank.weights.data(),
                                 rank.weights.size() * 4,
                                 DType::kF32,
                                 {},
                                 Device::Host(),
                                 true})
                      .ok());
      ASSERT_TRUE(rank.registry
                      .Register({"exp_avg_sq",
                                 "optimizer",
                                 rank.half.data(),
                                 rank.half.size() * 2,
                                 DType::kF16,
                                 {},
                                 Device::Host(),
                                 true})
                      .ok());
      ASSERT_TRUE(rank.registry
                      .Register({"rng_state",
                                 "",
                                 rank.own.data(),
                                 rank.own.size() * 4,
                                 DType::kF32,
                                 {},
                                 Device::Host()})
                      .ok());
      rank.client = store_.NewClient();
      CheckpointerOptions o;
      o.job_id = job_;
      o.rank = r;
      o.world_size = world;
      o.dir = dir_.path();
      o.chunk_bytes = 4096;
      o.copy_threads = 2;
      o.store = rank.client.get();
      o.timeout = absl::Seconds(30);
      o.replica_group = "tp0.cp0.pp0";
      o.host = absl::StrCat("host", r);
      if (canary) o.canary = [canary, r] { return canary(r); };
      absl::StatusOr<std::unique_ptr<Checkpointer>> c = Checkpointer::Create(&rank.registry, o);
      ASSERT_TRUE(c.ok()) << c.status();
      rank.checkpointer = *std::move(c);
      rank.checkpointer->set_observer([&rank](const SaveOutcome& outcome) {
        MutexLock lock(&rank.mu);
        rank.outcomes.push_back(outcome);
      });
    }
  }

  void TearDown() override {
    for (auto& rank : ranks_) rank->checkpointer.reset();
    for (int r = 0; r < world_; ++r) (void)Snapshotter::RemoveArena(job_, r);
  }

  // Every rank's replicated state of `step` (bit-identical across ranks), its own state differs.
  void Fill(int64_t step) {
    for (int r = 0; r < world_; ++r) {
      Rank& rank = *ranks_[r];
      for (size_t i = 0; i < rank.weights.size(); ++i) rank.weights[i] = step + i * 1e-3f;
      for (size_t i = 0; i < rank.half.size(); ++i) rank.half[i] = static_cast<uint16_t>(step + i);
      for (size_t i = 0; i < rank.own.size(); ++i) rank.own[i] = r * 100.0f + step;
    }
  }

  // Every rank saves `step` and waits for its worker; returns each rank's outcome.
  std::vector<SaveOutcome> SaveAll(int64_t step) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world_; ++r) {
      threads.emplace_back([this, r, step] {
        EXPECT_TRUE(ranks_[r]->checkpointer->Save(step, true).ok());
        EXPECT_TRUE(ranks_[r]->checkpointer->WaitIdle(absl::Seconds(60)).ok());
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<SaveOutcome> out;
    for (auto& rank : ranks_) {
      MutexLock lock(&rank->mu);
      EXPECT_FALSE(rank->outcomes.empty());
      if (!rank->outcomes.empty()) out.push_back(rank->outcomes.back());
    }
    return out;
  }

  // The committed step every rank restores together.
  int64_t RestoreAll() {
    std::vector<int64_t> steps(world_, -2);
    std::vector<std::thread> threads;
    for (int r = 0; r < world_; ++r) {
      threads.emplace_back([this, r, &steps] {
        absl::StatusOr<RestoreResult> restored = ranks_[r]->checkpointer->RestoreNewestCommitted();
        EXPECT_TRUE(restored.ok()) << restored.status();
        if (restored.ok()) steps[r] = restored->step;
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 1; r < world_; ++r) EXPECT_EQ(steps[r], steps[0]);
    return steps[0];
  }

  // The outcome of the rank that judged the ballot (one has disagreements), or nullptr.
  static const SaveOutcome* Judge(const std::vector<SaveOutcome>& outcomes) {
    const SaveOutcome* judge = nullptr;
    for (const SaveOutcome& o : outcomes) {
      if (o.disagreements.empty()) continue;
      EXPECT_EQ(judge, nullptr) << "two ranks judged";
      judge = &o;
    }
    return judge;
  }

  int world_ = 0;
  std::string job_;
  InMemoryStore store_;
  testing::TempDir dir_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  static inline int counter_ = 0;
};

TEST_F(SilentCorruptionTest, AFlippedBitIsNamedAndItsStepNeverCommittedPersistedOrRestored) {
  Start(3);
  Fill(10);
  for (const SaveOutcome& o : SaveAll(10)) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_TRUE(o.disagreements.empty());
  }
  Fill(20);
  ranks_[1]->weights[2500] = std::nextafter(ranks_[1]->weights[2500], 1e9f);  // one ulp
  const std::vector<SaveOutcome> outcomes = SaveAll(20);
  const SaveOutcome* judge = Judge(outcomes);
  ASSERT_NE(judge, nullptr);
  ASSERT_EQ(judge->disagreements.size(), 1u);
  const ReplicaDisagreement& d = judge->disagreements[0];
  EXPECT_EQ(d.group, "tp0.cp0.pp0");
  EXPECT_THAT(d.minority, ElementsAre(1));
  ASSERT_EQ(d.buffers.size(), 1u);
  EXPECT_THAT(d.buffers[0], ElementsAre("weights"));
  EXPECT_THAT(DescribeDisagreement(20, d),
              HasSubstr("rank 1 (host host1) buffer weights: fingerprint"));
  for (const SaveOutcome& o : outcomes) {
    EXPECT_FALSE(o.committed);
    EXPECT_FALSE(o.persisted);
    EXPECT_FALSE(o.durable_committed);
  }
  // The trainguard run line.
  absl::StatusOr<std::string> line =
      ranks_[0]->client->Get("job/silent_corruption", absl::Seconds(5));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("step 20: data-parallel group tp0.cp0.pp0 (ranks 0,1,2): rank 1"));
  // No shard of step 20 on disk, and the ranks go back to step 10.
  absl::StatusOr<std::vector<ShardRecord>> shards =
      ListCommittedShards(Env::Default(), dir_.path());
  ASSERT_TRUE(shards.ok()) << shards.status();
  for (const ShardRecord& s : *shards) EXPECT_EQ(s.step, 10) << "rank " << s.rank;
  EXPECT_EQ(RestoreAll(), 10);
  EXPECT_EQ(ranks_[1]->weights[2500], 10 + 2500 * 1e-3f);  // repaired
  // The replay of step 20 agrees and commits.
  Fill(20);
  bool committed = false;
  for (const SaveOutcome& o : SaveAll(20)) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_TRUE(o.disagreements.empty());
    committed |= o.committed;
  }
  EXPECT_TRUE(committed);
}

// A replica that stays corrupt (silent_corruption=alert trains on): every snapshot is rejected, and
// the store keeps the records of the newest 16 rejected steps only.
TEST_F(SilentCorruptionTest,
       AReplicaThatStaysCorruptIsRejectedAtEverySnapshotAndTheRecordsArePruned) {
  Start(3);
  for (int64_t step = 1; step <= 20; ++step) {
    Fill(step);
    ranks_[2]->weights[7] += 1.0f;
    const std::vector<SaveOutcome> outcomes = SaveAll(step);
    const SaveOutcome* judge = Judge(outcomes);
    ASSERT_NE(judge, nullptr) << "step " << step;
    EXPECT_THAT(judge->disagreements[0].minority, ElementsAre(2))
        << DescribeDisagreement(step, judge->disagreements[0]);
  }
  absl::StatusOr<std::vector<std::string>> rejected =
      ranks_[0]->client->ListKeys("ckpt/rejected/", absl::Seconds(5));
  ASSERT_TRUE(rejected.ok()) << rejected.status();
  EXPECT_EQ(rejected->size(), 16u);
  EXPECT_THAT(*rejected, ::testing::Contains("ckpt/rejected/20"));
  EXPECT_THAT(*rejected, ::testing::Not(::testing::Contains("ckpt/rejected/4")));
}

TEST_F(SilentCorruptionTest, TwoReplicasThatDisagreeAreUndecidableAndGoBackToTheLastAgreement) {
  Start(2);
  Fill(4);
  SaveAll(4);
  Fill(8);
  ranks_[0]->half[1999] ^= 0x0100;  // a bit of fp16 state
  const SaveOutcome* judge = nullptr;
  const std::vector<SaveOutcome> outcomes = SaveAll(8);
  judge = Judge(outcomes);
  ASSERT_NE(judge, nullptr);
  const ReplicaDisagreement& d = judge->disagreements[0];
  EXPECT_FALSE(d.majority.has_value());
  EXPECT_TRUE(d.minority.empty());
  ASSERT_EQ(d.buffers.size(), 1u);
  EXPECT_THAT(d.buffers[0], ElementsAre("exp_avg_sq"));
  for (const SaveOutcome& o : outcomes) EXPECT_FALSE(o.committed);
  EXPECT_EQ(RestoreAll(), 4);
  EXPECT_EQ(ranks_[0]->half[1999], static_cast<uint16_t>(4 + 1999));
  EXPECT_EQ(ranks_[1]->half[1999], static_cast<uint16_t>(4 + 1999));
}

// The compute canary: rank 2's arithmetic is perturbed (its result differs in one bit). It is
// named with its host; the state's replicas agree, so the step is committed all the same.
TEST_F(SilentCorruptionTest, ARankWhoseCanaryDiffersIsNamedAndTheAgreeingStepStillCommits) {
  Start(3, [](int rank) { return ComputeCanary() ^ (rank == 2 ? 1u : 0u); });
  Fill(6);
  const std::vector<SaveOutcome> outcomes = SaveAll(6);
  const SaveOutcome* judge = Judge(outcomes);
  ASSERT_NE(judge, nullptr);
  ASSERT_EQ(judge->disagreements.size(), 1u);
  const ReplicaDisagreement& d = judge->disagreements[0];
  EXPECT_EQ(d.group, kCanaryGroup);
  EXPECT_THAT(d.minority, ElementsAre(2));
  EXPECT_EQ(d.hosts[2], "host2");
  ASSERT_TRUE(d.majority.has_value());
  EXPECT_EQ(*d.majority, ComputeCanary());
  bool committed = false;
  for (const SaveOutcome& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    committed |= o.committed;
  }
  EXPECT_TRUE(committed);
  absl::StatusOr<std::string> line =
      ranks_[0]->client->Get("job/silent_corruption", absl::Seconds(5));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("step 6: compute canary: rank 2 (host host2) computed"));
  EXPECT_EQ(RestoreAll(), 6);
}

TEST_F(SilentCorruptionTest, ManyFaultFreeSnapshotsAndRestoresRaiseNoVerdict) {
  Start(3, [](int) { return ComputeCanary(); });
  for (int64_t step = 1; step <= 12; ++step) {
    Fill(step);
    bool committed = false;
    for (const SaveOutcome& o : SaveAll(step)) {
      EXPECT_TRUE(o.status.ok()) << "step " << step << ": " << o.status;
      EXPECT_TRUE(o.disagreements.empty()) << "step " << step;
      committed |= o.committed;
    }
    EXPECT_TRUE(committed) << "step " << step;
    if (step % 4 == 0) {
      EXPECT_EQ(RestoreAll(), step);
    }
  }
  EXPECT_FALSE(ranks_[0]->client->Get("job/silent_corruption", absl::Milliseconds(100)).ok());
}

}  // namespace
}  // namespace trainguard
