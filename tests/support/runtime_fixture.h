// A Runtime on a ManualClock with its run dir in a fresh temp dir, for unit tests of the guard and
// recovery policy.
#ifndef TRAINGUARD_TESTS_SUPPORT_RUNTIME_FIXTURE_H_
#define TRAINGUARD_TESTS_SUPPORT_RUNTIME_FIXTURE_H_

#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "trainguard/sdk.h"

namespace trainguard::testing {

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.job_id = absl::StrCat("unit-", getpid());  // its shm segments are per process
    options_.rank = 1;
    options_.world_size = 4;
    options_.run_dir = dir_.path();
    options_.clock = &clock_;
    auto rt = Runtime::Create(options_);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = *std::move(rt);
  }

  // The events this rank has written so far.
  std::vector<Event> Events() {
    auto contents = ReadEventLog(Env::Default(), EventLogPath(dir_.path(), options_.rank));
    EXPECT_TRUE(contents.ok()) << contents.status();
    return contents.ok() ? contents->events : std::vector<Event>{};
  }

  std::vector<Event> EventsOfType(EventType type) {
    std::vector<Event> out;
    for (Event& e : Events()) {
      if (e.type == type) out.push_back(std::move(e));
    }
    return out;
  }

  TempDir dir_;
  ManualClock clock_;
  Options options_;
  std::unique_ptr<Runtime> rt_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_RUNTIME_FIXTURE_H_
