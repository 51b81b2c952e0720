// What this build contains, and the launch-shape choice exposed for inspection and tests.
#include <nanobind/stl/string.h>

#include "launch_shape.h"
#include "opforge_build_config.h"
#include "tensor_view.h"
#ifdef OPFORGE_WITH_CUDA
#include "activation.h"
#include "device.h"
#include "norm.h"
#endif

namespace opforge {

void bind_runtime(nb::module_& m) {
  m.def("build_info", []() {
    nb::dict d;
    d["version"] = OPFORGE_VERSION;
#ifdef OPFORGE_WITH_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
    d["cuda_archs"] = std::string(OPFORGE_CUDA_ARCHS);
    d["cuda_version"] = std::string(OPFORGE_CUDA_VERSION);
    d["compiler"] = std::string(OPFORGE_CXX_COMPILER);
    d["commit"] = std::string(OPFORGE_COMMIT);
    return d;
  });
  m.def(
      "launches_with_pdl",
      [](int device) {
        nb::dict d;
#ifdef OPFORGE_WITH_CUDA
        d["norm"] = cuda::norm_launches_with_pdl(device);
        d["act_and_mul"] = cuda::act_and_mul_launches_with_pdl(device);
#else
        d["norm"] = false;
        d["act_and_mul"] = false;
#endif
        return d;
      },
      nb::arg("device"),
      "Whether enable_pdl=True launches of the norms and the act-and-mul ops on CUDA device `device` use "
      "programmatic dependent launch: the code loaded for that GPU waits for the previous kernel (else they "
      "launch plainly).");
  m.def(
      "norm_launch_shape",
      [](int64_t rows, int64_t hidden, int vec, int sms, int vpt) {
        const RowLaunch l = choose_norm_launch(rows, hidden / vec, sms, vpt);
        nb::dict d;
        d["vecs_per_thread"] = l.vecs_per_thread;
        d["group"] = l.group;
        d["threads"] = l.threads;
        d["blocks"] = l.blocks;
        return d;
      },
      nb::arg("rows"), nb::arg("hidden"), nb::arg("vec"), nb::arg("sms"), nb::arg("vpt") = -1,
      "The launch the CUDA norm kernels (RMSNorm and the fused add alike) pick for a shape (vec: elements per access).");
  m.def("norm_narrow_access", &norm_narrow_access, nb::arg("rows"), nb::arg("hidden"), nb::arg("elem_bytes"),
        nb::arg("sms"), nb::arg("vpt") = -1,
        "Whether the CUDA norm kernels read and write rows of this shape with 8-byte accesses (where aligned) "
        "instead of 16-byte ones.");
}

}  // namespace opforge
