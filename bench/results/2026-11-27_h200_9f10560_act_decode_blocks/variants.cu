// Decode-size kernel variants, standalone (ctypes), to find what costs time at 1 row.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "elementwise.cuh"
using namespace opforge::cuda;
typedef __nv_bfloat16 bf16;

struct Scale {
  static constexpr int kLoads = 1;
  static constexpr bool kCostlyMath = false;
  float factor;
  template <typename T, int VEC>
  __device__ __forceinline__ void load(const T* row, int64_t c, Vec<T, VEC> (&raw)[kLoads]) const { raw[0] = load_vec<T, VEC>(row + c); }
  template <typename T, int VEC>
  __device__ __forceinline__ void compute(const Vec<T, VEC> (&raw)[kLoads], float (&y)[VEC]) const {
    to_floats(raw[0], y);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] *= factor;
  }
};
__device__ __forceinline__ float rcp_approx(float x) { float r; asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float exp_approx_ftz(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f)); return r; }
__device__ __forceinline__ float silu(float x) { return x * rcp_approx(1.f + exp_approx_ftz(-x)); }
struct SiluMul {
  static constexpr int kLoads = 2;
  static constexpr bool kCostlyMath = true;
  int64_t d;
  template <typename T, int VEC>
  __device__ __forceinline__ void load(const T* row, int64_t c, Vec<T, VEC> (&raw)[kLoads]) const {
    raw[0] = load_vec<T, VEC>(row + c); raw[1] = load_vec<T, VEC>(row + d + c);
  }
  template <typename T, int VEC>
  __device__ __forceinline__ void compute(const Vec<T, VEC> (&raw)[kLoads], float (&y)[VEC]) const {
    float x[VEC], g[VEC]; to_floats(raw[0], x); to_floats(raw[1], g);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = silu(x[j]) * g[j];
  }
};

// Flat kernels: one row, contiguous, 32-bit (or 64-bit) indices, VEC elements per thread.
template <int VEC, bool WAIT, typename I>
__global__ void flat_scale(bf16* out, const bf16* in, int n, float f) {
  if (WAIT) wait_for_previous_grid();
  const I i = (I(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  Vec<bf16, VEC> v = load_vec<bf16, VEC>(in + i);
  float y[VEC]; to_floats(v, y);
#pragma unroll
  for (int j = 0; j < VEC; ++j) y[j] *= f;
  store_float<bf16, VEC>(out + i, y);
}
template <int VEC, bool WAIT>
__global__ void flat_silu(bf16* out, const bf16* in, int d, int rows) {
  if (WAIT) wait_for_previous_grid();
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= d * rows) return;
  const int r = i / d, c = i - r * d;
  Vec<bf16, VEC> a = load_vec<bf16, VEC>(in + r * 2 * d + c), g = load_vec<bf16, VEC>(in + r * 2 * d + d + c);
  float x[VEC], y[VEC], gg[VEC]; to_floats(a, x); to_floats(g, gg);
#pragma unroll
  for (int j = 0; j < VEC; ++j) y[j] = silu(x[j]) * gg[j];
  store_float<bf16, VEC>(out + i, y);
}

extern "C" int launch(int variant, void* out, const void* in, int n, float f, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  bf16* o = static_cast<bf16*>(out); const bf16* x = static_cast<const bf16*>(in);
  const RowwiseShape one{1, n, n, n};
  const RowwiseShape two{1, n, n, 2 * n};
  switch (variant) {
    // scale, n = cols (the once kernel)
    case 0: rowwise_map_kernel<bf16, 8, 1, true, Scale><<<dim3((n / 8 + 255) / 256), dim3(256), 0, s>>>(o, x, one, Scale{f}); break;
    case 1: rowwise_map_kernel<bf16, 8, 1, true, Scale><<<dim3((n / 8 + 127) / 128), dim3(128), 0, s>>>(o, x, one, Scale{f}); break;
    case 2: rowwise_map_kernel<bf16, 4, 1, true, Scale><<<dim3((n / 4 + 127) / 128), dim3(128), 0, s>>>(o, x, one, Scale{f}); break;
    case 3: rowwise_map_kernel<bf16, 2, 1, true, Scale><<<dim3((n / 2 + 127) / 128), dim3(128), 0, s>>>(o, x, one, Scale{f}); break;
    case 4: rowwise_map_kernel<bf16, 1, 1, true, Scale><<<dim3((n + 127) / 128), dim3(128), 0, s>>>(o, x, one, Scale{f}); break;
    case 5: rowwise_map_kernel<bf16, 8, 1, true, Scale><<<dim3((n / 8 + 63) / 64), dim3(64), 0, s>>>(o, x, one, Scale{f}); break;
    // silu_and_mul, n = d
    case 10: rowwise_map_kernel<bf16, 2, 1, true, SiluMul><<<dim3((n / 2 + 63) / 64), dim3(64), 0, s>>>(o, x, two, SiluMul{n}); break;
    case 11: rowwise_map_kernel<bf16, 1, 1, true, SiluMul><<<dim3((n + 127) / 128), dim3(128), 0, s>>>(o, x, two, SiluMul{n}); break;
    case 12: rowwise_map_kernel<bf16, 2, 1, true, SiluMul><<<dim3((n / 2 + 127) / 128), dim3(128), 0, s>>>(o, x, two, SiluMul{n}); break;
    case 13: rowwise_map_kernel<bf16, 1, 1, true, SiluMul><<<dim3((n + 63) / 64), dim3(64), 0, s>>>(o, x, two, SiluMul{n}); break;
    case 14: rowwise_map_kernel<bf16, 2, 1, true, SiluMul><<<dim3((n / 2 + 31) / 32), dim3(32), 0, s>>>(o, x, two, SiluMul{n}); break;
    case 15: rowwise_map_kernel<bf16, 4, 1, true, SiluMul><<<dim3((n / 4 + 63) / 64), dim3(64), 0, s>>>(o, x, two, SiluMul{n}); break;
    default: return -1;
  }
  return (int)cudaGetLastError();
}
