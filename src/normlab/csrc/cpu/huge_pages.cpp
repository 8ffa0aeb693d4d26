#include "huge_pages.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace normlab {
namespace {

bool advice_wanted() {
  static const bool on = [] {
    const char* env = std::getenv("NORMLAB_HUGEPAGES");
    if (env != nullptr && std::string(env) == "0") return false;
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return mode.find("[madvise]") != std::string::npos;
  }();
  return on;
}

}  // namespace

void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (data == nullptr || bytes < kHugeMin || !advice_wanted()) return;
  constexpr uintptr_t page = 4096;
  uintptr_t start = reinterpret_cast<uintptr_t>(data);
  uintptr_t lo = (start + page - 1) / page * page;
  uintptr_t hi = (start + uintptr_t(bytes)) / page * page;
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a refusal leaves it as it was
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace normlab
