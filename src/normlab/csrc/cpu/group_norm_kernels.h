// GroupNorm / InstanceNorm kernels on raw pointers (no torch headers: they compile in about a second).
//
// Every kernel sees the input as (N, C, S) (S = the product of the spatial dims) in one of two
// memory layouts:
//   rows  (contiguous NCHW, and every input with S == 1): x as (N*G, Cg, S), one group per row of
//         Cg*S contiguous values -- group_norm_kernels.cpp;
//   NHWC  (channels_last with S > 1; the backward of every S == 1 input): x as (N, S, C), channels
//         fastest, per-channel vectors of length C -- group_norm_nhwc_kernels.cpp.
// InstanceNorm is GroupNorm with G = C; with fixed (running) statistics (`fixed`) the kernels read a
// per-channel mean/rstd (C,) instead of computing them, and the backward keeps term 1 only.
//
// Storage S: float, double, bf16, f16; accumulation A = acc_t<S> (double for double, else float).
// w, b: (C,) in A (the caller materialises ones / zeros for an absent weight / bias). Statistics
// mean, var, rstd: (N*G,) in A, or null when nobody reads them (inference). dw, db: (C,) in A.
// The math: docs/derivations/group_norm.md.
#pragma once

#include <cstdint>
#include <functional>

#include "numerics/half.h"

namespace normlab::group_norm {

// Samples per chunk of the NHWC backward's dw/db partials: about 64K values (at least 16 rows of C
// channels), in whole samples; from the shape only, so the partials merge to the same bits for any
// number of threads.
int64_t nhwc_samples_per_chunk(int64_t n, int64_t ns, int64_t c);

// The forwards take an activation (GroupNormAct, numerics/activation.h: its id act and parameter
// act_param; 0, the identity, for GroupNorm) applied in the output pass to each value as rounded
// to S: y = act(GroupNorm(x)), the bits of the activation run on GroupNorm's output.

// Forward over group rows (contiguous x, or any x with S == 1). `fixed`: mean/rstd are (C,) inputs.
template <class S>
void fwd_rows(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
              acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, int64_t ns, double eps, bool fixed, int act = 0,
              double act_param = 0.0);

// Forward of channels_last x (N, S, C), S > 1.
template <class S>
void fwd_nhwc(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
              acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, int64_t ns, double eps, int act = 0,
              double act_param = 0.0);

// The backwards allow dx == dy (each value of dy is read before dx is written there: GroupNormAct's
// backward keeps its dy * act'(z) in dx's buffer).

// Backward over group rows (contiguous x). `fixed`: mean/rstd (C,), dx = rstd * dy * w (term 1).
// dx may be null (not needed). dy_rows(r0, r1) (GroupNormAct): writes group rows [r0, r1) of dy
// -- dz = dy * act'(z) into dx's buffer, which is then this dy -- called by the task that takes
// those rows just before it reads them, a block of rows of at most kScratchValues values at a
// time, so that they are still in cache for their sums and dx (all rows first, in tasks of their
// own, for long rows and `fixed`).
// relu (GroupNormAct with ReLU): the layer's own dy and nact's z constants, (N, C) float64 each;
// where every (sample, channel)'s "z <= 0" is a bound on x (numerics/relu_bound.h) and the rows
// are neither long (more than kScratchValues values a channel) nor short (under 512) nor `fixed`,
// bwd_rows reads relu->dy as relu's dz in its sums and dx (no dz written); otherwise it takes dy
// and dy_rows as given.
struct ReluDy {
  const void* dy;
  const double *hi, *a, *b;
};
template <class S>
void bwd_rows(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, bool fixed,
              const std::function<void(int64_t, int64_t)>* dy_rows = nullptr, const ReluDy* relu = nullptr);

// Backward of NHWC x (N, S, C), any S (S == 1: each group's Cg channels contiguous).
// relu (GroupNormAct with ReLU, S > 1): relu->dy read as relu's dz in the sums and dx (dy unused),
// where every (sample, channel)'s "z <= 0" is a bound on x (numerics/relu_bound.h); otherwise it
// returns false having done nothing, and the caller writes dz and calls again without relu.
// Without relu: dy as given, true.
template <class S>
bool bwd_nhwc(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, const ReluDy* relu = nullptr);

// S == 1 with small groups (group_norm_s1_kernels.cpp): whether 2 <= Cg = C / G <= a vector's lanes;
// then the forward of x (N, C) (statistics (N*G,) or null), and the backward (dx may be null) with dw/db
// partials pw, pb (runs of `run` samples, C) added into (zeroed by the caller), a task taking `spc`
// samples (a multiple of `run`) at a time.
template <class S> bool s1_packed(int64_t c, int64_t g);
template <class S>
void fwd_s1_packed(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
                   acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, double eps);
template <class S>
void bwd_s1_packed(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                   acc_t<S>* pw, acc_t<S>* pb, int64_t n, int64_t c, int64_t g, int64_t spc, int64_t run);

// dst (N, C, S) = src (N, S, C): a channels_last tensor's values in contiguous order, for values of
// `bytes` bytes (2, 4 or 8), in blocks of 64 positions x 16 channels (reads and writes in runs).
void nhwc_to_nchw(const void* src, void* dst, int64_t n, int64_t c, int64_t s, int64_t bytes);

// InstanceNorm's running statistics, in place: rm, rv (C,) of storage R with element strides;
// mean, var (N, C) per-instance means and biased variances in A.
template <class R, class A>
void update_running(R* rm, int64_t rm_stride, R* rv, int64_t rv_stride, const A* mean, const A* var, int64_t n,
                    int64_t c, double momentum, int64_t n_spatial);

}  // namespace normlab::group_norm
