// DyT's kernels on raw pointers: y = tanh(alpha * x) * w + b over (n_rows, n_cols) rows, w and b
// along the columns, and its backward -- docs/derivations/dyt.md.
//
// Storage S is float, double, bf16 or f16; alpha, w, b, the products and every sum are in
// acc_t<S> (float64 for double, float32 otherwise), the output rounded once to S. No torch
// headers here but ATen/Parallel.h (numerics/chunks.h).
#pragma once

#include <cstdint>

#include "numerics/half.h"

namespace normlab::dyt {

// The backward's reduction geometry, from the shape alone (so dw, db and dalpha have the same
// bits for any number of threads): rows in chunks of `chunk_rows` (a multiple of 16), columns
// in blocks of `col_block`; one task per (chunk, column block).
struct Geometry {
  int64_t chunk_rows, n_chunks, col_block, n_col_blocks;
};
Geometry geometry(int64_t n_rows, int64_t n_cols);

// Forward. w, b: (n_cols,) in acc_t<S>, nullptr for ones / zeros.
template <class S>
void forward(const S* x, acc_t<S> alpha, const acc_t<S>* w, const acc_t<S>* b, S* y, int64_t n_rows,
             int64_t n_cols);

// Backward. dx: (n_rows, n_cols) output or nullptr. The partials, float64, written per task:
// dw_part, db_part (n_chunks, n_cols) or nullptr; dalpha_part (n_chunks, n_col_blocks) or
// nullptr. merge() sums them in chunk order.
template <class S>
void backward(const S* dy, const S* x, acc_t<S> alpha, const acc_t<S>* w, S* dx, double* dw_part, double* db_part,
              double* dalpha_part, int64_t n_rows, int64_t n_cols, const Geometry& g);

// out[j] = sum over chunks c of part[c * n + j], in chunk order, in float64.
void merge(const double* part, int64_t n_chunks, int64_t n, double* out);
}  // namespace normlab::dyt
