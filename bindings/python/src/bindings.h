// The parts of the module trainguard._C, each bound by its own file (module.cc calls them), and the
// conversions they share.
//
// Thread safety: the Bind* functions run once, at import, with the GIL held.
#ifndef TRAINGUARD_BINDINGS_PYTHON_BINDINGS_H_
#define TRAINGUARD_BINDINGS_PYTHON_BINDINGS_H_

#include <nanobind/nanobind.h>

#include "absl/time/time.h"

namespace trainguard::python {

// Runtime, StepScope, StepResult (runtime_binding.cc).
void BindRuntime(nanobind::module_& m);
// Store, open_store, TcpStoreServer (store_binding.cc).
void BindStore(nanobind::module_& m);

// Seconds from Python (a float; negative is refused) as a Duration.
absl::Duration SecondsToDuration(double seconds);

}  // namespace trainguard::python

#endif  // TRAINGUARD_BINDINGS_PYTHON_BINDINGS_H_
