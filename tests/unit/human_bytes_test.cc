#include "sdk/core/human_bytes.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace trainguard {
namespace {

TEST(HumanBytes, WholeBytesBelowAKibibyteThenBinaryUnitsWithTwoDecimals) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1.00 KiB");
  EXPECT_EQ(HumanBytes(16394), "16.01 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{64} << 20), "64.00 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{1} << 50), "1024.00 TiB");
}

}  // namespace
}  // namespace trainguard
