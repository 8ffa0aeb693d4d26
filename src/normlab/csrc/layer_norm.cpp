// The layer_norm family's op schemas (LayerNorm, RMSNorm, their fused residual adds): the ops
// torch.compile and torch.export record, with their CPU (cpu/layer_norm.cpp), Meta
// (meta/layer_norm.cpp) and Autograd (autograd/layer_norm.cpp) kernels.
//
// x is normalised over its trailing `normalized_shape` dims, as rows of n_cols values; the
// statistics are (n_rows,) in the accumulation dtype (float32, float64 for float64). A weight
// or bias holds n_cols values, or G * n_cols (torch.func.vmap over stacked weights: G grouped
// weights, row i taking weight row i / (n_rows / G)); its gradient has its shape.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // forward with statistics (differentiable: the Autograd kernel saves them for the backward)
  m.def("layer_norm_fwd(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps)"
        " -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def("rms_norm_fwd(Tensor x, int[] normalized_shape, Tensor? weight, float eps, float offset,"
        " bool cast_x_hat) -> (Tensor y, Tensor rstd)");
  m.def("add_layer_norm_fwd(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight,"
        " Tensor? bias, float eps) -> (Tensor y, Tensor h, Tensor mean, Tensor rstd)");
  m.def("add_rms_norm_fwd(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight, float eps,"
        " float offset, bool cast_x_hat) -> (Tensor y, Tensor h, Tensor rstd)");
  // backward: dx (plus dh), dw in the weight's dtype (the accumulation dtype without a weight)
  // and db in db_dtype (the bias' dtype; None: the accumulation dtype); (0,) unless need_wb /
  // need_dw
  m.def("layer_norm_bwd(Tensor dy, Tensor x, int[] normalized_shape, Tensor? weight, Tensor mean,"
        " Tensor rstd, Tensor? dh, bool need_wb, ScalarType? db_dtype=None) -> (Tensor dx, Tensor dw, Tensor db)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, int[] normalized_shape, Tensor? weight, Tensor rstd,"
        " Tensor? dh, bool need_dw, float offset, bool cast_x_hat) -> (Tensor dx, Tensor dw)");
  // inference: the output alone (h undefined without a residual), no statistics allocated;
  // not differentiable (the fast eager entry calls it when autograd records nothing)
  m.def("row_norm_infer(Tensor x, Tensor? residual, int[] normalized_shape, Tensor? weight,"
        " Tensor? bias, float eps, bool center, float offset, bool cast_x_hat) -> (Tensor y, Tensor h)");
}
