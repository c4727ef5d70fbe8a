// HostLiveness (sdk/agent/host_liveness.h): which hosts the coordinator of a multi-host job finds
// silent, from heartbeats read at explicit instants: no processes, no store, no clock, no sleeps.
#include "sdk/agent/host_liveness.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(3);  // --host-timeout's default with a TcpStore
constexpr absl::Duration kTick = absl::Milliseconds(250);  // kTimeout / 12: the coordinator's reads
constexpr absl::Duration kNanosecond = absl::Nanoseconds(1);

absl::Time At(absl::Duration since_start) { return absl::UnixEpoch() + since_start; }

std::vector<std::string> Hosts(const std::vector<HostLiveness::Silent>& silent) {
  std::vector<std::string> hosts;
  for (const HostLiveness::Silent& s : silent) hosts.push_back(s.host);
  return hosts;
}

// Reads `beats` at every tick from `from` up to and including `to`; the hosts found silent at any
// of those reads.
std::vector<std::string> ReadEveryTick(HostLiveness& liveness,
                                       const std::map<std::string, std::string>& beats,
                                       absl::Time from, absl::Time to) {
  std::vector<std::string> silent;
  for (absl::Time now = from; now <= to; now += kTick) {
    for (const std::string& host : Hosts(liveness.Observe(beats, now))) silent.push_back(host);
  }
  return silent;
}

TEST(HostLiveness, AHostSilentForExactlyTheTimeoutIsDeadAndNotOneNanosecondBefore) {
  HostLiveness liveness(kTimeout);
  const std::map<std::string, std::string> beats = {{"host1", "7"}, {"host2", "7"}};
  EXPECT_THAT(ReadEveryTick(liveness, beats, At({}), At(kTimeout - kTick)), IsEmpty());
  EXPECT_THAT(liveness.Observe(beats, At(kTimeout - kNanosecond)), IsEmpty());
  EXPECT_FALSE(liveness.IsSilent("host1", At(kTimeout - kNanosecond)));

  const std::vector<HostLiveness::Silent> silent = liveness.Observe(beats, At(kTimeout));
  EXPECT_THAT(Hosts(silent), ElementsAre("host1", "host2"));
  ASSERT_FALSE(silent.empty());
  EXPECT_EQ(silent[0].since, At({}));
  EXPECT_EQ(silent[0].silent_for, kTimeout);  // what the launcher prints: "no heartbeat for 3s"
  EXPECT_TRUE(liveness.IsSilent("host1", At(kTimeout)));
}

// A host a third of the way to its timeout is quiet (a hang's diagnosis holds off for it): exactly
// then, not a nanosecond before, and no longer once its heartbeat changes.
TEST(HostLiveness, AHostIsQuietExactlyWhenItsHeartbeatStoodStillForTheGivenTimeAndNotBefore) {
  HostLiveness liveness(kTimeout);
  const absl::Duration quiet = kTimeout / 3;
  EXPECT_THAT(liveness.Observe({{"host1", "7"}, {"host2", "7"}}, At({})), IsEmpty());
  EXPECT_THAT(liveness.Observe({{"host1", "8"}, {"host2", "7"}}, At(kTick)), IsEmpty());
  EXPECT_THAT(Hosts(liveness.QuietFor(quiet, At(quiet - kNanosecond))), IsEmpty());
  const std::vector<HostLiveness::Silent> at_quiet = liveness.QuietFor(quiet, At(quiet));
  EXPECT_THAT(Hosts(at_quiet), ElementsAre("host2"));
  ASSERT_EQ(at_quiet.size(), 1u);
  EXPECT_EQ(at_quiet[0].silent_for, quiet);
  EXPECT_THAT(Hosts(liveness.QuietFor(quiet, At(kTick + quiet))), ElementsAre("host1", "host2"));
  EXPECT_THAT(liveness.Observe({{"host1", "8"}, {"host2", "8"}}, At(kTick + quiet)), IsEmpty());
  EXPECT_THAT(Hosts(liveness.QuietFor(quiet, At(kTick + quiet))), ElementsAre("host1"));
  liveness.Forget("host1");
  EXPECT_THAT(Hosts(liveness.QuietFor(quiet, At(kTick + quiet))), IsEmpty());
}

TEST(HostLiveness, AChangingHeartbeatKeepsAHostAliveAndItsLastChangeStartsItsBound) {
  HostLiveness liveness(kTimeout);
  int beat = 0;
  for (absl::Time now = At({}); now <= At(absl::Minutes(1)); now += kTick) {
    EXPECT_THAT(liveness.Observe({{"host1", std::to_string(++beat)}}, now), IsEmpty()) << now;
  }
  // The agent stops beating: its last change, at 1 min, is when its silence began.
  const std::map<std::string, std::string> last = {{"host1", std::to_string(beat)}};
  const absl::Time stopped = At(absl::Minutes(1));
  EXPECT_THAT(ReadEveryTick(liveness, last, stopped + kTick, stopped + kTimeout - kTick),
              IsEmpty());
  EXPECT_THAT(liveness.Observe(last, stopped + kTimeout - kNanosecond), IsEmpty());
  const std::vector<HostLiveness::Silent> silent = liveness.Observe(last, stopped + kTimeout);
  ASSERT_THAT(Hosts(silent), ElementsAre("host1"));
  EXPECT_EQ(silent[0].since, stopped);
}

// Issue 36: a store stall let the coordinator's lease lapse while its host trained on; the next
// holder counted that host's heartbeat as already timed out and declared it dead at its first read.
TEST(HostLiveness, ThePreviousLeaseHoldersHostGetsAFullTimeoutFromTheNewHoldersFirstRead) {
  const absl::Time takeover = At(absl::Minutes(10));
  HostLiveness liveness(kTimeout);  // the new holder's, fresh at the takeover
  // The previous holder's agent resumes beating a little after the takeover: it is alive.
  EXPECT_THAT(liveness.Observe({{"old-holder", "41"}, {"host2", "9"}}, takeover), IsEmpty());
  EXPECT_FALSE(liveness.IsSilent("old-holder", takeover));
  EXPECT_THAT(ReadEveryTick(liveness, {{"old-holder", "41"}, {"host2", "9"}}, takeover + kTick,
                            takeover + kTimeout - kTick),
              IsEmpty());
  EXPECT_THAT(liveness.Observe({{"old-holder", "42"}, {"host2", "9"}}, takeover + kTimeout),
              ElementsAre(::testing::Field(&HostLiveness::Silent::host, "host2")));
  // Had it not beaten again, it is dead a full timeout after the first read, not before.
  HostLiveness dead_holder(kTimeout);
  EXPECT_THAT(
      ReadEveryTick(dead_holder, {{"old-holder", "41"}}, takeover, takeover + kTimeout - kTick),
      IsEmpty());
  EXPECT_THAT(dead_holder.Observe({{"old-holder", "41"}}, takeover + kTimeout - kNanosecond),
              IsEmpty());
  EXPECT_THAT(Hosts(dead_holder.Observe({{"old-holder", "41"}}, takeover + kTimeout)),
              ElementsAre("old-holder"));
}

TEST(HostLiveness, AHostThatJoinsLaterGetsAFullTimeoutFromWhenItIsFirstSeen) {
  HostLiveness liveness(kTimeout);
  int beat = 0;
  for (absl::Time now = At({}); now < At(absl::Seconds(10)); now += kTick) {
    EXPECT_THAT(liveness.Observe({{"host1", std::to_string(++beat)}}, now), IsEmpty());
  }
  const absl::Time joined = At(absl::Seconds(10));
  for (absl::Time now = joined; now < joined + kTimeout; now += kTick) {
    EXPECT_THAT(liveness.Observe({{"host1", std::to_string(++beat)}, {"host2", ""}}, now),
                IsEmpty());
  }
  EXPECT_THAT(Hosts(liveness.Observe({{"host1", std::to_string(++beat)}, {"host2", ""}},
                                     joined + kTimeout)),
              ElementsAre("host2"));
}

TEST(HostLiveness, AGapInTheReadsLongerThanAThirdOfTheTimeoutGivesEveryHostAFreshBound) {
  HostLiveness liveness(kTimeout);
  const std::map<std::string, std::string> beats = {{"host1", "5"}, {"host2", "5"}};
  EXPECT_THAT(ReadEveryTick(liveness, beats, At({}), At(absl::Seconds(2))), IsEmpty());
  // The coordinator's reads stall for 4 s (an etcd leader election, a stalled coordinator): it saw
  // nobody beat meanwhile, so nobody is dead for it, though no beat changed since 0 s.
  const absl::Time resumed = At(absl::Seconds(6));
  EXPECT_THAT(liveness.Observe({{"host1", "5"}}, resumed), IsEmpty());
  EXPECT_FALSE(liveness.IsSilent("host2", resumed));  // not read then, refreshed all the same
  EXPECT_THAT(ReadEveryTick(liveness, beats, resumed + kTick, resumed + kTimeout - kTick),
              IsEmpty());
  const std::vector<HostLiveness::Silent> silent = liveness.Observe(beats, resumed + kTimeout);
  EXPECT_THAT(Hosts(silent), ElementsAre("host1", "host2"));
  ASSERT_FALSE(silent.empty());
  EXPECT_EQ(silent[0].since, resumed);
}

TEST(HostLiveness, AGapOfExactlyAThirdOfTheTimeoutIsNoGap) {
  HostLiveness liveness(kTimeout);
  const std::map<std::string, std::string> beats = {{"host1", "5"}};
  for (absl::Time now = At({}); now < At(kTimeout); now += kTimeout / 3) {
    EXPECT_THAT(liveness.Observe(beats, now), IsEmpty());
  }
  EXPECT_THAT(Hosts(liveness.Observe(beats, At(kTimeout))), ElementsAre("host1"));

  HostLiveness gapped(kTimeout);
  EXPECT_THAT(gapped.Observe(beats, At({})), IsEmpty());
  EXPECT_THAT(gapped.Observe(beats, At(kTimeout / 3 + kNanosecond)), IsEmpty());  // a gap: afresh
  EXPECT_THAT(gapped.Observe(beats, At(kTimeout)), IsEmpty());
  EXPECT_FALSE(gapped.IsSilent("host1", At(kTimeout)));
}

// The launcher forgets a host once its death is written; a write that failed is tried again.
TEST(HostLiveness, ASilentHostIsReportedAtEveryReadUntilForgottenAndThenNotAgain) {
  HostLiveness liveness(kTimeout);
  const std::map<std::string, std::string> beats = {{"host1", "3"}, {"host2", "3"}};
  EXPECT_THAT(ReadEveryTick(liveness, beats, At({}), At(kTimeout - kTick)), IsEmpty());
  EXPECT_THAT(Hosts(liveness.Observe(beats, At(kTimeout))), ElementsAre("host1", "host2"));
  EXPECT_THAT(Hosts(liveness.Observe(beats, At(kTimeout + kTick))),
              ElementsAre("host1", "host2"));  // neither declared yet: both again

  liveness.Forget("host1");
  EXPECT_FALSE(liveness.IsSilent("host1", At(kTimeout + kTick)));
  // The launcher leaves a dead host out of its reads; host2's declaration failed.
  EXPECT_THAT(Hosts(liveness.Observe({{"host2", "3"}}, At(kTimeout + 2 * kTick))),
              ElementsAre("host2"));
  liveness.Forget("host2");
  EXPECT_THAT(ReadEveryTick(liveness, {}, At(kTimeout + 3 * kTick), At(absl::Minutes(1))),
              IsEmpty());
  EXPECT_FALSE(liveness.IsSilent("host2", At(absl::Minutes(1))));
}

TEST(HostLiveness, AHostLeftOutOfAReadIsNeitherCheckedNorReportedButKeepsItsBound) {
  HostLiveness liveness(kTimeout);
  EXPECT_THAT(liveness.Observe({{"host1", "1"}, {"host2", "1"}}, At({})), IsEmpty());
  const std::vector<std::string> silent =
      ReadEveryTick(liveness, {{"host1", "1"}}, At(kTick), At(absl::Seconds(10)));
  EXPECT_THAT(silent, ::testing::Not(IsEmpty()));
  EXPECT_THAT(silent, ::testing::Each("host1"));
  EXPECT_TRUE(liveness.IsSilent("host2", At(absl::Seconds(10))));
  EXPECT_FALSE(liveness.IsSilent("host3", At(absl::Seconds(10))));  // never observed
}

// --- With ages (ObserveAges): the store says how long ago each heartbeat was written.

constexpr absl::Duration kRecheck = absl::Milliseconds(750);  // kTimeout / 4, as the coordinator

// A host seen beating at `last_beat` (its write, on the coordinator's clock) and read at `now`:
// the age the store answers, the answer arriving `way_back` after the store read it.
std::optional<absl::Duration> AgeOf(absl::Time last_beat, absl::Time now,
                                    absl::Duration way_back = absl::ZeroDuration()) {
  return (now - way_back) - last_beat;
}

// The deadline is the last write plus the timeout: declared by the read that arrives at it, and
// not by one a nanosecond before, however few reads came between.
TEST(HostLivenessAges, AHostIsSilentAtItsLastWritePlusTheTimeoutAndNotOneNanosecondBefore) {
  HostLiveness liveness(kTimeout, kRecheck);
  EXPECT_THAT(liveness.ObserveAges({{"host1", absl::ZeroDuration()}}, At({})), IsEmpty());
  const absl::Time last_beat = At(absl::Milliseconds(500));
  // Until its beat is a quarter of the bound old a host is not due for a read; the coordinator's
  // ticks read only the counts (no host) meanwhile.
  absl::Time now = At(kTick);
  for (; now < At(kRecheck); now += kTick) {
    EXPECT_THAT(liveness.DueForRead(now), IsEmpty());
    EXPECT_THAT(liveness.ObserveAges({}, now), IsEmpty());
  }
  EXPECT_THAT(liveness.DueForRead(now), ElementsAre("host1"));
  EXPECT_THAT(liveness.ObserveAges({{"host1", AgeOf(last_beat, now)}}, now), IsEmpty());
  EXPECT_THAT(liveness.DueForRead(now), IsEmpty());
  // Once its last beat is a quarter of the bound old, it is due at every read until its deadline.
  const absl::Time deadline = last_beat + kTimeout;
  for (now += kTick; now < deadline; now += kTick) {
    EXPECT_EQ(liveness.DueForRead(now).empty(), now - last_beat < kRecheck) << "at " << now;
    EXPECT_THAT(liveness.ObserveAges({{"host1", AgeOf(last_beat, now)}}, now), IsEmpty());
  }
  EXPECT_THAT(liveness.ObserveAges({{"host1", AgeOf(last_beat, deadline - kNanosecond)}},
                                   deadline - kNanosecond),
              IsEmpty());
  const std::vector<HostLiveness::Silent> silent =
      liveness.ObserveAges({{"host1", AgeOf(last_beat, deadline)}}, deadline);
  ASSERT_THAT(Hosts(silent), ElementsAre("host1"));
  EXPECT_EQ(silent[0].since, last_beat);
  EXPECT_EQ(silent[0].silent_for, kTimeout);
}

// The answer's way back makes the silence start later than the write (never earlier): the host is
// declared late by at most that way back, never early.
TEST(HostLivenessAges, TheAnswersWayBackMakesTheDeclarationLateByAtMostItNeverEarly) {
  constexpr absl::Duration kWayBack = absl::Milliseconds(40);
  HostLiveness liveness(kTimeout, kRecheck);
  EXPECT_THAT(liveness.ObserveAges({{"host1", std::nullopt}}, At({})), IsEmpty());
  const absl::Time last_beat = At(absl::Milliseconds(200));
  absl::Time now = At(kTick);
  for (; now <= last_beat + kTimeout + kWayBack; now += absl::Milliseconds(10)) {
    const std::vector<HostLiveness::Silent> silent =
        liveness.ObserveAges({{"host1", AgeOf(last_beat, now, kWayBack)}}, now);
    if (now < last_beat + kTimeout + kWayBack) {
      EXPECT_THAT(silent, IsEmpty()) << "at " << now;
    } else {
      ASSERT_THAT(Hosts(silent), ElementsAre("host1"));
      EXPECT_EQ(silent[0].since, last_beat + kWayBack);
    }
  }
  // A later answer with a shorter way back dates the same write earlier: the silence does not
  // move back.
  HostLiveness other(kTimeout, kRecheck);
  (void)other.ObserveAges({{"host1", std::nullopt}}, At({}));
  (void)other.ObserveAges({{"host1", AgeOf(last_beat, At(kTick), kWayBack)}}, At(kTick));
  for (absl::Time t = At(2 * kTick); t < last_beat + kTimeout; t += kTick) {
    (void)other.ObserveAges({}, t);  // the ticks' reads: no gap
  }
  EXPECT_THAT(
      other.ObserveAges({{"host1", AgeOf(last_beat, last_beat + kTimeout)}}, last_beat + kTimeout),
      IsEmpty());
}

// A live host beats between reads: each read moves its deadline on, and it is due for a read
// again only once its newest beat is `recheck` old.
TEST(HostLivenessAges, ALiveHostsDeadlineMovesOnWithEachReadOfItsNewBeat) {
  HostLiveness liveness(kTimeout, kRecheck);
  (void)liveness.ObserveAges({{"host1", kTick}}, At({}));
  for (absl::Time now = At(kRecheck); now <= At(10 * kTimeout); now += kRecheck) {
    ASSERT_THAT(liveness.DueForRead(now), ElementsAre("host1")) << "at " << now;
    // It beat a tick ago (its agent beats every twelfth of the bound).
    EXPECT_THAT(liveness.ObserveAges({{"host1", kTick}}, now), IsEmpty());
    EXPECT_THAT(liveness.DueForRead(now), IsEmpty());
    EXPECT_THAT(liveness.QuietFor(kTimeout / 3, now), IsEmpty());
  }
}

// A gap in the reads (more than a third of the bound since the previous) starts every bound
// afresh: a host whose last write is older than the bound is not declared by the read after it.
TEST(HostLivenessAges, AGapInTheReadsGivesEveryHostAFreshBoundWhateverItsAge) {
  HostLiveness liveness(kTimeout, kRecheck);
  (void)liveness.ObserveAges({{"host1", absl::ZeroDuration()}}, At({}));
  const absl::Time after_gap = At(kTimeout / 3 + kNanosecond);
  EXPECT_THAT(liveness.ObserveAges({}, after_gap), IsEmpty());
  EXPECT_EQ(liveness.bounds_since(), after_gap);
  // The store stalled for its agents too: its write is as old as the stall.
  const absl::Time later = At(kTimeout + kTick);
  for (absl::Time now = after_gap + kTick; now < later; now += kTick) {
    (void)liveness.ObserveAges({}, now);
  }
  EXPECT_THAT(liveness.ObserveAges({{"host1", later - At({})}}, later), IsEmpty());
  const std::vector<HostLiveness::Silent> silent =
      liveness.ObserveAges({{"host1", after_gap + kTimeout - At({})}}, after_gap + kTimeout);
  ASSERT_THAT(Hosts(silent), ElementsAre("host1"));
  EXPECT_EQ(silent[0].since, after_gap);
}

// A host seen for the first time (one that just joined; every host after a takeover, the previous
// lease holder's included) gets a full bound from that read, however old its last write.
TEST(HostLivenessAges, AHostSeenForTheFirstTimeGetsAFullBoundWhateverItsAge) {
  HostLiveness liveness(kTimeout, kRecheck);
  const absl::Time first = At(absl::Seconds(60));
  // Silent for 50 s already (the previous lease holder's host, say): a full bound from this read.
  const absl::Time last_beat = first - absl::Seconds(50);
  EXPECT_THAT(liveness.ObserveAges({{"old_holder", AgeOf(last_beat, first)}}, first), IsEmpty());
  EXPECT_TRUE(liveness.Knows("old_holder"));
  // Read at every tick (no gap), always as silent: not before the bound, from the first read.
  absl::Time now = first + kTick;
  for (; now < first + kTimeout; now += kTick) {
    EXPECT_THAT(liveness.ObserveAges({{"old_holder", AgeOf(last_beat, now)}}, now), IsEmpty())
        << "at " << now;
  }
  const std::vector<HostLiveness::Silent> silent =
      liveness.ObserveAges({{"old_holder", AgeOf(last_beat, now)}}, now);
  ASSERT_THAT(Hosts(silent), ElementsAre("old_holder"));
  EXPECT_EQ(silent[0].since, first);
  liveness.Forget("old_holder");
  EXPECT_FALSE(liveness.Knows("old_holder"));
  EXPECT_THAT(liveness.DueForRead(first + 2 * kTimeout), IsEmpty());
}

}  // namespace
}  // namespace trainguard
