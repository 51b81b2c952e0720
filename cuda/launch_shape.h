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

// Register budget: a thread that keeps more than 16 fp32 values in flight gets up to 128
// registers, so its block is capped at 512 threads; smaller working sets allow 1024.
inline int norm_max_threads(int elems_per_thread) { return elems_per_thread <= 16 ? 1024 : 512; }

// Picks the launch for `rows` rows of `nv` vectors of `vec` elements on a GPU with `sms`
// multiprocessors. Large batches get many vectors per thread (more loads in flight per thread,
// fewer threads per reduction); small batches get fewer vectors per thread and more threads per
// row so the few rows still spread over many warps. Rows too long to keep in registers use the
// streaming kernel, which re-reads the row from L2 and so needs no shared memory at any size.
inline RowLaunch choose_norm_launch(int64_t rows, int64_t nv, int vec, int sms) {
  RowLaunch pick{-1, 0, 0, 0};
  RowLaunch most_threads{-1, 0, 0, 0};
  for (int vpt : {8, 4, 2, 1}) {
    const int64_t need = (nv + vpt - 1) / vpt;
    if (need > norm_max_threads(vpt * vec)) continue;
    int group = 1;
    if (need <= 16) {
      while (group < need) group <<= 1;  // sub-warp groups reduce with shuffles: a power of two
    } else {
      group = static_cast<int>((need + 31) / 32 * 32);  // whole warps
    }
    // Enough bytes in flight to cover memory latency: about 4096 vectors per multiprocessor.
    const bool fills = rows * group * vpt >= int64_t(sms) * 4096;
    if (pick.vecs_per_thread < 0 && fills) pick = RowLaunch{vpt, group, 0, 0};
    most_threads = RowLaunch{vpt, group, 0, 0};  // the last feasible one has the smallest vpt
  }
  if (pick.vecs_per_thread < 0) pick = most_threads;
  if (pick.vecs_per_thread < 0) {  // streaming: one row per block
    const int64_t threads = nv >= 1024 ? 1024 : (nv + 31) / 32 * 32;
    return RowLaunch{0, static_cast<int>(threads), static_cast<int>(threads), rows};
  }
  int64_t rows_per_block = pick.group >= 256 ? 1 : 256 / pick.group;
  if (rows_per_block > rows) rows_per_block = rows < 1 ? 1 : rows;
  pick.threads = static_cast<int>(rows_per_block * pick.group);
  pick.blocks = (rows + rows_per_block - 1) / rows_per_block;
  return pick;
}

}  // namespace opforge
