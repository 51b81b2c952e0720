// Bindings of the element-wise ops (scale, silu/gelu/gelu_tanh_and_mul) and their CPU versions.
// The CUDA kernels are in cuda/scale.cu and cuda/activation.cu.
#include <cmath>

#include "activation.h"
#include "cpu_kernels.h"
#include "scale.h"
#include "tensor_view.h"

namespace opforge {
namespace {

using cuda::Activation;

template <typename T>
void scale_cpu(const cuda::ScaleParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t c = 0; c < p.cols; ++c) out[c] = cpu::from_float<T>(cpu::to_float(in[c]) * p.factor);
  }
}

// The same fp32 formulas as the CUDA functors in cuda/activation.cu.
inline float activate(Activation act, float x) {
  switch (act) {
    case Activation::kGelu: return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f));
    case Activation::kGeluTanh: return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    default: return x / (1.f + std::exp(-x));
  }
}

template <typename T>
void act_and_mul_cpu(const cuda::ActMulParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t c = 0; c < p.d; ++c) {
      out[c] = cpu::from_float<T>(activate(p.act, cpu::to_float(in[c])) * cpu::to_float(in[p.d + c]));
    }
  }
}

void scale(nb::handle out_obj, nb::handle input_obj, double factor, std::optional<uintptr_t> stream, bool launch) {
  const OpContext ctx{"scale"};
  const TensorArg input = tensor_arg(ctx, input_obj, "x");
  const RowView x = row_view(ctx, input);
  check_device_supported(ctx, x);
  const TensorArg out = tensor_arg_or_same(ctx, out_obj, "out", input_obj, input);
  const RowView o = row_view(ctx, out);
  check_same_dtype_device(ctx, x, o);
  check_same_shape(ctx, input, out);
  check_writable_rows(ctx, o);
  check_alias(ctx, o, x, true);

  cuda::ScaleParams p;
  p.out = o.data;
  p.input = x.data;
  p.rows = x.rows;
  p.cols = x.cols;
  p.out_stride = o.row_stride;
  p.input_stride = x.row_stride;
  p.factor = static_cast<float>(factor);
  p.dtype = x.dtype;
  if (!launch || x.numel() == 0) return;  // launch=false: validate only
  if (!x.is_cuda()) {
    cpu::run_cpu(p.dtype, x.numel(), [&](auto tag) { scale_cpu<decltype(tag)>(p); });
  } else {
#ifdef OPFORGE_WITH_CUDA
    check_launch(ctx, cuda::launch_scale(p, x.device_id, launch_stream(stream, x.device_id)), x.device_id);
#endif
  }
  mark_written({out_obj});
}

const char* act_op_name(Activation act) {
  switch (act) {
    case Activation::kGelu: return "gelu_and_mul";
    case Activation::kGeluTanh: return "gelu_tanh_and_mul";
    default: return "silu_and_mul";
  }
}

void act_and_mul(nb::handle out_obj, nb::handle input_obj, int act_code, std::optional<uintptr_t> stream, bool launch, bool pdl) {
  if (act_code < 0 || act_code > 2) throw_value_error("opforge: unknown activation code " + std::to_string(act_code));
  const auto act = static_cast<Activation>(act_code);
  const OpContext ctx{act_op_name(act)};
  const TensorArg input = tensor_arg(ctx, input_obj, "input");
  check_has_rows(ctx, input);
  const RowView x = row_view(ctx, input);
  check_device_supported(ctx, x);
  if (x.cols % 2 != 0) {
    throw_value_error(std::string("opforge.") + ctx.op + ": input has shape " + shape_string(input) +
                      "; its last dimension holds [x, gate] and must be even");
  }
  const TensorArg out = tensor_arg(ctx, out_obj, "out");
  const RowView o = row_view(ctx, out);
  check_same_dtype_device(ctx, x, o);
  bool shape_ok = out.ndim() == input.ndim() && o.cols == x.cols / 2;
  for (size_t i = 0; shape_ok && i + 1 < input.ndim(); ++i) shape_ok = out.shape(i) == input.shape(i);
  if (!shape_ok) {
    std::string want = "(";
    for (size_t i = 0; i + 1 < input.ndim(); ++i) want += std::to_string(input.shape(i)) + ", ";
    want += std::to_string(x.cols / 2) + (input.ndim() == 1 ? ",)" : ")");
    throw_value_error(std::string("opforge.") + ctx.op + ": out has shape " + shape_string(out) + "; expected " +
                      want + " for input " + shape_string(input));
  }
  check_writable_rows(ctx, o);
  // out is half as wide as a row of input, so it can never be the same view: no overlap at all.
  check_alias(ctx, o, x, false);

  cuda::ActMulParams p;
  p.out = o.data;
  p.input = x.data;
  p.rows = x.rows;
  p.d = x.cols / 2;
  p.out_stride = o.row_stride;
  p.input_stride = x.row_stride;
  p.act = act;
  p.dtype = x.dtype;
  check_pdl(ctx, x, pdl);
  p.pdl = pdl;
  if (!launch || o.numel() == 0) return;  // launch=false: validate only
  if (!x.is_cuda()) {
    cpu::run_cpu(p.dtype, o.numel(), [&](auto tag) { act_and_mul_cpu<decltype(tag)>(p); });
  } else {
#ifdef OPFORGE_WITH_CUDA
    check_launch(ctx, cuda::launch_act_and_mul(p, x.device_id, launch_stream(stream, x.device_id)), x.device_id);
#endif
  }
  mark_written({out_obj});
}

}  // namespace

void bind_elementwise(nb::module_& m) {
  m.def("scale", &scale, nb::arg("out"), nb::arg("input"), nb::arg("factor"),
        nb::arg("stream").none(), nb::arg("launch"), "out = input * factor (fp32 math); see opforge.ops.scale.");
  m.def("act_and_mul", &act_and_mul, nb::arg("out"), nb::arg("input"), nb::arg("act"),
        nb::arg("stream").none(), nb::arg("launch"), nb::arg("pdl") = false,
        "out = act(input[..., :d]) * input[..., d:]; act 0 silu, 1 gelu, 2 gelu_tanh; pdl: programmatic dependent launch.");
}

}  // namespace opforge
