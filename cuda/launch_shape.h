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
  int cluster = 1;      // blocks (one thread-block cluster) that split one row; > 1 needs sm_90
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
  *out = RowLaunch{vpt, group, static_cast<int>(rows_per_block * group), (rows + rows_per_block - 1) / rows_per_block, 1};
  return true;
}

// Streaming path: one row per block, as many threads as the row has vectors (up to 1024).
inline RowLaunch norm_streaming_launch(int64_t rows, int64_t nv) {
  const int threads = nv >= 1024 ? 1024 : static_cast<int>((nv + 31) / 32 * 32);
  return RowLaunch{0, threads, threads, rows, 1};
}

// Cluster path for long rows in small batches: a cluster of 2-8 blocks splits each row (about
// 256 vectors per block, 2 per thread) and combines the partial sums of squares through
// distributed shared memory, so one row is loaded by several SMs instead of one.
inline RowLaunch norm_cluster_launch(int64_t rows, int64_t nv) {
  int cluster = 2;
  while (cluster < 8 && nv / (cluster * 2) >= 256) cluster *= 2;
  const int64_t slice = (nv + cluster - 1) / cluster;
  const int group = static_cast<int>(((slice + 1) / 2 + 31) / 32 * 32);
  return RowLaunch{2, group, group, rows * cluster, cluster};
}

// Picks the launch for `rows` rows of `nv` vectors on a GPU with `sms` multiprocessors; `add`
// says the residual is read and written too. Measured on H200 (bench/results): large batches run
// best with 8 vectors of row data in flight per thread — 8 vectors per thread for RMSNorm, 4 (x
// and residual) for the fused add, unless that makes a group wider than 256 threads, where the
// wider reduction costs more than the extra loads save. Small batches (that cannot fill the GPU
// that way) use fewer vectors per thread and more threads per row, and rows of 512 vectors or
// more split over a cluster of blocks where the GPU has clusters (`clusters`: sm_90 and newer).
// Rows too long for registers use the streaming kernel, which re-reads the row from L2 and needs
// no shared memory at any size. `force_vpt` >= 0 overrides the choice (0 = streaming; for
// tuning); an infeasible override returns vecs_per_thread = -1.
inline RowLaunch choose_norm_launch(int64_t rows, int64_t nv, bool add, int sms, bool clusters,
                                    int force_vpt = -1) {
  RowLaunch l{-1, 0, 0, 0, 1};
  if (force_vpt == 0) return norm_streaming_launch(rows, nv);
  if (force_vpt > 0) {
    norm_register_launch(rows, nv, force_vpt, &l);
    return l;
  }
  const int preferred = add ? 4 : 8;
  RowLaunch most_threads{-1, 0, 0, 0, 1};
  for (int vpt : {preferred, 8, 4, 2, 1}) {
    RowLaunch candidate;
    if (!norm_register_launch(rows, nv, vpt, &candidate)) continue;
    if (vpt == preferred && preferred < 8 && candidate.group > 256) continue;
    // Enough bytes in flight to cover memory latency: about 4096 vectors per multiprocessor.
    if (l.vecs_per_thread < 0 && rows * candidate.group * vpt >= int64_t(sms) * 4096) l = candidate;
    if (most_threads.vecs_per_thread < 0 || vpt < most_threads.vecs_per_thread) most_threads = candidate;
  }
  if (l.vecs_per_thread >= 0) return l;
  if (most_threads.vecs_per_thread < 0) return norm_streaming_launch(rows, nv);
  if (clusters && nv >= 512) return norm_cluster_launch(rows, nv);
  return most_threads;
}

}  // namespace opforge
