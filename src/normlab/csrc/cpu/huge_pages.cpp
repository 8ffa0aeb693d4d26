#include "huge_pages.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace normlab {

void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (data == nullptr || bytes < kHugeMin) return;
  constexpr uintptr_t page = 4096;
  uintptr_t start = reinterpret_cast<uintptr_t>(data);
  uintptr_t lo = (start + page - 1) / page * page;
  uintptr_t hi = (start + uintptr_t(bytes)) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a refusal leaves it as it was
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace normlab
