// silu/gelu/gelu-tanh and mul, one functor per activation over the shared row-wise map.
#include <cuda_runtime.h>

#include "activation.h"
#include "elementwise.cuh"

namespace opforge::cuda {
namespace {

// The same formulas as torch's fp32 kernels (and opforge's CPU ops).
struct Silu {
  // x * (1 / (1 + e^-x)) with a correctly rounded reciprocal: within an ulp of torch's division
  // and much cheaper than an IEEE divide.
  __device__ __forceinline__ float operator()(float x) const { return x * __frcp_rn(1.f + expf(-x)); }
};
struct Gelu {
  __device__ __forceinline__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  __device__ __forceinline__ float operator()(float x) const {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + tanhf(inner));
  }
};

template <typename Act>
struct ActAndMul {
  static constexpr int kLoads = 2;  // x and its gate
  static constexpr bool kCostlyMath = true;  // see launch_rowwise_map
  int64_t d;
  template <typename T, int VEC>
  __device__ __forceinline__ void load(const T* row, int64_t c, Vec<T, VEC> (&raw)[kLoads]) const {
    raw[0] = load_vec<T, VEC>(row + c);
    raw[1] = load_vec<T, VEC>(row + d + c);
  }
  template <typename T, int VEC>
  __device__ __forceinline__ void compute(const Vec<T, VEC> (&raw)[kLoads], float (&y)[VEC]) const {
    float x[VEC], g[VEC];
    to_floats(raw[0], x);
    to_floats(raw[1], g);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = Act()(x[j]) * g[j];
  }
};

template <typename T, typename Act>
int launch_act(const ActMulParams& p, int device, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const RowwiseShape s{p.rows, p.d, p.out_stride, p.input_stride};
  T* out = static_cast<T*>(p.out);
  const T* in = static_cast<const T*>(p.input);
  const bool wide = p.d % kVec == 0 && vec_aligned(p.input, p.input_stride, kVec, sizeof(T)) &&
                    vec_aligned(p.out, p.out_stride, kVec, sizeof(T));
  const ActAndMul<Act> op{p.d};
  return wide ? launch_rowwise_map<T, kVec>(out, in, s, op, device, stream, p.pdl)
              : launch_rowwise_map<T, 1>(out, in, s, op, device, stream, p.pdl);
}

template <typename T>
int launch_typed(const ActMulParams& p, int device, cudaStream_t stream) {
  switch (p.act) {
    case Activation::kGelu: return launch_act<T, Gelu>(p, device, stream);
    case Activation::kGeluTanh: return launch_act<T, GeluTanh>(p, device, stream);
    default: return launch_act<T, Silu>(p, device, stream);
  }
}

}  // namespace

int launch_act_and_mul(const ActMulParams& p, int device, void* stream_ptr) {
  if (p.rows == 0 || p.d == 0) return 0;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_dtype(p.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, device, stream); });
}

}  // namespace opforge::cuda
