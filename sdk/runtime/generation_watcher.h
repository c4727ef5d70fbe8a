// GenerationWatcher: on a thread of its own, learns that the generation a rank holds was
// superseded (a newer one is published: a peer died, a host was lost, a rank asked for a
// re-rendezvous) and says so once per superseded generation (private to sdk/runtime).
//
// The thread waits (NewerGenerationWait) for the table of the generation after the one the rank's
// RendezvousMember holds: a store wait parked at the server, no polling. When it appears, the
// member is marked superseded and the watcher calls its handler with the superseded generation,
// once: the training thread adopts the next generation in its own time (recover()), and until then
// the watcher only looks again every few milliseconds, without a request. A store that fails is
// looked at again the same way.
//
// Stopping. A store wait cannot be interrupted (Store::Wait has no cancellation, and it waits for
// every key it names, so no second key can wake it), so the wait is cut into store waits of at
// most `slice` each, and Stop() is seen between two of them: the destructor waits for the thread
// at most one slice, beside a handler that is running. The slice is the trade between that and
// store traffic: one Wait request per slice while the generation is current (on etcd, a watch
// each).
//
// Thread safety: the handler runs on the watcher's thread; Stop() may be called from any thread;
// construction and destruction belong to the owner. Neither class is copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
#define TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"

namespace trainguard {

// A wait for the generation after the one a RendezvousMember holds, that Cancel() ends: the
// GenerationWatcher's, apart so that its end can be seen.
class NewerGenerationWait {
 public:
  // REQUIRES: `member` outlives the wait; `slice` > 0.
  NewerGenerationWait(RendezvousMember* member, absl::Duration slice);
  NewerGenerationWait(const NewerGenerationWait&) = delete;
  NewerGenerationWait& operator=(const NewerGenerationWait&) = delete;

  // Waits up to `timeout`, in store waits of at most the slice each
  // (RendezvousMember::AwaitNewerGeneration), for the member's generation to be superseded. True
  // once it is (also when it was already), false when `timeout` ran out; Cancelled once Cancel()
  // was called, before or during the wait (at the end of the store wait in progress); the
  // member's or the store's error otherwise. Any thread; one call at a time.
  absl::StatusOr<bool> Await(absl::Duration timeout);
  // Ends the wait in progress and every later one with Cancelled. Any thread.
  void Cancel();
  bool cancelled() const;

 private:
  RendezvousMember* const member_;
  const absl::Duration slice_;
  mutable Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class GenerationWatcher {
 public:
  // Starts the thread. `on_superseded(g)` is called on it once for each generation g the member
  // held and found superseded. REQUIRES: `member` outlives the watcher; `slice` > 0.
  GenerationWatcher(RendezvousMember* member, absl::Duration slice,
                    std::function<void(int64_t generation)> on_superseded);
  // Stops the thread and joins it: at the end of the store wait in progress (one slice at most),
  // or once a handler that is running returns.
  ~GenerationWatcher();
  // Asks the thread to stop, without waiting for it (the destructor joins it): the wait in
  // progress ends with Cancelled at the end of its slice. An owner stopping several threads lets
  // them stop together.
  void Stop();
  GenerationWatcher(const GenerationWatcher&) = delete;
  GenerationWatcher& operator=(const GenerationWatcher&) = delete;

 private:
  void Run();

  RendezvousMember* const member_;
  const std::function<void(int64_t)> on_superseded_;
  NewerGenerationWait wait_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses everything above
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
