#include "sdk/core/errno_error.h"

#include <cstring>
#include <string>

namespace trainguard {

std::string ErrnoText(int error) {
  char buf[256];
  // GNU strerror_r returns the message, possibly not in buf.
  return std::string(strerror_r(error, buf, sizeof(buf)));
}

}  // namespace trainguard
