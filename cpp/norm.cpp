// Bindings of the RMSNorm family (rmsnorm, fused_add_rmsnorm and their Gemma forms) and their
// CPU implementation. The CUDA kernels are in cuda/norm.cu.
#include <nanobind/stl/optional.h>

#include <cmath>
#include <optional>
#include <vector>

#include "cpu_kernels.h"
#include "norm.h"
#include "tensor_view.h"

namespace opforge {
namespace {

using cuda::NormParams;

// fp32 math, the same formula as the CUDA kernel: s = x (+ r); out = s * rstd(s) * (w + offset).
template <typename T>
void norm_cpu(const NormParams& p) {
  const T* w = static_cast<const T*>(p.weight);
  std::vector<float> s(static_cast<size_t>(p.hidden));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    // Eight partial sums let the compiler vectorise the reduction without reassociating it.
    float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (p.residual) {
      const T* res = static_cast<const T*>(p.residual) + r * p.residual_stride;
      T* res_out = static_cast<T*>(p.residual_out) + r * p.residual_out_stride;
      for (int64_t c = 0; c < p.hidden; ++c) s[c] = cpu::to_float(in[c]) + cpu::to_float(res[c]);
      for (int64_t c = 0; c < p.hidden; ++c) res_out[c] = cpu::from_float<T>(s[c]);
    } else {
      for (int64_t c = 0; c < p.hidden; ++c) s[c] = cpu::to_float(in[c]);
    }
    for (int64_t c = 0; c < p.hidden; ++c) partial[c & 7] += s[c] * s[c];
    float ss = 0.f;
    for (float v : partial) ss += v;
    const float rstd = 1.f / std::sqrt(ss / static_cast<float>(p.hidden) + p.eps);
    for (int64_t c = 0; c < p.hidden; ++c) {
      out[c] = cpu::from_float<T>(s[c] * rstd * (cpu::to_float(w[c]) + p.weight_offset));
    }
  }
}

const char* norm_op_name(bool add, bool gemma) {
  if (gemma) return add ? "gemma_fused_add_rmsnorm" : "gemma_rmsnorm";
  return add ? "fused_add_rmsnorm" : "rmsnorm";
}

void norm(Array out, Array input, std::optional<Array> residual, std::optional<Array> residual_out, Array weight,
          double eps, bool gemma, uintptr_t stream, bool launch, int vpt) {
  const OpContext ctx{norm_op_name(residual.has_value(), gemma)};
  check_has_rows(ctx, input, "input");
  const RowView x = row_view(ctx, input, "input");
  check_device_supported(ctx, x);
  const RowView w = row_view(ctx, weight, "weight");
  check_same_dtype_device(ctx, x, w);
  if (weight.ndim() != 1 || w.cols != x.cols) {
    throw_value_error(std::string("opforge.") + ctx.op + ": weight has shape " + shape_string(weight) +
                      "; expected (" + std::to_string(x.cols) + ",), the hidden size of input " +
                      shape_string(input));
  }
  const RowView o = row_view(ctx, out, "out");
  check_same_dtype_device(ctx, x, o);
  check_same_shape(ctx, input, "input", out, "out");
  check_writable_rows(ctx, o);
  if (!(std::isfinite(eps) && eps >= 0)) {
    throw_value_error(std::string("opforge.") + ctx.op + ": eps is " + std::to_string(eps) +
                      "; it must be a finite number >= 0");
  }
  check_alias(ctx, o, x, true);
  check_alias(ctx, o, w, false);

  NormParams p;
  p.out = o.data;
  p.input = x.data;
  p.weight = w.data;
  p.rows = x.rows;
  p.hidden = x.cols;
  p.out_stride = o.row_stride;
  p.input_stride = x.row_stride;
  p.eps = static_cast<float>(eps);
  p.weight_offset = gemma ? 1.f : 0.f;
  p.dtype = x.dtype;
  p.force_vpt = vpt;

  if (residual) {
    if (!residual_out) throw_value_error(std::string("opforge.") + ctx.op + ": residual_out is required");
    const RowView r = row_view(ctx, *residual, "residual");
    const RowView ro = row_view(ctx, *residual_out, "residual_out");
    check_same_dtype_device(ctx, x, r);
    check_same_dtype_device(ctx, x, ro);
    check_same_shape(ctx, input, "input", *residual, "residual");
    check_same_shape(ctx, input, "input", *residual_out, "residual_out");
    check_writable_rows(ctx, ro);
    check_alias(ctx, o, r, true);
    check_alias(ctx, ro, x, true);
    check_alias(ctx, ro, r, true);
    check_alias(ctx, ro, w, false);
    check_alias(ctx, ro, o, false);
    p.residual = r.data;
    p.residual_out = ro.data;
    p.residual_stride = r.row_stride;
    p.residual_out_stride = ro.row_stride;
  }
  if (!launch || p.rows == 0 || p.hidden == 0) return;  // launch=false: validate only
  if (p.rows > INT32_MAX) throw_value_error(std::string("opforge.") + ctx.op + ": more than 2^31 rows");

  if (!x.is_cuda()) {
    cpu::run_cpu(p.dtype, p.rows * p.hidden, [&](auto tag) { norm_cpu<decltype(tag)>(p); });
    return;
  }
#ifdef OPFORGE_WITH_CUDA
  check_launch(ctx, cuda::launch_norm(p, x.device_id, reinterpret_cast<void*>(stream)), x.device_id);
#endif
}

}  // namespace

void bind_norm(nb::module_& m) {
  m.def("norm", &norm, nb::arg("out").noconvert(), nb::arg("input").noconvert(),
        nb::arg("residual").noconvert().none(), nb::arg("residual_out").noconvert().none(),
        nb::arg("weight").noconvert(), nb::arg("eps"), nb::arg("gemma"), nb::arg("stream"), nb::arg("launch"), nb::arg("vpt") = -1,
        "RMSNorm family into `out` (and `residual_out` when `residual` is given); see opforge.ops.norm.\n"
        "vpt >= 0 forces the CUDA launch shape (vectors per thread, 0 = streaming) for tuning.");
}

}  // namespace opforge
