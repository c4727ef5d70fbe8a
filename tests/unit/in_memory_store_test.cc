#include <memory>

#include "tests/support/store_conformance.h"
#include "trainguard/store.h"

namespace trainguard::testing {
namespace {

class InMemoryStoreHarness {
 public:
  std::unique_ptr<Store> NewClient() { return store_.NewClient(); }

 private:
  InMemoryStore store_;
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(InMemoryStore, StoreConformance, InMemoryStoreHarness);

}  // namespace trainguard::testing
