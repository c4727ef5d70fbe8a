#include "trainguard/clock.h"

#include <time.h>

#include "absl/time/clock.h"

namespace trainguard {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }

  int64_t MonotonicNanos() override {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }

  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* Clock::Real() {
  static Clock* const clock = new RealClock();  // never destroyed: used by threads until exit
  return clock;
}

}  // namespace trainguard
