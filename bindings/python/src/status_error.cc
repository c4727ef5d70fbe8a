#include "status_error.h"

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace trainguard::python {
namespace {

const char* PythonClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kNotFound:
      return "NotFoundError";
    case absl::StatusCode::kDeadlineExceeded:
      return "DeadlineExceededError";
    case absl::StatusCode::kInvalidArgument:
      return "InvalidArgumentError";
    default:
      return "Error";
  }
}

}  // namespace

void RegisterStatusErrorTranslator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object errors = nb::module_::import_("trainguard.errors");
      nb::object cls = errors.attr(PythonClassFor(e.status().code()));
      nb::object exc =
          cls(nb::str(e.what()), nb::str(absl::StatusCodeToString(e.status().code()).c_str()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace trainguard::python
