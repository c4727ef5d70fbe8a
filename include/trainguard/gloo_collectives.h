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
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/math.h"
#include "trainguard/collectives.h"

#if __has_include("gloo/common/memory.h")
#include "gloo/transport/tcp/pair.h"
#define TRAINGUARD_GLOO_TCP_PAIR_HEADER 1
#else
#include <dlfcn.h>

#include <cstring>
#include <exception>
#include <typeinfo>
#define TRAINGUARD_GLOO_TCP_PAIR_HEADER 0
#endif

namespace trainguard {
namespace gloo_internal {

// Fails one TCP pair through gloo's own error path (tcp::Pair::signalExceptionExternal): every
// operation pending on it, and so every collective blocked on it, wakes at once with a
// gloo::IoException, and the connection closes (the peer sees it fail too). False when `pair` is
// not a TCP pair or the function cannot be reached; then nothing was done.
//
// Debian's libgloo-dev 0.0~git20220518 ships gloo/transport/tcp/pair.h without the
// gloo/common/memory.h it includes, so there the class cannot be named. The member function is
// exported by libgloo.so, though: it is looked up by its mangled name and called on the pair's
// most-derived object, once the pair's dynamic type is known to be gloo::transport::tcp::Pair
// (its RTTI name). A non-virtual member function takes `this` as its first argument in the
// Itanium C++ ABI, which is what makes the call well defined for this compiler and library.
inline bool FailTcpPair(gloo::transport::Pair* pair, const std::string& reason) {
  if (pair == nullptr) return false;
#if TRAINGUARD_GLOO_TCP_PAIR_HEADER
  auto* tcp = dynamic_cast<gloo::transport::tcp::Pair*>(pair);
  if (tcp == nullptr) return false;
  (void)tcp->signalExceptionExternal(reason);
  return true;
#elif defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
  if (std::strcmp(typeid(*pair).name(), "N4gloo9transport3tcp4PairE") != 0) return false;
  using SignalExceptionExternal = std::exception_ptr (*)(void* self, const std::string& msg);
  static const auto signal_exception_external = reinterpret_cast<SignalExceptionExternal>(
      dlsym(RTLD_DEFAULT,
            "_ZN4gloo9transport3tcp4Pair23signalExceptionExternalERKNSt7__cxx1112basic_stringIcSt11"
            "char_traitsIcESaIcEEE"));
  if (signal_exception_external == nullptr) return false;
  (void)signal_exception_external(dynamic_cast<void*>(pair), reason);
  return true;
#else
  (void)reason;
  return false;
#endif
}

}  // namespace gloo_internal

// The exception being handled, described in one line: gloo throws gloo::Exception subclasses for
// I/O errors and timeouts, and gloo::EnforceNotMet (not a std::runtime_error) for failed internal
// checks. Call it in a catch block, e.g. to translate what a gloo collective threw into a
// trainguard::CommunicationError.
inline std::string DescribeGlooException() {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    return std::string("gloo I/O error: ") + e.what();
  } catch (const gloo::EnforceNotMet& e) {
    return std::string("gloo check failed: ") + e.what();
  } catch (const gloo::Exception& e) {
    return std::string("gloo error: ") + e.what();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// Fails every TCP pair of `context` through gloo's own error path (gloo_internal::FailTcpPair): a
// rank blocked in one of the context's collectives wakes at once with a gloo::IoException, and so
// do its peers blocked on their connections to it. It then closes the connections
// (Context::closeConnections), so later collectives fail at once. Should a pair not be failable
// (another transport), a collective already blocked on it waits for its own gloo timeout: keep
// that finite. Never throws; callable from any thread (a sdk::Communicator's Abort()).
inline void AbortGlooContext(gloo::Context& context, const std::string& reason) {
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    try {
      (void)gloo_internal::FailTcpPair(context.getPair(peer).get(), reason);
    } catch (...) {
      // This pair has failed already: that is what we wanted.
    }
  }
  try {
    context.closeConnections();
  } catch (...) {
    // Already broken.
  }
}

// Registers `context` under `comm_id`; a hang aborts the context (once, AbortGlooContext) and it
// is unusable afterwards (build a new one for the next generation). The tracker keeps `context`
// alive until the communicator is unregistered.
inline absl::Status RegisterGlooContext(CollectiveTracker& tracker, uint64_t comm_id,
                                        std::string name, std::shared_ptr<gloo::Context> context) {
  return tracker.RegisterCommunicator(comm_id, std::move(name), [context, comm_id] {
    AbortGlooContext(*context, "trainguard watchdog: communicator " + std::to_string(comm_id) +
                                   " aborted after a hang");
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
