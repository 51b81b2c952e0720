// RMSNorm family launcher interface (plain C++; the kernels live in norm.cu).
#pragma once
#include <cstdint>

#include "dtype.h"

namespace opforge::cuda {

// One row-wise RMSNorm, optionally fused with a residual add:
//   s = input (+ residual);  residual_out = round(s);  out = round(s * rstd(s) * (weight + weight_offset))
// where rstd uses the unrounded fp32 s. weight_offset is 0 (RMSNorm) or 1 (Gemma).
// Strides are in elements between rows; the last dimension is contiguous.
// In-place use (out == input, residual_out == residual) is safe: every element is read before
// the thread that owns it writes it, and no thread reads an element another thread writes.
struct NormParams {
  void* out = nullptr;
  const void* input = nullptr;
  const void* residual = nullptr;  // null: plain RMSNorm
  void* residual_out = nullptr;    // required when residual is set
  const void* weight = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t out_stride = 0;
  int64_t input_stride = 0;
  int64_t residual_stride = 0;
  int64_t residual_out_stride = 0;
  float eps = 1e-6f;
  float weight_offset = 0.f;
  float inv_hidden = 0.f;  // 1 / hidden, filled in by launch_norm
  DType dtype = DType::kFloat32;
  int force_vpt = -1;  // launch-shape override for tuning (see choose_norm_launch); -1 = heuristic
  bool pdl = false;    // programmatic dependent launch (compute capability 9.0+, checked by the caller)
};

// Launches on `stream` (a cudaStream_t) of `device`; returns a cudaError_t value (0 = success).
int launch_norm(const NormParams& p, int device, void* stream);

// Whether a launch with `pdl` set on `device` is made with programmatic dependent launch: the
// code loaded for the GPU waits for the previous grid (launch.cuh); otherwise it is a plain launch.
bool norm_launches_with_pdl(int device);

}  // namespace opforge::cuda
