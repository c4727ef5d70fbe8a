// NameTable: a fixed set of short names (phase names, collective op names), each given a dense
// index the first time it is seen, so per-name state can live in arrays sized once at construction
// (private to sdk/watchdog).
//
// Lookups are lock-free and allocation-free: a linear scan comparing lengths, then bytes, over at
// most a few dozen entries. Inserting a new name takes a mutex (first sight of a name only) and
// still allocates nothing. Names longer than kMaxNameBytes are truncated, so two long names that
// share their first kMaxNameBytes bytes share an entry.
//
// Thread safety: every method may be called from any thread. Entries are written before the size
// that publishes them (release) and never change afterwards.
#ifndef TRAINGUARD_SDK_WATCHDOG_NAME_TABLE_H_
#define TRAINGUARD_SDK_WATCHDOG_NAME_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "sdk/core/mutex.h"

namespace trainguard {
namespace watchdog_internal {

class NameTable {
 public:
  static constexpr int kMaxNameBytes = 63;

  // REQUIRES: capacity >= 1.
  explicit NameTable(int capacity);
  NameTable(const NameTable&) = delete;
  NameTable& operator=(const NameTable&) = delete;

  // The index of `name` (truncated), or -1 when it was never added.
  int Find(std::string_view name) const;
  // The index of `name`, adding it when new; -1 when the table is full.
  int FindOrAdd(std::string_view name);

  // REQUIRES: 0 <= index < size().
  std::string_view Name(int index) const {
    return std::string_view(entries_[index].bytes, entries_[index].length);
  }
  // Copies the name at `index` into out[0, kMaxNameBytes + 1): the name, then NULs. A copy of a
  // fixed size, for FlightRecord::name on the hot path: no length-dependent memcpy, no separate
  // clearing of the bytes after the name. REQUIRES: 0 <= index < size().
  void CopyPadded(int index, char* out) const {
    std::memcpy(out, entries_[index].bytes, sizeof(entries_[index].bytes));
  }
  int size() const { return size_.load(std::memory_order_acquire); }
  int capacity() const { return capacity_; }

 private:
  struct Entry {
    char bytes[kMaxNameBytes + 1] = {};  // NUL after the name, up to the end
    uint8_t length = 0;
  };
  static std::string_view Truncate(std::string_view name) {
    return name.substr(0, std::min<size_t>(name.size(), kMaxNameBytes));
  }
  int Scan(std::string_view truncated, int from, int to) const;

  const int capacity_;
  const std::unique_ptr<Entry[]> entries_;
  std::atomic<int> size_{0};
  Mutex add_mu_;  // serialises additions; lookups never take it
};

}  // namespace watchdog_internal
}  // namespace trainguard

#endif  // TRAINGUARD_SDK_WATCHDOG_NAME_TABLE_H_
