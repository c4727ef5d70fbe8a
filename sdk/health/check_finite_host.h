// CheckFiniteHost's instruction-set variants (private to sdk/health): the public function runs the
// best one for the CPU; tests run each one the CPU supports, so a path the test machine would not
// pick is still tested.
#ifndef TRAINGUARD_SDK_HEALTH_CHECK_FINITE_HOST_H_
#define TRAINGUARD_SDK_HEALTH_CHECK_FINITE_HOST_H_

#include <cstddef>
#include <vector>

#include "trainguard/checkpoint.h"
#include "trainguard/health.h"

namespace trainguard {
namespace health_internal {

enum class FiniteScanIsa { kBaseline, kAvx2, kAvx512 };

// The variants this CPU can run, best last (kBaseline always).
std::vector<FiniteScanIsa> SupportedFiniteScanIsas();

// CheckFiniteHost() with the fast pass of `isa`. REQUIRES: `isa` is in SupportedFiniteScanIsas().
FiniteCheckResult CheckFiniteHostWith(FiniteScanIsa isa, const void* data, size_t count,
                                      DType dtype);

}  // namespace health_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_CHECK_FINITE_HOST_H_
