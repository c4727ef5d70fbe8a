// trainguard._C: the nanobind module under the trainguard Python package. The Python idiom (context
// managers, torch integration) lives in bindings/python/trainguard; this module is a thin layer
// over the public C++ API, and it releases the GIL around every call that can wait.
#include <nanobind/nanobind.h>

#include <cmath>

#include "bindings.h"
#include "status_error.h"
#include "trainguard/version.h"

namespace nb = nanobind;

namespace trainguard::python {

absl::Duration SecondsToDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) {
    throw StatusError(absl::InvalidArgumentError(
        "a timeout must be a finite number of seconds >= 0, got " + std::to_string(seconds)));
  }
  return absl::Seconds(seconds);
}

}  // namespace trainguard::python

NB_MODULE(_C, m) {
  m.doc() = "trainguard's C++ SDK (use the trainguard package, not this module)";
  m.attr("__version__") = TRAINGUARD_VERSION_STRING;
  trainguard::python::RegisterStatusErrorTranslator();
  trainguard::python::BindStore(m);
  trainguard::python::BindRuntime(m);
}
