#include "sdk/core/human_bytes.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace trainguard {

std::string HumanBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const int shift = 10 * (4 - i);
    if (bytes >= (uint64_t{1} << shift)) {
      return absl::StrFormat("%.2f %s", static_cast<double>(bytes) / double(uint64_t{1} << shift),
                             kUnits[i]);
    }
  }
  return absl::StrFormat("%d B", bytes);
}

}  // namespace trainguard
