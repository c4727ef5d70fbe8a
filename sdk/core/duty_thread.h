// DutyThread: a thread of periodic duties. It wakes every `period` and runs its owner's duties:
// the rank's (sdk/runtime: publishing its records, a dump asked for by SIGUSR2, the check on a step
// that outlives its generation), a host agent's heartbeat (HostAgent::StartBeating), the
// coordinator's lease renewal (LeaseKeeper::StartRenewing).
//
// Every wait is bounded by `period`. The destructor stops the thread and joins it: within the
// duties in progress.
//
// Thread safety: the duties run on the thread; construction and destruction belong to the owner.
// Not copyable or movable.
#ifndef TRAINGUARD_SDK_CORE_DUTY_THREAD_H_
#define TRAINGUARD_SDK_CORE_DUTY_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"

namespace trainguard {

struct DutyThreadOptions {
  // How often the duties run.
  absl::Duration period = absl::Milliseconds(250);
  std::function<void()> duties;
};

class DutyThread {
 public:
  // Starts the thread. REQUIRES: duties set.
  explicit DutyThread(DutyThreadOptions options);
  // Stops the thread and joins it.
  ~DutyThread();
  // Asks the thread to stop, without waiting for it (the destructor joins it): an owner stopping
  // several threads lets them stop together.
  void Stop();
  DutyThread(const DutyThread&) = delete;
  DutyThread& operator=(const DutyThread&) = delete;

 private:
  void Run();

  const DutyThreadOptions options_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses everything above
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_DUTY_THREAD_H_
