// The layer_norm2d family's schemas: LayerNorm over the channel dim 1 of an (N, C, *) tensor at
// every pixel (docs/derivations/layer_norm.md), for both memory layouts (contiguous planes and
// channels_last rows: csrc/layer_norm2d_layout.h).
//
//   layer_norm2d           y; differentiable (autograd/layer_norm2d.cpp). Its CPU kernel
//                          computes no statistics: what runs when nothing records a gradient.
//   layer_norm2d_forward   (y, mean, rstd): mean and rstd (N * prod(spatial),) per pixel, in the
//                          accumulation dtype (float64 for float64, float32 otherwise).
//   layer_norm2d_backward  (dx, dw, db): dx in x's layout; dw and db (C,) in the accumulation
//                          dtype, (0,) unless need_wb.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  m.def("layer_norm2d(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor");
  m.def("layer_norm2d_forward(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm2d_backward(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool need_wb) "
        "-> (Tensor, Tensor, Tensor)");
}
