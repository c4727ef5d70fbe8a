// GenerationWatcher: on a thread of its own, learns that the generation a rank holds was
// superseded (a newer one is published: a peer died, a host was lost, a rank asked for a
// re-rendezvous) and says so once per superseded generation (private to sdk/runtime).
//
// The thread waits, one bounded store wait after another, for the table of the generation after
// the one the rank's RendezvousMember holds (RendezvousMember::AwaitNewerGeneration: parked at the
// server, no polling). When it appears, the member is marked superseded and the watcher calls its
// handler with the superseded generation, once: the training thread adopts the next generation in
// its own time (recover()), and until then the watcher only looks again every few milliseconds,
// without a request. A store that fails is looked at again the same way.
//
// Each wait lasts `wait`: as much store traffic as the heartbeat when it is the heartbeat interval
// (an etcd store opens a watch per wait), and the longest the destructor waits for the thread,
// beside a handler that is running.
//
// Thread safety: the handler runs on the watcher's thread; construction and destruction belong to
// the owner. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
#define TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"

namespace trainguard {

class GenerationWatcher {
 public:
  // Starts the thread. `on_superseded(g)` is called on it once for each generation g the member
  // held and found superseded. REQUIRES: `member` outlives the watcher; `wait` > 0.
  GenerationWatcher(RendezvousMember* member, absl::Duration wait,
                    std::function<void(int64_t generation)> on_superseded);
  // Stops the thread and joins it: within `wait` (the store wait in progress), or once a handler
  // that is running returns.
  ~GenerationWatcher();
  // Asks the thread to stop, without waiting for it (the destructor joins it): an owner stopping
  // several threads lets them stop together.
  void Stop();
  GenerationWatcher(const GenerationWatcher&) = delete;
  GenerationWatcher& operator=(const GenerationWatcher&) = delete;

 private:
  void Run();

  RendezvousMember* const member_;
  const absl::Duration wait_;
  const std::function<void(int64_t)> on_superseded_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses everything above
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
