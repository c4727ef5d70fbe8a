#include "sdk/watchdog/recorder_append.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace trainguard {
namespace watchdog_internal {

void SetRecordName(FlightRecord& record, std::string_view name) {
  const size_t n = std::min(name.size(), sizeof(record.name) - 1);
  std::memcpy(record.name, name.data(), n);
  record.name[n] = '\0';
}

}  // namespace watchdog_internal
}  // namespace trainguard
