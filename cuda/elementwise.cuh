// One row-wise element map shared by scale and the act-and-mul ops. A functor names the
// vectors it reads for output column c (`load`, kLoads of them) and turns them into VEC output
// elements (`compute`), how costly that math is (`kCostlyMath`, `kMathBound`: both shape the
// launch, see launch_rowwise_map) and whether contiguous rows may be mapped as one long row
// (`kJoinsRows`); the kernels handle strided rows, vector width and the grid.
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
// indices are 32-bit: a bf16 scale makes 28 instructions before its load instead of 39, and no
// loop follows the store (on an H200 1 x 4096 took 1.15 us per call instead of 1.24, before
// decode sizes got decode_map_kernel below).
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

// Decode sizes (fewer 16-byte vectors than 256 per SM): one vector per thread in a grid that
// covers the problem, blocks of 256 threads over a row's columns (x) and one row per block row
// (y), a 64-bit column index. Where the input and output are each one contiguous run (one row, or
// rows laid end to end for an op whose functor allows it, Op::kJoinsRows) the grid is 1-D and the
// path to the first load is the block and thread ids, one wide multiply-add and base pointers in
// uniform registers: 21 instructions for a bf16 scale, where the 2-D row-wise kernel's one-step
// form takes 28 (its 32-bit indices, blockDim products and row-stride multiply). On an H200
// (CUDA-graph replay, medians over 10 buffer placements, torch.compile in the same run):
// silu_and_mul 1 x 11008 1.21 -> 1.15 us (1.20), 1 x 28672 1.28 -> 1.19 (1.24), 8 x 4096 1.30 ->
// 1.23 (1.25), gelu_tanh_and_mul 1 x 14336 1.24 -> 1.18 (1.29), scale 1 x 4096 1.13 -> 1.12 (1.09).
// 256 threads per block against 128, alternated twice in one run: 1 x 28672 silu 1.19 against
// 1.23-1.24, 32 x 4096 scale 1.23-1.24 against 1.27, 1 x 4096 scale 1.12-1.13 against 1.11;
// 16 x 14336 silu 1.37 against 1.73 (bench/results/2026-11-27_h200_5eddb83_decode_map/).
constexpr int kDecodeThreads = 256;

template <typename T, int VEC, bool kRows, typename Op>
__global__ void __launch_bounds__(kDecodeThreads) decode_map_kernel(T* out, const T* in, const RowwiseShape s,
                                                                    const Op op) {
  wait_for_previous_grid();
  const int64_t c = (int64_t(blockIdx.x) * kDecodeThreads + threadIdx.x) * VEC;
  if (c >= s.cols) return;
  if constexpr (kRows) {
    in += int64_t(blockIdx.y) * s.in_stride;
    out += int64_t(blockIdx.y) * s.out_stride;
  }
  Vec<T, VEC> raw[Op::kLoads];
  op.template load<T, VEC>(in, c, raw);
  float y[VEC];
  op.template compute<T, VEC>(raw, y);
  store_float<T, VEC>(out + c, y);
}

template <typename T, int VEC, typename Op>
int launch_decode(T* out, const T* in, const RowwiseShape& s, const Op& op, cudaStream_t stream, bool pdl) {
  const bool joined = s.rows == 1 || (Op::kJoinsRows && s.in_stride == s.cols && s.out_stride == s.cols);
  const RowwiseShape f = joined ? RowwiseShape{1, s.rows * s.cols, s.rows * s.cols, s.rows * s.cols} : s;
  const int64_t blocks = ((f.cols + VEC - 1) / VEC + kDecodeThreads - 1) / kDecodeThreads;
  const dim3 grid{unsigned(blocks), unsigned(f.rows)}, block{unsigned(kDecodeThreads)};
  const cudaError_t err = joined
      ? launch_kernel(decode_map_kernel<T, VEC, false, Op>, grid, block, 0, stream, pdl, out, in, f, op)
      : launch_kernel(decode_map_kernel<T, VEC, true, Op>, grid, block, 0, stream, pdl, out, in, f, op);
  return err != cudaSuccess ? static_cast<int>(err) : last_launch_status();
}

// Launch shape of the row-wise map past decode sizes: each thread takes UNROLL vectors per step
// (4 x 16-byte loads in flight per input for big problems of math-bound ops, else 1), in blocks
// of up to 256 threads; x covers the columns of a row once (the kernel strides when a grid
// dimension is capped), y the rows.
template <typename T, int VEC, int UNROLL, typename Op>
int launch_unrolled(T* out, const T* in, const RowwiseShape& s, const Op& op, cudaStream_t stream, bool pdl) {
  const int64_t nv = (s.cols + VEC - 1) / VEC;
  const int64_t width = int64_t(kMapThreads) * UNROLL;  // most vectors of a row per block
  // Blocks per row first, then threads per block just wide enough for an even split (a row of
  // 1376 vectors is two blocks of 192 threads, not 256 + a mostly idle 256).
  const int64_t gx = std::min<int64_t>((nv + width - 1) / width, INT32_MAX);
  const int64_t per_block = (nv + gx - 1) / gx;
  const int64_t tx = std::min<int64_t>(kMapThreads, (per_block + UNROLL * 32 - 1) / (UNROLL * 32) * 32);
  const int64_t ty = kMapThreads / tx;
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

// At decode sizes an op with costly math per element (Op::kCostlyMath: an exp and a reciprocal
// for silu) reads 4 bytes per thread instead of 16: the math then runs as short chains on many
// SMs rather than as 8-element chains on a few, which is what bounds a launch this small (1 x
// 14336 silu_and_mul on an H200: 1792 threads of 8 elements on 7 SMs took 1.65 us per call in a
// CUDA graph, 7168 threads of 2 1.28 us; 8 x 14336 gelu_and_mul 1.69 -> 1.41). A plain scale does
// not gain. Past decode sizes too, the narrowest access (4 bytes, else 8) whose threads stay
// within kCostlyDecodeThreadsPerSm per SM: narrower accesses win while the SMs keep room
// (H200, CUDA-graph replay, 4 bytes against 16, us: silu_and_mul 32 x 11008, 1334 threads per SM,
// 1.63 -> 1.53; 64 x 11008 at 8 bytes, 1334 per SM, 1.91 -> 1.80, gelu_and_mul 2.45 -> 2.30) and
// lose where they fill them (4 bytes at 1737 per SM, 32 x 14336: 1.68 -> 1.74; at 2001, 48 x
// 11008: 1.77 -> 1.94; bench/results/2026-11-27_h200_5c7cd4a_act_decode_access/).
constexpr int64_t kCostlyDecodeThreadsPerSm = 1536;

template <typename T, int VEC, typename Op>
int launch_rowwise_map(T* out, const T* in, const RowwiseShape& s, const Op& op, int device, cudaStream_t stream,
                       bool pdl = false) {
  if (s.rows == 0 || s.cols == 0) return 0;
  const int sms = sm_count(device);
  const int64_t vectors = s.rows * ((s.cols + VEC - 1) / VEC);
  if constexpr (Op::kCostlyMath) {
    constexpr int kNarrow = VEC * int(sizeof(T)) >= 16 && sizeof(T) <= 4 ? 4 / int(sizeof(T)) : VEC;  // 4 bytes
    constexpr int kHalf = VEC * int(sizeof(T)) >= 16 ? VEC / 2 : VEC;                                    // 8 bytes
    const int64_t room = int64_t(sms) * kCostlyDecodeThreadsPerSm;
    if (s.rows <= 65535) {  // y of a grid is at most 65535
      if constexpr (kNarrow < VEC) {
        if (vectors * (VEC / kNarrow) <= room) return launch_decode<T, kNarrow>(out, in, s, op, stream, pdl);
      }
      if constexpr (kHalf < VEC && kHalf > kNarrow) {
        if (vectors * (VEC / kHalf) <= room) return launch_decode<T, kHalf>(out, in, s, op, stream, pdl);
      }
    }
  }
  if (vectors < int64_t(sms) * 256 && s.rows <= 65535) {  // decode sizes
    return launch_decode<T, VEC>(out, in, s, op, stream, pdl);
  }
  // 4 vectors per thread for math that needs the overlap (Op::kMathBound), once that still gives
  // every resident thread (2048 per SM) work. On an H200 at 16384 x 14336, gelu_and_mul (erf) took
  // 340.6 us that way against 362.6 with one vector per thread; everything else was as fast or
  // faster with one: scale 32768 x 4096 128.9 against 133.1, 32768 x 8192 253.1 against 262.6,
  // silu_and_mul 16384 x 14336 325.1 against 327.5, gelu_tanh_and_mul 324.9 against 326.5.
  if constexpr (Op::kMathBound) {
    if (vectors >= int64_t(sms) * 2048 * 4) return launch_unrolled<T, VEC, 4>(out, in, s, op, stream, pdl);
  }
  // Cheap math between one and four waves of one-vector threads: 2 or 4 vectors per thread so that
  // one wave of blocks covers the problem instead of a second, partly filled one. H200, one launch,
  // inputs rotated past L2, bf16 scale: 1024 x 4096 8.1 -> 7.65 us, 2048 x 4096 12.4 -> 11.7;
  // 4096 x 4096 and larger are level or slower with more per thread (20.3 against 20.3-20.6,
  // 16384 x 4096 66.6 against 68.7-69.1), and silu/gelu_and_mul (costly math) slower from 1024 x
  // 4096 on (10.7 -> 11.0 / 11.4) (bench/results/2026-11-27_h200_657b251_map_unroll/).
  if constexpr (!Op::kCostlyMath) {
    const int64_t wave = int64_t(sms) * 2048;
    if (vectors > wave && vectors <= 2 * wave) return launch_unrolled<T, VEC, 2>(out, in, s, op, stream, pdl);
    if (vectors > 2 * wave && vectors <= 4 * wave) return launch_unrolled<T, VEC, 4>(out, in, s, op, stream, pdl);
  }
  return launch_unrolled<T, VEC, 1>(out, in, s, op, stream, pdl);
}

}  // namespace opforge::cuda
