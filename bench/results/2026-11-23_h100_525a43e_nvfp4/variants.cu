// Experiment: pipelined NVFP4 GEMV variants against the production kernel and a flat read.
// Build from the repository root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda \
//     bench/results/2026-11-23_h100_525a43e_nvfp4/variants.cu cuda/device.cu -o nvfp4_variants
//   ./nvfp4_variants 3023        (copy GB/s for the % columns; PROF=1: a short run for ncu)
#include "nvfp4_gemv.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <functional>
#include <string>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

namespace opforge::cuda {
namespace {

template <int ROWS, int U>
struct Stage {
  uint4 a[U][ROWS];
  unsigned short sa[U][ROWS];
  uint4 b[U];
  unsigned short sb[U];
};

template <int ROWS, int U, int MINB, bool NOMATH>
__global__ void __launch_bounds__(kNvfp4Threads, MINB)
    pipe_kernel(const Nvfp4GemvParams p, const int group, const int splits) {
  __shared__ float partial[kNvfp4Threads / 32][ROWS];
  const int lane = threadIdx.x & (group - 1);
  const uint32_t groups_per_block = kNvfp4Threads / group;
  const uint32_t rgpb = static_cast<uint32_t>((p.m + ROWS - 1) / ROWS);
  const uint32_t tasks = rgpb * static_cast<uint32_t>(p.l) * static_cast<uint32_t>(splits);
  const int64_t nv = p.k / kNvfp4VectorElems;
  const int64_t per_slice = (nv + splits - 1) / splits;
  const int width = group < 32 ? group : 32;
  const uint32_t stride_tasks = gridDim.x * groups_per_block;
  const uint32_t first = (threadIdx.x / group) * gridDim.x + blockIdx.x;
  const uint32_t rounds = (tasks + stride_tasks - 1) / stride_tasks;
  const int64_t step_vectors = int64_t(group) * U;
  const int S = static_cast<int>((per_slice + step_vectors - 1) / step_vectors);

  // Loader cursor (runs one step ahead of the math).
  const uint8_t* a_rows[ROWS];
  const uint8_t* sa_rows[ROWS];
  const uint8_t* b_row;
  const uint8_t* sb_row;
  int64_t lv_begin = 0, lv_end = 0;
  auto set_task = [&](uint32_t task) {
    const uint32_t t = task < tasks ? task : 0;
    const uint32_t slice = t % splits, row_group = t / splits;
    const int64_t batch = row_group / rgpb;
    const int64_t m0 = int64_t(row_group % rgpb) * ROWS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t m = min64(m0 + r, p.m - 1);
      a_rows[r] = static_cast<const uint8_t*>(p.a) + m * p.a_stride_m + batch * p.a_stride_l;
      sa_rows[r] = static_cast<const uint8_t*>(p.scale_a) + m * p.sa_stride_m + batch * p.sa_stride_l;
    }
    b_row = static_cast<const uint8_t*>(p.b) + batch * p.b_stride_l;
    sb_row = static_cast<const uint8_t*>(p.scale_b) + batch * p.sb_stride_l;
    lv_begin = min64(nv, int64_t(slice) * per_slice);
    lv_end = min64(nv, lv_begin + per_slice);
  };
  auto load = [&](Stage<ROWS, U>& s, int step) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = lv_begin + step * step_vectors + int64_t(u) * group + lane;
      const int64_t vc = v < lv_end ? v : lv_begin;
      s.b[u] = load_b<true>(b_row + vc * 16);
      s.sb[u] = load_scale_b<true>(sb_row + vc * 2);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        s.a[u][r] = load_a<true>(a_rows[r] + vc * 16);
        s.sa[u][r] = load_scale_a<true>(sa_rows[r] + vc * 2);
      }
    }
  };

  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
  const int64_t total = int64_t(rounds) * S;
  if (total == 0) return;
  set_task(first);
  Stage<ROWS, U> cur;
  load(cur, 0);
  int step = 0;
  uint32_t task = first;
  // compute cursor: v range of the current task
  int64_t cv_begin = lv_begin, cv_end = lv_end;
  for (int64_t it = 0; it < total; ++it) {
    Stage<ROWS, U> nxt;
    const bool last_step = step == S - 1;
    if (it + 1 < total) {
      if (last_step) set_task(task + stride_tasks);
      load(nxt, last_step ? 0 : step + 1);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = cv_begin + step * step_vectors + int64_t(u) * group + lane;
      if (v >= cv_end) break;
      if constexpr (NOMATH) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          acc[r] += __int_as_float((cur.a[u][r].x ^ cur.a[u][r].y ^ cur.a[u][r].z ^ cur.a[u][r].w ^ cur.sa[u][r] ^
                                    cur.b[u].x ^ cur.sb[u]) & 0x3fffffff);
        }
      } else {
        DecodedB b;
        decode_b(cur.b[u], b);
        float2 sb = e4m3x2_to_float2(cur.sb[u]);
        sb.x *= kBlockUnit;
        sb.y *= kBlockUnit;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const float2 s = block_sums(cur.a[u][r], b);
          const float2 sa = e4m3x2_to_float2(cur.sa[u][r]);
          acc[r] = fmaf(s.x * sa.x, sb.x, acc[r]);
          acc[r] = fmaf(s.y * sa.y, sb.y, acc[r]);
        }
      }
    }
    if (last_step) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        for (int offset = width >> 1; offset > 0; offset >>= 1) {
          acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset, width);
        }
      }
      if (group > 32) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) partial[warp][r] = acc[r];
        }
        __syncthreads();
        const int first_warp = warp & ~((group >> 5) - 1);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          float s = 0.f;
          for (int w = 0; w < (group >> 5); ++w) s += partial[first_warp + w][r];
          acc[r] = s;
        }
        __syncthreads();
      }
      if (task < tasks && lane == 0) {
        const uint32_t slice = task % splits, row_group = task / splits;
        const int64_t batch = row_group / rgpb;
        const int64_t m0 = int64_t(row_group % rgpb) * ROWS;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int64_t m = m0 + r;
          if (m >= p.m) break;
          if (splits == 1) {
            static_cast<__half*>(p.out)[m * p.out_stride_m + batch * p.out_stride_l] = __float2half_rn(acc[r]);
          } else {
            p.workspace[(int64_t(slice) * p.l + batch) * p.m + m] = acc[r];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
      task += stride_tasks;
      step = 0;
      cv_begin = lv_begin;
      cv_end = lv_end;
    } else {
      ++step;
    }
    cur = nxt;
  }
}


// --- bulk-copy streaming: each warp computes tasks of ROWS rows; its A and scale rows arrive in
// shared memory through cp.async.bulk in a ring of STAGES stages of FV vectors per row.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT_%=;\n}" :: "r"(smem_u32(b)), "r"(parity) : "memory");
}

template <int ROWS, int FV, int STAGES, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 1) tma_kernel(const Nvfp4GemvParams p, const int splits) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int A_BYTES = ROWS * FV * 16, S_BYTES = ROWS * FV * 2, STAGE = A_BYTES + S_BYTES;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* ring = smem + warp * (STAGES * STAGE);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + WARPS * STAGES * STAGE) + warp * STAGES;
  if (lane == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&bars[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();

  const uint32_t rgpb = static_cast<uint32_t>((p.m + ROWS - 1) / ROWS);
  const uint32_t tasks = rgpb * static_cast<uint32_t>(p.l) * static_cast<uint32_t>(splits);
  const int64_t nv = p.k / kNvfp4VectorElems;
  const int64_t per_slice = (nv + splits - 1) / splits;
  const uint32_t stride_tasks = gridDim.x * WARPS;
  const uint32_t first = warp * gridDim.x + blockIdx.x;
  const int S = static_cast<int>((per_slice + FV - 1) / FV);  // stages per task (the last slice may need fewer)

  struct Cursor { uint32_t task; int stage; };
  auto decompose = [&](uint32_t t, int64_t& batch, int64_t& m0, uint32_t& slice, int64_t& vb, int64_t& ve) {
    slice = t % splits;
    const uint32_t row_group = t / splits;
    batch = row_group / rgpb;
    m0 = int64_t(row_group % rgpb) * ROWS;
    vb = min64(nv, int64_t(slice) * per_slice);
    ve = min64(nv, vb + per_slice);
  };
  // Producer: issue item (task, stage) into ring slot `slot`.
  auto issue = [&](uint32_t t, int stage, int slot) {
    int64_t batch, m0, vb, ve; uint32_t slice;
    decompose(t, batch, m0, slice, vb, ve);
    const int64_t v0 = vb + int64_t(stage) * FV;
    const int64_t n = v0 < ve ? min64(FV, ve - v0) : 0;
    uint8_t* dst = ring + slot * STAGE;
    if (lane == 0) mbar_expect(&bars[slot], static_cast<unsigned>(n * 18 * ROWS));
    __syncwarp();
    if (n > 0 && lane < 2 * ROWS) {
      const int r = lane % ROWS;
      const int64_t m = min64(m0 + r, p.m - 1);
      if (lane < ROWS) {
        bulk_copy(dst + r * FV * 16, static_cast<const uint8_t*>(p.a) + m * p.a_stride_m + batch * p.a_stride_l + v0 * 16,
                  static_cast<unsigned>(n * 16), &bars[slot]);
      } else {
        bulk_copy(dst + A_BYTES + r * FV * 2,
                  static_cast<const uint8_t*>(p.scale_a) + m * p.sa_stride_m + batch * p.sa_stride_l + v0 * 2,
                  static_cast<unsigned>(n * 2), &bars[slot]);
      }
    }
  };
  auto next = [&](Cursor c) { return c.stage + 1 < S ? Cursor{c.task, c.stage + 1} : Cursor{c.task + stride_tasks, 0}; };

  // Fill the ring.
  Cursor pc{first, 0};
  for (int s = 0; s < STAGES; ++s) {
    if (pc.task < tasks) issue(pc.task, pc.stage, s);
    pc = next(pc);
  }
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
  Cursor cc{first, 0};
  uint32_t item = 0;
  while (cc.task < tasks) {
    const int slot = item % STAGES;
    mbar_wait(&bars[slot], (item / STAGES) & 1);
    int64_t batch, m0, vb, ve; uint32_t slice;
    decompose(cc.task, batch, m0, slice, vb, ve);
    const int64_t v0 = vb + int64_t(cc.stage) * FV;
    const int n = static_cast<int>(v0 < ve ? min64(FV, ve - v0) : 0);
    const uint8_t* st = ring + slot * STAGE;
    const uint8_t* b_row = static_cast<const uint8_t*>(p.b) + batch * p.b_stride_l;
    const uint8_t* sb_row = static_cast<const uint8_t*>(p.scale_b) + batch * p.sb_stride_l;
#pragma unroll
    for (int i = 0; i < FV / 32; ++i) {
      const int c = lane + 32 * i;
      if (c < n) {
        DecodedB b;
        decode_b(__ldg(reinterpret_cast<const uint4*>(b_row + (v0 + c) * 16)), b);
        float2 sb = e4m3x2_to_float2(__ldg(reinterpret_cast<const unsigned short*>(sb_row + (v0 + c) * 2)));
        sb.x *= kBlockUnit;
        sb.y *= kBlockUnit;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const uint4 a = *reinterpret_cast<const uint4*>(st + (r * FV + c) * 16);
          const unsigned short sas = *reinterpret_cast<const unsigned short*>(st + A_BYTES + (r * FV + c) * 2);
          const float2 s = block_sums(a, b);
          const float2 sa = e4m3x2_to_float2(sas);
          acc[r] = fmaf(s.x * sa.x, sb.x, acc[r]);
          acc[r] = fmaf(s.y * sa.y, sb.y, acc[r]);
        }
      }
    }
    __syncwarp();  // every lane has read the slot before it is refilled
    if (pc.task < tasks) issue(pc.task, pc.stage, slot);
    pc = next(pc);
    if (cc.stage == S - 1) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        for (int offset = 16; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
      }
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int64_t m = m0 + r;
          if (m >= p.m) break;
          if (splits == 1) {
            static_cast<__half*>(p.out)[m * p.out_stride_m + batch * p.out_stride_l] = __float2half_rn(acc[r]);
          } else {
            p.workspace[(int64_t(slice) * p.l + batch) * p.m + m] = acc[r];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    }
    cc = next(cc);
    ++item;
  }
}

// Pure read of n16 16-byte vectors, 8 in flight per thread.
__global__ void __launch_bounds__(256) flat_read(const uint4* __restrict__ x, int64_t n16, unsigned* sink) {
  uint32_t accx = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = load_a<true>(reinterpret_cast<const uint8_t*>(x + i + u * stride));
#pragma unroll
    for (int u = 0; u < 8; ++u) accx ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    uint4 v = load_a<true>(reinterpret_cast<const uint8_t*>(x + i));
    accx ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (accx == 0x12345678u) *sink = accx;
}

}  // namespace
}  // namespace opforge::cuda

using namespace opforge::cuda;

struct Problem {
  int64_t m, k, l;
  std::vector<Nvfp4GemvParams> sets;
  std::vector<void*> bufs;
  __half* ref_out;
  float* ws;
  size_t a_bytes;
};

static uint64_t rng = 88172645463325252ull;
static uint8_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return uint8_t(rng >> 24); }

Problem make(int64_t m, int64_t k, int64_t l) {
  Problem P{m, k, l};
  const size_t ab = size_t(m) * k / 2 * l, sab = size_t(m) * k / 16 * l, bb = size_t(k) / 2 * l, sbb = size_t(k) / 16 * l;
  P.a_bytes = ab + sab;
  int nsets = std::max<int>(2, int((400ull << 20) / P.a_bytes) + 1);
  nsets = std::min(nsets, 64);
  std::vector<uint8_t> h(std::max({ab, sab, bb, sbb}));
  auto fill = [&](size_t n, bool scale) {
    void* d; CK(cudaMalloc(&d, n));
    for (size_t i = 0; i < n; ++i) h[i] = scale ? uint8_t(0x30 + (rnd() % 24)) | (rnd() & 0x80) : rnd();
    CK(cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice));
    P.bufs.push_back(d);
    return d;
  };
  void* b = fill(bb, false); void* sb = fill(sbb, true);
  for (int s = 0; s < nsets; ++s) {
    Nvfp4GemvParams p;
    p.a = fill(ab, false); p.scale_a = fill(sab, true); p.b = b; p.scale_b = sb;
    void* o; CK(cudaMalloc(&o, size_t(m) * l * 2)); p.out = o;
    p.m = m; p.k = k; p.l = l;
    p.a_stride_m = k / 2; p.a_stride_l = m * k / 2; p.b_stride_l = k / 2;
    p.sa_stride_m = k / 16; p.sa_stride_l = m * k / 16; p.sb_stride_l = k / 16;
    p.out_stride_m = 1; p.out_stride_l = m;
    P.sets.push_back(p);
  }
  CK(cudaMalloc(&P.ws, size_t(64) * m * l * 4));
  for (auto& p : P.sets) p.workspace = P.ws;
  return P;
}

using Launch = std::function<void(const Nvfp4GemvParams&, cudaStream_t)>;

struct Result { double med_us, loop_us; double maxdiff; };

Result bench(Problem& P, const Launch& f, const Launch& ref) {
  cudaStream_t st = 0;
  // correctness vs production on set 0
  const size_t on = size_t(P.m) * P.l;
  std::vector<__half> r(on), g(on);
  ref(P.sets[0], st); CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(r.data(), P.sets[0].out, on * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemset(P.sets[0].out, 0xff, on * 2));
  f(P.sets[0], st); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(g.data(), P.sets[0].out, on * 2, cudaMemcpyDeviceToHost));
  double md = 0;
  for (size_t i = 0; i < on; ++i) {
    double d = fabs(double(__half2float(r[i])) - double(__half2float(g[i])));
    if (!(d == d)) d = 1e30;
    md = std::max(md, d);
  }
  if (getenv("PROF")) { for (int i = 0; i < 3; ++i) f(P.sets[i % P.sets.size()], st); CK(cudaDeviceSynchronize()); return {0, 0, md}; }
  const int reps = 300;
  cudaEvent_t ev[2];
  CK(cudaEventCreate(&ev[0]));
  CK(cudaEventCreate(&ev[1]));
  for (int i = 0; i < 20; ++i) f(P.sets[i % P.sets.size()], st);
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[0], st));
    f(P.sets[i % P.sets.size()], st);
    CK(cudaEventRecord(ev[1], st));
    CK(cudaEventSynchronize(ev[1]));
    CK(cudaEventElapsedTime(&t[i], ev[0], ev[1]));
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventRecord(ev[0], st));
  const int loops = 200;
  for (int i = 0; i < loops; ++i) f(P.sets[i % P.sets.size()], st);
  CK(cudaEventRecord(ev[1], st));
  CK(cudaEventSynchronize(ev[1]));
  float tot; CK(cudaEventElapsedTime(&tot, ev[0], ev[1]));
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  return {t[reps / 2] * 1000.0, tot * 1000.0 / loops, md};
}

template <int ROWS, int U, int MINB, bool NM>
Launch pipe(int group, int splits, int sms) {
  return [=](const Nvfp4GemvParams& p, cudaStream_t st) {
    const int64_t tasks = nvfp4_gemv_tasks(p.m, p.l, ROWS, splits);
    const int64_t needed = nvfp4_cdiv(tasks * group, kNvfp4Threads);
    const int64_t blocks = needed <= int64_t(sms) * MINB ? needed : int64_t(sms) * MINB;
    pipe_kernel<ROWS, U, MINB, NM><<<unsigned(blocks), kNvfp4Threads, 0, st>>>(p, group, splits);
    if (splits > 1) {
      const int64_t b2 = std::min<int64_t>(nvfp4_cdiv(p.m * p.l, 256), int64_t(sms) * 8);
      nvfp4_gemv_add_splits_kernel<<<unsigned(b2), 256, 0, st>>>(p, splits);
    }
  };
}

template <int ROWS, int FV, int STAGES, int WARPS>
Launch tma(int splits, int sms) {
  constexpr int smem = WARPS * STAGES * (ROWS * FV * 18) + WARPS * STAGES * 8;
  CK(cudaFuncSetAttribute(tma_kernel<ROWS, FV, STAGES, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tma_kernel<ROWS, FV, STAGES, WARPS>, WARPS * 32, smem));
  return [=](const Nvfp4GemvParams& p, cudaStream_t st) {
    const int64_t tasks = nvfp4_gemv_tasks(p.m, p.l, ROWS, splits);
    const int64_t needed = nvfp4_cdiv(tasks, WARPS);
    const int64_t blocks = std::min<int64_t>(needed, int64_t(sms) * per_sm);
    tma_kernel<ROWS, FV, STAGES, WARPS><<<unsigned(blocks), WARPS * 32, smem, st>>>(p, splits);
    if (splits > 1) {
      const int64_t b2 = std::min<int64_t>(nvfp4_cdiv(p.m * p.l, 256), int64_t(sms) * 8);
      nvfp4_gemv_add_splits_kernel<<<unsigned(b2), 256, 0, st>>>(p, splits);
    }
  };
}

int main(int argc, char** argv) {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* sink; CK(cudaMalloc(&sink, 4));
  double copy_gbs = argc > 1 ? atof(argv[1]) : 3023.0;
  struct Shape { int64_t m, k, l; };
  std::vector<Shape> shapes = {{7168, 16384, 1}, {4096, 7168, 8}, {7168, 2048, 4}, {128, 7168, 1}, {256, 7168, 8}};
  if (getenv("PROF")) shapes = {{7168, 16384, 1}, {7168, 2048, 4}};
  for (auto sh : shapes) {
    Problem P = make(sh.m, sh.k, sh.l);
    const Nvfp4GemvPlan plan = choose_nvfp4_gemv_plan(sh.m, sh.k, sh.l, sms);
    printf("\n== %lldx%lldx%lld  %.1f MB  plan rows %d group %d splits %d blocks %lld\n", (long long)sh.m,
           (long long)sh.k, (long long)sh.l, P.a_bytes / 1e6, plan.rows, plan.group, plan.splits, (long long)plan.blocks);
    Launch prod = [&](const Nvfp4GemvParams& p, cudaStream_t st) { launch_nvfp4_gemv(p, plan, 0, st); };
    auto report = [&](const std::string& name, const Launch& f) {
      Result r = bench(P, f, prod);
      printf("%-34s med %7.2f us (%5.1f%%)  loop %7.2f us (%5.1f%%)  maxdiff %g\n", name.c_str(), r.med_us,
             100.0 * P.a_bytes / (r.med_us * 1e3) / copy_gbs, r.loop_us, 100.0 * P.a_bytes / (r.loop_us * 1e3) / copy_gbs,
             r.maxdiff);
    };
    report("prod", prod);
    for (int grid_mult : {1, 2, 4}) {
      Launch flat = [&, grid_mult](const Nvfp4GemvParams& p, cudaStream_t st) {
        flat_read<<<sms * grid_mult * 2, 256, 0, st>>>(reinterpret_cast<const uint4*>(p.a), int64_t(P.a_bytes - P.m * P.k / 16 * P.l) / 16, sink);
      };
      Result r = bench(P, flat, prod);
      const double by = double(P.a_bytes - P.m * P.k / 16 * P.l);
      printf("%-34s med %7.2f us (%5.1f%%)  loop %7.2f us (%5.1f%%)\n", ("flat read A only x" + std::to_string(grid_mult * 2)).c_str(),
             r.med_us, 100.0 * by / (r.med_us * 1e3) / copy_gbs, r.loop_us, 100.0 * by / (r.loop_us * 1e3) / copy_gbs);
    }
    const int sp = plan.splits;
    if (P.k % 256 == 0) {
      report("tma r4 fv64 st2 w8", tma<4, 64, 2, 8>(sp, sms));
      report("tma r4 fv64 st3 w8", tma<4, 64, 3, 8>(sp, sms));
      report("tma r4 fv64 st4 w4", tma<4, 64, 4, 4>(sp, sms));
      report("tma r4 fv64 st2 w16", tma<4, 64, 2, 16>(sp, sms));
      report("tma r2 fv64 st3 w8", tma<2, 64, 3, 8>(sp, sms));
      if (P.k >= 8192) {
        report("tma r4 fv128 st2 w8", tma<4, 128, 2, 8>(sp, sms));
        report("tma r4 fv128 st3 w4", tma<4, 128, 3, 4>(sp, sms));
        report("tma r2 fv128 st3 w8", tma<2, 128, 3, 8>(sp, sms));
      }
      if (sh.m < 512) {
        report("tma r1 fv64 st3 w8", tma<1, 64, 3, 8>(sp, sms));
        report("tma r1 fv64 st3 w8 s4", tma<1, 64, 3, 8>(4, sms));
        report("tma r2 fv64 st3 w8 s4", tma<2, 64, 3, 8>(4, sms));
      }
    }
    report("NOMATH r4u2 g32", pipe<4, 2, 2, true>(32, sp, sms));
    report("NOMATH r1u8 g32", pipe<1, 8, 2, true>(32, sp, sms));
    for (void* b : P.bufs) cudaFree(b);
    for (auto& p : P.sets) cudaFree(p.out);
    cudaFree(P.ws);
  }
  return 0;
}
