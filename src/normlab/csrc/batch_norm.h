// The batch_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/batch_norm.cpp), bound by bind_batch_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

#include <map>
#include <optional>
#include <string>

#include "cpu/batch_norm_kernels.h"

namespace normlab::bn {

// BatchNorm of an (N, C, *) x through the registered ops (autograd included): training, the
// batch's statistics and, with running statistics, their update in place (version counters
// moved); evaluation, the running statistics. The eager path of ops/batch_norm/op.py.
at::Tensor batch_norm_entry(const at::Tensor& x, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& running_mean,
                            const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps);

// normlab.functional.batch_norm for arguments that its checks accept without a word (x a CPU
// tensor of a served dtype, (N, C, *) with N * prod(*) > 1 in training and numel > 0, each
// per-channel tensor absent or (C,) in x's dtype (float32 beside half precision), the running
// pair both or neither (both in evaluation), momentum in [0, 1], eps finite, > 0 in training,
// >= 0 otherwise): y, the running statistics updated in training. Anything else: None, and
// Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> batch_norm_fast(const at::Tensor& x, const std::optional<at::Tensor>& running_mean,
                                          const std::optional<at::Tensor>& running_var,
                                          const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
                                          bool training, double momentum, double eps);

// normlab.nn's BatchNorm forward (nn/batch_norm.py) as one call: the input rank (bit x.dim() of
// `dims`) and channel checks, which statistics to use and with what momentum
// (momentum=None: 1 / (num_batches_tracked + 1)), batch_norm_fast, then num_batches_tracked + 1
// (training with track_running_stats). None where Python must run it (it then raises, or
// serves the case), nothing changed.
std::optional<at::Tensor> batch_norm_module(const at::Tensor& x, const std::optional<at::Tensor>& w,
                                            const std::optional<at::Tensor>& b,
                                            const std::optional<at::Tensor>& running_mean,
                                            const std::optional<at::Tensor>& running_var,
                                            const std::optional<at::Tensor>& num_batches_tracked, bool training,
                                            bool track_running_stats, std::optional<double> momentum, double eps,
                                            int64_t num_features, int64_t dims);

// running = (1 - momentum) * running + momentum * stat, stats (2 or 3, C) float64 rows mean,
// biased var; n values per channel (unbiased var); version counters moved.
void batch_norm_update_entry(const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& stats,
                             int64_t n, double momentum);

}  // namespace normlab::bn

namespace normlab {

namespace bn {

// The geometry constants by name (tests set tiny ones to put chunk, task and column-block
// boundaries everywhere); set returns the previous values.
#define NORMLAB_BN_CONSTANTS(X) X(fold_below) X(fold_width) X(column_block) \
  X(chunk_elems) X(max_chunk_rows) X(task_elems) X(local_elems) X(min_local_run) X(plane_min) X(short_plane_min) X(plane_piece) \
  X(part_values) X(max_partials) X(phase1_values)

inline std::map<std::string, int64_t> get_constants() {
  std::map<std::string, int64_t> r;
#define NORMLAB_GET(name) r[#name] = constants().name;
  NORMLAB_BN_CONSTANTS(NORMLAB_GET)
#undef NORMLAB_GET
  return r;
}

inline std::map<std::string, int64_t> set_constants(const std::map<std::string, int64_t>& values) {
  auto old = get_constants();
  for (const auto& [key, v] : values) {
    TORCH_CHECK(old.count(key), "batch_norm constants: unknown name ", key);
    TORCH_CHECK(v > 0, "batch_norm constants: expected a positive ", key, ", got ", v);
  }
#define NORMLAB_SET(name) if (values.count(#name)) constants().name = values.at(#name);
  NORMLAB_BN_CONSTANTS(NORMLAB_SET)
#undef NORMLAB_SET
  return old;
}

// (fold, cw, sub, group, local) of the kernels' view (n_rows, width) with S = s_len; backward:
// the backward's (half the local size: it reads x and dy).
inline std::tuple<int64_t, int64_t, int64_t, int64_t, bool> geometry_of(int64_t n_rows, int64_t width, int64_t s_len,
                                                                     bool backward) {
  Geometry g = geometry(n_rows, width, s_len, constants().local_elems / (backward ? 2 : 1));
  return {g.fold, g.cw, g.sub, g.group, g.local};
}

}  // namespace bn

inline void bind_batch_norm(pybind11::module_& m) {
  m.def("batch_norm", &bn::batch_norm_entry, "BatchNorm forward (eager): normlab::batch_norm_train_fwd / _eval_fwd "
        "and the running-statistics update");
  namespace py = pybind11;
  // noconvert: an int, bool or tensor momentum / eps / training is Python's to check (TypeError -> None)
  m.def("batch_norm_fast", &bn::batch_norm_fast, "BatchNorm of arguments the checks accept, else None",
        py::arg("input"), py::arg("running_mean").none(true), py::arg("running_var").none(true),
        py::arg("weight").none(true), py::arg("bias").none(true), py::arg("training").noconvert(),
        py::arg("momentum").noconvert(), py::arg("eps").noconvert());
  m.def("batch_norm_module", &bn::batch_norm_module, "normlab.nn BatchNorm forward, else None", py::arg("input"),
        py::arg("weight").none(true), py::arg("bias").none(true), py::arg("running_mean").none(true),
        py::arg("running_var").none(true), py::arg("num_batches_tracked").none(true),
        py::arg("training").noconvert(), py::arg("track_running_stats").noconvert(),
        py::arg("momentum").none(true).noconvert(), py::arg("eps").noconvert(), py::arg("num_features").noconvert(),
        py::arg("dims").noconvert());
  m.def("batch_norm_update", &bn::batch_norm_update_entry, "running statistics blended in place (eager)");
  m.def("batch_norm_constants", &bn::get_constants, "the BatchNorm kernels' geometry constants");
  m.def("batch_norm_set_constants", &bn::set_constants, "set geometry constants (tests); returns the old ones");
  m.def("batch_norm_geometry", &bn::geometry_of, "(fold, cw, sub, group, local) of a (n_rows, width) view, S");
}

}  // namespace normlab
