// gloo collectives that a CollectiveTracker sees: each call is bracketed by Begin/End on the
// tracker (host-side: gloo's collectives block the calling thread until they finish or time out),
// so the watchdog names the gloo collective a rank is stuck in, and RegisterGlooContext lets a hang
// abort it (see RegisterGlooContext for what that can do with the installed gloo).
//
//     sdk::RegisterGlooContext(*tracker, kDp, "dp", context);
//     sdk::TrackedAllreduce(*tracker, kDp, context, grads.data(), grads.size(), absl::Seconds(60));
//
// Header-only, like gloo_store.h: it depends on gloo's headers, which only programs that use gloo
// include. gloo throws on failure (gloo::IoException, gloo::EnforceNotMet); the tracker's End still
// runs (RAII), and the exception propagates unchanged for the caller to translate (e.g. into
// trainguard::CommunicationError, as examples/cpp_trainer/gloo_data_parallel.cc does).
//
// Thread safety: as gloo (one collective at a time per context) and the tracker.
#ifndef TRAINGUARD_GLOO_COLLECTIVES_H_
#define TRAINGUARD_GLOO_COLLECTIVES_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/context.h"
#include "gloo/math.h"
#include "trainguard/collectives.h"

#if __has_include("gloo/common/memory.h")
#include "gloo/transport/tcp/pair.h"
#define TRAINGUARD_GLOO_ABORT_WAKES_WAITERS 1
#else
#define TRAINGUARD_GLOO_ABORT_WAKES_WAITERS 0
#endif

namespace trainguard {

// Registers `context` under `comm_id`; a hang aborts the context (once) and it is unusable
// afterwards (build a new one for the next generation). The tracker keeps `context` alive until the
// communicator is unregistered.
//
// What the abort can do depends on the gloo headers installed. With gloo's TCP transport headers
// (TRAINGUARD_GLOO_ABORT_WAKES_WAITERS is 1), every pair is failed through gloo's own error path
// (tcp::Pair::signalExceptionExternal): a rank blocked in one of the context's collectives wakes at
// once with a gloo::IoException. Debian's libgloo-dev 0.0~git20220518 ships tcp/pair.h without the
// gloo/common/memory.h it includes, so there the abort can only close the connections
// (Context::closeConnections): later collectives fail at once, but one already blocked waits for
// its own gloo timeout. Keep that timeout finite (TrackedAllreduce's `timeout`).
inline absl::Status RegisterGlooContext(CollectiveTracker& tracker, uint64_t comm_id,
                                        std::string name, std::shared_ptr<gloo::Context> context) {
  return tracker.RegisterCommunicator(comm_id, std::move(name), [context, comm_id] {
#if TRAINGUARD_GLOO_ABORT_WAKES_WAITERS
    const std::string reason =
        "trainguard watchdog: communicator " + std::to_string(comm_id) + " aborted after a hang";
    for (int peer = 0; peer < context->size; ++peer) {
      if (peer == context->rank) continue;
      try {
        auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(context->getPair(peer).get());
        if (tcp != nullptr) (void)tcp->signalExceptionExternal(reason);
      } catch (...) {
        // This pair has failed already: that is what we wanted.
      }
    }
#else
    (void)comm_id;
#endif
    try {
      context->closeConnections();
    } catch (...) {
      // Already broken.
    }
  });
}

// Sums `data[0, count)` element-wise across the context's ranks (gloo's ring allreduce), tracked
// as "all_reduce" on `comm_id`. `timeout` bounds gloo's own wait. Throws what gloo throws.
template <typename T>
void TrackedAllreduce(CollectiveTracker& tracker, uint64_t comm_id,
                      const std::shared_ptr<gloo::Context>& context, T* data, size_t count,
                      absl::Duration timeout, uint32_t tag = 0) {
  gloo::AllreduceOptions options(context);
  options.setOutput(data, count);
  options.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  options.setTag(tag);
  options.setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  ScopedCollective tracked(&tracker, "all_reduce", comm_id, count * sizeof(T));
  gloo::allreduce(options);
}

// Replaces `data[0, count)` on every rank by `root`'s, tracked as "broadcast" (peer = root).
template <typename T>
void TrackedBroadcast(CollectiveTracker& tracker, uint64_t comm_id,
                      const std::shared_ptr<gloo::Context>& context, T* data, size_t count,
                      int root, absl::Duration timeout, uint32_t tag = 0) {
  gloo::BroadcastOptions options(context);
  options.setOutput(data, count);
  options.setRoot(root);
  options.setTag(tag);
  options.setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  ScopedCollective tracked(&tracker, "broadcast", comm_id, count * sizeof(T), root);
  gloo::broadcast(options);
}

}  // namespace trainguard

#endif  // TRAINGUARD_GLOO_COLLECTIVES_H_
