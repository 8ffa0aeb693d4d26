// Work split on torch's thread pool (at::parallel_for), so torch.set_num_threads governs
// normlab too and a forked child runs as torch's own ops do there.
//
// for_rows: independent items (rows, planes) -- any split gives the same bits.
// for_chunks: a reduction over many items cut at fixed chunk boundaries that depend on the
// shape alone; each chunk writes its own partial, and the caller merges the partials in chunk
// order -- the same bits for any number of threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace normlab {

// About this many values of work per task before a split pays (torch's own grain, 32768).
constexpr int64_t kGrainValues = 32768;

// Calls f(begin, end) over [0, n) items of cost `values_per_item` each, in parallel when the
// whole job is large enough.
template <class F> inline void for_rows(int64_t n, int64_t values_per_item, const F& f) {
  if (n <= 0) return;
  int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(1, values_per_item));
  if (n <= grain) { f(int64_t(0), n); return; }  // no pool round trip for a small job
  at::parallel_for(0, n, grain, f);
}

// Number of chunks of `chunk` items that cover n items.
inline int64_t n_chunks(int64_t n, int64_t chunk) { return chunk <= 0 ? 0 : (n + chunk - 1) / chunk; }

// Calls f(c, begin, end) for chunk c = [c * chunk, min(n, (c + 1) * chunk)) of [0, n).
template <class F>
inline void for_chunks(int64_t n, int64_t chunk, int64_t values_per_item, const F& f) {
  int64_t nc = n_chunks(n, chunk);
  for_rows(nc, chunk * values_per_item, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(c, c * chunk, std::min(n, (c + 1) * chunk));
  });
}

}  // namespace normlab
