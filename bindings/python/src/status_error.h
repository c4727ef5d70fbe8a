// StatusError: how a non-OK absl::Status of the SDK crosses into Python.
//
// The bindings throw StatusError; the translator that module.cc registers raises the Python
// exception of trainguard.errors that fits the status code (KeyError for NotFound, TimeoutError for
// DeadlineExceeded, ValueError for InvalidArgument, trainguard.Error otherwise), with the status's
// message, which names what failed and where.
//
// Thread safety: a value type; ThrowIfError may be called without the GIL.
#ifndef TRAINGUARD_BINDINGS_PYTHON_STATUS_ERROR_H_
#define TRAINGUARD_BINDINGS_PYTHON_STATUS_ERROR_H_

#include <stdexcept>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainguard::python {

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

// Registers the translator (module.cc calls it once).
void RegisterStatusErrorTranslator();

}  // namespace trainguard::python

#endif  // TRAINGUARD_BINDINGS_PYTHON_STATUS_ERROR_H_
