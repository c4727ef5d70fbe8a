// The keys processes share through the store, as each side has always spelled them: a change here
// is a protocol change that old ranks and launchers would not follow.
#include "sdk/core/store_keys.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/runtime.h"

namespace trainguard::store_keys {
namespace {

TEST(StoreKeys, EveryKeyIsSpelledAsTheProtocolSays) {
  EXPECT_STREQ(kJobStop, "job/stop");
  EXPECT_STREQ(kJobStop, Runtime::kJobStopKey);
  EXPECT_EQ(Hang(3), "hang/gen3");
  EXPECT_EQ(HangAborted(3, 12), "hang/gen3/aborted/12");
  EXPECT_EQ(HangWithdrawn(0, 1), "hang/gen0/withdrawn/1");
  EXPECT_EQ(HangProgress(7, 0), "hang/gen7/progress/0");
  EXPECT_EQ(Resumed(2, 5), "rdzv/gen/2/resumed/5");
}

TEST(StoreKeys, AHangDeclarationRoundTrips) {
  const HangDeclaration d{17, "hang (phase) at step 9: step phase: no beat for 2s: rank 3 waits"};
  const std::string value = EncodeHangDeclaration(d);
  EXPECT_EQ(value, "rank 17: hang (phase) at step 9: step phase: no beat for 2s: rank 3 waits");
  std::optional<HangDeclaration> back = DecodeHangDeclaration(value);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 17);
  EXPECT_EQ(back->report, d.report);
}

TEST(StoreKeys, AValueThatIsNotADeclarationIsRefused) {
  for (const char* bad : {"", "rank", "rank : x", "rank -1: x", "rank x: y", "rank 3 x", "3: x",
                          "hang: x"}) {
    EXPECT_EQ(DecodeHangDeclaration(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace trainguard::store_keys
