#include "tensor_view.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "opforge_build_config.h"
#ifdef OPFORGE_WITH_CUDA
#include "device.h"
#endif

namespace opforge {

void throw_value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }
void throw_type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }
void throw_runtime_error(const std::string& msg) { throw CudaError(msg); }

// --- torch tensors -> DLPack ------------------------------------------------------------------

namespace {

// DLPack's C exchange API (DLPack >= 1.2), published by torch as a capsule in
// torch.Tensor.__dlpack_c_exchange_api__: a non-owning export of a tensor object costs tens of
// nanoseconds, against hundreds for a DLPack capsule. Only the entry opforge calls is typed.
struct DLPackExchangeAPI {
  uint32_t major, minor;
  void* prev_api;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

// The payload of a DLPack capsule ("dltensor"): the export for torch releases without the above.
struct DLManagedTensor {
  nb::dlpack::dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// torch's side of the bridge, handed over by opforge._ext at import (bind_torch), and kept until
// the next bind_torch.
struct TorchBridge {
  PyObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* to_dlpack = nullptr;    // torch._C._to_dlpack
  int (*export_view)(void*, nb::dlpack::dltensor*) = nullptr;  // the exchange API's, when torch has it
  int (*current_work_stream)(int32_t, int32_t, void**) = nullptr;  // likewise
  PyObject* current_stream = nullptr;                           // Python fallback: device index -> handle
  PyObject* increment_version = nullptr;                        // takes a tuple of tensors
  PyObject* is_grad_enabled = nullptr;                          // torch.is_grad_enabled
  // torch.Tensor's own attributes, looked up once: calling them directly skips the attribute
  // lookup through the instance dict and the class hierarchy that obj.name() pays on every call
  // (a third of a method call's cost), and always reaches torch's implementation.
  PyObject* untyped_storage = nullptr;  // methods
  PyObject* storage_offset = nullptr;
  PyObject* is_neg = nullptr;
  PyObject* requires_grad = nullptr;  // a descriptor
  descrgetfunc requires_grad_get = nullptr;  // and its getter (PyType_GetSlot: the limited API's way)
};
TorchBridge torch_bridge;

PyObject* call_method(PyObject* method, PyObject* self) {
  PyObject* args[1] = {self};
  PyObject* result = PyObject_Vectorcall(method, args, 1, nullptr);
  if (!result) throw nb::python_error();
  return result;
}

// The value of torch.Tensor.requires_grad for `self`, through the descriptor's getter.
PyObject* requires_grad_of(PyObject* self) {
  PyObject* result = torch_bridge.requires_grad_get(torch_bridge.requires_grad, self,
                                                     reinterpret_cast<PyObject*>(Py_TYPE(self)));
  if (!result) throw nb::python_error();
  return result;
}

std::string first_line(const char* text) {
  std::string s(text ? text : "");
  return s.substr(0, s.find('\n'));
}

// The export failed (a Python error is pending): say why in opforge's words.
[[noreturn]] void refuse_export(const OpContext& ctx, nb::handle obj, const char* name) {
  std::string what = "the DLPack export failed";
  if (PyErr_Occurred()) {
    nb::python_error err;
    what = first_line(nb::str(err.value()).c_str());
  }
  nb::object device = nb::getattr(obj, "device", nb::none());
  const std::string kind = device.is_none() ? "" : nb::str(nb::getattr(device, "type", nb::str(""))).c_str();
  const std::string prefix = std::string("opforge.") + ctx.op + ": " + name;
  if (kind != "cpu" && kind != "cuda") {
    throw_value_error(prefix + " is on " + nb::str(device).c_str() + "; accepted: cpu or cuda tensors");
  }
  throw_value_error(prefix + " cannot be passed to the kernels (" + what + "); accepted: dense cpu or cuda tensors");
}

// Bytes from the start of the storage to one past the furthest element the view reaches, or -1
// when some element lies before the storage's start or the sum overflows.
int64_t bytes_reached(const TensorArg& a, int64_t storage_offset) {
  int64_t lo = storage_offset, hi = storage_offset;
  for (size_t i = 0; i < a.ndim(); ++i) {
    int64_t reach;
    if (__builtin_mul_overflow(a.shape(i) - 1, a.stride(i), &reach)) return -1;
    if (__builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) return -1;
  }
  const int64_t elem = int64_t(a.dtype().bits) * a.dtype().lanes / 8;
  int64_t bytes;
  if (lo < 0 || __builtin_mul_overflow(hi + 1, elem, &bytes)) return -1;
  return bytes;
}

void check_storage(const OpContext& ctx, nb::handle obj, const TensorArg& a) {
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0) return;  // no element is ever addressed
  }
  const nb::object storage = nb::steal(call_method(torch_bridge.untyped_storage, obj.ptr()));
  const Py_ssize_t nbytes = PyObject_Size(storage.ptr());  // len(UntypedStorage): its size in bytes
  if (nbytes < 0) throw nb::python_error();
  const nb::object offset = nb::steal(call_method(torch_bridge.storage_offset, obj.ptr()));
  const int64_t reached = bytes_reached(a, PyLong_AsLongLong(offset.ptr()));
  if (reached >= 0 && reached <= nbytes) return;
  throw_value_error(std::string("opforge.") + ctx.op + ": " + a.name + " (shape " + shape_string(a) +
                    ") reaches " + (reached < 0 ? std::string("outside") : "byte " + std::to_string(reached)) +
                    " of its storage, which holds " + std::to_string(nbytes) +
                    " bytes (freed or shrunk with untyped_storage().resize_()?); accepted: tensors whose "
                    "storage holds every element they view");
}

}  // namespace

TensorArg tensor_arg(const OpContext& ctx, nb::handle obj, const char* name) {
  if (!torch_bridge.tensor_type) throw_runtime_error("opforge._C: import opforge first, it binds torch");
  if (!PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(torch_bridge.tensor_type))) {
    throw_type_error(std::string("opforge.") + ctx.op + ": " + name + " must be a torch.Tensor, got " +
                     nb::str(obj.type().attr("__name__")).c_str());
  }
  // Autograd cannot see through the kernels: a tensor that needs grad while grad mode is on is
  // refused rather than given a result without a gradient. The tensor's flag first: grad mode
  // (a Python call) is asked only for the rare tensor that requires grad.
  PyObject* needs = requires_grad_of(obj.ptr());
  const bool requires_grad = needs == Py_True;
  Py_DECREF(needs);
  if (requires_grad) {
    PyObject* grad_mode = PyObject_Vectorcall(torch_bridge.is_grad_enabled, nullptr, 0, nullptr);
    if (!grad_mode) throw nb::python_error();
    const bool grad_on = grad_mode == Py_True;
    Py_DECREF(grad_mode);
    if (grad_on) {
      throw_value_error(std::string("opforge.") + ctx.op + ": " + name +
                        " requires grad, but opforge ops have no backward; call under torch.no_grad() / "
                        "torch.inference_mode() or pass " + name + ".detach()");
    }
  }
  TensorArg a;
  a.name = name;
  if (torch_bridge.export_view) {
    if (torch_bridge.export_view(obj.ptr(), &a.dl) != 0) refuse_export(ctx, obj, name);
  } else {
    PyObject* args[1] = {obj.ptr()};
    PyObject* capsule = PyObject_Vectorcall(torch_bridge.to_dlpack, args, 1, nullptr);
    if (!capsule) refuse_export(ctx, obj, name);
    // An unconsumed capsule calls the export's deleter when it dies, after the call.
    a.capsule = nb::steal(capsule);
    a.dl = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"))->dl_tensor;
  }
  // A negative-bit view stores its values negated and DLPack cannot say so. (The conjugate bit
  // exists only on complex tensors, which every op refuses by dtype.)
  if (nb::steal(call_method(torch_bridge.is_neg, obj.ptr())).is(Py_True)) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + name +
                      " is a negative-bit view (its memory holds the negated values, e.g. x.conj().imag); "
                      "accepted: plain tensors, e.g. " + name + ".resolve_neg()");
  }
  check_storage(ctx, obj, a);
  return a;
}

TensorArg tensor_arg_or_same(const OpContext& ctx, nb::handle obj, const char* name, nb::handle seen_obj,
                             const TensorArg& seen) {
  if (!obj.is(seen_obj)) return tensor_arg(ctx, obj, name);
  TensorArg again = seen;  // the same tensor object: its export and checks hold as they are
  again.name = name;
  return again;
}

void mark_written(std::initializer_list<nb::handle> outputs) {
  const nb::object written = nb::steal(PyTuple_New(Py_ssize_t(outputs.size())));
  Py_ssize_t i = 0;
  for (nb::handle h : outputs) PyTuple_SetItem(written.ptr(), i++, h.inc_ref().ptr());
  PyObject* args[1] = {written.ptr()};
  PyObject* result = PyObject_Vectorcall(torch_bridge.increment_version, args, 1, nullptr);
  if (!result) throw nb::python_error();
  Py_DECREF(result);
}

void* launch_stream(std::optional<uintptr_t> stream, int device) {
  if (stream) return reinterpret_cast<void*>(*stream);
  void* handle = nullptr;
  if (torch_bridge.current_work_stream) {
    if (torch_bridge.current_work_stream(2 /* kDLCUDA */, device, &handle) != 0) {
      throw_runtime_error("opforge: torch could not name its current CUDA stream on cuda:" + std::to_string(device));
    }
    return handle;
  }
  const nb::object index = nb::int_(device);
  PyObject* args[1] = {index.ptr()};
  const nb::object result = nb::steal(PyObject_Vectorcall(torch_bridge.current_stream, args, 1, nullptr));
  if (!result.is_valid()) throw nb::python_error();
  return reinterpret_cast<void*>(nb::cast<uintptr_t>(result));
}

void bind_tensors(nb::module_& m) {
  m.def(
      "bind_torch",
      [](nb::handle tensor_type, nb::handle to_dlpack, nb::handle exchange_api, nb::handle increment_version,
         nb::handle is_grad_enabled, nb::handle current_stream) {
        const DLPackExchangeAPI* api = nullptr;
        if (!exchange_api.is_none()) {
          api = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(exchange_api.ptr(), "dlpack_exchange_api"));
          if (!api) throw nb::python_error();
        }
        TorchBridge b;
        b.tensor_type = tensor_type.inc_ref().ptr();
        b.to_dlpack = to_dlpack.inc_ref().ptr();
        // Only DLPack major version 1 has this layout; anything else goes through Python.
        if (api && api->major == 1) {
          b.export_view = api->dltensor_from_py_object_no_sync;
          b.current_work_stream = api->current_work_stream;
        }
        b.current_stream = current_stream.inc_ref().ptr();
        b.increment_version = increment_version.inc_ref().ptr();
        b.is_grad_enabled = is_grad_enabled.inc_ref().ptr();
        b.requires_grad = nb::object(tensor_type.attr("requires_grad")).release().ptr();
        b.requires_grad_get =
            reinterpret_cast<descrgetfunc>(PyType_GetSlot(Py_TYPE(b.requires_grad), Py_tp_descr_get));
        if (!b.requires_grad_get) throw nb::type_error("opforge._C: torch.Tensor.requires_grad is not a descriptor");
        b.untyped_storage = nb::object(tensor_type.attr("untyped_storage")).release().ptr();
        b.storage_offset = nb::object(tensor_type.attr("storage_offset")).release().ptr();
        b.is_neg = nb::object(tensor_type.attr("is_neg")).release().ptr();
        // Rebinding (tests force the capsule export this way) releases the previous objects.
        for (PyObject* o : {torch_bridge.tensor_type, torch_bridge.to_dlpack, torch_bridge.current_stream,
                            torch_bridge.increment_version, torch_bridge.is_grad_enabled, torch_bridge.untyped_storage,
                            torch_bridge.storage_offset, torch_bridge.is_neg, torch_bridge.requires_grad}) {
          Py_XDECREF(o);
        }
        torch_bridge = b;
      },
      nb::arg("tensor_type"), nb::arg("to_dlpack"), nb::arg("exchange_api").none(), nb::arg("increment_version"),
      nb::arg("is_grad_enabled"), nb::arg("current_stream"),
      "Called once by opforge._ext: torch.Tensor, torch._C._to_dlpack, torch's DLPack exchange API capsule "
      "(None where torch has none), a function bumping the version counters of a tuple of tensors, "
      "torch.is_grad_enabled and a function from a CUDA device index to its current stream's handle "
      "(used where the exchange API is missing).");
}

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
    // torch exports float4_e2m1fn_x2 as 2 lanes of 4 bits: its name already says x2
    case C::Float4_E2M1FN: return dt.lanes == 2 ? "float4_e2m1fn_x2" : "float4_e2m1fn";
    default: s = "dlpack dtype code " + std::to_string(int(dt.code)) + " of " + std::to_string(int(dt.bits)) + " bits";
  }
  if (dt.lanes != 1) s += "x" + std::to_string(int(dt.lanes));
  return s;
}

std::string shape_string(const TensorArg& a) {
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

RowView row_view(const OpContext& ctx, const TensorArg& a) {
  const char* name = a.name;
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

void check_same_shape(const OpContext& ctx, const TensorArg& a, const TensorArg& b) {
  bool same = a.ndim() == b.ndim();
  for (size_t i = 0; same && i < a.ndim(); ++i) same = a.shape(i) == b.shape(i);
  if (!same) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + b.name + " has shape " + shape_string(b) +
                      " but " + a.name + " has shape " + shape_string(a) + "; they must be equal");
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

void check_pdl(const OpContext& ctx, const RowView& v, bool pdl) {
  if (!pdl) return;
  if (!v.is_cuda()) {
    throw_value_error(std::string("opforge.") + ctx.op + ": enable_pdl=True needs CUDA tensors (programmatic "
                      "dependent launch); " + v.name + " is on " + device_string(v.device_type, v.device_id));
  }
#ifdef OPFORGE_WITH_CUDA
  const int cc = cuda::compute_capability(v.device_id);
  if (cc < 90) {
    throw_value_error(std::string("opforge.") + ctx.op + ": enable_pdl=True needs a GPU of compute capability 9.0 "
                      "or newer (programmatic dependent launch); cuda:" + std::to_string(v.device_id) + " is " +
                      (cc < 0 ? std::string("unknown") : std::to_string(cc / 10) + "." + std::to_string(cc % 10)));
  }
#endif
}

void check_has_rows(const OpContext& ctx, const TensorArg& a) {
  if (a.ndim() == 0) {
    throw_value_error(std::string("opforge.") + ctx.op + ": " + a.name +
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

namespace opforge {

// --- arguments that are not rows -------------------------------------------------------------

std::string op_prefix(const OpContext& ctx) { return std::string("opforge.") + ctx.op + ": "; }

bool has_dtype(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits) {
  return dt.code == uint8_t(code) && dt.bits == bits && dt.lanes == 1;
}

std::string dims_string(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + ")";
}

int64_t SizedArg::numel() const {
  int64_t n = 1;
  for (size_t i = 0; i < t.ndim(); ++i) n *= t.shape(i);
  return n;
}

int64_t SizedArg::extent_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (size_t i = 0; i < t.ndim(); ++i) last += (t.shape(i) - 1) * t.stride(i);
  return (last + 1) * elem_bytes;
}

RowView SizedArg::device_view() const {
  RowView v;
  v.device_type = t.device_type();
  v.device_id = t.device_id();
  v.name = t.name;
  return v;
}

void check_rank(const OpContext& ctx, const SizedArg& a, size_t rank, const std::string& layout) {
  if (a.t.ndim() != rank) {
    throw_value_error(op_prefix(ctx) + a.name() + " has shape " + shape_string(a.t) + "; expected a " +
                      std::to_string(rank) + "-d tensor " + layout);
  }
  for (size_t i = 0; i < rank; ++i) {
    if (a.stride(i) < 0) {
      throw_value_error(op_prefix(ctx) + a.name() + " has a negative stride; accepted: non-negative strides");
    }
  }
}

void check_dims(const OpContext& ctx, const SizedArg& a, std::initializer_list<int64_t> want,
                const std::string& layout) {
  size_t i = 0;
  bool same = true;
  for (int64_t d : want) same = same && a.shape(i++) == d;
  if (!same) {
    throw_value_error(op_prefix(ctx) + a.name() + " has shape " + shape_string(a.t) + "; expected " + layout + " = " +
                      dims_string(want));
  }
}

void check_same_device(const OpContext& ctx, const SizedArg& ref, const SizedArg& a) {
  if (ref.t.device_type() == a.t.device_type() && ref.t.device_id() == a.t.device_id()) return;
  throw_value_error(op_prefix(ctx) + a.name() + " is on " + device_string(a.t.device_type(), a.t.device_id()) +
                    " but " + ref.name() + " is on " + device_string(ref.t.device_type(), ref.t.device_id()) +
                    "; all tensors must be on one device");
}

void check_separate(const OpContext& ctx, const SizedArg& out, const SizedArg& other) {
  const int64_t ob = out.extent_bytes(), ib = other.extent_bytes();
  if (ob == 0 || ib == 0) return;
  const auto o0 = reinterpret_cast<uintptr_t>(out.data()), i0 = reinterpret_cast<uintptr_t>(other.data());
  if (o0 + uintptr_t(ob) <= i0 || i0 + uintptr_t(ib) <= o0) return;
  throw_value_error(op_prefix(ctx) + out.name() + " overlaps " + other.name() + "; they must be separate memory");
}

bool overlaps_itself(const SizedArg& a) {
  // In order of increasing stride, each stride must pass the span of the smaller ones.
  std::vector<std::pair<int64_t, int64_t>> dims_by_stride;
  for (size_t i = 0; i < a.t.ndim(); ++i) {
    if (a.shape(i) > 1) dims_by_stride.emplace_back(a.stride(i), a.shape(i));
  }
  std::sort(dims_by_stride.begin(), dims_by_stride.end());
  int64_t span = 0;  // offset of the last element over the dimensions so far
  for (const auto& [stride, size] : dims_by_stride) {
    if (stride <= span) return true;
    span += stride * (size - 1);
  }
  return false;
}

}  // namespace opforge
