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
// act, act_param (LayerNormAct2d, csrc/cpu/norm_act.cpp): the activation (numerics/activation.h ids;
// 0 = identity, the plain norm) applied in the output pass to z = x_hat * w + b rounded to S, so
// that the fused output has the bits of the norm followed by the activation on its output.
template <class S>
void fwd_nchw(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* rstd,
              int64_t n, int64_t nc, int64_t ns, double eps, bool far, int act = 0, double act_param = 0.0);
// The backward; with an activation (act != 0; b: the forward's bias, nullptr for zeros) dy is the
// gradient of act(z): the first pass writes dz = dy * act'(z) (z = ((x - mean) * rstd) * w + b,
// rounded once to S) into dx's buffer and sums it, the second reads it back from there (L2).
template <class S>
void bwd_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far, const acc_t<S>* b = nullptr,
              int act = 0, double act_param = 0.0);
}  // namespace normlab::ln2d
