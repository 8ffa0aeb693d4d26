// normlab._C: the Python module of the extension, and the one place where Python meets the C++
// API. It holds the one registration block of the op schemas (each family's `define`, in
// csrc/<family>.h; the families' CPU, Meta and Autograd kernels register themselves from cpu/,
// meta/ and autograd/) and gives Python every eager entry of every family (declared in
// csrc/<family>.h): direct calls of the registered ops through cached dispatcher handles
// (cheaper than torch.ops), and the fast entries of normlab.functional, which check their
// arguments themselves and return None for anything Python's checks must word.
//
// This is the one translation unit that includes torch/extension.h (pybind11 and the tensor
// casters, ~20 s to compile).
#include <torch/extension.h>

#include "batch_norm.h"
#include "dyt.h"
#include "frn.h"
#include "cpu/huge_pages.h"
#include "group_norm.h"
#include "layer_norm.h"
#include "scale_norm.h"
#include "cpu/levels.h"

namespace {

namespace py = pybind11;
using OptTensor = std::optional<at::Tensor>;

// The Python objects group_norm_fast / instance_norm_fast take, read without pybind11's casters
// (and their conversions): a tensor, None, an int (not a bool), a float, a bool -- exactly the
// types the Python checks' own fast path accepts. False: not one of those (the entry returns
// None, and Python's checks word it).
bool tensor_arg(PyObject* o, at::Tensor& t) {
  if (!THPVariable_Check(o)) return false;
  t = THPVariable_Unpack(o);
  return true;
}
bool opt_tensor_arg(PyObject* o, OptTensor& t) {
  if (o == Py_None) return true;
  if (!THPVariable_Check(o)) return false;
  t = THPVariable_Unpack(o);
  return true;
}
py::object wrap(std::optional<at::Tensor>&& y) {
  if (!y.has_value()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(*y)));
}

void bind_layer_norm(py::module_& m) {
  using namespace normlab::layer_norm;
  // eps not converted (noconvert): an int or a bool is declined (TypeError), and Python's checks word it
  m.def("add_norm_fast", &add_norm_fast, "add_layer_norm / add_rms_norm of arguments the checks accept, else None",
        py::arg("x"), py::arg("residual"), py::arg("normalized_shape"), py::arg("weight"), py::arg("bias"),
        py::arg("eps").noconvert(), py::arg("center"));
  m.def("layer_norm_fast", &layer_norm_fast, "LayerNorm of arguments the checks accept, else None", py::arg("x"),
        py::arg("normalized_shape"), py::arg("weight"), py::arg("bias"), py::arg("eps").noconvert());
  m.def("rms_norm_fast", &rms_norm_fast, "RMSNorm (torch's casting) of arguments the checks accept, else None",
        py::arg("x"), py::arg("normalized_shape"), py::arg("weight"), py::arg("eps").noconvert());
  m.def("row_norm", &row_norm, "LayerNorm / RMSNorm (and the fused residual add) -> (y, h, mean, rstd)",
        py::arg("x"), py::arg("normalized_shape"), py::arg("residual"), py::arg("weight"), py::arg("bias"),
        py::arg("eps"), py::arg("center"), py::arg("offset"), py::arg("cast_x_hat"), py::arg("stats"));
  m.def("layer_norm2d", &layer_norm2d,
        "LayerNorm over dim 1 of an (N, C, *) tensor at every pixel: layer_norm2d(x, weight, bias, eps) -> y");
  m.def("layer_norm2d_fast", &layer_norm2d_fast, "LayerNorm2d of arguments the checks accept, else None",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps").noconvert());
}

void bind_batch_norm(py::module_& m) {
  using namespace normlab::batch_norm;
  m.def("batch_norm", &batch_norm_entry, "BatchNorm forward (eager): normlab::batch_norm_fwd / _eval_fwd "
        "and the running-statistics update");
  // noconvert: an int, bool or tensor momentum / eps / training is Python's to check (TypeError -> None)
  m.def("batch_norm_fast", &batch_norm_fast, "BatchNorm of arguments the checks accept, else None",
        py::arg("input"), py::arg("running_mean").none(true), py::arg("running_var").none(true),
        py::arg("weight").none(true), py::arg("bias").none(true), py::arg("training").noconvert(),
        py::arg("momentum").noconvert(), py::arg("eps").noconvert());
  m.def("batch_norm_module", &batch_norm_module, "normlab.nn BatchNorm forward, else None", py::arg("input"),
        py::arg("weight").none(true), py::arg("bias").none(true), py::arg("running_mean").none(true),
        py::arg("running_var").none(true), py::arg("num_batches_tracked").none(true),
        py::arg("training").noconvert(), py::arg("track_running_stats").noconvert(),
        py::arg("momentum").none(true).noconvert(), py::arg("eps").noconvert(), py::arg("num_features").noconvert(),
        py::arg("dims").noconvert());
  m.def("batch_norm_update", &batch_norm_update_entry, "running statistics blended in place (eager)");
  m.def("batch_norm_constants", &kernel_constants, "the BatchNorm kernels' geometry constants");
  m.def("batch_norm_set_constants", &set_kernel_constants, "set geometry constants (tests); returns the old ones");
  m.def("batch_norm_geometry", &kernel_geometry, "(fold, cw, sub, group, local) of a (n_rows, width) view, S");
}

void bind_group_norm(py::module_& m) {
  using namespace normlab::group_norm;
  m.def(
      "group_norm",
      [](const at::Tensor& x, int64_t num_groups, const OptTensor& w, const OptTensor& b, double eps) {
        return group_norm(x, w, b, num_groups, eps);
      },
      "GroupNorm of (N, C, *) x: group_norm(x, num_groups, w, b, eps) -> y");
  m.def("instance_norm", &instance_norm_entry,
        "InstanceNorm of (N, C, *) x: instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, "
        "eps) -> y (contiguous); running statistics updated in place when given and use_input_stats");
  m.def(
      "group_norm_fast",
      [](py::handle x, py::handle g, py::handle w, py::handle b, py::handle eps) -> py::object {
        at::Tensor xt;
        OptTensor wt, bt;
        if (!tensor_arg(x.ptr(), xt) || !PyLong_CheckExact(g.ptr()) || !PyFloat_CheckExact(eps.ptr()) ||
            !opt_tensor_arg(w.ptr(), wt) || !opt_tensor_arg(b.ptr(), bt))
          return py::none();
        int overflow = 0;
        const long long gv = PyLong_AsLongLongAndOverflow(g.ptr(), &overflow);
        if (overflow) return py::none();
        return wrap(group_norm_fast(xt, gv, wt, bt, PyFloat_AS_DOUBLE(eps.ptr())));
      },
      "GroupNorm of arguments the checks accept (x, num_groups, weight, bias, eps: a float), else None");
  m.def(
      "instance_norm_fast",
      [](py::handle x, py::handle rm, py::handle rv, py::handle w, py::handle b, py::handle use_input_stats,
         py::handle momentum, py::handle eps) -> py::object {
        at::Tensor xt;
        OptTensor rmt, rvt, wt, bt;
        if (!tensor_arg(x.ptr(), xt) || !PyBool_Check(use_input_stats.ptr()) || !PyFloat_CheckExact(momentum.ptr()) ||
            !PyFloat_CheckExact(eps.ptr()) || !opt_tensor_arg(rm.ptr(), rmt) || !opt_tensor_arg(rv.ptr(), rvt) ||
            !opt_tensor_arg(w.ptr(), wt) || !opt_tensor_arg(b.ptr(), bt))
          return py::none();
        return wrap(instance_norm_fast(xt, rmt, rvt, wt, bt, use_input_stats.ptr() == Py_True,
                                       PyFloat_AS_DOUBLE(momentum.ptr()), PyFloat_AS_DOUBLE(eps.ptr())));
      },
      "InstanceNorm of arguments the checks accept (x, running_mean, running_var, weight, bias, use_input_stats: a "
      "bool, momentum, eps: floats), else None");
}

}  // namespace

void bind_dyt(py::module_& m) {
  using namespace normlab::dyt;
  m.def("dyt_fast", &dyt_fast, "DyT of arguments the checks accept, else None", py::arg("x"),
        py::arg("normalized_shape"), py::arg("alpha"), py::arg("weight"), py::arg("bias"));
}

void bind_frn(py::module_& m) {
  using namespace normlab::frn;
  // eps not converted (noconvert): an int or a bool is declined (TypeError), and Python's checks word it
  m.def("frn_fast", &frn_fast, "filter_response_norm of arguments the checks accept, else None", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("tau"), py::arg("eps").noconvert());
}

void bind_scale_norm(py::module_& m) {
  using namespace normlab::scale_norm;
  // eps not converted (noconvert): an int or a bool is declined (TypeError), and Python's checks word it
  m.def("scale_norm2d_fast", &scale_norm2d_fast,
        "rms_norm2d (simple=False) / simple_norm2d (simple=True) of arguments the checks accept, else None",
        py::arg("x"), py::arg("weight"), py::arg("eps").noconvert(), py::arg("simple"));
}

// The op schemas of every family: torch.ops.normlab.<name>.
TORCH_LIBRARY_FRAGMENT(normlab, m) {
  normlab::batch_norm::define(m);
  normlab::dyt::define(m);
  normlab::frn::define(m);
  normlab::group_norm::define(m);
  normlab::layer_norm::define(m);
  normlab::scale_norm::define(m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "normlab's compiled CPU kernels (the \"cpu\" backend); ops registered as torch.ops.normlab.*";
  m.attr("vec_bytes") = normlab::levels::vec_bytes();  // the bound level's (cpu/levels.h)
  m.def("cpu_level", [] {
    const auto& c = normlab::levels::choice();
    py::dict d;
    d["level"] = c.level;
    d["reason"] = c.reason;
    d["error"] = c.error;
    py::list runs, built;
    for (const auto& lv : c.cpu_runs) runs.append(lv);
    for (const auto& lv : c.built) built.append(lv);
    d["cpu_runs"] = runs;
    d["built"] = built;
    return d;
  }, "the x86-64 level whose kernels this process runs, chosen at load (cpu/levels.h): level, reason, error "
     "(a refused NORMLAB_CPU_LEVEL), the levels this CPU runs and the levels built");
  m.def("advise_huge_pages", [](const at::Tensor& t) {
    normlab::advise_huge_pages(t.data_ptr(), int64_t(t.numel()) * int64_t(t.element_size()));
  }, "advise a large tensor's pages onto transparent huge pages, as the kernels do for their outputs");
  bind_layer_norm(m);
  bind_batch_norm(m);
  bind_group_norm(m);
  bind_dyt(m);
  bind_frn(m);
  bind_scale_norm(m);
}
