// normlab._C: the Python module of the extension. Importing it runs the families'
// TORCH_LIBRARY_FRAGMENT(normlab, ...) registrations (schemas, CPU, Autograd and Meta kernels:
// csrc/<family>.cpp, cpu/, autograd/, meta/) and gives Python the fast entry points: direct
// calls of the registered ops through a cached dispatcher handle, cheaper than torch.ops.
//
// This is the one translation unit that includes torch/extension.h (pybind11 and the tensor
// casters, ~20 s to compile); each family's csrc/<family>.h, included only here, declares its
// entry points and binds them (inline bind_<family>).
#include <torch/extension.h>

#include "cpu/huge_pages.h"
#include "numerics/vec.h"
#include "batch_norm.h"
#include "group_norm.h"
#include "layer_norm.h"
#include "layer_norm2d.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "normlab's compiled CPU kernels (the \"cpu\" backend); ops registered as torch.ops.normlab.*";
  m.attr("vec_bytes") = NORMLAB_VEC_BYTES;
  m.def("advise_huge_pages", [](const at::Tensor& t) {
    normlab::advise_huge_pages(t.data_ptr(), int64_t(t.numel()) * int64_t(t.element_size()));
  }, "advise a large tensor's pages onto transparent huge pages, as the kernels do for their outputs");
  normlab::bind_layer_norm(m);
  normlab::bind_layer_norm2d(m);
  normlab::bind_batch_norm(m);
  normlab::bind_group_norm(m);
}
