// Waiting is not hanging: a rank whose collective runs past its bound while a peer that has not
// entered it is still making progress postpones the hang (WatchdogOptions::peer_progress), and the
// Runtime answers that question from the peers' progress records (sdk/runtime/peer_progress.h).
// The watchdog tests drive a ManualClock and PollOnce() with the monitor thread off.
#include "sdk/runtime/peer_progress.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/poll_until_hang.h"
#include "trainguard/clock.h"
#include "trainguard/collectives.h"
#include "trainguard/communicator.h"
#include "trainguard/watchdog.h"

namespace trainguard {
namespace {

using runtime_internal::AwaitingFirstRecords;
using runtime_internal::EncodeProgressQuestion;
using runtime_internal::EncodeProgressRecord;
using runtime_internal::ExplainWait;
using runtime_internal::ParseProgressQuestion;
using runtime_internal::ParseProgressRecord;
using runtime_internal::ProgressRecord;
using ::testing::HasSubstr;

constexpr uint64_t kDp = 1;
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

ProgressRecord Record(absl::Duration published_ago, absl::Duration age, int64_t step,
                      int64_t begun_on_dp) {
  ProgressRecord r;
  r.published = kNow - published_ago;
  r.progress_age = age;
  r.step = step;
  r.begun = {{kDp, begun_on_dp}, {42, 7}};
  return r;
}

TEST(PeerProgressRecord, RoundTripsThroughItsTextForm) {
  const ProgressRecord r = Record(absl::Milliseconds(120), absl::Milliseconds(3), 811, 812);
  const std::string text = EncodeProgressRecord(r);
  EXPECT_THAT(text, ::testing::StartsWith("v1 "));
  absl::StatusOr<ProgressRecord> back = ParseProgressRecord(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->published, r.published);
  EXPECT_EQ(back->progress_age, r.progress_age);
  EXPECT_EQ(back->step, 811);
  EXPECT_EQ(back->BegunOn(kDp), 812);
  EXPECT_EQ(back->BegunOn(42), 7);
  EXPECT_EQ(back->BegunOn(5), -1);

  ProgressRecord none;
  none.published = kNow;
  absl::StatusOr<ProgressRecord> empty = ParseProgressRecord(EncodeProgressRecord(none));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->begun.empty());
}

TEST(PeerProgressRecord, AMalformedRecordIsRejectedNamingTheField) {
  EXPECT_THAT(ParseProgressRecord("").status().message(), HasSubstr("version or field count"));
  EXPECT_THAT(ParseProgressRecord("v2 1 2 3 -").status().message(),
              HasSubstr("version or field count"));
  EXPECT_THAT(ParseProgressRecord("v1 x 2 3 -").status().message(), HasSubstr("wall time"));
  EXPECT_THAT(ParseProgressRecord("v1 1 -2 3 -").status().message(), HasSubstr("progress age"));
  EXPECT_THAT(ParseProgressRecord("v1 1 2 s -").status().message(), HasSubstr("step"));
  EXPECT_THAT(ParseProgressRecord("v1 1 2 3 1:").status().message(),
              HasSubstr("communicator entry"));
  EXPECT_THAT(ParseProgressRecord("v1 1 2 3 1:5,\x01").status().message(),
              HasSubstr("communicator entry"));
}

std::vector<std::optional<std::string>> Records(std::vector<std::optional<ProgressRecord>> rs) {
  std::vector<std::optional<std::string>> out;
  for (const auto& r : rs) {
    out.push_back(r.has_value() ? std::optional<std::string>(EncodeProgressRecord(*r))
                                : std::nullopt);
  }
  return out;
}

TEST(ProgressQuestion, RoundTripsThroughItsTextFormAndAMalformedOneIsRejected) {
  const absl::Time asked = absl::FromUnixNanos(1'700'000'000'123'456'789);
  absl::StatusOr<absl::Time> parsed = ParseProgressQuestion(EncodeProgressQuestion(3, asked));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, asked);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseProgressQuestion("3").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseProgressQuestion("3 soon").status()));
}

TEST(ProgressQuestion, PostponesTheWaitForOneWindowAfterThePeersWereAsked) {
  const absl::Time asked = absl::FromUnixSeconds(1'700'000'000);
  const absl::Duration window = absl::Milliseconds(1100);
  const std::optional<std::string> awaiting =
      AwaitingFirstRecords(asked, asked + absl::Milliseconds(120), window);
  ASSERT_TRUE(awaiting.has_value());
  EXPECT_EQ(*awaiting, "the peers were asked for their progress records 120ms ago");
  EXPECT_TRUE(AwaitingFirstRecords(asked, asked - absl::Seconds(1), window).has_value())
      << "asked on a clock ahead of this one";
  EXPECT_FALSE(AwaitingFirstRecords(asked, asked + window, window).has_value());
  EXPECT_FALSE(AwaitingFirstRecords(absl::InfinitePast(), asked, window).has_value())
      << "a question that does not parse counts as long ago";
}

TEST(ExplainWait, APeerThatHasNotEnteredTheCollectiveAndProgressedRecentlyExplainsTheWait) {
  // Rank 0 waits in all_reduce #812 on dp. Rank 1 entered it too (it waits as well); rank 2 has not
  // and ticked 40 ms ago (its record is 100 ms old and says 40 ms... of which 60 ms before).
  const auto records = Records({Record(absl::Milliseconds(50), absl::Milliseconds(5), 812, 813),
                                Record(absl::Milliseconds(50), absl::Seconds(3), 812, 813),
                                Record(absl::Milliseconds(30), absl::Milliseconds(10), 811, 812)});
  std::optional<std::string> why =
      ExplainWait(records, /*self=*/0, "all_reduce", kDp, 812, kNow, absl::Seconds(1));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "rank 2 has not entered all_reduce #812 (comm 1) and made progress 40ms ago "
            "(step 811)");
}

TEST(ExplainWait, PeersWaitingInTheSameCollectiveOrSilentTooLongExplainNothing) {
  const absl::Duration window = absl::Seconds(1);
  // Every peer entered #812: they all wait; nobody is working towards it.
  EXPECT_FALSE(ExplainWait(Records({std::nullopt,
                                    Record(absl::Milliseconds(1), absl::ZeroDuration(), 812, 813),
                                    Record(absl::Milliseconds(1), absl::ZeroDuration(), 812, 813)}),
                           0, "all_reduce", kDp, 812, kNow, window)
                   .has_value());
  // Rank 2 has not entered it but last progressed 1.2 s ago (a stopped or stuck rank).
  EXPECT_FALSE(ExplainWait(Records({std::nullopt, std::nullopt,
                                    Record(absl::Seconds(1), absl::Milliseconds(200), 811, 812)}),
                           0, "all_reduce", kDp, 812, kNow, window)
                   .has_value());
  // No record (it never published), an unreadable one, or only this rank's own.
  std::vector<std::optional<std::string>> odd = {
      EncodeProgressRecord(Record(absl::ZeroDuration(), absl::ZeroDuration(), 811, 812)),
      std::nullopt, std::string("garbage")};
  EXPECT_FALSE(ExplainWait(odd, 0, "all_reduce", kDp, 812, kNow, window).has_value());
}

TEST(ExplainWait, APeerItsHostAgentSeesStoppedExplainsNothingHoweverRecentItsRecord) {
  // Rank 2 published 100 ms ago, having progressed just before: then SIGSTOP. Its record alone
  // excuses the wait for a whole window; its host agent's agents/stopped/<member> does not.
  const auto records = Records({std::nullopt, std::nullopt,
                                Record(absl::Milliseconds(100), absl::Milliseconds(5), 811, 812),
                                Record(absl::Milliseconds(20), absl::Milliseconds(1), 811, 812)});
  const absl::Duration window = absl::Seconds(1);
  ASSERT_TRUE(ExplainWait(records, 0, "all_reduce", kDp, 812, kNow, window).has_value());
  // Rank 2 stopped; rank 3, running and not in the collective yet, still explains the wait.
  std::optional<std::string> why = ExplainWait(records, 0, "all_reduce", kDp, 812, kNow, window,
                                               {false, false, true, false});
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("rank 3 has not entered"));
  // Both stopped: nobody works towards the collective, the hang is declared.
  EXPECT_FALSE(ExplainWait(records, 0, "all_reduce", kDp, 812, kNow, window,
                           {false, false, true, true})
                   .has_value());
  // A shorter list (no agent view of the last ranks) leaves those ranks to their records.
  EXPECT_TRUE(
      ExplainWait(records, 0, "all_reduce", kDp, 812, kNow, window, {false, false, true})
          .has_value());
}

TEST(ExplainWait, APeerWithoutTheCommunicatorHasNotEnteredIt) {
  ProgressRecord r = Record(absl::Milliseconds(10), absl::ZeroDuration(), 3, 0);
  r.begun = {{99, 4}};
  EXPECT_TRUE(ExplainWait(Records({std::nullopt, r}), 0, "barrier", kDp, 0, kNow, absl::Seconds(1))
                  .has_value());
}

// A peer with communicators of the same generation but not this group's (a rank of another
// tensor-parallel group, making progress) is not a member: it explains nothing, however recent.
TEST(ExplainWait, APeerOutsideTheGroupExplainsNothing) {
  CommunicatorSpec spec;
  spec.comm_id = 4;  // generation 3
  ProgressRecord r = Record(absl::Milliseconds(10), absl::ZeroDuration(), 3, 0);
  r.begun = {{spec.comm_id, 0}, {spec.GroupId(1), 7}};  // the world's, and tp1
  EXPECT_FALSE(ExplainWait(Records({std::nullopt, r}), 0, "all_reduce", spec.GroupId(0), 0, kNow,
                           absl::Seconds(1))
                   .has_value());
  // A member of it that has not entered the collective does.
  r.begun.push_back({spec.GroupId(0), 0});
  EXPECT_TRUE(ExplainWait(Records({std::nullopt, r}), 0, "all_reduce", spec.GroupId(0), 0, kNow,
                          absl::Seconds(1))
                  .has_value());
}

// A rank with a tracker and a watchdog whose peer_progress answer the test controls.
struct WaitingRank {
  WaitingRank() {
    CollectiveTrackerOptions t;
    t.clock = &clock;
    tracker = *CollectiveTracker::Create(t);
    EXPECT_TRUE(tracker->RegisterCommunicator(kDp, "dp", [this] { ++aborts; }).ok());
    WatchdogOptions w;
    w.poll_period = absl::ZeroDuration();
    w.clock = &clock;
    w.tracker = tracker.get();
    w.peer_progress = [this](const InFlightCollective& c) -> std::optional<std::string> {
      ++asked;
      asked_about = c.comm_seq;
      if (while_asked) while_asked();
      if (!peer_busy) return std::nullopt;
      return std::string("rank 2 is still generating");
    };
    wd = *Watchdog::Create(w);
    // History: a "step" of 1 s whose all_reduce takes 100 ms; bounds 3 s and 2 s (the floor).
    for (int i = 0; i < 5; ++i) {
      ScopedPhase step(wd.get(), "step");
      clock.Advance(absl::Milliseconds(900));
      ScopedCollective c(tracker.get(), "all_reduce", kDp, 1024);
      clock.Advance(absl::Milliseconds(100));
    }
  }
  std::optional<absl::Duration> RunUntilHang(absl::Duration step, absl::Duration limit) {
    return testing::PollUntilHang(clock, *wd, step, limit);
  }

  ManualClock clock;
  std::unique_ptr<CollectiveTracker> tracker;
  std::unique_ptr<Watchdog> wd;
  bool peer_busy = true;
  std::function<void()> while_asked;  // runs inside peer_progress, before it answers
  int asked = 0;
  int64_t asked_about = -1;
  int aborts = 0;
};

TEST(PeerProgress, AWaitForAPeerThatKeepsProgressingIsPostponedAndDeclaredOnceThePeerStops) {
  WaitingRank r;
  ASSERT_EQ(r.tracker->BoundFor("all_reduce"), absl::Seconds(2));
  r.wd->BeginPhase("step");
  CollectiveHandle waiting = r.tracker->Begin("all_reduce", kDp, 1024);
  // A minute of waiting for a peer that keeps generating: no hang, no abort.
  EXPECT_FALSE(r.RunUntilHang(absl::Milliseconds(100), absl::Minutes(1)).has_value());
  EXPECT_EQ(r.wd->hangs_declared(), 0);
  EXPECT_EQ(r.wd->hangs_postponed(), 1) << "one collective, counted once";
  EXPECT_EQ(r.aborts, 0);
  EXPECT_EQ(r.asked_about, 5) << "the collective this rank waits in";
  EXPECT_LE(r.asked, 60 * 4 + 1) << "asked at most every peer_recheck (250 ms)";
  EXPECT_GE(r.asked, 60 * 4 / 2);

  // The peer stops: the hang is declared at the next re-check, with the postponement as evidence.
  r.peer_busy = false;
  std::optional<absl::Duration> at = r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(5));
  ASSERT_TRUE(at.has_value());
  EXPECT_LE(*at, absl::Milliseconds(300));
  std::optional<HangReport> hang = r.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->Evidence("postponed_for"), "rank 2 is still generating");
  EXPECT_FALSE(hang->Evidence("postponed_ms").empty());
  ASSERT_TRUE(hang->collective.has_value());
  EXPECT_EQ(hang->collective->comm_seq, 5);
  EXPECT_EQ(r.aborts, 1);
  r.tracker->End(waiting);
  r.wd->EndPhase();
}

TEST(PeerProgress, AnExcusedWaitTeachesTheBoundsWhenItCompletes) {
  WaitingRank r;
  r.wd->BeginPhase("step");
  CollectiveHandle waiting = r.tracker->Begin("all_reduce", kDp, 1024);
  EXPECT_FALSE(r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(10)).has_value());
  EXPECT_EQ(r.wd->hangs_postponed(), 1);
  r.tracker->End(waiting);
  r.wd->EndPhase();
  // The 10 s wait is a healthy sample now: the next wait that long is within the bound, and the
  // peer is not even asked.
  EXPECT_EQ(r.tracker->BoundFor("all_reduce"), absl::Seconds(30));
  r.peer_busy = false;
  const int asked = r.asked;
  r.wd->BeginPhase("step");
  CollectiveHandle again = r.tracker->Begin("all_reduce", kDp, 1024);
  EXPECT_FALSE(r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(10)).has_value());
  EXPECT_EQ(r.asked, asked);
  r.tracker->End(again);
  r.wd->EndPhase();
}

TEST(PeerProgress, ASilentPhaseWaitingInACollectiveIsPostponedToo) {
  WaitingRank r;
  // A new op has the 10-minute warm-up bound: only the "step" phase's silence (bound 3 s) can fire.
  r.wd->BeginPhase("step");
  CollectiveHandle waiting = r.tracker->Begin("all_gather", kDp, 1024);
  EXPECT_FALSE(r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(30)).has_value());
  EXPECT_EQ(r.wd->hangs_postponed(), 1);
  EXPECT_EQ(r.asked_about, 5);
  r.peer_busy = false;
  ASSERT_TRUE(r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(5)).has_value());
  std::optional<HangReport> hang = r.wd->TakeHang();
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->cause, HangReport::Cause::kPhase);
  EXPECT_EQ(hang->phase, "step");
  r.tracker->End(waiting);
  r.wd->EndPhase();
}

// The race the RL test found under AddressSanitizer: the bound runs out at the very moment the last
// peer enters; while the watchdog asks the peers (a store round trip) the collective completes and
// the step ends. Nothing is hung any more, so nothing may be declared.
TEST(PeerProgress, AWaitThatEndsWhileThePeersAreAskedIsNotDeclared) {
  WaitingRank r;
  r.peer_busy = false;  // every peer has entered: no excuse
  r.wd->BeginPhase("step");
  CollectiveHandle waiting = r.tracker->Begin("all_reduce", kDp, 1024);
  r.while_asked = [&] {
    r.tracker->End(waiting);
    r.wd->EndPhase();
    r.wd->BeginPhase("step");  // the next step has begun by the time the answer comes
  };
  EXPECT_FALSE(r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(3)).has_value());
  EXPECT_EQ(r.asked, 1) << "asked once, when the all_reduce passed its 2 s bound";
  EXPECT_EQ(r.wd->hangs_declared(), 0);
  EXPECT_EQ(r.aborts, 0);
  r.while_asked = nullptr;
  r.wd->EndPhase();
}

TEST(PeerProgress, ARankStalledOutsideAnyCollectiveIsItsOwnHangAndNeverPostponed) {
  WaitingRank r;
  r.wd->BeginPhase("step");
  std::optional<absl::Duration> at = r.RunUntilHang(absl::Milliseconds(100), absl::Seconds(30));
  ASSERT_TRUE(at.has_value());
  EXPECT_LE(*at, absl::Milliseconds(3100));
  EXPECT_EQ(r.asked, 0) << "no collective in flight: nobody else to wait for";
  EXPECT_EQ(r.wd->hangs_postponed(), 0);
  r.wd->EndPhase();
}

}  // namespace
}  // namespace trainguard
