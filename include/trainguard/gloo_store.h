// GlooStore: lets gloo rendezvous through a trainguard Store (TcpStore, EtcdStore, InMemoryStore,
// ...), so a job's CPU collectives use the same coordination service, namespaces and fencing as
// trainguard.
//
//     sdk::PrefixStore scoped(absl::StrCat("gloo/gen", generation), store);
//     sdk::GlooStore gloo_store(&scoped, absl::Seconds(60));
//     context->connectFullMesh(gloo_store, device);
//
// Header-only: it depends on gloo's headers, which only programs that use gloo include. gloo
// expects its store to throw on failure; GlooStore throws gloo::IoException carrying the Store's
// status message, so a failed rendezvous inside a guarded step is a communication failure once
// wrapped by the caller.
//
// Round trips: gloo's full mesh makes each rank read every peer's key one at a time, each read a
// wait for the key followed by a get of it, so the mesh of a world of N costs each rank O(N)
// dependent store round trips, and the rank that reads last waits for all of them. A key that
// exists costs one round trip here, not two or three: get() reads first and waits only for a key
// that is absent, and wait() reads the keys it is asked for, keeping their values for the get()
// that follows it (a get() after a wait() returns the value the wait saw).
//
// Thread safety: as the wrapped Store (all trainguard Stores are thread-safe).
#ifndef TRAINGUARD_GLOO_STORE_H_
#define TRAINGUARD_GLOO_STORE_H_

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"
#include "trainguard/store.h"

namespace trainguard {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // REQUIRES: `store` outlives this adapter. `timeout` bounds every call gloo makes without one.
  GlooStore(trainguard::Store* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string_view(data.data(), data.size()), timeout_), "set", key);
  }

  // gloo's get blocks until the key exists: the value the last wait() read, else one read, and
  // only when the key is absent a wait and a second read.
  std::vector<char> get(const std::string& key) override {
    if (std::optional<std::string> seen = TakeWaited(key); seen.has_value()) {
      return std::vector<char>(seen->begin(), seen->end());
    }
    absl::StatusOr<std::string> value = store_->Get(key, timeout_);
    if (absl::IsNotFound(value.status())) {
      Check(store_->Wait({key}, timeout_), "get", key);
      value = store_->Get(key, timeout_);
    }
    Check(value.status(), "get", key);
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }

  // Reads the keys first: when all exist, their values are kept for the get() calls that follow
  // (gloo waits for a key, then gets it), in place of the values kept by the wait before.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Duration bound = absl::FromChrono(timeout);
    absl::StatusOr<std::vector<std::optional<std::string>>> values = store_->MultiGet(keys, bound);
    std::map<std::string, std::string> seen;
    for (size_t i = 0; values.ok() && i < keys.size() && i < values->size(); ++i) {
      if (!(*values)[i].has_value()) break;
      seen[keys[i]] = *std::move((*values)[i]);
    }
    const bool all = seen.size() == keys.size();
    {
      absl::MutexLock lock(&mu_);
      waited_ = all ? std::move(seen) : std::map<std::string, std::string>();
    }
    if (all) return;
    Check(store_->Wait(keys, bound), "wait", keys.empty() ? "" : keys.front());
  }

 private:
  static std::chrono::milliseconds ToChrono(absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }

  // The value of `key` the last wait() read, once: a later get() of it reads the store.
  std::optional<std::string> TakeWaited(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = waited_.find(key);
    if (it == waited_.end()) return std::nullopt;
    std::optional<std::string> value = std::move(it->second);
    waited_.erase(it);
    return value;
  }

  static void Check(const absl::Status& status, const char* op, const std::string& key) {
    if (!status.ok()) {
      throw ::gloo::IoException(std::string("trainguard store ") + op + " " + key + ": " +
                                status.ToString());
    }
  }

  trainguard::Store* const store_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  // The values read by the last wait() whose keys all existed, until a get() takes each.
  std::map<std::string, std::string> waited_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_GLOO_STORE_H_
