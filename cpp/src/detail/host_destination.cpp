#include "gdscp/detail/host_destination.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace gdscp::detail {
namespace {

constexpr uintptr_t kPage = 4096;

// Whether this kernel knows MADV_POPULATE_WRITE: asked of a page of our own
// (EINVAL from a caller's buffer may also mean a mapping that cannot be
// populated, such as VM_PFNMAP). Cached in an atomic, not a lazily
// initialised static: workers ask first, and a process forked while one of
// them initialised such a static would wait for ever on it.
bool populate_supported() {
  static std::atomic<int> known{-1};
  int v = known.load(std::memory_order_relaxed);
  if (v < 0) {
    void* p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    v = p != MAP_FAILED && madvise(p, kPage, MADV_POPULATE_WRITE) == 0;
    if (p != MAP_FAILED) munmap(p, kPage);
    known.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

bool destination_unmapped(const char* dst, size_t size) noexcept {
  const uintptr_t start = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t first = (start + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (start + size) & ~(kPage - 1);  // past the last whole page
  if (first >= end) return false;
  const uintptr_t last = end - kPage;
  const uintptr_t middle = first + ((last - first) / 2 & ~(kPage - 1));
  for (const uintptr_t page : {first, middle, last}) {
    unsigned char resident = 0;
    if (mincore(reinterpret_cast<void*>(page), kPage, &resident) == 0 && !(resident & 1)) return true;
  }
  return false;
}

bool populate_for_write(char* dst, size_t n) noexcept {
  if (n == 0) return true;
  if (!populate_supported()) return false;
  const uintptr_t start = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t a = start & ~(kPage - 1);
  const uintptr_t b = (start + n + kPage - 1) & ~(kPage - 1);
  return madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE) == 0;
}

}  // namespace gdscp::detail
