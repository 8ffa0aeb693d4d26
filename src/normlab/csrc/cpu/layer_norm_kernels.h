// LayerNorm / RMSNorm row kernels on raw pointers (docs/derivations/layer_norm.md): the
// arguments of one call, and the two entry points. Free of torch headers beyond
// <ATen/Parallel.h> (through numerics/chunks.h), so this and its .cpp compile in about a second.
#pragma once

#include <cstdint>

#include "numerics/dtype.h"

namespace normlab::ln {

// The storage types the kernels take: x, res, h, y, dy, dh, dx in `x`; weight and bias in `w`,
// which is x's own dtype or its accumulation dtype (float32 for the half types).
using Dtype = normlab::Dtype;

// norm_fwd: LayerNorm (center) or RMSNorm of every row, optionally of h = x + res.
struct FwdArgs {
  const void* x;     // (n_rows, n_cols)  input, storage dtype
  const void* res;   // (n_rows, n_cols)  residual (nullptr: none)
  void* h;           // (n_rows, n_cols)  out: x + res rounded to storage (written with res)
  const void* w;     // (n_w, n_cols)     weight as applied (nullptr: none), dtype `wdt`
  const void* b;     // (n_b, n_cols)     bias (nullptr: none), dtype `wdt`
  void* y;           // (n_rows, n_cols)  out: the normalised rows, storage dtype
  void* mean;        // (n_rows,)         out: row means, accumulation dtype (nullptr: not kept)
  void* rstd;        // (n_rows,)         out: 1 / sqrt(var + eps), accumulation dtype (nullptr: not kept)
  int64_t n_rows, n_cols;
  int64_t n_w, n_b;  // weight / bias rows: 1, or G grouped rows (row i uses row i / (n_rows / G))
  double eps;
  bool center;       // LayerNorm (true) or RMSNorm (no shift, no mean, no bias)
  bool cast_x_hat;   // y = round(x_hat) * w: x_hat rounded to storage before the weight (Llama)
};

// norm_bwd: the gradients of norm_fwd.
struct BwdArgs {
  const void* dy;    // (n_rows, n_cols)  gradient of y, storage dtype
  const void* x;     // (n_rows, n_cols)  the forward's normalised input (its h for the fused add)
  const void* w;     // (n_w, n_cols)     weight as applied (nullptr: none), dtype `wdt`
  const void* mean;  // (n_rows,)         saved means, accumulation dtype (read if center)
  const void* rstd;  // (n_rows,)         saved 1 / sqrt(var + eps)
  const void* dh;    // (n_rows, n_cols)  gradient arriving at h = x + res (nullptr: none)
  void* dx;          // (n_rows, n_cols)  out: gradient of x (plus dh), storage dtype
  void* dw;          // (n_w, n_cols)     out: sum over each weight's rows of dy * x_hat
  void* db;          // (n_w, n_cols)     out: sum over each weight's rows of dy (dw nullptr: neither needed;
                     //                   db nullptr: no bias)
  int64_t n_rows, n_cols, n_w;
  bool center, cast_x_hat;
  // dw / db stored in the storage dtype (the sums rounded to the accumulation dtype, then to
  // storage, as a .to() after them would) rather than in the accumulation dtype: half-precision
  // parameters get their gradients without a conversion op after the kernel
  bool dw_storage, db_storage;
};

void norm_fwd(Dtype x, Dtype w, const FwdArgs& a);
void norm_bwd(Dtype x, Dtype w, const BwdArgs& a);

// Rows per chunk of the backward's dw/db reduction for n_rows rows (of one weight) of n_cols
// values: fixed by the shape alone, so the partials merged in chunk order give the same bits
// for any number of threads.
int64_t bwd_rows_per_chunk(int64_t n_rows, int64_t n_cols);

}  // namespace normlab::ln
