// Device building blocks shared by every kernel: element conversion, aligned vector access,
// and the one sum reduction used by all row reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace opforge::cuda {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round-to-nearest-even, as torch does when it narrows fp32 results.
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// N elements moved as one access of N*sizeof(T) bytes (16 bytes at the widest). The access goes
// through an integer type of the full width so the compiler always emits one vector instruction.
template <int Bytes>
struct BitsOf;
template <>
struct BitsOf<16> { using type = uint4; };
template <>
struct BitsOf<8> { using type = uint2; };
template <>
struct BitsOf<4> { using type = unsigned int; };
template <>
struct BitsOf<2> { using type = unsigned short; };

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  using Bits = typename BitsOf<sizeof(T) * N>::type;
  T v[N];
};

// Plain (coherent, default cache policy) access for row data: correct when an output is also an
// input (in place), and what a row was just written with stays in L2 for the op that reads it
// next (decode batches live in L2 from op to op).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  const auto bits = *reinterpret_cast<const typename Vec<T, N>::Bits*>(p);
  Vec<T, N> r;
  memcpy(&r, &bits, sizeof(r));
  return r;
}

// Read-only-cache access for data that is reused across rows and never written (weights).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_reused(const T* p) {
  const auto bits = __ldg(reinterpret_cast<const typename Vec<T, N>::Bits*>(p));
  Vec<T, N> r;
  memcpy(&r, &bits, sizeof(r));
  return r;
}

// The same accesses, predicated: zeros where `ok` is false, with no memory access (kReused: the
// read-only-cache access). The choice is made on the raw bits, so it costs one predicated load and
// a zeroed register (element by element, a 16-bit type would be selected one half-word at a time).
template <typename T, int N, bool kReused = false>
__device__ __forceinline__ Vec<T, N> load_vec_or_zero(const T* p, bool ok) {
  using Bits = typename Vec<T, N>::Bits;
  Bits bits{};
  if (ok) bits = kReused ? __ldg(reinterpret_cast<const Bits*>(p)) : *reinterpret_cast<const Bits*>(p);
  Vec<T, N> r;
  memcpy(&r, &bits, sizeof(r));
  return r;
}

template <typename T, int N>
__device__ __forceinline__ void to_floats(const Vec<T, N>& raw, float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(raw.v[i]);
}

// bf16 is the top half of an fp32: a pair of bf16 in one 32-bit word widens with one shift (low
// element) and one mask (high element). Element by element, the compiler extracts the high half
// first (a byte permute, then the shift): three instructions per pair instead of two, which at
// decode sizes, where one block does the whole row, is issue time on the critical path.
template <int N>
__device__ __forceinline__ void to_floats(const Vec<__nv_bfloat16, N>& raw, float (&out)[N]) {
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      unsigned int pair;
      memcpy(&pair, &raw.v[i], sizeof(pair));
      out[i] = __uint_as_float(pair << 16);
      out[i + 1] = __uint_as_float(pair & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __bfloat162float(raw.v[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_float(T* p, const float (&in)[N]) {
  Vec<T, N> raw;
#pragma unroll
  for (int i = 0; i < N; ++i) raw.v[i] = from_float<T>(in[i]);
  typename Vec<T, N>::Bits bits;
  memcpy(&bits, &raw, sizeof(bits));
  *reinterpret_cast<typename Vec<T, N>::Bits*>(p) = bits;
}

// Sum over groups of `width` consecutive lanes (width a power of two <= 32).
__device__ __forceinline__ float warp_sum(float v, int width) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    if (offset < width) v += __shfl_xor_sync(0xffffffffu, v, offset, width);
  }
  return v;
}

// Sum over the threads that share one row: the blockDim.x threads of one threadIdx.y. Rows of up
// to 32 threads are lanes of one warp (blockDim.x a power of two); wider rows are whole warps
// (blockDim.x a multiple of 32) and combine their warp sums through shared memory. Every thread
// of the block must call this, since the wide-row path has a block-wide barrier. (Rows along y,
// not cut out of a flat block by division: an integer division by a run-time group costs about
// 20 instructions per thread, a tenth of a decode-size norm.)
template <bool kFixedSecondStage = false>
__device__ __forceinline__ float row_sum(float v, float* scratch /* >= 32 floats */) {
  const int group = blockDim.x;
  if (group <= 32) return warp_sum(v, group);
  v = warp_sum(v, 32);
  const int warps_per_row = group >> 5;
  if (kFixedSecondStage && blockDim.y == 1 && warps_per_row <= 8) {
    // One row of at most 8 warps per block (decode launches, and big batches with 256-thread
    // rows): three shuffles of fixed width, the shared-memory address known before the barrier.
    // The general path below works out its shuffle width at run time, a setup and two taken
    // branches between the barrier and the first shuffle. Callers opt in where it measured faster
    // (the norm kernel from 4 vectors per thread: on an H200 one row of 7168 and of 8192
    // 0.04-0.05 us faster; at 2 vectors per thread it was 0.01-0.03 us slower, for reasons the
    // SASS does not show).
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    const int w = threadIdx.x & 7;
    const float sum = scratch[w];  // read unconditionally (in bounds), then dropped past the last warp
    return warp_sum(w < warps_per_row ? sum : 0.f, 8);
  }
  const int first = threadIdx.y * warps_per_row;
  if ((threadIdx.x & 31) == 0) scratch[first + (threadIdx.x >> 5)] = v;
  __syncthreads();
  // Every lane reads one warp's sum and the warp adds them with shuffles: one shared-memory read
  // and log2(warps) shuffle steps, where a loop over the sums is a read and a dependent add per
  // warp plus its loop control. Lanes are read in spans of the next power of two, each span a
  // whole copy (zeros past the last warp), so every lane ends with the total.
  const int span = 1 << (32 - __clz(warps_per_row - 1));
  const int w = threadIdx.x & (span - 1);
  const float mine = w < warps_per_row ? scratch[first + w] : 0.f;
  return warp_sum(mine, span);  // scratch is still being read: a second reduction would need a barrier first
}

// Calls f(T{}) with T the device storage type of `dtype`: every launcher's dtype dispatch.
template <typename F>
int dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(__half{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
    default: return f(float{});
  }
}

// Launch status of the last kernel as the plain int the C++ side understands.
inline int last_launch_status() { return static_cast<int>(cudaGetLastError()); }

}  // namespace opforge::cuda
