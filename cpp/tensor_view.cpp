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
  const auto code = static_cast<C>(dt.code);
  std::string base;
  switch (code) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: base = "dtype" + std::to_string(int(dt.code)) + "_"; break;
  }
  std::string s = base + std::to_string(int(dt.bits));
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
  v.data = const_cast<void*>(a.data());
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

void check_alias(const OpContext& ctx, const RowView& out, const RowView& in, bool same_view_allowed) {
  if (out.numel() == 0 || in.numel() == 0) return;
  const auto o0 = reinterpret_cast<uintptr_t>(out.data), o1 = o0 + out.extent_bytes();
  const auto i0 = reinterpret_cast<uintptr_t>(in.data), i1 = i0 + in.extent_bytes();
  if (o1 <= i0 || i1 <= o0) return;  // disjoint
  const bool same_view = o0 == i0 && out.row_stride == in.row_stride && out.rows == in.rows && out.cols == in.cols;
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
