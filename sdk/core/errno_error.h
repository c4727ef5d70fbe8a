// ErrnoError and ErrnoText: the status and the text of a failed system call (private to sdk/; any
// subsystem may include it, sdk/core being the bottom layer). Thread-safe.
#ifndef TRAINGUARD_SDK_CORE_ERRNO_ERROR_H_
#define TRAINGUARD_SDK_CORE_ERRNO_ERROR_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "trainguard/env.h"

namespace trainguard {

// strerror's text of `error` (an errno value), e.g. "Connection refused"; thread-safe, unlike
// strerror.
std::string ErrnoText(int error);

// `error` (an errno value) from `operation` on the `kind` object `name`, e.g. ErrnoError(ENOSPC,
// "snapshot arena", "/tg-job-3", "ftruncate"): "snapshot arena /tg-job-3: ftruncate: No space left
// on device", with the code ErrnoToStatus gives `error` (a full /dev/shm is ResourceExhausted).
inline absl::Status ErrnoError(int error, std::string_view kind, std::string_view name,
                               std::string_view operation) {
  return ErrnoToStatus(error, absl::StrFormat("%s %s: %s", kind, name, operation));
}

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_ERRNO_ERROR_H_
