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
#include "norm_act.h"
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
  m.def("batch_norm_update", &batch_norm_update_entry, "running statistics blended in place (eager)");
  m.def("batch_norm_constants", &kernel_constants, "the BatchNorm kernels' geometry constants");
  m.def("batch_norm_set_constants", &set_kernel_constants, "set geometry constants (tests); returns the old ones");
  m.def("batch_norm_geometry", &kernel_geometry, "(fold, cw, sub, group, local, tail) of a (n_rows, width) view, S");
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

// ---- norm_act: the Python objects its fast entries take, judged as normlab.functional's
// *_act functions took them for the fused kernels: tensors of torch.Tensor itself (or
// torch.nn.Parameter; not a subclass, whose own __torch_function__ is not ours), ints of type
// int, numbers.Real values (not bools) compared as Python compares them ----

PyObject* torch_attr(const char* module, const char* name) {
  return py::object(py::module_::import(module).attr(name)).release().ptr();  // (kept for the process)
}

// A tensor whose type is torch.Tensor exactly (or torch.nn.Parameter, where `parameter` is true).
bool plain_tensor_arg(PyObject* o, at::Tensor& t, bool parameter = true) {
  static PyObject* const tensor_type = torch_attr("torch", "Tensor");
  static PyObject* const parameter_type = torch_attr("torch.nn", "Parameter");
  const PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type != tensor_type && !(parameter && type == parameter_type)) return false;
  t = THPVariable_Unpack(o);
  return true;
}

bool plain_opt_tensor_arg(PyObject* o, OptTensor& t) {
  if (o == Py_None) return true;
  at::Tensor v;
  if (!plain_tensor_arg(o, v)) return false;
  t = std::move(v);
  return true;
}

// A numbers.Real (not a bool) with `o op 0` (op: Py_GT or Py_GE) and, where up_to_one, o <= 1.
bool real_arg(PyObject* o, int op, bool up_to_one = false) {
  if (PyFloat_CheckExact(o)) {
    const double v = PyFloat_AS_DOUBLE(o);
    return (op == Py_GT ? v > 0 : v >= 0) && (!up_to_one || v <= 1);
  }
  static PyObject* const real = torch_attr("numbers", "Real");
  if (PyBool_Check(o)) return false;
  const int is_real = PyObject_IsInstance(o, real);
  if (is_real < 0) throw py::error_already_set();
  if (!is_real) return false;
  auto compare = [&](long bound, int cmp) {
    const py::int_ b(bound);
    const int r = PyObject_RichCompareBool(o, b.ptr(), cmp);
    if (r < 0) throw py::error_already_set();
    return r == 1;
  };
  return compare(0, op) && (!up_to_one || compare(1, Py_LE));
}

// float(o) of a real_arg (its error, if it has one, raised).
double real_value(PyObject* o) {
  if (PyFloat_CheckExact(o)) return PyFloat_AS_DOUBLE(o);
  const py::object f = py::reinterpret_steal<py::object>(PyNumber_Float(o));
  if (!f) throw py::error_already_set();
  return PyFloat_AS_DOUBLE(f.ptr());
}

// An int of type int (not a bool) that fits int64.
bool int_arg(PyObject* o, int64_t& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  v = PyLong_AsLongLongAndOverflow(o, &overflow);
  return !overflow;
}

// normalized_shape as layer_norm_act takes it: an int, or a non-empty tuple / list / torch.Size
// of ints.
bool shape_arg(PyObject* o, std::vector<int64_t>& shape) {
  int64_t v = 0;
  if (PyLong_CheckExact(o)) {
    if (!int_arg(o, v)) return false;
    shape.assign(1, v);
    return true;
  }
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  if (n == 0) return false;
  shape.resize(size_t(n));
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!int_arg(PySequence_Fast_GET_ITEM(o, i), shape[size_t(i)])) return false;
  return true;
}

void bind_norm_act(py::module_& m) {
  using namespace normlab::norm_act;
  m.def(
      "batch_norm_act_fast",
      [](py::handle x, py::handle rm, py::handle rv, py::handle w, py::handle b, py::handle training,
         py::handle momentum, py::handle eps, int64_t act, double act_param) -> py::object {
        at::Tensor xt;
        OptTensor rmt, rvt, wt, bt;
        if (!plain_tensor_arg(x.ptr(), xt, /*parameter=*/false) || !plain_opt_tensor_arg(rm.ptr(), rmt) ||
            !plain_opt_tensor_arg(rv.ptr(), rvt) || !plain_opt_tensor_arg(w.ptr(), wt) ||
            !plain_opt_tensor_arg(b.ptr(), bt) || !PyBool_Check(training.ptr()) ||
            !real_arg(momentum.ptr(), Py_GE, true) || !real_arg(eps.ptr(), Py_GT))
          return py::none();
        const double mv = real_value(momentum.ptr()), ev = real_value(eps.ptr());
        return wrap(batch_norm_act_fast(xt, rmt, rvt, wt, bt, training.ptr() == Py_True, mv, ev, act, act_param));
      },
      "batch_norm_act by the fused kernels (x, running_mean, running_var, weight, bias, training, momentum, eps, "
      "act id, act_param) where they take the arguments, else None");
  m.def(
      "group_norm_act_fast",
      [](py::handle x, py::handle g, py::handle w, py::handle b, py::handle eps, int64_t act,
         double act_param) -> py::object {
        at::Tensor xt;
        OptTensor wt, bt;
        int64_t gv = 0;
        if (!plain_tensor_arg(x.ptr(), xt) || !int_arg(g.ptr(), gv) || !plain_opt_tensor_arg(w.ptr(), wt) ||
            !plain_opt_tensor_arg(b.ptr(), bt) || !real_arg(eps.ptr(), Py_GE))
          return py::none();
        return wrap(group_norm_act_fast(xt, gv, wt, bt, real_value(eps.ptr()), act, act_param));
      },
      "group_norm_act by the fused kernels (x, num_groups, weight, bias, eps, act id, act_param) where they take "
      "the arguments, else None");
  m.def(
      "layer_norm_act_fast",
      [](py::handle x, py::handle normalized_shape, py::handle w, py::handle b, py::handle eps, int64_t act,
         double act_param) -> py::object {
        at::Tensor xt;
        OptTensor wt, bt;
        std::vector<int64_t> shape;
        if (!plain_tensor_arg(x.ptr(), xt) || !shape_arg(normalized_shape.ptr(), shape) ||
            !plain_opt_tensor_arg(w.ptr(), wt) || !plain_opt_tensor_arg(b.ptr(), bt) || !real_arg(eps.ptr(), Py_GE))
          return py::none();
        return wrap(layer_norm_act_fast(xt, shape, wt, bt, real_value(eps.ptr()), act, act_param));
      },
      "layer_norm_act by the fused kernels (x, normalized_shape, weight, bias, eps, act id, act_param) where they "
      "take the arguments, else None");
  m.def(
      "layer_norm_act2d_fast",
      [](py::handle x, py::handle w, py::handle b, py::handle eps, int64_t act, double act_param) -> py::object {
        at::Tensor xt;
        OptTensor wt, bt;
        if (!plain_tensor_arg(x.ptr(), xt) || !plain_opt_tensor_arg(w.ptr(), wt) ||
            !plain_opt_tensor_arg(b.ptr(), bt) || !real_arg(eps.ptr(), Py_GE))
          return py::none();
        return wrap(layer_norm_act2d_fast(xt, wt, bt, real_value(eps.ptr()), act, act_param));
      },
      "layer_norm_act2d by the fused kernels (x, weight, bias, eps, act id, act_param) where they take the "
      "arguments, else None");
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
  normlab::norm_act::define(m);
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
  bind_norm_act(m);
}
