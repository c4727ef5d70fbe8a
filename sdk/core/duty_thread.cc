#include "sdk/core/duty_thread.h"

#include <utility>

namespace trainguard {

DutyThread::DutyThread(DutyThreadOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

DutyThread::~DutyThread() {
  Stop();
  thread_.join();
}

void DutyThread::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
}

void DutyThread::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; }, options_.period);
      if (stop_) return;
    }
    options_.duties();
  }
}

}  // namespace trainguard
