// The group_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/group_norm.cpp), bound by bind_group_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

namespace normlab {

// normlab::group_norm through a cached dispatcher handle (autograd, then the CPU kernel).
at::Tensor group_norm_entry(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, double eps);
// InstanceNorm: training statistics (and the running-statistics update) or fixed running statistics.
at::Tensor instance_norm_entry(const at::Tensor& x, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& w,
                               const std::optional<at::Tensor>& b, bool use_input_stats, double momentum, double eps);

// normlab.functional.group_norm / instance_norm for arguments that its checks accept without a
// word (x a CPU tensor of a served dtype, not empty; parameters and running statistics None or
// (C,) CPU tensors in x's dtype or float32 beside half precision; num_groups dividing C; eps
// finite and >= 0; momentum in [0, 1]; more than one value a group): y. Anything else: None, and
// Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> group_norm_fast(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& w,
                                          const std::optional<at::Tensor>& b, double eps);
std::optional<at::Tensor> instance_norm_fast(const at::Tensor& x, const std::optional<at::Tensor>& running_mean,
                                             const std::optional<at::Tensor>& running_var,
                                             const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
                                             bool use_input_stats, double momentum, double eps);

namespace detail {

// The Python objects the fast entries take, read without pybind11's casters (and their
// conversions): a tensor, None, an int (not a bool), a float, a bool -- exactly the types the
// Python checks' own fast path accepts. False: not one of those.
inline bool tensor_arg(PyObject* o, at::Tensor& t) {
  if (!THPVariable_Check(o)) return false;
  t = THPVariable_Unpack(o);
  return true;
}
inline bool opt_tensor_arg(PyObject* o, std::optional<at::Tensor>& t) {
  if (o == Py_None) return true;
  if (!THPVariable_Check(o)) return false;
  t = THPVariable_Unpack(o);
  return true;
}
inline pybind11::object wrap(std::optional<at::Tensor>&& y) {
  if (!y.has_value()) return pybind11::none();
  return pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(std::move(*y)));
}

}  // namespace detail

inline void bind_group_norm(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("group_norm", &group_norm_entry, "GroupNorm of (N, C, *) x: group_norm(x, num_groups, w, b, eps) -> y");
  m.def("instance_norm", &instance_norm_entry,
        "InstanceNorm of (N, C, *) x: instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, "
        "eps) -> y (contiguous); running statistics updated in place when given and use_input_stats");
  m.def(
      "group_norm_fast",
      [](py::handle x, py::handle g, py::handle w, py::handle b, py::handle eps) -> py::object {
        at::Tensor xt;
        std::optional<at::Tensor> wt, bt;
        if (!detail::tensor_arg(x.ptr(), xt) || !PyLong_CheckExact(g.ptr()) || !PyFloat_CheckExact(eps.ptr()) ||
            !detail::opt_tensor_arg(w.ptr(), wt) || !detail::opt_tensor_arg(b.ptr(), bt))
          return py::none();
        int overflow = 0;
        const long long gv = PyLong_AsLongLongAndOverflow(g.ptr(), &overflow);
        if (overflow) return py::none();
        return detail::wrap(group_norm_fast(xt, gv, wt, bt, PyFloat_AS_DOUBLE(eps.ptr())));
      },
      "GroupNorm of arguments the checks accept (x, num_groups, weight, bias, eps: a float), else None");
  m.def(
      "instance_norm_fast",
      [](py::handle x, py::handle rm, py::handle rv, py::handle w, py::handle b, py::handle use_input_stats,
         py::handle momentum, py::handle eps) -> py::object {
        at::Tensor xt;
        std::optional<at::Tensor> rmt, rvt, wt, bt;
        if (!detail::tensor_arg(x.ptr(), xt) || !PyBool_Check(use_input_stats.ptr()) ||
            !PyFloat_CheckExact(momentum.ptr()) || !PyFloat_CheckExact(eps.ptr()) ||
            !detail::opt_tensor_arg(rm.ptr(), rmt) || !detail::opt_tensor_arg(rv.ptr(), rvt) ||
            !detail::opt_tensor_arg(w.ptr(), wt) || !detail::opt_tensor_arg(b.ptr(), bt))
          return py::none();
        return detail::wrap(instance_norm_fast(xt, rmt, rvt, wt, bt, use_input_stats.ptr() == Py_True,
                                               PyFloat_AS_DOUBLE(momentum.ptr()), PyFloat_AS_DOUBLE(eps.ptr())));
      },
      "InstanceNorm of arguments the checks accept (x, running_mean, running_var, weight, bias, use_input_stats: a "
      "bool, momentum, eps: floats), else None");
}

}  // namespace normlab
