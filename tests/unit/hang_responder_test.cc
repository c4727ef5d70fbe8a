// HangResponder (sdk/runtime/hang_responder.h): what a rank does when a hang is declared, its own
// or a peer's, on an in-memory store at instants a ManualClock sets. The evidence is a recording of
// the dumps asked for (no stacks are captured), so that a test counts them.
#include "sdk/runtime/hang_responder.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"
#include "sdk/core/store_keys.h"
#include "trainguard/clock.h"
#include "trainguard/events.h"
#include "trainguard/store.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr int kRank = 2;

// The dumps asked for: each capture, and each write with its reason and generation.
class RecordingEvidence final : public HangEvidenceSource {
 public:
  struct Dump {
    std::string reason;
    int64_t generation;
  };

  CapturedEvidence Capture() override {
    MutexLock lock(&mu_);
    ++captures_;
    return CapturedEvidence{.stacks = absl::UnavailableError("no stacks in this test"),
                            .ring = absl::UnavailableError("no ring in this test")};
  }
  std::string Write(const CapturedEvidence&, const std::string& reason, int64_t generation,
                    std::string* stacks_out, int64_t* symbolize_ms) override {
    MutexLock lock(&mu_);
    dumps_.push_back({reason, generation});
    if (stacks_out != nullptr) *stacks_out = "(stacks)";
    if (symbolize_ms != nullptr) *symbolize_ms = 0;
    return absl::StrCat("dump-", dumps_.size());
  }
  int captures() {
    MutexLock lock(&mu_);
    return captures_;
  }
  std::vector<Dump> dumps() {
    MutexLock lock(&mu_);
    return dumps_;
  }

 private:
  Mutex mu_;
  int captures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Dump> dumps_ ABSL_GUARDED_BY(mu_);
};

struct Emitted {
  int64_t generation;
  Event event;
};

class HangResponderTest : public ::testing::Test {
 protected:
  HangResponderOptions Options(Store* store) {
    return HangResponderOptions{
        .rank = kRank,
        .store = store,
        .evidence = &evidence_,
        .clock = &clock_,
        .generation = [this] { return generation_.load(); },
        .step = [] { return int64_t{7}; },
        .emit =
            [this](int64_t generation, Event event) {
              MutexLock lock(&mu_);
              events_.push_back({generation, std::move(event)});
            },
        .withdraw_hang_if_ended = [this] { return wait_ended_.load(); },
        // On the ManualClock: it runs out only when a test advances the clock.
        .dump_wait = absl::Seconds(5)};
  }
  std::vector<Emitted> events() {
    MutexLock lock(&mu_);
    return events_;
  }
  // A peer (rank 1) declares a hang in `generation`, as its OnOwnHang does.
  void PeerDeclares(int64_t generation) {
    ASSERT_TRUE(store_
                    .Set(store_keys::Hang(generation),
                         store_keys::EncodeHangDeclaration({1, "hang (phase) at step 7"}), kTimeout)
                    .ok());
  }
  // The peer-hang watcher's read of the hang key of `generation`, sent now.
  void WatcherReads(int64_t generation) {
    const absl::Time asked = clock_.Now();
    responder_.OnHangKey(generation, store_.Get(store_keys::Hang(generation), kTimeout), asked);
    clock_.Advance(absl::Milliseconds(250));
  }
  static HangReport Report() {
    HangReport report;
    report.phase = "step";
    report.step = 7;
    return report;
  }
  bool Exists(const std::string& key) { return store_.Get(key, kTimeout).ok(); }

  InMemoryStore store_;
  ManualClock clock_;
  RecordingEvidence evidence_;
  std::atomic<int64_t> generation_{3};
  std::atomic<bool> wait_ended_{false};
  Mutex mu_;
  std::vector<Emitted> events_ ABSL_GUARDED_BY(mu_);
  HangResponder responder_{Options(&store_)};
};

TEST_F(HangResponderTest, APeersHangInTheRanksGenerationIsDumpedExactlyOnce) {
  PeerDeclares(3);
  for (int read = 0; read < 3; ++read) WatcherReads(3);
  // The generation is then superseded: the hang is dumped already.
  bool let_go = false;
  responder_.OnSuperseded(3, [&] { let_go = true; });
  EXPECT_TRUE(let_go);
  ASSERT_EQ(evidence_.dumps().size(), 1u);
  EXPECT_EQ(evidence_.dumps()[0].generation, 3);
  EXPECT_EQ(evidence_.dumps()[0].reason, "a peer declared a hang: rank 1: hang (phase) at step 7");
  const std::vector<Emitted> written = events();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].generation, 3);
  EXPECT_EQ(written[0].event.type, EventType::kHang);
  EXPECT_EQ(written[0].event.step, 7);
  EXPECT_THAT(written[0].event.attributes,
              ElementsAre(Pair("remote", "true"), Pair("dump", "dump-1")));
}

TEST_F(HangResponderTest, AHangOfAnOlderGenerationIsIgnored) {
  PeerDeclares(2);
  generation_ = 3;
  // A read sent before the rank adopted generation 3, answered after.
  WatcherReads(2);
  WatcherReads(3);  // nothing declared in generation 3
  EXPECT_EQ(evidence_.captures(), 0);
  EXPECT_THAT(evidence_.dumps(), IsEmpty());
  EXPECT_THAT(events(), IsEmpty());
  // A hang of the rank's own generation is still answered.
  PeerDeclares(3);
  WatcherReads(3);
  ASSERT_EQ(evidence_.dumps().size(), 1u);
  EXPECT_EQ(evidence_.dumps()[0].generation, 3);
}

TEST_F(HangResponderTest, AWithdrawnPeersHangIsDumpedAgainWhenDeclaredAgain) {
  PeerDeclares(3);
  WatcherReads(3);
  ASSERT_EQ(evidence_.dumps().size(), 1u);
  // A read sent before the key was seen, answered NotFound, proves nothing.
  responder_.OnHangKey(3, absl::NotFoundError("hang/gen3"), clock_.Now() - absl::Seconds(1));
  WatcherReads(3);
  EXPECT_EQ(evidence_.dumps().size(), 1u);
  // The launcher withdraws the hang (deletes its key); a read sent since finds it absent.
  ASSERT_TRUE(store_.Delete(store_keys::Hang(3), kTimeout).ok());
  WatcherReads(3);
  EXPECT_EQ(evidence_.dumps().size(), 1u);
  PeerDeclares(3);
  WatcherReads(3);
  WatcherReads(3);
  EXPECT_EQ(evidence_.dumps().size(), 2u);
}

TEST_F(HangResponderTest, AWithdrawnOwnHangEndsTheResponseWithoutAnAbort) {
  responder_.NoteStepBegun();
  std::thread watchdog([&] { responder_.OnOwnHang(Report(), 3); });
  // The declaration is published before the wait for the peers' dumps.
  ASSERT_TRUE(store_.Wait({store_keys::Hang(3)}, kTimeout).ok());
  wait_ended_ = true;  // the collective it waited in completed
  responder_.NoteStepEnding(/*failed=*/false);
  watchdog.join();
  EXPECT_TRUE(Exists(store_keys::HangWithdrawn(3, kRank)));
  EXPECT_FALSE(Exists(store_keys::HangAborted(3, kRank)));
  absl::StatusOr<store_keys::HangDeclaration> declared =
      store_keys::DecodeHangDeclaration(*store_.Get(store_keys::Hang(3), kTimeout));
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(declared->rank, kRank);
  const std::vector<Emitted> written = events();
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[0].event.type, EventType::kHang);
  EXPECT_EQ(KindOf(written[1].event), EventKind::kHangWithdrawn);
  EXPECT_THAT(written[1].event.message, HasSubstr("hang withdrawn: the wait ended by itself"));
  EXPECT_NE(written[1].event.Attribute("waited_ms"), "");
  // Its own dump answers the watcher's read of its own key.
  WatcherReads(3);
  EXPECT_EQ(evidence_.dumps().size(), 1u);
}

TEST_F(HangResponderTest, AnOwnHangStandsWhenItsStepFailsOrTheWaitForDumpsRunsOut) {
  // The step failed (a peer died and its collective broke) before the verdict was looked for.
  responder_.NoteStepBegun();
  responder_.NoteStepEnding(/*failed=*/true);
  responder_.OnOwnHang(Report(), 3);
  EXPECT_TRUE(Exists(store_keys::HangAborted(3, kRank)));
  EXPECT_FALSE(Exists(store_keys::HangWithdrawn(3, kRank)));
  // In the next generation nothing ends the wait: it stands once dump_wait has passed.
  responder_.NoteStepBegun();
  generation_ = 4;
  std::atomic<bool> returned{false};
  std::thread watchdog([&] {
    responder_.OnOwnHang(Report(), 4);
    returned = true;
  });
  // Time passes on the ManualClock until the wait runs out (bounded polling: the wait's deadline
  // is set once the dump is written, some moment after the declaration appears).
  for (int i = 0; i < 2000 && !returned; ++i) {
    clock_.Advance(absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(10));
  }
  watchdog.join();
  EXPECT_TRUE(returned);
  EXPECT_TRUE(Exists(store_keys::HangAborted(4, kRank)));
  EXPECT_FALSE(Exists(store_keys::HangWithdrawn(4, kRank)));
  EXPECT_EQ(evidence_.dumps().size(), 2u);
}

TEST_F(HangResponderTest, StopEndsTheWaitForThePeersDumps) {
  responder_.NoteStepBegun();
  std::thread watchdog([&] { responder_.OnOwnHang(Report(), 3); });
  ASSERT_TRUE(store_.Wait({store_keys::Hang(3)}, kTimeout).ok());
  responder_.Stop();
  watchdog.join();
  EXPECT_TRUE(Exists(store_keys::HangAborted(3, kRank)));
}

TEST_F(HangResponderTest, ASupersededGenerationsHangIsCapturedBeforeTheRankIsLetGo) {
  PeerDeclares(3);
  int captured_before = -1;
  size_t written_before = 99;
  responder_.OnSuperseded(3, [&] {
    captured_before = evidence_.captures();
    written_before = evidence_.dumps().size();
  });
  EXPECT_EQ(captured_before, 1);
  EXPECT_EQ(written_before, 0u);
  ASSERT_EQ(evidence_.dumps().size(), 1u);
  const std::vector<Emitted> written = events();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_THAT(written[0].event.message, HasSubstr("(dumped as its generation was superseded)"));
  // The watcher's read of the same key, answered late, dumps nothing more.
  WatcherReads(3);
  EXPECT_EQ(evidence_.dumps().size(), 1u);
}

TEST_F(HangResponderTest, AStaticJobDumpsOnceForEachGenerationsCommunicationFailure) {
  HangResponder responder(Options(nullptr));
  EXPECT_EQ(responder.DumpCommunicationFailure(0, "allreduce failed"), "dump-1");
  EXPECT_EQ(responder.DumpCommunicationFailure(0, "allreduce failed again"), std::nullopt);
  EXPECT_EQ(responder.DumpCommunicationFailure(1, "broadcast failed"), "dump-2");
  ASSERT_EQ(evidence_.dumps().size(), 2u);
  EXPECT_EQ(evidence_.dumps()[0].reason, "communication failure: allreduce failed");
}

TEST_F(HangResponderTest, ADumpOnDemandIsWrittenEveryTime) {
  responder_.DumpOnDemand();
  responder_.DumpOnDemand();
  EXPECT_EQ(evidence_.dumps().size(), 2u);
  const std::vector<Emitted> written = events();
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(KindOf(written[1].event), EventKind::kEvidenceDumped);
  EXPECT_EQ(written[1].event.Attribute("dump"), "dump-2");
}

}  // namespace
}  // namespace trainguard
