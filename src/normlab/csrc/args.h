// The dtype and argument helpers every family's op layer shares (cpu/, meta/, autograd/ and the
// typed op API of csrc/<family>.cpp): the accumulation dtype, the kernels' dtype enum and type
// tags from an at::ScalarType, the pieces of each fast entry's argument-fit test (fits_fast),
// plain_eps, and the cached typed handle of a registered op.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

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

// ---- the registered ops ----

// The typed dispatcher handle of normlab::<name> (the caller keeps it in a function-local static:
// looked up once).
template <class Sig> c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

}  // namespace normlab
