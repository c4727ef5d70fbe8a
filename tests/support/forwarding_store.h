// ForwardingStore for the tests' stores (sdk/core/forwarding_store.h): they derive from it and
// override only the calls they record, count or fail.
#ifndef TRAINGUARD_TESTS_SUPPORT_FORWARDING_STORE_H_
#define TRAINGUARD_TESTS_SUPPORT_FORWARDING_STORE_H_

#include "sdk/core/forwarding_store.h"

namespace trainguard::testing {

using ::trainguard::ForwardingStore;

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_FORWARDING_STORE_H_
