// The one check of a job's parallel shape (private to sdk/core): Options::Validate and
// Topology::Create both apply it, so an Options that validates always yields a Topology.
#ifndef TRAINGUARD_SDK_CORE_PARALLEL_SHAPE_H_
#define TRAINGUARD_SDK_CORE_PARALLEL_SHAPE_H_

#include "absl/status/status.h"

namespace trainguard {

// InvalidArgument naming the field unless world_size, tp, cp and pp are all >= 1 and tp*cp*pp
// divides world_size, e.g. "world_size 12 is not divisible by tp*cp*pp = 8 (tp=4, cp=1, pp=2)".
absl::Status CheckParallelShape(int world_size, int tp, int cp, int pp);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_PARALLEL_SHAPE_H_
