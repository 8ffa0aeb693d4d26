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

// The lines of the next block a pass will read -- `rows` rows of `row_bytes` bytes, `ld_bytes`
// apart, from p (or one contiguous range) -- asked for a few at a time over `ticks` calls made as
// the current block's pass goes (rest() asks for whatever is left, or everything without ticks):
// the next block is in cache when its pass comes, the memory read beside the arithmetic.
class Ahead {
 public:
  Ahead(const void* p, int64_t ld_bytes, int64_t row_bytes, int64_t rows, int64_t ticks)
      : p_(static_cast<const char*>(p)), ld_(ld_bytes), row_(row_bytes), rows_(rows) {
    const int64_t lines = (rows * row_bytes + kCacheLineBytes - 1) / kCacheLineBytes;
    step_ = ticks > 0 ? (lines + ticks - 1) / ticks * kCacheLineBytes : 0;
  }
  Ahead(const void* p, int64_t bytes, int64_t ticks) : Ahead(p, bytes, bytes, bytes > 0 ? 1 : 0, ticks) {}
  void operator()() { ask(step_); }
  void rest() { ask(rows_ * row_); }

 private:
  void ask(int64_t bytes) {
    while (bytes > 0 && r_ < rows_) {
      const int64_t m = bytes < row_ - off_ ? bytes : row_ - off_;
      prefetch_read(p_ + r_ * ld_ + off_, m);
      off_ += m, bytes -= m;
      if (off_ == row_) off_ = 0, ++r_;
    }
  }
  const char* p_;
  int64_t ld_, row_, rows_, step_ = 0, r_ = 0, off_ = 0;
};

}  // namespace normlab
