// How LayerNorm2d reads an (N, C, *) tensor, shared by its CPU and Meta kernels so that both give
// the same output strides: the NCHW kernels on contiguous planes (more than one pixel), the row
// kernels on a channels-last-dense tensor (each pixel's C values contiguous), or either after a
// copy into x's suggested memory format when x is neither. Written on sizes and strides that may
// be symbolic (torch.compile's dynamic shapes): comparisons of SymInts guard.
#pragma once

#include <ATen/ATen.h>

namespace normlab::layer_norm {

enum class Layout { kNchw, kRows };

struct Plan {
  Layout layout;
  bool copy;                // x must first be copied into `format`
  at::MemoryFormat format;  // the copy's memory format
};

// Whether x's dims in the order (0, 2, ..., d-1, 1) are contiguous (size-1 dims skipped): the
// pixels are rows of C values.
template <class Sizes> inline bool rows_dense(const Sizes& sizes, const Sizes& strides) {
  using I = std::decay_t<decltype(sizes[0])>;
  const int64_t d = int64_t(sizes.size());
  I expected(1);
  auto step = [&](int64_t k) {
    if (sizes[k] == 1) return true;
    if (strides[k] != expected) return false;
    expected = expected * sizes[k];
    return true;
  };
  if (!step(1)) return false;
  for (int64_t k = d - 1; k >= 2; --k)
    if (!step(k)) return false;
  return step(0);
}

inline Plan plan_of(const at::Tensor& x) {
  const bool symbolic = x.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  bool planes;  // more than one pixel per sample: (N, C, *) with numel != N * C
  bool dense;
  if (symbolic) {
    planes = x.dim() >= 3 && x.sym_numel() != x.sym_size(0) * x.sym_size(1);
    dense = rows_dense(x.sym_sizes(), x.sym_strides());
  } else {
    planes = x.dim() >= 3 && x.numel() != x.size(0) * x.size(1);
    dense = rows_dense(x.sizes(), x.strides());
  }
  if (planes && x.is_contiguous()) return {Layout::kNchw, false, at::MemoryFormat::Contiguous};
  if (dense) return {Layout::kRows, false, at::MemoryFormat::Preserve};
  const at::MemoryFormat fmt = x.suggest_memory_format();
  if (planes && fmt == at::MemoryFormat::Contiguous) return {Layout::kNchw, true, fmt};
  return {Layout::kRows, true, fmt};
}

// x in the layout the kernels read (a copy only when plan.copy).
inline at::Tensor dense_input(const at::Tensor& x, const Plan& plan) {
  return plan.copy ? x.contiguous(plan.format) : x;
}

// A fresh output like the dense input xd: contiguous for the NCHW kernels, xd's own strides for
// the rows (xd is dense, so empty_like preserves them).
inline at::Tensor output_like(const at::Tensor& xd, const Plan& plan) {
  return at::empty_like(xd, plan.layout == Layout::kNchw ? at::MemoryFormat::Contiguous : at::MemoryFormat::Preserve);
}

// N * prod(spatial): the number of pixels, one mean and rstd each.
inline c10::SymInt sym_pixels(const at::Tensor& x) {
  c10::SymInt p = x.sym_size(0);
  for (int64_t k = 2; k < x.dim(); ++k) p = p * x.sym_size(k);
  return p;
}

}  // namespace normlab::layer_norm
