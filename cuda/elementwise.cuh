// One row-wise element map shared by scale and the act-and-mul ops. A functor names the
// vectors it reads for output column c (`load`, kLoads of them) and turns them into VEC output
// elements (`compute`), and how costly that math is (`kCostlyMath`, `kMathBound`: both shape the
// launch, see launch_rowwise_map); the kernel handles strided rows, vector width, the grid, and
// keeps UNROLL steps of loads in flight before the first use.
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
// rows in one block (blockDim.y > 1) so no block is mostly idle. kOnce: the grid covers the
// problem (each thread makes one step, no loops) and every offset fits in 31 bits, so the
// indices are 32-bit; at decode sizes that one step is the whole kernel, and the instructions
// before its loads are its latency (a bf16 scale: 28 instructions before the load instead of 39,
// and no loop after the store; on an H200 1 x 4096 took 1.15 us per call instead of 1.24, and
// silu_and_mul 1 x 14336 1.24 instead of 1.36).
template <typename T, int VEC, int UNROLL, bool kOnce, typename Op>
__global__ void __launch_bounds__(kMapThreads) rowwise_map_kernel(T* out, const T* in, const RowwiseShape s, const Op op) {
  wait_for_previous_grid();
  // One step: UNROLL vectors of row r from column `base`. Every load first, at clamped addresses
  // rather than behind branches, so the memory round trips overlap; then compute and store. Each
  // element is read and written by this thread only, so in-place use stays correct.
  auto step = [&](auto r, auto base) {
    using I = decltype(base);
    const T* in_row = in + r * static_cast<I>(s.in_stride);
    T* out_row = out + r * static_cast<I>(s.out_stride);
    const I cols = static_cast<I>(s.cols);
    Vec<T, VEC> raw[UNROLL][Op::kLoads];
    bool ok[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I c = base + static_cast<I>(u * blockDim.x * VEC);
      ok[u] = c < cols;
      op.template load<T, VEC>(in_row, ok[u] ? c : 0, raw[u]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (!ok[u]) continue;
      float y[VEC];
      op.template compute<T, VEC>(raw[u], y);
      store_float<T, VEC>(out_row + base + static_cast<I>(u * blockDim.x * VEC), y);
    }
  };
  if constexpr (kOnce) {
    const int r = blockIdx.y * blockDim.y + threadIdx.y;
    const int c = (blockIdx.x * blockDim.x * UNROLL + threadIdx.x) * VEC;
    if (r < static_cast<int>(s.rows) && c < static_cast<int>(s.cols)) step(r, c);
    return;
  }
  // The thread's first step runs ahead of the strided loops (which only a grid capped in some
  // dimension needs): written as their first iteration, its loads waited behind the loops' setup.
  const int64_t first_row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t first_col = (int64_t(blockIdx.x) * blockDim.x * UNROLL + threadIdx.x) * VEC;
  if (first_row >= s.rows || first_col >= s.cols) return;
  step(first_row, first_col);
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  const int64_t col_step = int64_t(gridDim.x) * blockDim.x * VEC * UNROLL;
  for (int64_t r = first_row; r < s.rows; r += row_step) {
    for (int64_t base = r == first_row ? first_col + col_step : first_col; base < s.cols; base += col_step) step(r, base);
  }
}

// Launch shape: each thread takes UNROLL vectors per step (4 x 16-byte loads in flight per input
// for big problems of math-bound ops, else 1), in blocks of up to 256 threads. `spread` (decode
// batches of an op with costly math, below) makes blocks as narrow as four warps, with as few
// rows per block as spread the work over about one block per SM: a block of four warps covers
// the math's latency better than one or two on more SMs (1 x 14336 silu_and_mul on an H200: 56
// blocks of 128 threads 1.22 us per call, 112 of 64 1.26; 4 x 2048 1.20 against 1.28). x covers
// the columns of a row once (the kernel strides when a grid dimension is capped), y the rows.
template <typename T, int VEC, int UNROLL, typename Op>
int launch_unrolled(T* out, const T* in, const RowwiseShape& s, const Op& op, int sms, bool spread,
                    cudaStream_t stream, bool pdl) {
  const int64_t nv = (s.cols + VEC - 1) / VEC;
  int64_t width = int64_t(kMapThreads) * UNROLL;  // most vectors of a row per block
  if (spread) {
    const int64_t per_sm = (s.rows * nv + sms - 1) / sms;
    width = std::clamp<int64_t>((per_sm + 31) / 32 * 32, 128, kMapThreads);
  }
  // Blocks per row first, then threads per block just wide enough for an even split (a row of
  // 1376 vectors is two blocks of 192 threads, not 256 + a mostly idle 256).
  const int64_t gx = std::min<int64_t>((nv + width - 1) / width, INT32_MAX);
  const int64_t per_block = (nv + gx - 1) / gx;
  const int64_t tx = std::min<int64_t>(kMapThreads, (per_block + UNROLL * 32 - 1) / (UNROLL * 32) * 32);
  int64_t ty = kMapThreads / tx;
  if (spread) ty = std::clamp<int64_t>((s.rows * gx + sms - 1) / sms, 1, ty);  // about one block per SM
  const int64_t gy = std::min<int64_t>((s.rows + ty - 1) / ty, 65535);
  // One step per thread where the grid covers the problem and every offset (the last row's
  // start plus a row, rounded up to whole steps) stays below 2^31.
  const int64_t reach = (s.rows - 1) * std::max(s.in_stride, s.out_stride) + gx * tx * VEC * UNROLL;
  const bool once = gy * ty >= s.rows && gx * tx * VEC * UNROLL >= s.cols && reach < INT32_MAX;
  const dim3 grid{unsigned(gx), unsigned(gy)}, block{unsigned(tx), unsigned(ty)};
  void (*kernel)(T*, const T*, const RowwiseShape, const Op) =
      once ? rowwise_map_kernel<T, VEC, UNROLL, true, Op> : rowwise_map_kernel<T, VEC, UNROLL, false, Op>;
  const cudaError_t err = launch_kernel(kernel, grid, block, 0, stream, pdl, out, in, s, op);
  return err != cudaSuccess ? static_cast<int>(err) : last_launch_status();
}

// Decode batches (fewer 16-byte vectors than 256 per SM) of an op with costly math per
// element (Op::kCostlyMath: an exp and a reciprocal for silu) read 4 bytes per thread instead,
// spread over the SMs: the math then runs as short chains on many SMs rather than as 8-element
// chains on a few, which is what bounds a launch this small. 1 x 14336 silu_and_mul on an H200:
// 1792 threads of 8 elements on 7 SMs (286 instructions per warp) took 1.65 us per call in a CUDA
// graph, 7168 threads of 2 on 112 SMs 1.28 us (torch.compile 1.20), on 56 SMs in blocks of four
// warps (launch_unrolled) 1.22 (torch.compile 1.24 in that run). Up to 256 vectors per SM, not
// 64: 8 x 14336 gelu_and_mul 1.69 -> 1.41 us, silu_and_mul 1.37 -> 1.32, 16 x 14336 gelu 1.80 ->
// 1.58 (32 rows, past the bound, unchanged at 1.69). A plain scale does not gain.
template <typename T, int VEC, typename Op>
int launch_rowwise_map(T* out, const T* in, const RowwiseShape& s, const Op& op, int device, cudaStream_t stream,
                       bool pdl = false) {
  if (s.rows == 0 || s.cols == 0) return 0;
  const int sms = sm_count(device);
  const int64_t vectors = s.rows * ((s.cols + VEC - 1) / VEC);
  constexpr int kNarrow = VEC * int(sizeof(T)) >= 16 && sizeof(T) <= 4 ? 4 / int(sizeof(T)) : VEC;
  if constexpr (Op::kCostlyMath && kNarrow < VEC) {
    if (vectors < int64_t(sms) * 256) return launch_unrolled<T, kNarrow, 1>(out, in, s, op, sms, true, stream, pdl);
  }
  // 4 vectors per thread for math that needs the overlap (Op::kMathBound), once that still gives
  // every resident thread (2048 per SM) work. On an H200 at 16384 x 14336, gelu_and_mul (erf) took
  // 340.6 us that way against 362.6 with one vector per thread; everything else was as fast or
  // faster with one: scale 32768 x 4096 128.9 against 133.1, 32768 x 8192 253.1 against 262.6,
  // silu_and_mul 16384 x 14336 325.1 against 327.5, gelu_tanh_and_mul 324.9 against 326.5.
  if constexpr (Op::kMathBound) {
    if (vectors >= int64_t(sms) * 2048 * 4) return launch_unrolled<T, VEC, 4>(out, in, s, op, sms, false, stream, pdl);
  }
  return launch_unrolled<T, VEC, 1>(out, in, s, op, sms, false, stream, pdl);
}

}  // namespace opforge::cuda
