// One row-wise element map shared by scale and the act-and-mul ops. A functor names the
// vectors it reads for output column c (`load`, kLoads of them) and turns them into VEC output
// elements (`compute`); the kernel handles strided rows, vector width, the grid, and keeps
// UNROLL steps of loads in flight before the first use.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "device.h"
#include "launch.cuh"
#include "vec.cuh"

namespace opforge::cuda {

struct RowwiseShape {
  int64_t rows = 0;
  int64_t cols = 0;  // output columns
  int64_t out_stride = 0;
  int64_t in_stride = 0;
};

constexpr int kMapThreads = 256;

// x (block and grid) strides over the columns of a row, y over rows; short rows put several
// rows in one block (blockDim.y > 1) so no block is mostly idle.
template <typename T, int VEC, int UNROLL, typename Op>
__global__ void __launch_bounds__(kMapThreads) rowwise_map_kernel(T* out, const T* in, const RowwiseShape s, const Op op) {
  wait_for_previous_grid();
  const int64_t col_step = int64_t(gridDim.x) * blockDim.x * VEC * UNROLL;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < s.rows; r += int64_t(gridDim.y) * blockDim.y) {
    const T* in_row = in + r * s.in_stride;
    T* out_row = out + r * s.out_stride;
    for (int64_t base = (int64_t(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x) * VEC; base < s.cols;
         base += col_step) {
      Vec<T, VEC> raw[UNROLL][Op::kLoads];
      bool ok[UNROLL];
      // Every load of this step first, at clamped addresses rather than behind branches, so the
      // memory round trips overlap; then compute and store. Each element is read and written by
      // this thread only, so in-place use stays correct.
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t c = base + int64_t(u) * blockDim.x * VEC;
        ok[u] = c < s.cols;
        op.template load<T, VEC>(in_row, ok[u] ? c : 0, raw[u]);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (!ok[u]) continue;
        float y[VEC];
        op.template compute<T, VEC>(raw[u], y);
        store_float<T, VEC>(out_row + base + int64_t(u) * blockDim.x * VEC, y);
      }
    }
  }
}

// Launch shape: big problems give each thread 4 vectors per step (4 x 16-byte loads in flight
// per input); small ones (decode batches) 1, spread over more blocks, so the few vectors there
// reach many SMs at once instead of queueing behind each other in a couple of blocks.
// x covers the columns of a row once (the kernel strides when a grid dimension is capped),
// y the rows.
template <typename T, int VEC, int UNROLL, typename Op>
int launch_unrolled(T* out, const T* in, const RowwiseShape& s, const Op& op, cudaStream_t stream, bool pdl) {
  const int64_t nv = (s.cols + VEC - 1) / VEC;
  // Blocks per row first, then threads per block just wide enough for an even split (a row of
  // 1376 vectors is two blocks of 192 threads, not 256 + a mostly idle 256).
  const int64_t gx = std::min<int64_t>((nv + kMapThreads * UNROLL - 1) / (kMapThreads * UNROLL), INT32_MAX);
  const int64_t per_block = (nv + gx - 1) / gx;
  const int64_t tx = std::min<int64_t>(kMapThreads, (per_block + UNROLL * 32 - 1) / (UNROLL * 32) * 32);
  const int64_t ty = kMapThreads / tx;
  const int64_t gy = std::min<int64_t>((s.rows + ty - 1) / ty, 65535);
  const cudaError_t err = launch_kernel(rowwise_map_kernel<T, VEC, UNROLL, Op>, dim3(unsigned(gx), unsigned(gy)),
                                        dim3(unsigned(tx), unsigned(ty)), 0, stream, pdl, out, in, s, op);
  return err != cudaSuccess ? static_cast<int>(err) : last_launch_status();
}

template <typename T, int VEC, typename Op>
int launch_rowwise_map(T* out, const T* in, const RowwiseShape& s, const Op& op, int device, cudaStream_t stream,
                       bool pdl = false) {
  if (s.rows == 0 || s.cols == 0) return 0;
  const int64_t vectors = s.rows * ((s.cols + VEC - 1) / VEC);
  // 4 vectors per thread only once that still gives every resident thread (2048 per SM) work.
  if (vectors < int64_t(sm_count(device)) * 2048 * 4) return launch_unrolled<T, VEC, 1>(out, in, s, op, stream, pdl);
  return launch_unrolled<T, VEC, 4>(out, in, s, op, stream, pdl);
}

}  // namespace opforge::cuda
