// BatchNorm's CPU kernels on raw pointers (docs/derivations/batch_norm.md, "The cpu kernels").
//
// Two views, each with its rule (docs/derivations/batch_norm.md, "The cpu kernels"):
//  - planes: contiguous (N, C, *spatial) with S >= plane_min values per plane (or S >=
//    short_plane_min and S >= 8 N, or half precision with sums from mid_plane_min and S >= 4 N:
//    takes_planes). A channel's N*S
//    values are cut into P = ceil(N*S / part_values) parts (at most 64); a task is one
//    (channel, part), read in pieces of plane_piece values (two passes in L1, Chan-merged in
//    float64); parts merged in order. P == 1: the task finishes its channel while in cache.
//  - rows (n_rows, width): (M, C) and channels-last tensors (S = 1), and short planes (N, C*S)
//    with channel c at columns c*S .. c*S+S. Rows narrower than fold_below are folded (F rows
//    read as one, up to fold_width values: F_max = fold_width / width, or the largest divisor
//    of the rows from F_max / 2 up, else F_max with the last R mod F rows read unfolded as a
//    view of their own, merged into the channels' statistics and sums). Statistics per column per chunk of rows by the
//    shifted two passes, merged with Chan's formula in float64 in a fixed order.
// Boundaries depend on the shape only: the same bits for any thread count. Scratch belongs to a
// call (nothing is kept between calls) and is bounded: C * 64 partials (planes), at most
// max_partials per-column partials (rows).
//
// No torch headers here beyond <ATen/Parallel.h> (via chunks.h, in the .cpp): this compiles in
// about a second.
#pragma once

#include <cstdint>
#include <functional>

#include "numerics/dtype.h"

namespace normlab::bn {

// Storage dtypes the kernels take (for x, y, dy, dx and for the per-channel vectors).
using Dt = normlab::Dtype;

// A (C,) per-channel vector of any storage dtype, strided; p == nullptr: absent.
struct Chan {
  const void* p = nullptr;
  Dt dt = Dt::f32;
  int64_t stride = 1;
  double at(int64_t c) const;  // element c as float64 (exact)
};

// A (C,) buffer written in place (running statistics): each store rounded once to its dtype.
struct MutChan {
  void* p = nullptr;
  Dt dt = Dt::f32;
  int64_t stride = 1;
  double at(int64_t c) const;
  void set(int64_t c, double v) const;
};

// The 2-D view of a canonical input: (n_rows, width = C * S), s_len = S.
struct View {
  int64_t n_rows, width, s_len, n_ch;
};

// The work split, from the shape alone (kernels' geometry; launch.py's before the port).
struct Geometry {
  int64_t fold;  // rows read as one (F)
  int64_t tail;  // the last rows, R mod F, read unfolded (as their own view of fold 1)
  int64_t cw;    // columns per task (of the folded view)
  int64_t sub;   // rows per chunk (two passes in cache)
  int64_t group; // chunks per task
  bool local;    // a task holds every row of whole channels: statistics, then normalise, in cache
};

// The constants of the geometry (settable for tests: tiny values put chunk, task and
// column-block boundaries everywhere).
struct Constants {
  int64_t fold_below = 64;         // rows narrower than this many values are folded ...
  int64_t fold_width = 256;        // ... into rows of at most this many (per-column constants in L1)
  int64_t column_block = 2048;     // columns per task
  int64_t chunk_elems = 65536;     // values per chunk (two passes in cache)
  int64_t max_chunk_rows = 256;
  int64_t task_elems = 1 << 19;    // values per task
  int64_t local_elems = 1 << 18;   // a block of whole channels of at most this many values is local
  int64_t min_local_run = 1024;    // ... read in runs of at least this many values per row
  int64_t plane_min = 256;         // planes of at least this many values: per-plane sums ...
  int64_t mid_plane_min = 128;     // ... and of at least this many when S >= 4 N (half precision, sums) ...
  int64_t short_plane_min = 32;    // ... and of at least this many when S >= 8 N (few rows)
  int64_t plane_piece = 4096;      // ... in pieces of at most this many values
  int64_t part_values = 65536;     // ... a channel cut into ceil(N * S / this) parts (at most 64)
  int64_t plane_local_bytes = 4 << 20;  // ... one part writes its y in its task up to x + y of this many
                                        // bytes (constants() sets the last-level cache's eighth)
  int64_t max_partials = 1 << 19;  // rows: at most this many per-column partials (and 64 row groups)
  int64_t phase1_values = 65536;   // values per task of the elementwise passes
};
Constants& constants();

// Geometry of the (n_rows, width) view with S = s_len; local_elems: constants().local_elems for
// the forward, half of it for the backward (which reads x and dy).
Geometry geometry(int64_t n_rows, int64_t width, int64_t s_len, int64_t local_elems);

// Forward. x, y: the view (n_rows, width) in storage dt; y == nullptr: statistics only.
// w, b: (C,) (absent: ones, zeros); rm, rv: (C,) running statistics (evaluation only).
// stats: (3, C) float64 out: rows mean, biased var, rstd (the batch's in training, the running
// ones in evaluation).
void forward(Dt dt, const void* x, void* y, Chan w, Chan b, Chan rm, Chan rv, double* stats, View v, double eps,
             bool train);

// Whether an output pass over n_planes planes of s_len values (x and y, storage dt) streams y's
// whole lines plane by plane: forward_planes' rule, which BatchNormAct2d's output pass
// (nact::forward_out) shares.
bool streams_planes(Dt dt, int64_t n_planes, int64_t s_len);

// Backward. dy, x, dx: the view; stats: the forward's (3, C). dx written if need_dx.
// db = sum(dy), dw = sum(dy * x_hat): (C,) float64, written if train or need_wb.
// dy_runs (BatchNormAct2d: dy is dz = dy * act'(z), computed here): dy_runs(c, off, len, dst)
// writes channel c's values [off, off + len) of dy (offsets into the (N, C, S) view) to dst[0,
// len), or, dst null, into dy's own buffer at off, just before the backward first reads them, in
// the task that reads them (a task's scratch where only that task reads them again). Only the
// planes view takes it (backward_takes_planes); elsewhere the caller writes the whole of dy first.
using DyRuns = std::function<void(int64_t, int64_t, int64_t, void*)>;
// relu (BatchNormAct2d with ReLU): dy is the layer's own gradient and each value is read as
// relu's dz -- dy where z = (x - hi[c]) * a[c] + b[c] (each constant rounded once to the
// accumulation type, as nact's passes compute z) is > 0 or NaN, +0 where it is <= 0 -- computed
// where dy is read, in the sums and in dx: no dz written, dy and x read as the plain backward
// reads them. (C,) float64 each. backward returns false, having done nothing, where it cannot
// (the rows view with a channel whose constants are not finite or whose a is 0): the caller then
// writes dz and calls again without relu. Otherwise (and without relu) it returns true.
struct ReluZ {
  const double *hi, *a, *b;
};
bool backward_takes_planes(Dt dt, View v, bool train, bool need_wb);
bool backward(Dt dt, const void* dy, const void* x, void* dx, Chan w, const double* stats, double* dw, double* db,
              View v, bool train, bool need_dx, bool need_wb, const DyRuns* dy_runs = nullptr,
              const ReluZ* relu = nullptr);

// running = (1 - momentum) * running + momentum * stat (float64, rounded once to the buffer),
// with the unbiased variance var * n / (n - 1). mean, var: (C,) float64.
void update_running(MutChan rm, MutChan rv, const double* mean, const double* var, int64_t n_ch, int64_t n,
                    double momentum);

}  // namespace normlab::bn
