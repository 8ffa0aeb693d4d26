// The dtype and argument helpers every family's op layer shares (cpu/, meta/, autograd/ and the
// typed op API of csrc/<family>.cpp): the accumulation dtype, the kernels' dtype enum and type
// tags from an at::ScalarType, the pieces of each fast entry's argument-fit test (fits_fast),
// plain_eps, the CPU entries' pieces (outputs allocated and advised, raw pointers, the 2-D
// families' memory format, float64 partials summed in order), and the cached typed handle of a
// registered op.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "cpu/huge_pages.h"
#include "numerics/dtype.h"
#include "numerics/half.h"

namespace normlab {

using OptTensor = std::optional<at::Tensor>;

// ---- dtypes ----

// Statistics and sums: float64 for float64, float32 for float32, bfloat16 and float16.
inline at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline bool half_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// The dtypes the kernels serve.
inline bool served_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kDouble || half_dtype(t); }

// The kernels' dtype enum (numerics/dtype.h) of a served dtype; `what` names the tensor in the
// error for any other.
inline Dtype kernel_dtype(at::ScalarType t, const char* op = "normlab", const char* what = "a tensor") {
  switch (t) {
    case at::kFloat: return Dtype::f32;
    case at::kDouble: return Dtype::f64;
    case at::kBFloat16: return Dtype::bf16;
    case at::kHalf: return Dtype::f16;
    default:
      TORCH_CHECK(false, op, ": expected ", what, " of dtype float32, float64, bfloat16 or float16, got ", t);
  }
}

// f(S{}) with S the kernels' storage type of dtype t (float, double, bf16, f16).
template <class F> void visit_dtype(at::ScalarType t, const char* op, const F& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kBFloat16: f(bf16{}); break;
    case at::kHalf: f(f16{}); break;
    default: TORCH_CHECK(false, op, ": expected a float32, float64, bfloat16 or float16 tensor, got ", t);
  }
}

// ---- arguments ----

inline bool given(const OptTensor& t) { return t.has_value() && t->defined(); }

// A saved tensor as an op's optional argument (undefined: absent).
inline OptTensor opt(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The eps a fast entry takes: a non-negative float, +inf included (torch takes it), NaN not.
inline bool plain_eps(double eps) { return eps >= 0; }

// A strided CPU tensor.
inline bool cpu_strided(const at::Tensor& t) { return t.device().is_cpu() && t.layout() == at::kStrided; }

// A tensor the CPU kernels read directly: strided on the CPU, no Python-dispatched subclass
// (FakeTensor, functional tensors) or other dispatch layer in front of it.
inline bool plain_cpu(const at::Tensor& t) {
  return cpu_strided(t) && !t.key_set().has(c10::DispatchKey::Python) &&
         !t.key_set().has(c10::DispatchKey::Functionalize) && !t.is_conj() && !t.is_neg();
}

// A running statistic autograd would have to differentiate (grad mode on and requires_grad):
// torch refuses it ("not differentiable with respect to argument 'running_mean'"), and so do
// normlab's checks -- the fast entries decline it so that Python's check words the error.
inline bool recorded_buffer(const OptTensor& t) {
  return given(t) && t->requires_grad() && at::GradMode::is_enabled();
}

using Place = bool (*)(const at::Tensor&);

// fits_fast, the input: defined, `place` (cpu_strided or plain_cpu), a served dtype, at least
// min_dim dims.
inline bool input_fits(const at::Tensor& x, int64_t min_dim, Place place = cpu_strided) {
  return x.defined() && place(x) && served_dtype(x.scalar_type()) && x.dim() >= min_dim;
}

// fits_fast, a parameter (weight, bias, a running statistic): absent, or `place` with exactly
// `sizes`, in x's dtype x_dtype (or float32 beside half precision, where half_params).
inline bool param_fits(const OptTensor& p, at::IntArrayRef sizes, at::ScalarType x_dtype, bool half_params = true,
                       Place place = cpu_strided) {
  if (!given(p)) return true;
  const at::Tensor& t = *p;
  if (!place(t) || t.sizes() != sizes) return false;
  const auto st = t.scalar_type();
  return st == x_dtype || (half_params && half_dtype(x_dtype) && st == at::kFloat);
}

// A backward's dy: of x's shape and dtype.
inline void check_dy(const at::Tensor& dy, const at::Tensor& x, const char* op) {
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(), op, ": expected dy of x's shape ",
              x.sizes(), " and dtype ", x.scalar_type(), ", got ", dy.sizes(), " ", dy.scalar_type());
}

// A parameter of n values (a per-channel or per-column weight, bias, or DyT's alpha) read into
// a vector of A (the accumulation type), in whatever float dtype it comes; `fill` where the
// parameter is absent (n copies), or an empty vector without a fill. The kernels take these.
template <class A>
std::vector<A> param_values(const OptTensor& t, int64_t n, const char* op, const char* name,
                            std::optional<A> fill = std::nullopt) {
  if (!given(t)) return fill ? std::vector<A>(n, *fill) : std::vector<A>();
  TORCH_CHECK(t->numel() == n, op, ": expected ", name, " with ", n, " values, got shape ", t->sizes());
  std::vector<A> out(n);
  const at::Tensor p = t->contiguous();
  visit_dtype(p.scalar_type(), op, [&](auto tag) {
    using P = decltype(tag);
    const P* q = reinterpret_cast<const P*>(p.data_ptr());
    for (int64_t j = 0; j < n; ++j) out[j] = A(to_acc(q[j]));
  });
  return out;
}

// nullptr for an empty vector (param_values without a fill: the parameter absent), else
// its values.
template <class A> const A* data_or_null(const std::vector<A>& v) { return v.empty() ? nullptr : v.data(); }

// param_values' values without the copy where t holds them as they are (contiguous, of type A):
// t's own data; else param_values' vector, kept in `keep`; nullptr for an absent parameter.
template <class A>
const A* param_ptr(const OptTensor& t, int64_t n, const char* op, const char* name, std::vector<A>& keep) {
  if (given(t) && t->numel() == n && t->scalar_type() == c10::CppTypeToScalarType<A>::value && t->is_contiguous())
    return t->const_data_ptr<A>();
  keep = param_values<A>(t, n, op, name);
  return data_or_null(keep);
}

// ---- the CPU entries: outputs and pointers ----

// A tensor's data as T* for the raw-pointer kernels; nullptr for an undefined tensor.
template <class T> T* ptr(const at::Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

// A fresh output, large ones advised onto transparent huge pages (cpu/huge_pages.h).
inline at::Tensor advised(at::Tensor t) {
  advise_huge_pages(t.data_ptr(), int64_t(t.nbytes()));
  return t;
}

// An uninitialised output of x's shape, dtype and device in memory format fmt, advised.
inline at::Tensor empty_out(const at::Tensor& x, at::MemoryFormat fmt = at::MemoryFormat::Contiguous) {
  return advised(at::empty(x.sizes(), x.options().memory_format(fmt)));
}

// The memory format of an (N, C, H, W) family that has NCHW and NHWC kernels (frn, scale_norm):
// channels_last where x suggests it, else contiguous. The CPU and Meta kernels share it.
inline at::MemoryFormat nchw_or_nhwc(const at::Tensor& x) {
  return x.suggest_memory_format() == at::MemoryFormat::ChannelsLast ? at::MemoryFormat::ChannelsLast
                                                                     : at::MemoryFormat::Contiguous;
}

// t as a contiguous tensor of dtype dt: t itself when it is one (no copy).
inline at::Tensor contiguous_in(const at::Tensor& t, at::ScalarType dt) {
  return (t.scalar_type() == dt && t.is_contiguous()) ? t : t.to(dt).contiguous();
}

// (rows, c) float64 partials (a task's or a sample's sums, contiguous) summed over the rows in
// row order, as a (c,) tensor of dtype acc (rounded once).
inline at::Tensor rows_summed(const at::Tensor& part, at::ScalarType acc) {
  const int64_t rows = part.size(0), c = part.size(1);
  std::vector<double> s(c, 0.0);
  const double* p = ptr<const double>(part);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < c; ++k) s[k] += p[r * c + k];  // in row order
  at::Tensor out = at::empty({c}, part.options());
  std::copy(s.begin(), s.end(), ptr<double>(out));
  return out.to(acc);
}

// ---- the registered ops ----

// The typed dispatcher handle of normlab::<name> (the caller keeps it in a function-local static:
// looked up once).
template <class Sig> c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

}  // namespace normlab
