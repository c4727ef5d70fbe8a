// PeerHangWatcher: the rank's watcher thread (private to sdk/runtime). It wakes every `period` to
// run the rank's periodic duties (its owner's: publishing the rank's records, a dump asked for by
// SIGUSR2, the check on a step that outlives its generation), and, with a store, every
// `hang_check_period` reads the hang key of the rank's current generation (hang/gen<G>: a peer's
// declaration of a hang, sdk/core/store_keys.h) and hands the answer to its owner, who decides
// whether this rank dumps its evidence: one Get per check, no watch.
//
// Every wait is bounded: the sleep by `period`, the Get by 2 s. The destructor stops the thread
// and joins it: within the duty or the Get in progress.
//
// Thread safety: the callbacks run on the watcher's thread; construction and destruction belong
// to the owner. Not copyable or movable.
#ifndef TRAINGUARD_SDK_RUNTIME_PEER_HANG_WATCHER_H_
#define TRAINGUARD_SDK_RUNTIME_PEER_HANG_WATCHER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "trainguard/store.h"

namespace trainguard {

struct PeerHangWatcherOptions {
  // How often the duties run, and how often the hang key is read (at the first wake-up at least
  // this long after the previous read).
  absl::Duration period = absl::Milliseconds(250);
  absl::Duration hang_check_period = absl::Milliseconds(250);
  Store* store = nullptr;  // nullptr: no hang key is read
  // The rank's current generation: whose hang key is read.
  std::function<int64_t()> generation;
  // Every period, before the hang key is read.
  std::function<void()> duties;
  // After each read of the hang key of `generation`, sent at `asked` (absl::Now()): the declarer's
  // value, NotFound when no hang is declared, or the store's error.
  std::function<void(int64_t generation, const absl::StatusOr<std::string>& declared_by,
                     absl::Time asked)>
      on_hang_key;
};

class PeerHangWatcher {
 public:
  // Starts the thread. REQUIRES: the store outlives the watcher; the callbacks are set.
  explicit PeerHangWatcher(PeerHangWatcherOptions options);
  // Stops the thread and joins it.
  ~PeerHangWatcher();
  // Asks the thread to stop, without waiting for it (the destructor joins it): an owner stopping
  // several threads lets them stop together.
  void Stop();
  PeerHangWatcher(const PeerHangWatcher&) = delete;
  PeerHangWatcher& operator=(const PeerHangWatcher&) = delete;

 private:
  void Run();

  const PeerHangWatcherOptions options_;
  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses everything above
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RUNTIME_PEER_HANG_WATCHER_H_
