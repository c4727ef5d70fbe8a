// GenerationWatcher: on a thread of its own, learns what happens to the generation a rank holds,
// without polling the store (private to sdk/runtime):
//
//   - it was superseded (a newer one is published: a peer died, a host was lost, a rank asked for a
//     re-rendezvous): the member is marked superseded and on_superseded is called once for it; the
//     training thread adopts the next generation in its own time (recover()), and until then the
//     watcher only looks again every few milliseconds, without a request;
//   - a peer declared a hang in it (its key hang/gen<G>, sdk/core/store_keys.h): the key's value is
//     read and handed to on_hang_key, which decides whether this rank dumps its evidence;
//   - a notice appeared: a key by which another process asks this rank for something (the host
//     agent's request for work records); its handler is called once per key.
//
// One parked store wait covers all of them, and the watcher's own shutdown: a Store::WaitAny
// (RendezvousMember::AwaitNewerGenerationOr) on the next generation's table, the hang key of the
// held generation, the notices not seen yet and a wake key of this watcher
// (rdzv/wake/<member>/<nonce>), lasting `park`.
// While nothing happens a rank sends one request per `park`, whatever the size of the job. While a
// peer's hang of the held generation stands (its key exists), the key itself cannot be waited for,
// so the watcher reads it every `hang_recheck` (each read behind a wait of that long on the table
// and the wake key) until it is withdrawn (deleted) or the generation is superseded. A store that
// fails is looked at again after a few milliseconds, with waits of 250 ms at most until one ends
// normally again.
//
// Stopping. Stop() writes the wake key (one store Set, bounded by a second), which ends the parked
// wait at once; the destructor joins the thread and deletes the key. When the Set cannot reach
// the store, the destructor waits for the parked wait to end by itself: 250 ms at most once a wait
// has failed, `park` at most for the wait in progress as the store was lost (plus the store
// client's grace). A member whose writes the fence rejects is one whose next generation is
// published, and that table ends the wait by itself.
//
// Thread safety: the handlers run on the watcher's thread; Stop() may be called from any thread;
// construction and destruction belong to the owner. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
#define TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/rendezvous/rendezvous.h"
#include "trainguard/store.h"

namespace trainguard {

struct GenerationWatcherOptions {
  RendezvousMember* member = nullptr;
  // The member's store: the hang key is read and the wake key written through it.
  Store* store = nullptr;
  // How long one parked wait lasts: the rank's request rate while nothing happens, and the
  // longest the destructor waits for the thread when the store cannot be reached.
  absl::Duration park = absl::Seconds(5);
  // While a peer's hang of the held generation stands: how often its key is read again.
  absl::Duration hang_recheck = absl::Milliseconds(250);
  // Called once for each generation g the member held and found superseded.
  std::function<void(int64_t generation)> on_superseded;
  // After each read of the hang key of `generation`, sent at `asked` (absl::Now()): the declarer's
  // value, NotFound once a standing hang was withdrawn, or the store's error. Empty: the hang key
  // is not watched.
  std::function<void(int64_t generation, const absl::StatusOr<std::string>& declared_by,
                     absl::Time asked)>
      on_hang_key;
  // A key waited for until it exists; then `on_seen` is called once, and the key is no longer
  // waited for. `key` builds it for the held generation: a key of the whole job ignores it; a
  // key of each generation is waited for (and seen) anew in each.
  struct Notice {
    std::function<std::string(int64_t generation)> key;
    std::function<void(int64_t generation)> on_seen;
  };
  std::vector<Notice> notices;
};

class GenerationWatcher {
 public:
  // Starts the thread. REQUIRES: the member and the store outlive the watcher; on_superseded is
  // set; park and hang_recheck > 0.
  explicit GenerationWatcher(GenerationWatcherOptions options);
  // Stops the thread (Stop()), joins it, and deletes the wake key if Stop() wrote it.
  ~GenerationWatcher();
  // Asks the thread to stop and ends its parked wait (writes the wake key, bounded by a second),
  // without waiting for the thread: an owner stopping several threads lets them stop together. A
  // handler that is running finishes first.
  void Stop();
  GenerationWatcher(const GenerationWatcher&) = delete;
  GenerationWatcher& operator=(const GenerationWatcher&) = delete;

  // The key Stop() writes.
  const std::string& wake_key() const { return wake_key_; }

 private:
  void Run();
  bool stopping();
  // Waits up to `timeout` for Stop(), without a request.
  void Idle(absl::Duration timeout);
  // Reads the hang key of `generation` and hands the answer to on_hang_key. True when the key
  // exists (the hang stands).
  bool ReadHangKey(int64_t generation);

  const GenerationWatcherOptions options_;
  const std::string wake_key_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;  // the wake key was written
  std::thread thread_;                       // last: it uses everything above
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_GENERATION_WATCHER_H_
