#include "tensor_view.h"

#include <sstream>

#include "opforge_build_config.h"
#ifdef OPFORGE_WITH_CUDA
#include "device.h"
#endif

namespace opforge {

void throw_value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }
void throw_type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }
void throw_runtime_error(const std::string& msg) { throw CudaError(msg); }

std::string dtype_name(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  std::string s;
  switch (static_cast<C>(dt.code)) {
    case C::Int: s = "int" + std::to_string(int(dt.bits)); break;
    case C::UInt: s = "uint" + std::to_string(int(dt.bits)); break;
    case C::Float: s = "float" + std::to_string(int(dt.bits)); break;
    case C::Bfloat: s = "bfloat" + std::to_string(int(dt.bits)); break;
    case C::Complex: s = "complex" + std::to_string(int(dt.bits)); break;
    case C::Bool: s = "bool"; break;
    // torch's names for the narrow float formats
    case C::Float8_E3M4: s = "float8_e3m4"; break;
    case C::Float8_E4M3: s = "float8_e4m3"; break;
    case C::Float8_E4M3B11FNUZ: s = "float8_e4m3b11fnuz"; break;
    case C::Float8_E4M3FN: s = "float8_e4m3fn"; break;
    case C::Float8_E4M3FNUZ: s = "float8_e4m3fnuz"; break;
    case C::Float8_E5M2: s = "float8_e5m2"; break;
    case C::Float8_E5M2FNUZ: s = "float8_e5m2fnuz"; break;
    case C::Float8_E8M0FNU: s = "float8_e8m0fnu"; break;
    case C::Float6_E2M3FN: s = "float6_e2m3fn"; break;
    case C::Float6_E3M2FN: s = "float6_e3m2fn"; break;
    case C::Float4_E2M1FN: s = "float4_e2m1fn_x2"; break;
    default: s = "dlpack dtype code " + std::to_string(int(dt.code)) + " of " + std::to_string(int(dt.bits)) + " bits";
  }
  if (dt.lanes != 1) s += "x" + std::to_string(int(dt.lanes));
  return s;
}

std::string shape_string(const Array& a) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << (a.ndim() == 1 ? ",)" : ")");
  return os.str();
}

std::string device_string(int device_type, int device_id) {
  switch (device_type) {
    case 1: return "cpu";
    case 2: return "cuda:" + std::to_string(device_id);
    default: return "device type " + std::to_string(device_type);
  }
}

static bool to_dtype(nb::dlpack::dtype dt, DType* out) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return false;
  if (dt.code == uint8_t(C::Float) && dt.bits == 32) return *out = DType::kFloat32, true;
  if (dt.code == uint8_t(C::Float) && dt.bits == 16) return *out = DType::kFloat16, true;
  if (dt.code == uint8_t(C::Bfloat) && dt.bits == 16) return *out = DType::kBFloat16, true;
  return false;
}

static const char* dtype_label(DType t) {
  switch (t) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    default: return "float32";
  }
}

RowView row_view(const OpContext& ctx, const Array& a, const char* name) {
  RowView v;
  v.name = name;
  if (!to_dtype(a.dtype(), &v.dtype)) {
    throw_type_error(std::string("opforge.") + ctx.op + ": " + name + " has dtype " + dtype_name(a.dtype()) +
                     "; accepted: float16, bfloat16, float32");
  }
  v.device_type = a.device_type();
  v.device_id = a.device_id();
  const size_t nd = a.ndim();
  if (nd == 0) {  // a scalar tensor: one row of one element
    v.rows = v.cols = v.row_stride = 1;
    v.data = const_cast<void*>(a.data());
    return v;
  }
  v.cols = a.shape(nd - 1);
  if (v.cols > 1 && a.stride(nd - 1) != 1) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + name + " has last-dimension stride " +
                      std::to_string(a.stride(nd - 1)) + "; the last dimension must be contiguous (stride 1)");
  }
  v.rows = 1;
  for (size_t i = 0; i + 1 < nd; ++i) v.rows *= a.shape(i);
  v.data = const_cast<void*>(a.data());
  if (v.rows == 0) {  // an empty batch: no row is ever addressed, whatever the strides say
    v.row_stride = v.cols;
    return v;
  }
  // Leading dimensions must collapse into one stride: stride[i] == stride[i+1] * shape[i+1]
  // (dimensions of size 1 place no constraint).
  int64_t stride = v.cols;
  bool have_stride = false;
  for (size_t k = nd - 1; k-- > 0;) {
    if (a.shape(k) == 1) continue;
    if (!have_stride) {
      stride = a.stride(k);
      have_stride = true;
    } else {
      // the dimension inside k (next one with size > 1) determines what stride k must have
      size_t inner = k + 1;
      while (a.shape(inner) == 1) ++inner;
      if (a.stride(k) != a.stride(inner) * int64_t(a.shape(inner))) {
        throw_value_error(std::string("opforge.") + ctx.op + ": the rows of " + name + " (shape " +
                          shape_string(a) + ") are not evenly spaced in memory, so they cannot be " +
                          "addressed with one row stride; pass " + name + ".contiguous() or a 2-D view");
      }
    }
  }
  v.row_stride = stride;
  if (v.row_stride < 0) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + name + " has a negative row stride");
  }
  return v;
}

void check_same_dtype_device(const OpContext& ctx, const RowView& a, const RowView& b) {
  if (a.dtype != b.dtype) {
    throw_type_error(std::string("opforge.") + ctx.op + ": " + b.name + " has dtype " + dtype_label(b.dtype) +
                     " but " + a.name + " has " + dtype_label(a.dtype) + "; all tensors must share " + a.name +
                     "'s dtype");
  }
  if (a.device_type != b.device_type || a.device_id != b.device_id) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + b.name + " is on " +
                      device_string(b.device_type, b.device_id) + " but " + a.name + " is on " +
                      device_string(a.device_type, a.device_id) + "; all tensors must be on one device");
  }
}

void check_same_shape(const OpContext& ctx, const Array& a, const char* a_name, const Array& b, const char* b_name) {
  bool same = a.ndim() == b.ndim();
  for (size_t i = 0; same && i < a.ndim(); ++i) same = a.shape(i) == b.shape(i);
  if (!same) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + b_name + " has shape " + shape_string(b) +
                      " but " + a_name + " has shape " + shape_string(a) + "; they must be equal");
  }
}

void check_writable_rows(const OpContext& ctx, const RowView& out) {
  if (out.rows > 1 && out.row_stride < out.cols) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + out.name + " has row stride " +
                      std::to_string(out.row_stride) + " < row length " + std::to_string(out.cols) +
                      ", so its rows overlap (an expanded or broadcast tensor cannot be written)");
  }
}

// Floor division for possibly negative numerators (denominator > 0).
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Whether two row views share an element. Views with one common row stride (two slices of one
// buffer, the usual case) are compared exactly: element offsets o + a*S + j and i + b*S + k meet
// when delta + m*S lies in [-(co - 1), ci - 1] for some row difference m = a - b. Other stride
// pairs fall back to comparing the byte ranges they span.
static bool views_overlap(const RowView& out, const RowView& in) {
  const auto o0 = reinterpret_cast<uintptr_t>(out.data), o1 = o0 + out.extent_bytes();
  const auto i0 = reinterpret_cast<uintptr_t>(in.data), i1 = i0 + in.extent_bytes();
  if (o1 <= i0 || i1 <= o0) return false;
  const int64_t es = dtype_size(out.dtype);
  const int64_t delta_bytes = int64_t(o0) - int64_t(i0);
  if (out.row_stride != in.row_stride || out.row_stride <= 0 || out.dtype != in.dtype || delta_bytes % es != 0) {
    return true;
  }
  const int64_t S = out.row_stride, delta = delta_bytes / es;
  const int64_t lo = -(out.cols - 1) - delta, hi = (in.cols - 1) - delta;  // need m*S in [lo, hi]
  int64_t m_min = -floor_div(-lo, S);                                      // ceil(lo / S)
  const int64_t m_max = floor_div(hi, S);
  const int64_t row_lo = -(in.rows - 1), row_hi = out.rows - 1;  // m = a - b
  if (m_min < row_lo) m_min = row_lo;
  return m_min <= m_max && m_min <= row_hi;
}

void check_alias(const OpContext& ctx, const RowView& out, const RowView& in, bool same_view_allowed) {
  if (out.numel() == 0 || in.numel() == 0) return;
  if (!views_overlap(out, in)) return;
  const bool same_view = out.data == in.data && out.row_stride == in.row_stride && out.rows == in.rows &&
                         out.cols == in.cols && out.dtype == in.dtype;
  if (same_view && same_view_allowed) return;
  throw_value_error(std::string("opforge.") + ctx.op + ": " + out.name + " overlaps " + in.name +
                    (same_view_allowed ? " without being the same view of it; an output may be exactly its "
                                         "input (in place) or separate memory"
                                       : "; they must be separate memory"));
}

void check_device_supported(const OpContext& ctx, const RowView& v) {
  if (v.device_type == 1) return;
  if (v.device_type == 2) {
#ifndef OPFORGE_WITH_CUDA
    throw_runtime_error(std::string("opforge.") + ctx.op + ": " + v.name +
                        " is a CUDA tensor but this opforge build has no CUDA kernels (built with "
                        "CUDA_ARCH_LIST=none or without nvcc); reinstall with nvcc on PATH and "
                        "CUDA_ARCH_LIST set, e.g. CUDA_ARCH_LIST=\"9.0a\" pip install opforge");
#endif
    return;
  }
  throw_value_error(std::string("opforge.") + ctx.op + ": " + v.name + " is on " +
                    device_string(v.device_type, v.device_id) + "; accepted: cpu or cuda tensors");
}

void check_has_rows(const OpContext& ctx, const Array& a, const char* name) {
  if (a.ndim() == 0) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + name +
                      " is a 0-d tensor; it needs at least one dimension (the hidden size)");
  }
}

void check_launch(const OpContext& ctx, int err, int device) {
  if (err == 0) return;
#ifdef OPFORGE_WITH_CUDA
  if (cuda::is_no_kernel_image(err)) {
    const int cc = cuda::compute_capability(device);
    throw_runtime_error(std::string("opforge.") + ctx.op + ": opforge was built for " + OPFORGE_CUDA_ARCHS +
                        "; this GPU (cuda:" + std::to_string(device) + ") is " + std::to_string(cc / 10) + "." +
                        std::to_string(cc % 10) + "; rebuild with CUDA_ARCH_LIST=\"" + std::to_string(cc / 10) +
                        "." + std::to_string(cc % 10) + "\"");
  }
  throw_runtime_error(std::string("opforge.") + ctx.op + ": CUDA error on cuda:" + std::to_string(device) + ": " +
                      cuda::error_string(err));
#else
  throw_runtime_error(std::string("opforge.") + ctx.op + ": CUDA error " + std::to_string(err));
#endif
}

}  // namespace opforge
