// The guard's happy path allocates nothing (issue: no heap allocation per step). This binary counts
// every global operator new (tests/support/allocation_counter.h).
#include "gtest/gtest.h"
#include "tests/support/allocation_counter.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard {
namespace {

using testing::AllocationCount;

class GuardAllocation : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options;
    options.run_dir = dir_.path();
    auto rt = Runtime::Create(options);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = *std::move(rt);
  }
  testing::TempDir dir_;
  std::unique_ptr<Runtime> rt_;
};

TEST_F(GuardAllocation, ASuccessfulGuardedStepAllocatesNothing) {
  int64_t sum = 0;
  guard(*rt_, 0, [&](Step& s) { sum += s.number(); });  // warm-up
  const int64_t before = AllocationCount();
  for (int64_t step = 1; step <= 10'000; ++step) {
    StepResult r = guard(*rt_, step, [&](Step& s) { sum += s.number(); });
    if (!r.ok()) FAIL() << r.status;
  }
  EXPECT_EQ(AllocationCount() - before, 0);
  EXPECT_EQ(sum, 10'000 * 10'001 / 2);
}

TEST_F(GuardAllocation, ASuccessfulStepScopeAllocatesNothing) {
  const int64_t before = AllocationCount();
  for (int64_t step = 0; step < 10'000; ++step) {
    StepScope scope(*rt_, step);
    ASSERT_TRUE(scope.active());
    ASSERT_TRUE(scope.Finish().ok());
  }
  EXPECT_EQ(AllocationCount() - before, 0);
}

TEST_F(GuardAllocation, TheCounterSeesAllocations) {
  const int64_t before = AllocationCount();
  int* volatile p = new int(3);  // volatile: the compiler may not elide the allocation
  delete p;
  EXPECT_EQ(AllocationCount() - before, 1);
}

}  // namespace
}  // namespace trainguard
