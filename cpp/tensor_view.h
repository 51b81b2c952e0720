// torch tensors from Python -> DLPack descriptions -> plain row views for the kernels, with every
// check that keeps a bad argument from reaching a kernel. Errors name the op, the argument, what
// was given and what is accepted, and map to ValueError / TypeError (nanobind translates the
// exception types).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>  // nb::dlpack: DLPack's ABI structs
#include <nanobind/stl/optional.h>  // stream=None: the current stream

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "dtype.h"

namespace opforge {

namespace nb = nanobind;

// Raised as opforge.CudaError (a RuntimeError) for failures reported by the CUDA runtime.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_value_error(const std::string& msg);
[[noreturn]] void throw_type_error(const std::string& msg);
[[noreturn]] void throw_runtime_error(const std::string& msg);

// A tensor seen as `rows` rows of `cols` contiguous elements, rows `row_stride` elements apart.
struct RowView {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  DType dtype = DType::kFloat32;
  int device_type = 0;  // kDLCPU (1) or kDLCUDA (2)
  int device_id = 0;
  const char* name = "";

  int64_t numel() const { return rows * cols; }
  bool is_cuda() const { return device_type == 2; }
  // Bytes from the first to one past the last element (rows may be padded).
  int64_t extent_bytes() const { return rows == 0 ? 0 : ((rows - 1) * row_stride + cols) * dtype_size(dtype); }
};

struct OpContext {
  const char* op;  // public name, e.g. "rmsnorm"
};

// One tensor argument as DLPack describes it. The shape and strides point into the torch tensor,
// which the caller keeps alive for the whole call.
struct TensorArg {
  nb::dlpack::dltensor dl;
  const char* name = "";
  nb::object capsule;  // keeps the export alive when it went through a DLPack capsule

  size_t ndim() const { return size_t(dl.ndim); }
  int64_t shape(size_t i) const { return dl.shape[i]; }
  int64_t stride(size_t i) const {
    if (dl.strides) return dl.strides[i];
    int64_t s = 1;  // DLPack allows null strides: compact row-major
    for (size_t k = i + 1; k < ndim(); ++k) s *= dl.shape[k];
    return s;
  }
  nb::dlpack::dtype dtype() const { return dl.dtype; }
  int device_type() const { return dl.device.device_type; }
  int device_id() const { return dl.device.device_id; }
  void* data() const { return static_cast<char*>(dl.data) + dl.byte_offset; }
};

// `obj` as the kernels will see it, after the checks only torch can answer: it is a
// torch.Tensor, it does not require grad while grad mode is on, it is not a negative-bit view,
// and its storage holds every element the view reaches (a storage freed or shrunk with
// untyped_storage().resize_() does not).
TensorArg tensor_arg(const OpContext& ctx, nb::handle obj, const char* name);
// tensor_arg of an argument that may be the very object already read as `seen` (an in-place call
// passes input as out): that reading, renamed, instead of a second export and the same checks.
TensorArg tensor_arg_or_same(const OpContext& ctx, nb::handle obj, const char* name, nb::handle seen_obj,
                             const TensorArg& seen);

// Tells autograd that the kernels wrote these tensors in place (bumps their version counters),
// so a backward that saved one of them raises instead of using the new values, as it does after
// torch's own in-place ops.
void mark_written(std::initializer_list<nb::handle> outputs);

// The stream a launch on CUDA device `device` goes to: `stream` when given (0 is the legacy
// default stream), else torch's current stream on that device, asked of torch in C (its DLPack
// exchange API) rather than through a Python call.
void* launch_stream(std::optional<uintptr_t> stream, int device);

// opforge._ext hands over torch's side of the bridge once, at import (see tensor_view.cpp).
void bind_tensors(nb::module_& m);

std::string dtype_name(nb::dlpack::dtype dt);
std::string shape_string(const TensorArg& a);
std::string device_string(int device_type, int device_id);

// Checks dtype (fp16/bf16/fp32), a contiguous last dimension and that the leading dimensions
// collapse into one row stride; then returns the row view (a 0-d tensor is one 1-element row).
RowView row_view(const OpContext& ctx, const TensorArg& a);

// `b` must have `a`'s dtype and device (ctx names both arguments in the error).
void check_same_dtype_device(const OpContext& ctx, const RowView& a, const RowView& b);

// `b` must have exactly `a`'s shape.
void check_same_shape(const OpContext& ctx, const TensorArg& a, const TensorArg& b);

// An output must not have rows that overlap each other (it would be written twice).
void check_writable_rows(const OpContext& ctx, const RowView& out);

// `out` may be the very same view as `in` (in-place) or disjoint from it, never partly overlapping.
void check_alias(const OpContext& ctx, const RowView& out, const RowView& in, bool same_view_allowed);

// Refuses CUDA arrays in a build without CUDA, and unknown device kinds.
void check_device_supported(const OpContext& ctx, const RowView& v);

// enable_pdl=True needs CUDA tensors on a GPU of compute capability 9.0 or newer.
void check_pdl(const OpContext& ctx, const RowView& v, bool pdl);
// Ops that work on rows of a hidden dimension refuse 0-d tensors.
void check_has_rows(const OpContext& ctx, const TensorArg& a);

// --- arguments that are not rows (nvfp4_gemv's [M, K/2, L] operands, paged attention's caches) ---

// "opforge.<op>: ", the start of every message about the op's arguments.
std::string op_prefix(const OpContext& ctx);

bool has_dtype(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits);

// "(4, 1, 8)".
std::string dims_string(std::initializer_list<int64_t> dims);

// A tensor argument with the size of its elements: what the checks on byte ranges need.
struct SizedArg {
  TensorArg t;
  int elem_bytes = 1;

  const char* name() const { return t.name; }
  int64_t shape(size_t i) const { return t.shape(i); }
  int64_t stride(size_t i) const { return t.stride(i); }
  char* data() const { return static_cast<char*>(t.data()); }
  int64_t numel() const;
  // Bytes from the first to one past the last element (0 when empty).
  int64_t extent_bytes() const;
  // Its device as a RowView (for check_device_supported).
  RowView device_view() const;
};

// `a` must have `rank` dimensions (`layout` names them in the error, e.g. "[M, K/2, L]") and no
// negative stride.
void check_rank(const OpContext& ctx, const SizedArg& a, size_t rank, const std::string& layout);

// `a`'s shape must be `want` (`layout` names the dimensions in the error).
void check_dims(const OpContext& ctx, const SizedArg& a, std::initializer_list<int64_t> want,
                const std::string& layout);

// `a` must be on `ref`'s device.
void check_same_device(const OpContext& ctx, const SizedArg& ref, const SizedArg& a);

// An output must not share a byte with another argument: byte ranges are compared (exact for
// separate tensors, conservative for views interleaved within one buffer).
void check_separate(const OpContext& ctx, const SizedArg& out, const SizedArg& other);

// Whether two distinct index tuples of `a` reach the same element (an output would be written
// twice there).
bool overlaps_itself(const SizedArg& a);

// Turns a launcher's cudaError_t value into opforge.CudaError naming the op (and, for a missing
// kernel image, the archs this build has and how to rebuild).
void check_launch(const OpContext& ctx, int err, int device);

}  // namespace opforge
