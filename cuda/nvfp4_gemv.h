// NVFP4 batched GEMV launcher interface (plain C++; the kernels live in nvfp4_gemv.cu), and the
// launch plan as inline C++ so that it can be inspected and tested without a GPU
// (opforge._C.nvfp4_gemv_plan exposes it).
//
//   c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l]
//
// A and B are FP4 E2M1 codes, two per byte along K (the even element in the low nibble), times
// one FP8 E4M3 scale per 16 consecutive elements along K (ops/nvfp4_format.py). Every 16-element
// block is summed exactly (products of two E2M1 values are multiples of 1/4 up to 36), times
// scale_a * scale_b (exact: 4-bit by 4-bit mantissas), and added into an fp32 accumulator: the
// fp32 additions across blocks and the final rounding to fp16 are the only roundings.
#pragma once
#include <cstdint>

namespace opforge::cuda {

// Strides are in bytes for the 1-byte operands (a packed FP4 pair, an E4M3 scale) and in fp16
// elements for `out`. Along K every operand is contiguous.
struct Nvfp4GemvParams {
  void* out = nullptr;               // fp16 [M, 1, L]
  const void* a = nullptr;           // [M, K/2, L] packed FP4 pairs
  const void* b = nullptr;           // [1, K/2, L]
  const void* scale_a = nullptr;     // [M, K/16, L] E4M3
  const void* scale_b = nullptr;     // [1, K/16, L] E4M3
  float* workspace = nullptr;        // splits * M * L fp32 partial sums when the plan splits K across blocks
  int64_t m = 0, k = 0, l = 0;       // k in elements (a multiple of 64)
  int64_t a_stride_m = 0, a_stride_l = 0;
  int64_t b_stride_l = 0;
  int64_t sa_stride_m = 0, sa_stride_l = 0;
  int64_t sb_stride_l = 0;
  int64_t out_stride_m = 0, out_stride_l = 0;
};

// Threads per block of the main kernel. It comes in two occupancies, compiled for 2 or 4 blocks
// per SM (at most 128 or 64 registers per thread), with 8 or 4 vectors of A in flight per thread:
// the same bytes in flight per SM, held by 16 or 32 warps. The grid never exceeds what is resident
// at once; the groups loop over the tasks, so no block waits for a second wave.
constexpr int kNvfp4Threads = 256;
constexpr int kNvfp4DeepBlocksPerSm = 2;
constexpr int kNvfp4WideBlocksPerSm = 4;

// Vectors of A in flight per thread (over all rows of a task) in the kernel for BPS blocks per SM.
template <int BPS>
constexpr int kNvfp4VectorsInFlight = BPS == kNvfp4WideBlocksPerSm ? 4 : 8;
// A 16-byte vector of A holds 32 FP4 values: two scale blocks.
constexpr int64_t kNvfp4VectorElems = 32;
// Most splits of K across blocks (each adds M * L floats of workspace).
constexpr int kNvfp4MaxSplits = 64;

// How the work is cut. A task is `rows` rows (1, 2 or 4) of one batch over one slice of K; the
// rows share each decoded vector of B. A group of `group` threads (a power of two, 1..256; more
// than 32 spans whole warps of one block and adds through shared memory) computes a task, each
// thread reading the 16-byte vectors lane, lane + group, ... of the slice with 8 / rows steps
// unrolled: 8 or 4 vectors of A in flight per thread, as `blocks_per_sm` says (in the kernel for
// aligned operands, the one every torch-allocated tensor gets). `splits` > 1 cuts K into that
// many slices whose fp32 partial sums a second kernel adds in slice order (deterministic).
// `blocks`: the grid.
struct Nvfp4GemvPlan {
  int rows = 0;  // 0: no valid plan
  int group = 0;
  int splits = 0;
  int blocks_per_sm = 0;
  int64_t blocks = 0;
};

inline int64_t nvfp4_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool nvfp4_is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Tasks of a plan's main kernel; the kernel indexes them with 32-bit integers.
inline int64_t nvfp4_gemv_tasks(int64_t m, int64_t l, int rows, int splits) {
  return nvfp4_cdiv(m, rows) * l * splits;
}

// Completes a plan from its choices; rows = 0 when they are out of range. blocks_per_sm -1: 4
// where each thread reads at most 8 vectors of a row's slice, else 2. Short rows make short
// tasks, whose first loads wait with nothing else in flight in their warp; twice the warps keep
// the SM's loads going meanwhile (measured on an H100: 7168 x 2048 x 4 1.08x faster; at
// 7168 x 16384 x 1, 16 vectors per thread, the deeper kernel is 3% faster).
inline Nvfp4GemvPlan nvfp4_gemv_plan(int64_t m, int64_t k, int64_t l, int sms, int rows, int group, int splits,
                                     int blocks_per_sm = -1) {
  Nvfp4GemvPlan p;
  if ((rows != 1 && rows != 2 && rows != 4) || !nvfp4_is_pow2(group) || group > kNvfp4Threads || splits < 1 ||
      splits > kNvfp4MaxSplits || sms < 1 ||
      (blocks_per_sm != -1 && blocks_per_sm != kNvfp4DeepBlocksPerSm && blocks_per_sm != kNvfp4WideBlocksPerSm)) {
    return p;
  }
  if (blocks_per_sm == -1) {
    const int64_t per_thread = nvfp4_cdiv(nvfp4_cdiv(k / kNvfp4VectorElems, splits), group);
    blocks_per_sm = per_thread <= 8 ? kNvfp4WideBlocksPerSm : kNvfp4DeepBlocksPerSm;
  }
  // Up to one block per SM: as many as the tasks fill. Beyond: every resident block, the tasks
  // dealt over them in turn, so that each SM gets the same share to within a task (fewer blocks
  // than resident would leave some SMs a block short).
  const int64_t needed = nvfp4_cdiv(nvfp4_gemv_tasks(m, l, rows, splits) * group, kNvfp4Threads);
  p.rows = rows;
  p.group = group;
  p.splits = splits;
  p.blocks_per_sm = blocks_per_sm;
  p.blocks = needed <= sms ? needed : int64_t(sms) * blocks_per_sm;
  return p;
}

// The plan for an M x K x L problem on a GPU with `sms` multiprocessors. The goal is at least
// 256 threads per SM with 8 vectors of A in flight each (32 KiB per SM, about twice what covers
// the memory latency at full bandwidth), with as little extra work as possible:
// 1. rows: 4 (each vector of B decoded once for 4 rows), unless even groups as wide as the row
//    allows (1 vector per thread) leave the GPU short of that goal; then 2, then 1.
// 2. group: 16 threads (4 vectors per thread at K = 2048), narrowed to the row's vector count for
//    short rows, and widened while the groups would fill less than 3/4 of the resident threads
//    (512 per SM in the deeper kernel) and every thread keeps a vector per row. Narrow groups spend less on the
//    reduction per task; wide ones keep the SMs full when M * L is small. (Measured on an H100
//    over groups 8..256 at the shapes below: within 2% of the best plan at every one.)
// 3. splits: only when a 256-thread group per row still leaves the goal unmet (M * L small
//    against the SM count) and every slice keeps 2 vectors per thread: the second kernel and
//    M * L * splits floats of workspace are worth it then.
// 4. blocks per SM: 4 for short row slices, else 2 (nvfp4_gemv_plan).
// On 132 SMs: 7168 x 16384 x 1 gets rows 4, group 32, 2 blocks per SM; 4096 x 7168 x 8 rows 4,
// group 16, 2 per SM; 7168 x 2048 x 4 rows 4, group 16, 4 per SM; 128 x 7168 x 1 rows 1, group
// 128; none splits K.
inline Nvfp4GemvPlan choose_nvfp4_gemv_plan(int64_t m, int64_t k, int64_t l, int sms) {
  const int64_t nv = k / kNvfp4VectorElems;  // 16-byte vectors per row of A
  const int64_t goal = int64_t(sms) * 256;   // threads
  const int64_t fill = int64_t(sms) * 384;   // 3/4 of the resident threads
  int widest = 1;                            // widest group that keeps 1 vector per thread
  while (widest < kNvfp4Threads && nv >= 2 * widest) widest *= 2;
  int rows = 4;
  while (rows > 1 && (rows > m || nvfp4_cdiv(m, rows) * l * widest < goal)) rows /= 2;
  const int64_t groups = nvfp4_cdiv(m, rows) * l;
  int group = 16;
  while (group > 1 && group > nv) group /= 2;
  while (group < widest && groups * group < fill) group *= 2;
  int splits = 1;
  while (splits < kNvfp4MaxSplits && groups * group * splits < goal && nv >= 4 * group * splits) splits *= 2;
  return nvfp4_gemv_plan(m, k, l, sms, rows, group, splits);
}

// fp32 elements of workspace a plan needs (0 without a split).
inline int64_t nvfp4_gemv_workspace_elems(const Nvfp4GemvPlan& plan, int64_t m, int64_t l) {
  return plan.splits > 1 ? int64_t(plan.splits) * m * l : 0;
}

// Launches on `stream` (a cudaStream_t) of `device`; returns a cudaError_t value (0 = success).
// p.workspace must hold nvfp4_gemv_workspace_elems(plan, ...) floats.
int launch_nvfp4_gemv(const Nvfp4GemvParams& p, const Nvfp4GemvPlan& plan, int device, void* stream);

}  // namespace opforge::cuda
