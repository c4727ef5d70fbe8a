// RunNiced: CPU-heavy work that must not starve the rest of a busy machine, run at a lower
// priority.
//
// A rank that declares a hang symbolises the stacks of all its threads; for frames in a large
// module (libtorch_cpu.so) that is about 0.5 s of CPU, and every rank of the job does it at once.
// At normal priority, on a machine whose cores the ranks fill, that starved the launcher agents,
// the store and the ranks that were recovering by as long (docs/PERFORMANCE.md). Linux lets a
// thread raise its own nice value but not lower it back without CAP_SYS_NICE, so the work runs on
// a thread of its own, which ends with it.
//
// Thread safety: a plain function; `fn` runs on the new thread while the caller waits, so it may
// use the caller's locals.
#ifndef TRAINGUARD_SDK_CORE_RUN_NICED_H_
#define TRAINGUARD_SDK_CORE_RUN_NICED_H_

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "absl/functional/function_ref.h"

namespace trainguard {

// The nice value of the calling thread.
inline int ThreadNice() {
  errno = 0;
  return getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
}

// Runs `fn` on a new thread whose nice value is the caller's plus `increment` (capped at 19 by
// the kernel; left as it is if the kernel refuses), and returns once it has run.
inline void RunNiced(int increment, absl::FunctionRef<void()> fn) {
  const int base = ThreadNice();
  std::thread worker([&] {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), base + increment);
    fn();
  });
  worker.join();
}

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_RUN_NICED_H_
