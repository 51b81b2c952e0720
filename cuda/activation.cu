// silu/gelu/gelu-tanh and mul, one functor per activation over the shared row-wise map.
#include <cuda_runtime.h>

#include "activation.h"
#include "elementwise.cuh"

namespace opforge::cuda {
namespace {

// fp32 outputs: the same formulas as torch's fp32 kernels (and opforge's CPU ops). 16-bit outputs
// (`kLow`): silu and gelu-tanh as x * sigmoid(z) from the hardware's approximate exp2 and
// reciprocal, a few 1e-7 relative in fp32 before one rounding to a type whose half ulp is 2e-3
// (bf16) or 5e-4 (fp16), so still the exact value rounded once (tests/test_activation.py checks
// that) for a third of the instructions: at 256 rows of 14336 the accurate exp and reciprocal
// were about a third of the kernel's issue time with the data in L2.
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// e^x as 2^(x log2 e) by the hardware's approximate exp2, flushing results below 2^-126 to zero:
// where that happens the caller adds them to 1, which they cannot change, and the flush saves
// the range check and rescaling that __expf puts on the critical path. (The reciprocal keeps its
// non-flushing form: its results below 2^-126 still matter after the multiply by x.)
__device__ __forceinline__ float exp_approx_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
  return r;
}
// x * sigmoid(z) = x / (1 + e^-z); e^-z overflowing to inf gives x * 0, the limit.
__device__ __forceinline__ float times_sigmoid_approx(float x, float z) { return x * rcp_approx(1.f + exp_approx_ftz(-z)); }

struct Silu {
  static constexpr bool kMathBound = false;
  // fp32: x * (1 / (1 + e^-x)) with a correctly rounded reciprocal, within an ulp of torch's
  // division and much cheaper than an IEEE divide.
  template <bool kLow>
  __device__ __forceinline__ float apply(float x) const {
    if constexpr (kLow) return times_sigmoid_approx(x, x);
    return x * __frcp_rn(1.f + expf(-x));
  }
};
struct Gelu {
  // erf has no cheap exact form: both paths keep it, and big problems need several vectors per
  // thread in flight to cover it (launch_rowwise_map).
  static constexpr bool kMathBound = true;
  template <bool kLow>
  __device__ __forceinline__ float apply(float x) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  static constexpr bool kMathBound = false;
  template <bool kLow>
  __device__ __forceinline__ float apply(float x) const {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    // 0.5 * (1 + tanh(u)) = sigmoid(2u): the 16-bit path needs no tanh and does not cancel
    // where tanh(u) is near -1.
    if constexpr (kLow) return times_sigmoid_approx(x, 2.f * inner);
    return 0.5f * x * (1.f + tanhf(inner));
  }
};

template <typename Act>
struct ActAndMul {
  static constexpr int kLoads = 2;  // x and its gate
  static constexpr bool kCostlyMath = true;  // see launch_rowwise_map
  static constexpr bool kMathBound = Act::kMathBound;  // erf: gelu only
  static constexpr bool kJoinsRows = false;  // the gate sits d after each row's x
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
    for (int j = 0; j < VEC; ++j) y[j] = Act().template apply<(sizeof(T) < 4)>(x[j]) * g[j];
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

// Whether this file's code loaded for `device` (the current device) waits for the previous grid
// (launch.cuh): its kernels are all compiled for the same archs, so one of them tells.
bool code_waits_for_previous_grid(int device) {
  return image_waits_for_previous_grid<rowwise_map_kernel<float, 1, 1, false, ActAndMul<Silu>>>(device);
}

}  // namespace

bool act_and_mul_launches_with_pdl(int device) {
  DeviceGuard guard(device);
  return code_waits_for_previous_grid(device);
}

int launch_act_and_mul(const ActMulParams& p, int device, void* stream_ptr) {
  if (p.rows == 0 || p.d == 0) return 0;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  ActMulParams q = p;
  q.pdl = p.pdl && code_waits_for_previous_grid(device);  // else a plain launch, serialised on the stream
  return dispatch_dtype(q.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(q, device, stream); });
}

}  // namespace opforge::cuda
