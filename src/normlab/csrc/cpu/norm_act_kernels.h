// The norm+act kernels' elementwise passes on raw pointers (docs/derivations/norm_act.md): the
// output pass y = act(z) and the backward's dz = dy * act'(z), with z = (x - hi) * a + b2
// recomputed from x and per-"constant" values (hi, a, b2) -- a BatchNorm channel, a GroupNorm
// (sample, channel) -- rounded to the accumulation type as the norm's own output pass rounds them
// (so the identity activation gives the norm's bits).
//
// Two layouts, each a loop with no reduction (the same bits for any thread count):
//  - planes: n_planes runs of s_len values; plane p uses constant p % n_const (BatchNorm NCHW:
//    p = n * C + c; GroupNorm NCHW: n_const = N * C);
//  - rows: n_rows rows of n_cols values; row r, column c uses constant (r / block_rows) * n_cols + c
//    (BatchNorm channels-last: block_rows = n_rows; GroupNorm channels-last: block_rows = S).
// Tasks of about 32768 values: whole planes or whole rows.
#pragma once

#include <cstdint>
#include <functional>

#include "numerics/dtype.h"

namespace normlab::nact {

struct Layout {
  bool planes;
  int64_t n_outer;  // planes: n_planes; rows: n_rows
  int64_t n_inner;  // planes: s_len; rows: n_cols
  int64_t n_const;  // planes: constants cycle with this period; rows: unused
  int64_t block_rows;  // rows: rows that share one row of constants
};

// hi, a, b2: float64 constants (rounded to the accumulation type inside).
// y = act(z) over the layout; x, y in storage dtype dt. stats_of_x: hi is x's own mean (training),
// so that no z can be NaN where the constants are finite (a bfloat16 y then skips its NaN test).
void forward_out(Dtype dt, const void* x, void* y, const double* hi, const double* a, const double* b2,
                 int64_t n_consts, Layout l, int act, double param, bool stats_of_x);
// dz = dy * act'(z), rounded once to dt (dz may alias dy); relu: dy itself where z > 0 or z is NaN,
// +0 where z <= 0 (torch's threshold_backward; not dy * 0, which is -0 or NaN for some dy).
// parallel = false: on the calling thread alone (a caller's task: GroupNormAct's backward, a group
// row at a time inside GroupNorm's backward).
void grad_z(Dtype dt, const void* dy, const void* x, void* dz, const double* hi, const double* a, const double* b2,
            int64_t n_consts, Layout l, int act, double param, bool parallel = true);

// grad_z over runs of one constant each, the constants rounded and the activation chosen once
// (BatchNormAct2d's backward: runs of a channel's planes inside BatchNorm's sums pass, bn::DyRuns):
// the returned run(c, off, len, dst) writes dz of values [off, off + len) with constant c to
// dst[0, len) (dst null: dz + off), on the calling thread. Elementwise, as grad_z: the same bits
// however the values are cut into runs.
std::function<void(int64_t, int64_t, int64_t, void*)> grad_z_runs(Dtype dt, const void* dy, const void* x, void* dz,
                                                                  const double* hi, const double* a,
                                                                  const double* b2, int64_t n_consts, int act,
                                                                  double param);

// LayerNorm's rows (LayerNormAct): dz = dy * act'(z), z = (x - mean[r]) * rstd[r] * w[c] + b[c] over
// n_rows rows of n_cols values (w, b null: ones, zeros), rounded once to dt (dz may alias dy; relu as
// grad_z's).
void grad_z_rows(Dtype dt, const void* dy, const void* x, void* dz, const double* mean, const double* rstd,
                 const double* w, const double* b, int64_t n_rows, int64_t n_cols, int act, double param);

// y = act(y) over n values in place (the pass after a norm kernel that wrote y, while y is in cache).
void apply_inplace(Dtype dt, void* y, int64_t n, int act, double param);

}  // namespace normlab::nact
