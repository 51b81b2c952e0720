// Bindings of the RMSNorm family (rmsnorm, fused_add_rmsnorm and their Gemma forms) and their
// CPU implementation. The CUDA kernels are in cuda/norm.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "cpu_kernels.h"
#include "norm.h"
#include "tensor_view.h"

namespace opforge {
namespace {

using cuda::NormParams;

// Sum of s[c]^2 whose rounding error does not grow with the row length: eight fp32 lanes (so the
// loop vectorises) over blocks of kBlock elements, the block sums added in double. A single fp32
// accumulator loses about n * 2^-24 of relative accuracy (8e-5 for a 4M-element row).
inline float sum_of_squares(const float* s, int64_t n) {
  constexpr int64_t kBlock = 128;
  double total = 0.0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t c = begin; c < end; ++c) partial[c & 7] += s[c] * s[c];
    float block = 0.f;
    for (float v : partial) block += v;
    total += block;
  }
  return static_cast<float>(total);
}

// fp32 math, the same formula as the CUDA kernel: s = x (+ r); out = s * rstd(s) * (w + offset).
template <typename T>
void norm_cpu(const NormParams& p) {
  const T* w = static_cast<const T*>(p.weight);
  std::vector<float> s(static_cast<size_t>(p.hidden));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    if (p.residual) {
      const T* res = static_cast<const T*>(p.residual) + r * p.residual_stride;
      T* res_out = static_cast<T*>(p.residual_out) + r * p.residual_out_stride;
      for (int64_t c = 0; c < p.hidden; ++c) s[c] = cpu::to_float(in[c]) + cpu::to_float(res[c]);
      for (int64_t c = 0; c < p.hidden; ++c) res_out[c] = cpu::from_float<T>(s[c]);
    } else {
      for (int64_t c = 0; c < p.hidden; ++c) s[c] = cpu::to_float(in[c]);
    }
    const float ss = sum_of_squares(s.data(), p.hidden);
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

void norm(nb::handle out_obj, nb::handle input_obj, nb::handle residual_obj, nb::handle residual_out_obj,
          nb::handle weight_obj, double eps, bool gemma, std::optional<uintptr_t> stream, bool launch, int vpt, bool pdl) {
  const bool add = !residual_obj.is_none();
  const OpContext ctx{norm_op_name(add, gemma)};
  const TensorArg input = tensor_arg(ctx, input_obj, "input");
  check_has_rows(ctx, input);
  const RowView x = row_view(ctx, input);
  check_device_supported(ctx, x);
  const TensorArg weight = tensor_arg(ctx, weight_obj, "weight");
  const RowView w = row_view(ctx, weight);
  check_same_dtype_device(ctx, x, w);
  if (weight.ndim() != 1 || w.cols != x.cols) {
    throw_value_error(std::string("opforge.") + ctx.op + ": weight has shape " + shape_string(weight) +
                      "; expected (" + std::to_string(x.cols) + ",), the hidden size of input " +
                      shape_string(input));
  }
  const TensorArg out = tensor_arg_or_same(ctx, out_obj, "out", input_obj, input);
  const RowView o = row_view(ctx, out);
  check_same_dtype_device(ctx, x, o);
  check_same_shape(ctx, input, out);
  check_writable_rows(ctx, o);
  // eps is applied in fp32, where a larger double would be infinite.
  if (!(eps >= 0 && eps <= std::numeric_limits<float>::max())) {
    std::ostringstream given;
    given << eps;
    throw_value_error(std::string("opforge.") + ctx.op + ": eps is " + given.str() +
                      "; accepted: a finite number >= 0 within float32's range (<= 3.4e38)");
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
  check_pdl(ctx, x, pdl);
  p.pdl = pdl;

  if (add) {
    if (residual_out_obj.is_none()) throw_value_error(std::string("opforge.") + ctx.op + ": residual_out is required");
    const TensorArg residual = tensor_arg(ctx, residual_obj, "residual");
    const TensorArg residual_out = tensor_arg_or_same(ctx, residual_out_obj, "residual_out", residual_obj, residual);
    const RowView r = row_view(ctx, residual);
    const RowView ro = row_view(ctx, residual_out);
    check_same_dtype_device(ctx, x, r);
    check_same_dtype_device(ctx, x, ro);
    check_same_shape(ctx, input, residual);
    check_same_shape(ctx, input, residual_out);
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
  } else {
#ifdef OPFORGE_WITH_CUDA
    check_launch(ctx, cuda::launch_norm(p, x.device_id, launch_stream(stream, x.device_id)), x.device_id);
#endif
  }
  if (add) {
    mark_written({out_obj, residual_out_obj});
  } else {
    mark_written({out_obj});
  }
}

}  // namespace

void bind_norm(nb::module_& m) {
  m.def("norm", &norm, nb::arg("out"), nb::arg("input"), nb::arg("residual").none(), nb::arg("residual_out").none(),
        nb::arg("weight"), nb::arg("eps"), nb::arg("gemma"), nb::arg("stream").none(), nb::arg("launch"), nb::arg("vpt") = -1,
        nb::arg("pdl") = false,
        "RMSNorm family into `out` (and `residual_out` when `residual` is given); see opforge.ops.norm.\n"
        "pdl: programmatic dependent launch (compute capability 9.0+).\n"
        "vpt >= 0 forces the CUDA launch shape (vectors per thread, 0 = streaming) for tuning.");
}

}  // namespace opforge
