// DutyThread (sdk/core/duty_thread.h): a thread of periodic duties, and how it stops.
#include "sdk/core/duty_thread.h"

#include <memory>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "sdk/core/mutex.h"

namespace trainguard {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

// How often the duties ran, and a bounded wait for it.
class Duties {
 public:
  DutyThreadOptions Options(absl::Duration period) {
    return DutyThreadOptions{.period = period, .duties = [this] {
                               MutexLock lock(&mu_);
                               ++runs_;
                             }};
  }
  bool AwaitRuns(int n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return runs_ >= n; },
                                kTimeout);
  }
  int runs() {
    MutexLock lock(&mu_);
    return runs_;
  }

 private:
  Mutex mu_;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(DutyThread, RunsTheDutiesEveryPeriod) {
  Duties duties;
  DutyThread thread(duties.Options(absl::Milliseconds(5)));
  EXPECT_TRUE(duties.AwaitRuns(3));
}

TEST(DutyThread, StopsAtOnceOnDestructionWhateverItsPeriod) {
  Duties duties;
  // An hour: only Stop() ends its sleep before ctest's timeout.
  auto thread = std::make_unique<DutyThread>(duties.Options(absl::Hours(1)));
  absl::SleepFor(absl::Milliseconds(20));  // asleep for its period
  thread.reset();
  EXPECT_EQ(duties.runs(), 0);
}

}  // namespace
}  // namespace trainguard
