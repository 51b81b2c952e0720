// How row-wise kernels are shaped, as plain C++ so the choice can be inspected and tested on
// machines without a GPU (opforge._C.norm_launch_shape exposes it).
#pragma once
#include <cstdint>

namespace opforge {

struct RowLaunch {
  int vecs_per_thread;  // vectors each thread keeps in registers; 0 = streaming two-pass kernel
  int group;            // threads that share one row
  int threads;          // threads per block (rows_per_block * group)
  int64_t blocks;
};

// Register budget: a thread keeps up to three raw vectors (row, residual, weight; 12 registers
// for 16-byte vectors) per vector of its row, so its block is capped where the register file
// still gives it room: 64 registers at 1024 threads, 128 at 512, 255 at 256.
inline int norm_max_threads(int vecs_per_thread) {
  return vecs_per_thread <= 2 ? 1024 : vecs_per_thread <= 4 ? 512 : 256;
}

// The register-path launch that gives each thread `vpt` vectors of a row of `nv` vectors, or
// false when the row does not fit (a group would need more threads than the budget allows).
inline bool norm_register_launch(int64_t rows, int64_t nv, int vpt, RowLaunch* out) {
  const int64_t need = (nv + vpt - 1) / vpt;
  if (need > norm_max_threads(vpt)) return false;
  int group = 1;
  if (need <= 16) {
    while (group < need) group <<= 1;  // sub-warp groups reduce with shuffles: a power of two
  } else {
    group = static_cast<int>((need + 31) / 32 * 32);  // whole warps
  }
  int64_t rows_per_block = group >= 256 ? 1 : 256 / group;
  if (rows_per_block > rows) rows_per_block = rows < 1 ? 1 : rows;
  *out = RowLaunch{vpt, group, static_cast<int>(rows_per_block * group), (rows + rows_per_block - 1) / rows_per_block};
  return true;
}

// Streaming path: one row per block, as many threads as the row has vectors (up to 1024).
inline RowLaunch norm_streaming_launch(int64_t rows, int64_t nv) {
  const int threads = nv >= 1024 ? 1024 : static_cast<int>((nv + 31) / 32 * 32);
  return RowLaunch{0, threads, threads, rows};
}

// Picks the launch for `rows` rows of `nv` vectors on a GPU with `sms` multiprocessors, for RMSNorm
// and the fused add alike. Measured on H200 (bench/results/, the norm launch sweeps):
// - batches that fill the GPU run best with 4 vectors per thread, RMSNorm and the fused add
//   alike (at hidden 4096 and 8192, 8 was 3-7% slower for RMSNorm and 6-13% for the fused add),
//   unless that needs a group wider than 256 threads, where the wider reduction costs more than
//   the loads save and 8 serve (re-measured at 84a4770 for rows of 1024 vectors, fp32 4096 and
//   bf16 8192: 8 per thread now level to 1.6% faster, bench/results/2026-11-27_h200_84a4770_standing/;
//   at 640 and 768, bf16 5120 and 6144, 8 is 5-13% slower for RMSNorm: kept as is,
//   bench/results/2026-11-27_h200_9788b6c_norm_large_inductor/);
// - smaller batches run best with groups of at most 256 threads holding as few vectors each as
//   that allows (4 for hidden 8192, 8 for 16384), rows packed into 256-thread blocks;
// - decode batches (up to kNormDecodeRows rows, where it was measured) rather with 2 vectors per
//   thread where that keeps the group within 384 threads (bf16 rows up to 6144), and with one
//   row per block, spread over as many SMs as there are rows (bf16, CUDA-graph replay, µs: hidden
//   2048 one row 1.47 with 1 vector per thread, 1.37 with 2; 32 rows two to a block 1.59, one
//   1.47; 5120 one row 1.74 with 4, 1.61 with 2; 8192 1.78 with 4, 1.83 with 2;
//   bench/results/2026-11-27_h200_36bdb17_norm_decode_shape/).
// Rows too long for registers use the streaming kernel, which re-reads the row from L2 and needs
// no shared memory at any size. `force_vpt` >= 0 overrides the choice (0 = streaming; for
// tuning); an infeasible override returns vecs_per_thread = -1.
constexpr int64_t kNormDecodeRows = 256;

inline RowLaunch choose_norm_launch(int64_t rows, int64_t nv, int sms, int force_vpt = -1) {
  RowLaunch l{-1, 0, 0, 0};
  if (force_vpt == 0) return norm_streaming_launch(rows, nv);
  if (force_vpt > 0) {
    norm_register_launch(rows, nv, force_vpt, &l);
    return l;
  }
  RowLaunch large{-1, 0, 0, 0}, small{-1, 0, 0, 0}, two{-1, 0, 0, 0}, any{-1, 0, 0, 0};
  for (int vpt : {1, 2, 4, 8}) {
    RowLaunch c;
    if (!norm_register_launch(rows, nv, vpt, &c)) continue;
    if (any.vecs_per_thread < 0) any = c;
    if (small.vecs_per_thread < 0 && c.group <= 256) small = c;
    if (vpt == 2 && c.group <= 384) two = c;
    if (vpt == 8 || (vpt == 4 && c.group <= 256)) {
      if (large.vecs_per_thread < 0) large = c;
    }
  }
  if (any.vecs_per_thread < 0) return norm_streaming_launch(rows, nv);
  // Enough bytes in flight to cover memory latency: about 4096 vectors per multiprocessor.
  if (large.vecs_per_thread > 0 && rows * large.group * large.vecs_per_thread >= int64_t(sms) * 4096) return large;
  RowLaunch chosen = small.vecs_per_thread > 0 ? small : any;
  if (rows > kNormDecodeRows) return chosen;
  if (two.vecs_per_thread > 0) chosen = two;
  if (chosen.group >= 32) {  // one row per block (sub-warp rows stay packed: a block per row of 16 threads would idle)
    chosen.threads = chosen.group;
    chosen.blocks = rows;
  }
  return chosen;
}

// Decode batches of 16-bit rows of at most kNormNarrowHidden elements, kNormNarrowElems in all,
// take 8-byte accesses, two per thread, instead of 16-byte ones: twice the threads on rows too
// short to keep many busy (bf16, CUDA-graph replay on an H200, medians over 10 placements, us:
// 1 x 512 1.31 -> 1.25, 32 x 1024 1.43 -> 1.40, 256 x 512 1.56 -> 1.52, 32 x 128 1.41 -> 1.30,
// fused add 32 x 1024 1.52 -> 1.50; but 256 x 1024 1.64 -> 1.65 and fused 1.72 -> 1.76, and one
// row of 2048 1.35 -> 1.36; bench/results/2026-11-27_h200_dda18b3_norm_narrow/). Only that kernel
// (2 vectors per thread) is built for 8-byte accesses, so shapes the plan gives another launch (on
// GPUs of a few SMs) and the tuning override (force_vpt) keep 16-byte ones.
constexpr int64_t kNormNarrowHidden = 1024;
constexpr int64_t kNormNarrowElems = int64_t(1) << 17;

// Whether rows of this shape take 8-byte accesses, and then their launch (in 8-byte vectors) in
// `*launch`: the launcher uses it as it is.
inline bool norm_narrow_launch(int64_t rows, int64_t hidden, int elem_bytes, int sms, int force_vpt,
                               RowLaunch* launch) {
  if (force_vpt >= 0 || elem_bytes != 2 || rows > kNormDecodeRows || hidden > kNormNarrowHidden ||
      rows * hidden > kNormNarrowElems) {
    return false;
  }
  *launch = choose_norm_launch(rows, hidden / (8 / elem_bytes), sms);
  return launch->vecs_per_thread == 2;  // not on GPUs of a few SMs
}

inline bool norm_narrow_access(int64_t rows, int64_t hidden, int elem_bytes, int sms, int force_vpt = -1) {
  RowLaunch unused;
  return norm_narrow_launch(rows, hidden, elem_bytes, sms, force_vpt, &unused);
}

}  // namespace opforge
