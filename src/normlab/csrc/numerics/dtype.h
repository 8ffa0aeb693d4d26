// The storage dtypes the kernels take, as one enum for every family's argument structs
// (cpu/layer_norm_kernels.h, cpu/batch_norm_kernels.h); args.h maps an at::ScalarType onto it.
// Free of torch headers, as the kernels are.
#pragma once

#include <cstdint>

namespace normlab {

enum class Dtype : int8_t { f32, f64, bf16, f16 };

}  // namespace normlab
