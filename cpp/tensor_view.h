// DLPack arrays from Python -> plain row views for the kernels, with every check that keeps a
// bad argument from reaching a kernel. Errors name the op, the argument, what was given and what
// is accepted, and map to ValueError / TypeError (nanobind translates the exception types).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "dtype.h"

namespace opforge {

namespace nb = nanobind;
using Array = nb::ndarray<nb::ro>;  // read-only view: also accepts arrays exported read-only

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

std::string dtype_name(nb::dlpack::dtype dt);
std::string shape_string(const Array& a);
std::string device_string(int device_type, int device_id);

// Checks dtype (fp16/bf16/fp32), a contiguous last dimension and that the leading dimensions
// collapse into one row stride; then returns the row view (a 0-d tensor is one 1-element row).
RowView row_view(const OpContext& ctx, const Array& a, const char* name);

// `b` must have `a`'s dtype and device (ctx names both arguments in the error).
void check_same_dtype_device(const OpContext& ctx, const RowView& a, const RowView& b);

// `b` must have exactly `a`'s shape.
void check_same_shape(const OpContext& ctx, const Array& a, const char* a_name, const Array& b, const char* b_name);

// An output must not have rows that overlap each other (it would be written twice).
void check_writable_rows(const OpContext& ctx, const RowView& out);

// `out` may be the very same view as `in` (in-place) or disjoint from it, never partly overlapping.
void check_alias(const OpContext& ctx, const RowView& out, const RowView& in, bool same_view_allowed);

// Refuses CUDA arrays in a build without CUDA, and unknown device kinds.
void check_device_supported(const OpContext& ctx, const RowView& v);

// Ops that work on rows of a hidden dimension refuse 0-d tensors.
void check_has_rows(const OpContext& ctx, const Array& a, const char* name);

// Turns a launcher's cudaError_t value into opforge.CudaError naming the op (and, for a missing
// kernel image, the archs this build has and how to rebuild).
void check_launch(const OpContext& ctx, int err, int device);

}  // namespace opforge
