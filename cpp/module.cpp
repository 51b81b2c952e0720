// The opforge._C extension: one nanobind module holding every op's binding, CPU versions and
// (when built with CUDA) the AOT-compiled kernels. Importing it never touches a GPU.
#include <nanobind/nanobind.h>

#include "tensor_view.h"

namespace opforge {
void bind_runtime(nb::module_& m);
void bind_norm(nb::module_& m);
void bind_elementwise(nb::module_& m);
void bind_nvfp4_gemv(nb::module_& m);
void bind_paged_decode_attention(nb::module_& m);
}  // namespace opforge

NB_MODULE(_C, m) {
  m.doc() = "opforge compiled ops (internal; use the opforge package)";
  nanobind::exception<opforge::CudaError>(m, "CudaError", PyExc_RuntimeError);
  opforge::bind_tensors(m);
  opforge::bind_runtime(m);
  opforge::bind_norm(m);
  opforge::bind_elementwise(m);
  opforge::bind_nvfp4_gemv(m);
  opforge::bind_paged_decode_attention(m);
}
