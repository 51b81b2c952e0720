// One parametric RMSNorm kernel for every norm variant: plain or fused with a residual add
// (compile-time ADD), with weight or Gemma's (1 + weight) (run-time weight_offset), in
// fp32/fp16/bf16 with 16-byte or scalar accesses. All math is fp32.
#include <cuda_runtime.h>

#include "device.h"
#include "launch_shape.h"
#include "norm.h"
#include "vec.cuh"

namespace opforge::cuda {
namespace {

template <int VPT, int VEC>
constexpr int kMaxThreads = VPT * VEC <= 16 ? 1024 : 512;

// Register path: each group of `group` threads owns one row and keeps it in registers
// (VPT vectors of VEC elements per thread), so every element is read once and written once.
template <typename T, int VEC, int VPT, bool ADD>
__global__ void __launch_bounds__(kMaxThreads<VPT, VEC>) norm_rows_kernel(const NormParams p, const int group) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x % group;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  const bool active = row < p.rows;

  const T* in = static_cast<const T*>(p.input) + row * p.input_stride;
  const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;

  float x[VPT][VEC];
  // Issue every load of the row before the first use, so VPT (x2 with the residual) 16-byte
  // loads per thread are in flight together.
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = (int64_t(i) * group + lane) * VEC;
    if (active && c < p.hidden) {
      load_float<T, VEC>(in + c, x[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[i][j] = 0.f;
    }
  }
  if constexpr (ADD) {
    T* res_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t c = (int64_t(i) * group + lane) * VEC;
      if (active && c < p.hidden) {
        float r[VEC];
        load_float<T, VEC>(res + c, r);
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[i][j] += r[j];
        store_float<T, VEC>(res_out + c, x[i]);
      }
    }
  }

  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += x[i][j] * x[i][j];
  ss = group_sum(ss, group, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(p.hidden) + p.eps);

  if (!active) return;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t c = (int64_t(i) * group + lane) * VEC;
    if (c < p.hidden) {
      float wv[VEC];
      load_float<T, VEC>(w + c, wv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[i][j] = x[i][j] * rstd * (wv[j] + p.weight_offset);
      store_float<T, VEC>(out + c, x[i]);
    }
  }
}

// Streaming path for rows too long for registers: one block per row, a first pass for the sum
// of squares and a second pass that re-reads the row (from L2) to write it. With a residual, the
// first pass writes nothing, so in-place use stays safe: the second pass reads input and residual
// before the same thread overwrites them.
template <typename T, int VEC, bool ADD>
__global__ void __launch_bounds__(1024) norm_rows_streaming_kernel(const NormParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* in = static_cast<const T*>(p.input) + row * p.input_stride;
  const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
  const int64_t step = int64_t(blockDim.x) * VEC;

  float ss = 0.f;
#pragma unroll 4
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < p.hidden; c += step) {
    float x[VEC];
    load_float<T, VEC>(in + c, x);
    if constexpr (ADD) {
      float r[VEC];
      load_float<T, VEC>(res + c, r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] += r[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += x[j] * x[j];
  }
  ss = group_sum(ss, blockDim.x, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(p.hidden) + p.eps);

  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  T* res_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
#pragma unroll 4
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < p.hidden; c += step) {
    float x[VEC], wv[VEC];
    load_float<T, VEC>(in + c, x);
    if constexpr (ADD) {
      float r[VEC];
      load_float<T, VEC>(res + c, r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] += r[j];
      store_float<T, VEC>(res_out + c, x);
    }
    load_float<T, VEC>(w + c, wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] = x[j] * rstd * (wv[j] + p.weight_offset);
    store_float<T, VEC>(out + c, x);
  }
}

template <typename T, int VEC, bool ADD>
int launch_shaped(const NormParams& p, int device, cudaStream_t stream) {
  const RowLaunch l = choose_norm_launch(p.rows, p.hidden / VEC, VEC, sm_count(device));
  switch (l.vecs_per_thread) {
    case 0: norm_rows_streaming_kernel<T, VEC, ADD><<<l.blocks, l.threads, 0, stream>>>(p); break;
    case 1: norm_rows_kernel<T, VEC, 1, ADD><<<l.blocks, l.threads, 0, stream>>>(p, l.group); break;
    case 2: norm_rows_kernel<T, VEC, 2, ADD><<<l.blocks, l.threads, 0, stream>>>(p, l.group); break;
    case 4: norm_rows_kernel<T, VEC, 4, ADD><<<l.blocks, l.threads, 0, stream>>>(p, l.group); break;
    default: norm_rows_kernel<T, VEC, 8, ADD><<<l.blocks, l.threads, 0, stream>>>(p, l.group); break;
  }
  return last_launch_status();
}

template <typename T>
int launch_typed(const NormParams& p, int device, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int es = sizeof(T);
  // 16-byte accesses need every pointer and row stride aligned and whole vectors per row;
  // otherwise the scalar kernel serves (odd hidden sizes, offset views).
  bool wide = p.hidden % kVec == 0 && vec_aligned(p.input, p.input_stride, kVec, es) &&
              vec_aligned(p.out, p.out_stride, kVec, es) && vec_aligned(p.weight, 0, kVec, es);
  const bool add = p.residual != nullptr;
  if (add) {
    wide = wide && vec_aligned(p.residual, p.residual_stride, kVec, es) &&
           vec_aligned(p.residual_out, p.residual_out_stride, kVec, es);
    return wide ? launch_shaped<T, kVec, true>(p, device, stream) : launch_shaped<T, 1, true>(p, device, stream);
  }
  return wide ? launch_shaped<T, kVec, false>(p, device, stream) : launch_shaped<T, 1, false>(p, device, stream);
}

}  // namespace

int launch_norm(const NormParams& p, int device, void* stream_ptr) {
  if (p.rows == 0) return 0;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case DType::kFloat16: return launch_typed<__half>(p, device, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, device, stream);
    default: return launch_typed<float>(p, device, stream);
  }
}

}  // namespace opforge::cuda
