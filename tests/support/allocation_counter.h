// Replaces the global operator new/delete with versions that count allocations, so a test or
// benchmark can assert that a code path does not allocate. Include in exactly one translation unit
// per binary.
//
// GCC's -Wmismatched-new-delete misfires on a replaced operator new that uses malloc: targets
// including this header compile with -Wno-mismatched-new-delete.
#ifndef TRAINGUARD_TESTS_SUPPORT_ALLOCATION_COUNTER_H_
#define TRAINGUARD_TESTS_SUPPORT_ALLOCATION_COUNTER_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace trainguard::testing {

inline std::atomic<int64_t> g_allocation_count{0};

// Allocations by this process (all threads) so far.
inline int64_t AllocationCount() { return g_allocation_count.load(std::memory_order_relaxed); }

}  // namespace trainguard::testing

void* operator new(std::size_t size) {
  trainguard::testing::g_allocation_count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

#endif  // TRAINGUARD_TESTS_SUPPORT_ALLOCATION_COUNTER_H_
