// LayerNorm2d's kernels on raw pointers: LayerNorm over the C channels of every pixel of an
// (N, C, *) tensor, in both memory layouts -- docs/derivations/layer_norm.md, "LayerNorm2d".
//
// - NCHW (contiguous): a pixel's channels lie S = H * W values apart, so the kernels stream the
//   C planes of a block of pixels with the pixels as the vector lanes (fwd_nchw, bwd_nchw).
// - channels_last: the pixels are rows of C contiguous values, which LayerNorm's row kernels
//   normalise (cpu/layer_norm_kernels.h).
//
// Storage S is float, double, bf16 or f16; weights, statistics and sums are in acc_t<S>
// (float64 for double, float32 otherwise). No torch headers here but ATen/Parallel.h (chunks.h).
#pragma once

#include <cstdint>

#include "numerics/half.h"

namespace normlab::ln2d {

// Pixels per NCHW task for N = n samples, C = nc channels, S = ns pixels and itemsize-byte
// storage: from the shape and dtype only (dw/db are merged per task, so their bits never
// depend on the number of threads).
int64_t block_size(int64_t n, int64_t nc, int64_t ns, int64_t itemsize);      // the backward's
int64_t fwd_block_size(int64_t n, int64_t nc, int64_t ns, int64_t itemsize);  // the forward's

// A tensor of at least this many bytes is read with prefetches (it streams from memory).
constexpr int64_t kFarBytes = int64_t(8) << 20;

// w, b: (C,) in acc_t<S>, nullptr for ones / zeros. mean, rstd: (N * S,) outputs, nullptr when
// the caller needs no statistics (inference). dw, db: (C,) outputs, nullptr when not needed.
template <class S>
void fwd_nchw(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* rstd,
              int64_t n, int64_t nc, int64_t ns, double eps, bool far);
template <class S>
void bwd_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far);
}  // namespace normlab::ln2d
