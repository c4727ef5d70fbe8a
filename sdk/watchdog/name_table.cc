#include "sdk/watchdog/name_table.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace trainguard {
namespace watchdog_internal {

NameTable::NameTable(int capacity)
    : capacity_(std::max(capacity, 1)), entries_(new Entry[capacity_]) {}

int NameTable::Scan(std::string_view truncated, int from, int to) const {
  for (int i = from; i < to; ++i) {
    const Entry& e = entries_[i];
    if (e.length == truncated.size() &&
        std::memcmp(e.bytes, truncated.data(), truncated.size()) == 0) {
      return i;
    }
  }
  return -1;
}

int NameTable::Find(std::string_view name) const { return Scan(Truncate(name), 0, size()); }

int NameTable::FindOrAdd(std::string_view name) {
  const std::string_view truncated = Truncate(name);
  const int seen = size();
  if (int i = Scan(truncated, 0, seen); i >= 0) return i;
  MutexLock lock(&add_mu_);
  // Another thread may have added it (or others) since the lock-free scan.
  const int now = size_.load(std::memory_order_relaxed);
  if (int i = Scan(truncated, seen, now); i >= 0) return i;
  if (now == capacity_) return -1;
  Entry& e = entries_[now];
  std::memcpy(e.bytes, truncated.data(), truncated.size());
  e.bytes[truncated.size()] = '\0';
  e.length = static_cast<uint8_t>(truncated.size());
  size_.store(now + 1, std::memory_order_release);
  return now;
}

}  // namespace watchdog_internal
}  // namespace trainguard
