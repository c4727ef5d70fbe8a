// FlightRecorder::Append allocates nothing (it runs on the training thread at every step, phase and
// collective). This binary counts every global operator new (tests/support/allocation_counter.h).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "sdk/watchdog/flight_recorder.h"
#include "tests/support/allocation_counter.h"

namespace trainguard {
namespace {

using testing::AllocationCount;

TEST(FlightRecorderAllocation, AppendAllocatesNothingEvenWhenTheRingWraps) {
  auto fr = FlightRecorder::Create(absl::StrFormat("fralloc-%d", getpid()), 0, 64);
  ASSERT_TRUE(fr.ok()) << fr.status();
  FlightRecord r;
  r.type = FlightRecordType::kCollectiveBegin;
  std::snprintf(r.name, sizeof(r.name), "allreduce");
  const int64_t before = AllocationCount();
  for (int64_t i = 0; i < 10'000; ++i) {
    r.step = i / 10;
    r.comm_seq = i;
    r.time_ns = (i % 2 == 0) ? 0 : i;  // both paths: the recorder stamps the time, or keeps it
    (*fr)->Append(r);
  }
  EXPECT_EQ(AllocationCount() - before, 0);
  EXPECT_EQ((*fr)->Snapshot().size(), 64u);
}

TEST(FlightRecorderAllocation, TheCounterSeesAllocations) {
  const int64_t before = AllocationCount();
  int* volatile p = new int(3);  // volatile: the compiler may not elide the allocation
  delete p;
  EXPECT_EQ(AllocationCount() - before, 1);
}

}  // namespace
}  // namespace trainguard
