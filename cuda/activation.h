// Act-and-mul (gated MLP) launcher interface: input rows [x | gate] of 2*d, output rows of d,
//   out = round(act(x) * gate), computed in fp32.
#pragma once
#include <cstdint>

#include "dtype.h"

namespace opforge::cuda {

enum class Activation : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

struct ActMulParams {
  void* out = nullptr;
  const void* input = nullptr;
  int64_t rows = 0;
  int64_t d = 0;
  int64_t out_stride = 0;
  int64_t input_stride = 0;
  Activation act = Activation::kSilu;
  DType dtype = DType::kFloat32;
  bool pdl = false;  // programmatic dependent launch (compute capability 9.0+, checked by the caller)
};

int launch_act_and_mul(const ActMulParams& p, int device, void* stream);

// Whether a launch with `pdl` set on `device` is made with programmatic dependent launch: the
// code loaded for the GPU waits for the previous grid (launch.cuh); otherwise it is a plain launch.
bool act_and_mul_launches_with_pdl(int device);

}  // namespace opforge::cuda
