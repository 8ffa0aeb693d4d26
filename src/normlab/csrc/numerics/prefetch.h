// Cache hints: the cache lines of a byte range asked for ahead of use, for reading or for
// writing. A hint changes no result; the kernels use them where the hardware prefetcher starts
// too late (short rows, many plane runs at once).
#pragma once

#include <cstdint>

namespace normlab {

constexpr int64_t kCacheLineBytes = 64;

// The cache lines of bytes [p, p + n), for reading / for writing (n <= 0: none).
inline void prefetch_read(const void* p, int64_t n) {
  for (int64_t q = 0; q < n; q += kCacheLineBytes) __builtin_prefetch(static_cast<const char*>(p) + q, 0, 3);
}
inline void prefetch_write(void* p, int64_t n) {
  for (int64_t q = 0; q < n; q += kCacheLineBytes) __builtin_prefetch(static_cast<char*>(p) + q, 1, 3);
}

}  // namespace normlab
