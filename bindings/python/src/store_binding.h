// PyStore: what trainguard._C.Store holds: a Store it owns (open_store) or one a Runtime owns
// (Runtime.store, kept alive by the Python Runtime object).
//
// Thread safety: as the Store it wraps (thread-safe); Close() must not race other calls.
#ifndef TRAINGUARD_BINDINGS_PYTHON_STORE_BINDING_H_
#define TRAINGUARD_BINDINGS_PYTHON_STORE_BINDING_H_

#include <memory>
#include <utility>

#include "trainguard/store.h"

namespace trainguard::python {

class PyStore {
 public:
  explicit PyStore(std::unique_ptr<Store> owned) : owned_(std::move(owned)), store_(owned_.get()) {}
  explicit PyStore(Store* borrowed) : store_(borrowed) {}
  // The store; FailedPrecondition (as StatusError) after Close().
  Store& get() const;
  void Close() {
    store_ = nullptr;
    owned_.reset();
  }

 private:
  std::unique_ptr<Store> owned_;
  Store* store_;
};

}  // namespace trainguard::python

#endif  // TRAINGUARD_BINDINGS_PYTHON_STORE_BINDING_H_
