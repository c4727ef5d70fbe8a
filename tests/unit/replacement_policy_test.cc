// ReplacementPolicy (sdk/agent/replacement_policy.h): what a rank's or a parked standby's death
// leads to, driven with explicit instants: no processes, no clock, no sleeps.
#include "sdk/agent/replacement_policy.h"

#include <string>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::IsEmpty;

constexpr char kExit1[] = "exited with status 1";

absl::Time At(absl::Duration since_start) { return absl::UnixEpoch() + since_start; }

ReplacementPolicyOptions Options(int max_replacements, absl::Duration restart_backoff) {
  ReplacementPolicyOptions options;
  options.max_replacements = max_replacements;
  options.restart_backoff = restart_backoff;
  return options;
}

// The replacement a death was answered with; fails the test on any other decision.
ReplacementPolicy::Replace ExpectReplace(const ReplacementPolicy::Decision& decision) {
  const auto* replace = std::get_if<ReplacementPolicy::Replace>(&decision);
  EXPECT_NE(replace, nullptr) << "not a replacement";
  return replace != nullptr ? *replace : ReplacementPolicy::Replace{};
}

std::string ExpectFail(const ReplacementPolicy::Decision& decision) {
  const auto* fail = std::get_if<ReplacementPolicy::Fail>(&decision);
  EXPECT_NE(fail, nullptr) << "the job does not fail";
  return fail != nullptr ? fail->why : "";
}

// What the launcher does with a replacement: a standby takes the rank when the backoff allows.
void TakeRank(ReplacementPolicy& policy, int rank, absl::Time when) {
  policy.OnReplacementsMade(1);
  policy.OnRankTaken(rank, when);
}

TEST(ReplacementPolicy,
     ACrashLoopBacksOffDoublingUpToThirtySecondsAndEndsAtMaxReplacementsNamingTheDeaths) {
  ReplacementPolicy policy(Options(/*max_replacements=*/9, absl::Seconds(1)));
  // Rank 0's command dies 1 s after each process takes the rank.
  absl::Time now = At(absl::Hours(1));
  std::vector<absl::Duration> delays;
  for (int death = 1; death <= 9; ++death) {
    const ReplacementPolicy::Replace replace = ExpectReplace(policy.OnRankDeath(0, kExit1, now));
    EXPECT_EQ(replace.deaths, death);
    EXPECT_EQ(replace.streak, death);
    EXPECT_EQ(replace.not_before, now + replace.delay);
    delays.push_back(replace.delay);
    TakeRank(policy, 0, replace.not_before);
    now = replace.not_before + absl::Seconds(1);
  }
  EXPECT_THAT(delays,
              ::testing::ElementsAre(absl::ZeroDuration(), absl::Seconds(1), absl::Seconds(2),
                                     absl::Seconds(4), absl::Seconds(8), absl::Seconds(16),
                                     absl::Seconds(30), absl::Seconds(30), absl::Seconds(30)));
  EXPECT_EQ(policy.replacements(), 9);
  EXPECT_EQ(ExpectFail(policy.OnRankDeath(0, kExit1, now)),
            "rank 0 died 10 times (last: exited with status 1); --max-replacements=9 reached");
  EXPECT_EQ(policy.history(0).deaths, 10);
  EXPECT_EQ(policy.history(0).last, kExit1);
}

TEST(ReplacementPolicy, AReplacementThatWaitsSaysWhyInTheLauncherWords) {
  ReplacementPolicy policy(Options(/*max_replacements=*/3, absl::Seconds(1)));
  const ReplacementPolicy::Replace first = ExpectReplace(policy.OnRankDeath(0, kExit1, At({})));
  EXPECT_THAT(first.message, IsEmpty());  // replaced at once: nothing to explain
  TakeRank(policy, 0, At(absl::Seconds(5)));
  const ReplacementPolicy::Replace second =
      ExpectReplace(policy.OnRankDeath(0, kExit1, At(absl::Seconds(6))));
  EXPECT_EQ(second.message,
            "rank 0 died 2 times (last: exited with status 1), 2 in a row within 1m of taking its "
            "rank: replacing it in 1s");
  EXPECT_EQ(second.not_before, At(absl::Seconds(7)));
}

TEST(ReplacementPolicy, ADeathSixtySecondsOrMoreAfterTakingTheRankIsReplacedAtOnceAgain) {
  for (const absl::Duration lived : {absl::Seconds(60), absl::Seconds(61), absl::Hours(5)}) {
    ReplacementPolicy policy(Options(/*max_replacements=*/10, absl::Seconds(1)));
    (void)policy.OnRankDeath(0, kExit1, At({}));
    TakeRank(policy, 0, At(absl::Seconds(1)));
    (void)policy.OnRankDeath(0, kExit1, At(absl::Seconds(2)));  // a streak of 2
    TakeRank(policy, 0, At(absl::Seconds(3)));
    const ReplacementPolicy::Replace replace =
        ExpectReplace(policy.OnRankDeath(0, kExit1, At(absl::Seconds(3)) + lived));
    EXPECT_EQ(replace.streak, 1) << lived;
    EXPECT_EQ(replace.delay, absl::ZeroDuration()) << lived;
    EXPECT_THAT(replace.message, IsEmpty()) << lived;
    EXPECT_EQ(replace.deaths, 3) << lived;  // the deaths are still counted
  }
}

TEST(ReplacementPolicy, ADeathJustUnderSixtySecondsAfterTakingTheRankExtendsTheStreak) {
  ReplacementPolicy policy(Options(/*max_replacements=*/10, absl::Seconds(1)));
  (void)policy.OnRankDeath(0, kExit1, At({}));
  TakeRank(policy, 0, At(absl::Seconds(1)));
  const ReplacementPolicy::Replace replace = ExpectReplace(policy.OnRankDeath(
      0, kExit1, At(absl::Seconds(1)) + absl::Seconds(60) - absl::Nanoseconds(1)));
  EXPECT_EQ(replace.streak, 2);
  EXPECT_EQ(replace.delay, absl::Seconds(1));
}

TEST(ReplacementPolicy, ARankThatNeverTookOverStartsAStreakOfOneHoweverSoonItDies) {
  // The job's first process of a rank took it at formation, not by replacement.
  ReplacementPolicy policy(Options(/*max_replacements=*/10, absl::Seconds(1)));
  const ReplacementPolicy::Replace replace = ExpectReplace(policy.OnRankDeath(3, kExit1, At({})));
  EXPECT_EQ(replace.streak, 1);
  EXPECT_EQ(replace.delay, absl::ZeroDuration());
}

TEST(ReplacementPolicy, EachRankHasItsOwnStreak) {
  ReplacementPolicy policy(Options(/*max_replacements=*/10, absl::Seconds(1)));
  (void)policy.OnRankDeath(0, kExit1, At({}));
  TakeRank(policy, 0, At(absl::Seconds(1)));
  const ReplacementPolicy::Replace other =
      ExpectReplace(policy.OnRankDeath(1, "killed by SIGKILL", At(absl::Seconds(2))));
  EXPECT_EQ(other.streak, 1);
  EXPECT_EQ(other.deaths, 1);
  EXPECT_EQ(other.delay, absl::ZeroDuration());
  EXPECT_EQ(ExpectReplace(policy.OnRankDeath(0, kExit1, At(absl::Seconds(2)))).streak, 2);
}

TEST(ReplacementPolicy, ReplacementsAreBoundedByTenByDefault) {
  ReplacementPolicyOptions options;
  options.restart_backoff = absl::ZeroDuration();
  ReplacementPolicy policy(options);
  absl::Time now = At({});
  for (int i = 0; i < 10; ++i) {
    const ReplacementPolicy::Replace replace = ExpectReplace(policy.OnRankDeath(0, kExit1, now));
    EXPECT_EQ(replace.delay, absl::ZeroDuration());  // a backoff of 0 never waits
    TakeRank(policy, 0, now);
    now += absl::Milliseconds(100);
  }
  EXPECT_EQ(ExpectFail(policy.OnRankDeath(0, kExit1, now)),
            "rank 0 died 11 times (last: exited with status 1); --max-replacements=10 reached");
}

TEST(ReplacementPolicy, AHostsRanksCountTowardsTheBound) {
  ReplacementPolicy policy(Options(/*max_replacements=*/4, absl::Seconds(1)));
  policy.OnReplacementsMade(4);  // a dead host's four ranks, in one generation
  EXPECT_EQ(ExpectFail(policy.OnRankDeath(2, "killed by SIGKILL", At({}))),
            "rank 2 died 1 time (last: killed by SIGKILL); --max-replacements=4 reached");
}

TEST(ReplacementPolicy, WithoutStandbysARankDeathFailsTheJobNamingIt) {
  ReplacementPolicyOptions options;
  options.has_standbys = false;
  ReplacementPolicy policy(options);
  EXPECT_EQ(ExpectFail(policy.OnRankDeath(2, "killed by SIGKILL", At({}))),
            "rank 2 died and the job has no standbys (killed by SIGKILL)");
}

TEST(ReplacementPolicy, StandbysDyingWhileParkedAreRestartedWithBackoffAndStopAtTheLimit) {
  ReplacementPolicy policy(Options(/*max_replacements=*/2, absl::Seconds(1)));
  // Every standby dies 1 s after it started.
  const ReplacementPolicy::StandbyDecision first =
      policy.OnStandbyDeath(kExit1, At({}), At(absl::Seconds(1)));
  EXPECT_TRUE(first.respawn);
  EXPECT_EQ(first.not_before, At(absl::Seconds(1)));
  EXPECT_THAT(first.message, IsEmpty());

  const ReplacementPolicy::StandbyDecision second =
      policy.OnStandbyDeath(kExit1, At(absl::Seconds(1)), At(absl::Seconds(2)));
  EXPECT_TRUE(second.respawn);
  EXPECT_EQ(second.not_before, At(absl::Seconds(3)));
  EXPECT_EQ(second.message,
            "standbys died 2 times in a row within 1m of starting: the next starts in 1s");
  EXPECT_FALSE(policy.standbys_exhausted());

  const ReplacementPolicy::StandbyDecision third =
      policy.OnStandbyDeath(kExit1, At(absl::Seconds(3)), At(absl::Seconds(4)));
  EXPECT_FALSE(third.respawn);
  EXPECT_EQ(third.message,
            "standbys died 3 times while parked (last: exited with status 1); "
            "--max-replacements=2 reached: no more standbys are started");
  EXPECT_TRUE(policy.standbys_exhausted());

  // Said once: a later death (a standby still parked) is counted, and nothing more is said.
  const ReplacementPolicy::StandbyDecision fourth =
      policy.OnStandbyDeath("killed by SIGKILL", At({}), At(absl::Seconds(5)));
  EXPECT_FALSE(fourth.respawn);
  EXPECT_THAT(fourth.message, IsEmpty());
  EXPECT_EQ(policy.standby_deaths(), 4);
  EXPECT_EQ(policy.standby_last_death(), "killed by SIGKILL");
}

TEST(ReplacementPolicy, AStandbyThatWasParkedSixtySecondsStartsANewStreak) {
  ReplacementPolicy policy(Options(/*max_replacements=*/10, absl::Seconds(1)));
  (void)policy.OnStandbyDeath(kExit1, At({}), At(absl::Seconds(1)));
  (void)policy.OnStandbyDeath(kExit1, At(absl::Seconds(1)), At(absl::Seconds(2)));
  const ReplacementPolicy::StandbyDecision after_a_minute =
      policy.OnStandbyDeath(kExit1, At(absl::Seconds(2)), At(absl::Seconds(62)));
  EXPECT_TRUE(after_a_minute.respawn);
  EXPECT_EQ(after_a_minute.not_before, At(absl::Seconds(62)));
  EXPECT_THAT(after_a_minute.message, IsEmpty());
}

TEST(ReplacementPolicy, StandbyDeathsDoNotCountAsReplacements) {
  ReplacementPolicy policy(Options(/*max_replacements=*/1, absl::Seconds(1)));
  (void)policy.OnStandbyDeath(kExit1, At({}), At(absl::Seconds(1)));
  EXPECT_EQ(policy.replacements(), 0);
  EXPECT_EQ(ExpectReplace(policy.OnRankDeath(0, kExit1, At(absl::Seconds(2)))).deaths, 1);
}

}  // namespace
}  // namespace trainguard
