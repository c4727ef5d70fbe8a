// HangArbiter (sdk/agent/hang_arbiter.h): what the launcher does about a declared hang (wait for
// the dumps, wait for the declarer's verdict, withdraw, diagnose; whom to replace), driven with
// explicit instants and hand-made observations: no processes, no clock, no sleeps.
#include "sdk/agent/hang_arbiter.h"

#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kNanosecond = absl::Nanoseconds(1);

absl::Time At(absl::Duration since_start) { return absl::UnixEpoch() + since_start; }

// A hang of generation 3 in a job of `world_size` ranks, seen at 100 s, declared by rank 0.
HangObservations Hang(int world_size) {
  HangObservations observed;
  observed.generation = 3;
  observed.seen = At(absl::Seconds(100));
  observed.world_size = world_size;
  observed.declarer = 0;
  return observed;
}

std::set<int> Ranks(int from, int to) {
  std::set<int> ranks;
  for (int rank = from; rank < to; ++rank) ranks.insert(rank);
  return ranks;
}

HangVerdict Verdict(HangVerdict::Kind kind, std::string withdrawal = "") {
  return HangVerdict{kind, std::move(withdrawal)};
}

// The wait a decision is; fails the test on any other action.
HangArbiter::Wait ExpectWait(const HangArbiter::Action& action) {
  const auto* wait = std::get_if<HangArbiter::Wait>(&action);
  EXPECT_NE(wait, nullptr) << "does not wait";
  return wait != nullptr ? *wait : HangArbiter::Wait{};
}

bool Waits(const HangArbiter::Action& action) {
  return std::holds_alternative<HangArbiter::Wait>(action);
}
bool Diagnoses(const HangArbiter::Action& action) {
  return std::holds_alternative<HangArbiter::Diagnose>(action);
}
bool ReadsTheVerdict(const HangArbiter::Action& action) {
  return std::holds_alternative<HangArbiter::ReadVerdict>(action);
}

TEST(HangArbiter, WaitsForMissingDumpsUntilThreeSecondsAfterTheHangWasSeenAndNotOneNanosecondMore) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(4);
  observed.dumped = {0, 1, 2};  // rank 3 may still dump
  observed.declarer = -1;       // nothing to wait for after the dumps

  const HangArbiter::Wait wait = ExpectWait(arbiter.Decide(observed, observed.seen));
  EXPECT_EQ(wait.what, HangArbiter::Wait::For::kDumps);
  EXPECT_EQ(wait.until, observed.seen + absl::Seconds(3));
  EXPECT_TRUE(Waits(arbiter.Decide(observed, observed.seen + absl::Seconds(3) - kNanosecond)));

  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen + absl::Seconds(3))));
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen + absl::Seconds(3) + kNanosecond)));
}

TEST(HangArbiter, DoesNotWaitWhenEveryRankDumpedOrWillNotDump) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(4);
  observed.declarer = -1;
  observed.dumped = {0, 1};
  observed.not_running = {2};     // stopped
  observed.no_longer_held = {3};  // died; its replacement watches a later generation
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen)));

  // A rank both dumped and stopped since counts once: rank 3 may still dump.
  observed.no_longer_held.clear();
  observed.not_running = {1};
  EXPECT_TRUE(Waits(arbiter.Decide(observed, observed.seen)));
}

TEST(HangArbiter, AwaitsTheDumpsBeforeItAsksForTheVerdict) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(2);
  observed.dumped = {0};
  observed.verdict = Verdict(HangVerdict::Kind::kWithdrawn, "rank 0 progressed");
  EXPECT_EQ(ExpectWait(arbiter.Decide(observed, observed.seen + absl::Seconds(1))).what,
            HangArbiter::Wait::For::kDumps);
}

TEST(HangArbiter, WithEveryRankRunningWaitsForTheDeclarersVerdictUpToFiveSeconds) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(2);
  observed.dumped = {0, 1};
  EXPECT_TRUE(ReadsTheVerdict(arbiter.Decide(observed, observed.seen)));

  observed.verdict = Verdict(HangVerdict::Kind::kNone);
  const HangArbiter::Wait wait = ExpectWait(arbiter.Decide(observed, observed.seen));
  EXPECT_EQ(wait.what, HangArbiter::Wait::For::kVerdict);
  EXPECT_EQ(wait.until, observed.seen + absl::Seconds(5));
  EXPECT_TRUE(Waits(arbiter.Decide(observed, observed.seen + absl::Seconds(5) - kNanosecond)));

  // Overdue: the suspects are diagnosed (and replaced) all the same.
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen + absl::Seconds(5))));
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen + absl::Seconds(5) + kNanosecond)));
}

TEST(HangArbiter, ADeadRankDoesNotSpareTheVerdictWait) {
  // A rank no longer held will not dump, but a death says nothing about the hang: every rank of
  // the hung generation that is left is running, so the declarer's verdict is still awaited.
  const HangArbiter arbiter;
  HangObservations observed = Hang(2);
  observed.dumped = {0};
  observed.no_longer_held = {1};
  EXPECT_TRUE(ReadsTheVerdict(arbiter.Decide(observed, observed.seen)));
}

constexpr char kDeclaration[] =
    "rank 0: hang (collective) at step 12 in phase \"step\": running 1.2s (bound 1s)";

// Issue 40, 10: rank 1 is killed while ranks 0 and 2 wait for it in an allreduce; their watchdog
// declares a hang before the death is acted on. Rank 1 never dumps (no process holds it), the
// declarer's step fails with the death (aborted), and the diagnosis names rank 1: the hang is the
// death seen from the survivors, announced as such in one line, and not acted on.
TEST(HangArbiter, AHangWhoseOnlySuspectDiedIsAnnouncedAsExplainedByItsDeath) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(3);
  observed.dumped = {0, 2};
  observed.no_longer_held = {1};
  EXPECT_TRUE(ReadsTheVerdict(arbiter.Decide(observed, observed.seen + absl::Milliseconds(50))));
  observed.verdict = Verdict(HangVerdict::Kind::kAborted);
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen + absl::Milliseconds(100))));

  const HangArbiter::Headline headline = arbiter.Announce(observed, {1}, kDeclaration);
  EXPECT_TRUE(headline.explained_by_death);
  EXPECT_EQ(
      headline.line,
      "hang in generation 3 explained by rank 1's death (its replacement takes over): rank 0: "
      "hang (collective) at step 12 in phase \"step\": running 1.2s (bound 1s)");

  HangObservations two_dead = Hang(4);
  two_dead.no_longer_held = {1, 3};
  EXPECT_THAT(arbiter.Announce(two_dead, {1, 3}, kDeclaration).line,
              ::testing::StartsWith("hang in generation 3 explained by the deaths of ranks 1,3 "
                                    "(their replacements take over): rank 0: "));
}

// A suspect that still runs may be truly hung, and the next generation would wait for it: the
// hang is announced as declared and diagnosed, whoever else died. So is one with no suspect, or
// whose suspect is stopped (not running) rather than dead.
TEST(HangArbiter, AHangWithASuspectThatDidNotDieIsAnnouncedAsDeclared) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(4);
  observed.dumped = {0, 3};
  observed.no_longer_held = {1};
  observed.not_running = {2};
  const std::string declared =
      "hang in generation 3: rank 0: hang (collective) at step 12 in phase \"step\": running "
      "1.2s (bound 1s)";
  for (const std::vector<int>& suspects :
       {std::vector<int>{1, 3}, std::vector<int>{}, std::vector<int>{2}, std::vector<int>{1, 2}}) {
    const HangArbiter::Headline headline = arbiter.Announce(observed, suspects, kDeclaration);
    EXPECT_FALSE(headline.explained_by_death) << ::testing::PrintToString(suspects);
    EXPECT_EQ(headline.line, declared) << ::testing::PrintToString(suspects);
  }
  EXPECT_EQ(HangArbiter::Declared(3, kDeclaration), declared);

  // Rank 2 was seen stopped and replaced at once: no process of generation 3 holds it any more,
  // but its stop, not a death, is the hang.
  observed.no_longer_held = {1, 2};
  const HangArbiter::Headline stopped = arbiter.Announce(observed, {2}, kDeclaration);
  EXPECT_FALSE(stopped.explained_by_death);
  EXPECT_EQ(stopped.line, declared);
}

TEST(HangArbiter, AWithdrawnHangIsWithdrawnWithTheDeclarersReason) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(2);
  observed.dumped = {0, 1};
  observed.verdict = Verdict(HangVerdict::Kind::kWithdrawn,
                             "rank 0's wait in allreduce/grads ended 0.4s after the hang");
  const HangArbiter::Action action = arbiter.Decide(observed, observed.seen + absl::Seconds(1));
  const auto* withdraw = std::get_if<HangArbiter::Withdraw>(&action);
  ASSERT_NE(withdraw, nullptr);
  EXPECT_EQ(withdraw->message,
            "hang in generation 3 withdrawn: rank 0's wait in allreduce/grads ended 0.4s after the "
            "hang; no one replaced");
}

TEST(HangArbiter, AnAbortedHangIsDiagnosedAtOnce) {
  const HangArbiter arbiter;
  HangObservations observed = Hang(2);
  observed.dumped = {0, 1};
  observed.verdict = Verdict(HangVerdict::Kind::kAborted);
  EXPECT_TRUE(Diagnoses(arbiter.Decide(observed, observed.seen)));
}

TEST(HangArbiter, ARankNotRunningOrAnUnknownDeclarerIsNotWaitedForAVerdict) {
  const HangArbiter arbiter;
  HangObservations stopped = Hang(2);
  stopped.dumped = {0};
  stopped.not_running = {1};
  EXPECT_TRUE(Diagnoses(arbiter.Decide(stopped, stopped.seen)));

  HangObservations unknown = Hang(2);
  unknown.dumped = {0, 1};
  unknown.declarer = -1;
  EXPECT_TRUE(Diagnoses(arbiter.Decide(unknown, unknown.seen)));
}

TEST(HangArbiter, TakesItsWaitsFromItsOptions) {
  HangArbiterOptions options;
  options.dump_grace = absl::Milliseconds(500);
  options.verdict_wait = absl::Seconds(1);
  const HangArbiter arbiter(options);
  HangObservations observed = Hang(2);
  observed.dumped = {0};
  EXPECT_EQ(ExpectWait(arbiter.Decide(observed, observed.seen)).until,
            observed.seen + absl::Milliseconds(500));
  observed.dumped = {0, 1};
  observed.verdict = Verdict(HangVerdict::Kind::kNone);
  EXPECT_EQ(ExpectWait(arbiter.Decide(observed, observed.seen)).until,
            observed.seen + absl::Seconds(1));
}

TEST(HangArbiter, AStoppedRankIsReplacedAtOnceWhileAnotherRuns) {
  const HangArbiter arbiter;
  const HangArbiter::StoppedReplacement one_host =
      arbiter.StoppedToReplaceNow({1}, {}, /*world_size=*/2, /*multi_host=*/false);
  EXPECT_THAT(one_host.ranks, ElementsAre(1));
  EXPECT_EQ(one_host.message,
            "hang diagnosis: rank(s) 1 stopped (SIGSTOP): replaced now; the diagnosis follows once "
            "the others' dumps are in");

  const HangArbiter::StoppedReplacement hosts =
      arbiter.StoppedToReplaceNow({1, 3}, {}, /*world_size=*/4, /*multi_host=*/true);
  EXPECT_THAT(hosts.ranks, ElementsAre(1, 3));
  EXPECT_EQ(hosts.message,
            "hang diagnosis: rank(s) 1,3 stopped (their agents say): replaced now; the diagnosis "
            "follows once the others' dumps are in");
}

TEST(HangArbiter, NoStoppedRankIsReplacedWhenEveryRankIsStoppedOrSomeWereReplacedAlready) {
  const HangArbiter arbiter;
  const HangArbiter::StoppedReplacement all_stopped =
      arbiter.StoppedToReplaceNow(Ranks(0, 2), {}, /*world_size=*/2, /*multi_host=*/false);
  EXPECT_THAT(all_stopped.ranks, IsEmpty());
  EXPECT_THAT(all_stopped.message, IsEmpty());

  const HangArbiter::StoppedReplacement again =
      arbiter.StoppedToReplaceNow({2}, {1}, /*world_size=*/4, /*multi_host=*/false);
  EXPECT_THAT(again.ranks, IsEmpty());
  EXPECT_THAT(arbiter.StoppedToReplaceNow({}, {}, 4, false).ranks, IsEmpty());
}

TEST(HangArbiter, ASuspectNotRunningIsTheOneReplacedWhenOtherSuspectsRun) {
  const HangArbiter arbiter;
  // Rank 2 is stopped; rank 1, running, is named too (it never entered the collective, waiting on
  // rank 2 elsewhere).
  const HangArbiter::SuspectReplacement replacement =
      arbiter.SuspectsToReplace({1, 2}, /*not_running=*/{2}, /*replaced=*/{}, /*multi_host=*/false);
  EXPECT_THAT(replacement.suspects, ElementsAre(2));
  EXPECT_THAT(replacement.replace, ElementsAre(2));
  EXPECT_EQ(replacement.narrowed,
            "hang diagnosis: of the suspects, rank(s) 2 are not running (stopped, SIGSTOP): they "
            "are the ones replaced");
  EXPECT_THAT(replacement.replaced_already, IsEmpty());
}

TEST(HangArbiter, SaysNoHeartbeatOrStoppedWhenTheSuspectsRunOnSeveralHosts) {
  const HangArbiter arbiter;
  const HangArbiter::SuspectReplacement replacement = arbiter.SuspectsToReplace(
      {0, 3, 5}, /*not_running=*/{3, 5}, /*replaced=*/{}, /*multi_host=*/true);
  EXPECT_THAT(replacement.replace, ElementsAre(3, 5));
  EXPECT_EQ(replacement.narrowed,
            "hang diagnosis: of the suspects, rank(s) 3,5 are not running (stopped, or no "
            "heartbeat): they are the ones replaced");
}

TEST(HangArbiter, KeepsEverySuspectWhenAllOrNoneAreRunning) {
  const HangArbiter arbiter;
  const HangArbiter::SuspectReplacement running =
      arbiter.SuspectsToReplace({1, 2}, /*not_running=*/{}, /*replaced=*/{}, false);
  EXPECT_THAT(running.replace, ElementsAre(1, 2));
  EXPECT_THAT(running.narrowed, IsEmpty());

  const HangArbiter::SuspectReplacement stopped =
      arbiter.SuspectsToReplace({1, 2}, /*not_running=*/{0, 1, 2}, /*replaced=*/{}, false);
  EXPECT_THAT(stopped.suspects, ElementsAre(1, 2));
  EXPECT_THAT(stopped.replace, ElementsAre(1, 2));
  EXPECT_THAT(stopped.narrowed, IsEmpty());
}

TEST(HangArbiter, ReplacesNoOneElseWhenRanksWereReplacedAlreadyForBeingStopped) {
  const HangArbiter arbiter;
  // Rank 1 was replaced when it was seen stopped; the diagnosis names it and rank 0, waiting.
  const HangArbiter::SuspectReplacement replacement =
      arbiter.SuspectsToReplace({0, 1}, /*not_running=*/{1}, /*replaced=*/{1}, false);
  EXPECT_THAT(replacement.suspects, ElementsAre(1));
  EXPECT_THAT(replacement.replace, IsEmpty());
  EXPECT_EQ(replacement.replaced_already,
            "hang diagnosis: rank(s) 1 replaced already (stopped); no one else is");

  // Replaced ranks count as not running even where the caller did not list them so.
  EXPECT_THAT(
      arbiter.SuspectsToReplace({0, 1}, /*not_running=*/{}, /*replaced=*/{1}, false).suspects,
      ElementsAre(1));
}

}  // namespace
}  // namespace trainguard
