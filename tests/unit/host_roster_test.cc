// HostsStillInJob (sdk/agent/host_roster.h): who is still in a multi-host job that is ending.
#include "sdk/agent/host_roster.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(HostRoster, EveryHostThatJoinedIsInTheJobUntilItLeavesOrIsDeclaredDead) {
  EXPECT_THAT(HostsStillInJob({"h1", "h2", "h3"}, {"h1"}, {"h2"}), ElementsAre("h3"));
  EXPECT_THAT(HostsStillInJob({"h1", "h2", "h3"}, {"h1", "h3"}, {"h2"}), IsEmpty());
}

// The fault issue 36 found: a host fenced out (declared dead, then back) also writes that it left;
// counted twice, it let the store's host stop the store while h3 still read the job's end.
TEST(HostRoster, AFencedHostThatAlsoLeftCountsOnceAndTheOthersAreStillAwaited) {
  EXPECT_THAT(HostsStillInJob({"h1", "h2", "h3"}, {"h1", "h2"}, {"h2"}), ElementsAre("h3"));
}

TEST(HostRoster, AHostThatNeverJoinedIsNotAwaited) {
  EXPECT_THAT(HostsStillInJob({"h1"}, {"h1", "h9"}, {"h8"}), IsEmpty());
  EXPECT_THAT(HostsStillInJob({}, {}, {}), IsEmpty());
}

}  // namespace
}  // namespace trainguard
