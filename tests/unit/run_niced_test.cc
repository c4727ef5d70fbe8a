// RunNiced (sdk/core/run_niced.h): the work runs on another thread, at the caller's nice value
// plus the increment, and the caller's own nice value is untouched.
#include "sdk/core/run_niced.h"

#include <unistd.h>

#include <algorithm>

#include "gtest/gtest.h"

namespace trainguard {
namespace {

TEST(RunNiced, TheWorkRunsOnAnotherThreadAtTheRaisedNiceValue) {
  const int before = ThreadNice();
  int nice_seen = -100;
  pid_t tid_seen = 0;
  RunNiced(10, [&] {
    nice_seen = ThreadNice();
    tid_seen = gettid();
  });
  EXPECT_EQ(nice_seen, std::min(before + 10, 19));
  EXPECT_NE(tid_seen, 0);
  EXPECT_NE(tid_seen, gettid());
  EXPECT_EQ(ThreadNice(), before);  // the caller is not reniced
}

TEST(RunNiced, TheNiceValueIsCappedAt19) {
  int nice_seen = -100;
  RunNiced(100, [&] { nice_seen = ThreadNice(); });
  EXPECT_EQ(nice_seen, 19);
}

}  // namespace
}  // namespace trainguard
