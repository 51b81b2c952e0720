// Scale launcher interface: out = round(x * factor), fp32 math, over rows with a row stride.
#pragma once
#include <cstdint>

#include "dtype.h"

namespace opforge::cuda {

struct ScaleParams {
  void* out = nullptr;
  const void* input = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t out_stride = 0;
  int64_t input_stride = 0;
  float factor = 1.f;
  DType dtype = DType::kFloat32;
};

int launch_scale(const ScaleParams& p, int device, void* stream);

}  // namespace opforge::cuda
