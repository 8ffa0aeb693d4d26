// A kernel call's scratch array, freed when the call returns.
//
// Nothing is kept between calls, and no array grows with the largest call ever seen. Up to
// `Inline` values live in the object itself (no allocation on a small call); a larger array is
// uninitialised heap memory: pages are touched only where written, and no call pays for zeroing
// values it writes before it reads them (a GroupNorm channels-last forward of 2048 channels
// zeroed 100 KB a sample of 400 KB). An allocation that fails raises what torch's CPU allocator
// raises, a std::runtime_error (Python: RuntimeError) naming the size.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

namespace normlab {

template <class T, int64_t Inline = 256> class Scratch {
 public:
  explicit Scratch(int64_t n) : p_(local_) {
    if (n <= Inline) return;
    heap_.reset(static_cast<T*>(std::malloc(size_t(n) * sizeof(T))));
    if (!heap_)
      throw std::runtime_error("DefaultCPUAllocator: can't allocate memory: you tried to allocate " +
                               std::to_string(n * int64_t(sizeof(T))) + " bytes (normlab kernel scratch).");
    p_ = heap_.get();
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }
  T& operator[](int64_t i) const { return p_[i]; }

 private:
  struct Free {
    void operator()(T* q) const { std::free(q); }
  };
  T local_[Inline];
  std::unique_ptr<T, Free> heap_;
  T* p_;
};

}  // namespace normlab
