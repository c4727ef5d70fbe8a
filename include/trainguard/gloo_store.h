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
// Thread safety: as the wrapped Store (all trainguard Stores are thread-safe).
#ifndef TRAINGUARD_GLOO_STORE_H_
#define TRAINGUARD_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

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

  // gloo's get blocks until the key exists.
  std::vector<char> get(const std::string& key) override {
    Check(store_->Wait({key}, timeout_), "get", key);
    absl::StatusOr<std::string> value = store_->Get(key, timeout_);
    Check(value.status(), "get", key);
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(store_->Wait(keys, absl::FromChrono(timeout)), "wait", keys.empty() ? "" : keys.front());
  }

 private:
  static std::chrono::milliseconds ToChrono(absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }

  static void Check(const absl::Status& status, const char* op, const std::string& key) {
    if (!status.ok()) {
      throw ::gloo::IoException(std::string("trainguard store ") + op + " " + key + ": " +
                                status.ToString());
    }
  }

  trainguard::Store* const store_;
  const absl::Duration timeout_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_GLOO_STORE_H_
