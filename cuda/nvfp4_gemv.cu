// NVFP4 batched GEMV: c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l] (see nvfp4_gemv.h for the
// format, the arithmetic and the launch plan).
//
// The op is a stream over A (K/2 bytes per row plus K/16 bytes of scales); B is K/2 bytes per
// batch, read by every row and served from L1/L2. Each thread reads 16-byte vectors of A
// (32 values, two scale blocks) with 8 of them in flight per loop iteration and sums each
// 16-value block of products exactly (see block_sums); the block sum goes to fp32, is scaled by
// scale_a * scale_b and added to the fp32 accumulator.
//
// Decoding FP4 depends on the arch the code was compiled for, and the driver picks the cubin of
// the GPU it runs on, so the choice is made at run time per GPU:
// * Blackwell-family targets (10.0a/f, 10.3a, 11.0a, 12.0a/f, ...; __CUDA_ARCH_FAMILY_SPECIFIC__
//   >= 1000) have cvt.rn.f16x2.e2m1x2, one instruction per FP4 pair. No GPU of that family was
//   available when this path was written: it is compiled (CUDA_ARCH_LIST="9.0a;10.0a"; CI
//   compiles it for sm_100a in ci/check.sh) but has not run.
// * Older GPUs (sm_80, sm_89, sm_90) have no FP4 instructions: byte-table lookups (prmt) turn
//   four codes at a time into small integers and dp4a adds their products.
// E4M3 scales use cvt.rn.f16x2.e4m3x2 from sm_89 on, the same bit placement before.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "device.h"
#include "nvfp4_gemv.h"
#include "vec.cuh"

namespace opforge::cuda {
namespace {

#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000
#define OPFORGE_NVFP4_CVT_E2M1 1
#endif

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof(h));
  return h;
}

// --- decoding ---------------------------------------------------------------------------------
//
// A 16-byte vector holds 32 FP4 codes (4 words of 8), two 16-value blocks: words 0-1 and 2-3.
// block_sums returns the two block dot products of a vector of A with the decoded vector of B,
// exactly, as floats in units of kBlockUnit (folded into B's scale once per vector). A and B
// always go through the same decoding, so every product meets its partner.

#ifdef OPFORGE_NVFP4_CVT_E2M1
// Hardware path: cvt.rn.f16x2.e2m1x2 makes the exact values of two consecutive codes. The block
// sums run in packed half2 FMAs: each half lane adds 8 products of two E2M1 values (multiples of
// 1/4, at most 36), so every partial sum is a multiple of 1/4 below 288, which fp16 holds.
constexpr float kBlockUnit = 1.f;

__device__ __forceinline__ void fp4x8_to_half2x4(uint32_t w, uint32_t (&h)[4]) {
  asm("{\n"
      ".reg .b8 b0, b1, b2, b3;\n"
      "mov.b32 {b0, b1, b2, b3}, %4;\n"
      "cvt.rn.f16x2.e2m1x2 %0, b0;\n"
      "cvt.rn.f16x2.e2m1x2 %1, b1;\n"
      "cvt.rn.f16x2.e2m1x2 %2, b2;\n"
      "cvt.rn.f16x2.e2m1x2 %3, b3;\n"
      "}"
      : "=r"(h[0]), "=r"(h[1]), "=r"(h[2]), "=r"(h[3])
      : "r"(w));
}

struct DecodedB {
  __half2 v[16];
};

struct Decoder {
  __device__ __forceinline__ void decode_b(const uint4& v, DecodedB& b) const {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t h[4];
      fp4x8_to_half2x4(words[i], h);
#pragma unroll
      for (int j = 0; j < 4; ++j) b.v[4 * i + j] = as_half2(h[j]);
    }
  }

  __device__ __forceinline__ float2 block_sums(const uint4& a, const DecodedB& b) const {
    const uint32_t words[4] = {a.x, a.y, a.z, a.w};
    __half2 s[2] = {__float2half2_rn(0.f), __float2half2_rn(0.f)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t h[4];
      fp4x8_to_half2x4(words[i], h);
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i / 2] = __hfma2(as_half2(h[j]), b.v[4 * i + j], s[i / 2]);
    }
    const float2 s0 = __half22float2(s[0]), s1 = __half22float2(s[1]);
    return make_float2(s0.x + s0.y, s1.x + s1.y);
  }
};

__device__ __forceinline__ Decoder make_decoder() { return {}; }
#else
// Software path (sm_80..sm_90: no FP4 instructions): integer dot products. Twice an E2M1 value
// is an integer, 2|x| in {0, 1, 2, 3, 4, 6, 8, 12}, so a block's sum of 16 products is an exact
// int32 (at most 16 * 144) counted in quarters. One prmt looks up four codes at once in an 8-byte
// table indexed by the codes' 3 magnitude bits; its sign-replicate mode, selected by the code's
// own sign bit (bit 3 of each selector nibble), answers 0 for negative codes (every table byte is
// below 0x80). The same lookup with the sign bits flipped gives the negative codes' magnitudes,
// so A = P - N with P, N >= 0 bytewise, and A . B = P . B - N . B: one dp4a per part adds four
// products into the block's P or N sum, with B decoded once per vector (signed bytes 2x) and
// shared by the task's rows. Per 8 codes of A: 3 integer ops, 4 prmt, 4 dp4a.
constexpr float kBlockUnit = 0.25f;
constexpr uint32_t kTwiceE2M1Lo = 0x03020100u;  // codes 0..3 -> 0, 1, 2, 3
constexpr uint32_t kTwiceE2M1Hi = 0x0C080604u;  // codes 4..7 -> 4, 6, 8, 12

// The 32 values of a vector of B as signed bytes 2x, four per word, in code order.
struct DecodedB {
  uint32_t v[8];
};

struct Decoder {
  // The low table word in a register of its own: prmt takes one table word as an immediate, the
  // other from a register, and the compiler would otherwise copy the constant into a fresh
  // register before every prmt (one extra instruction per four codes).
  uint32_t lo;

  // Bytewise 2|x| of the four codes in the low 16 bits of `sel` whose sign bit is clear (0 for
  // the others).
  __device__ __forceinline__ uint32_t twice_magnitudes(uint32_t sel) const {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "n"(kTwiceE2M1Hi), "r"(sel));
    return d;
  }

  __device__ __forceinline__ void decode_b(const uint4& v, DecodedB& b) const {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t flipped = words[i] ^ 0x88888888u;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t p = twice_magnitudes(words[i] >> (16 * h));
        const uint32_t n = twice_magnitudes(flipped >> (16 * h));
        // p - n bytewise (each byte has p or n zero, both below 13): biased by 0x80 per byte the
        // subtraction cannot borrow across bytes, and the xor removes the bias.
        b.v[2 * i + h] = (p + 0x80808080u - n) ^ 0x80808080u;
      }
    }
  }

  __device__ __forceinline__ float2 block_sums(const uint4& a, const DecodedB& b) const {
    const uint32_t words[4] = {a.x, a.y, a.z, a.w};
    int sp[2] = {0, 0}, sn[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t flipped = words[i] ^ 0x88888888u;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t p = twice_magnitudes(words[i] >> (16 * h));
        const uint32_t n = twice_magnitudes(flipped >> (16 * h));
        sp[i / 2] = __dp4a(static_cast<int>(p), static_cast<int>(b.v[2 * i + h]), sp[i / 2]);
        sn[i / 2] = __dp4a(static_cast<int>(n), static_cast<int>(b.v[2 * i + h]), sn[i / 2]);
      }
    }
    return make_float2(__int2float_rn(sp[0] - sn[0]), __int2float_rn(sp[1] - sn[1]));  // exact: below 2^24
  }
};

__device__ __forceinline__ Decoder make_decoder() {
  Decoder d;
  asm volatile("mov.b32 %0, %1;" : "=r"(d.lo) : "n"(kTwiceE2M1Lo));  // opaque: kept, not re-made
  return d;
}
#endif

// Two E4M3 scales (the lower address in the low byte) as exact floats; the NaN code gives NaN.
__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short x) {
#if __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(x));
  return __half22float2(as_half2(h));
#else
  // Sign to fp16 bit 15 and exponent.mantissa to bits 14..7: an fp16 of the value * 2^-8 (E4M3
  // subnormals land on fp16 subnormals); E4M3 has no infinities and one NaN code per sign.
  const uint32_t u = x;
  const uint32_t h = ((u & 0x80u) << 8) | ((u & 0x7Fu) << 7) | ((u & 0x8000u) << 16) | ((u & 0x7F00u) << 15);
  float2 f = __half22float2(as_half2(h));
  f.x = (u & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fffffff) : f.x * 256.f;
  f.y = (u & 0x7F00u) == 0x7F00u ? __int_as_float(0x7fffffff) : f.y * 256.f;
  return f;
#endif
}

// --- loads ------------------------------------------------------------------------------------

// A and its scales are read exactly once: no L1 allocation, and L2 fetches 256-byte runs (a row
// is read front to back). B and its scales are read by every row of the batch: through L1.
template <bool WIDE>
__device__ __forceinline__ uint4 load_a(const uint8_t* p) {
  uint4 v;
  if constexpr (WIDE) {
#if __CUDA_ARCH__ >= 800
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#else
    v = __ldcs(reinterpret_cast<const uint4*>(p));
#endif
  } else {
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 4] |= uint32_t(__ldg(p + i)) << (8 * (i % 4));
    v = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return v;
}

template <bool WIDE>
__device__ __forceinline__ unsigned short load_scale_a(const uint8_t* p) {
  if constexpr (WIDE) {
    unsigned short s;
#if __CUDA_ARCH__ >= 800
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(s) : "l"(p));
#else
    s = __ldcs(reinterpret_cast<const unsigned short*>(p));
#endif
    return s;
  } else {
    return static_cast<unsigned short>(__ldg(p) | (__ldg(p + 1) << 8));
  }
}

template <bool WIDE>
__device__ __forceinline__ uint4 load_b(const uint8_t* p) {
  if constexpr (WIDE) {
    return __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    return load_a<false>(p);
  }
}

template <bool WIDE>
__device__ __forceinline__ unsigned short load_scale_b(const uint8_t* p) {
  if constexpr (WIDE) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  } else {
    return load_scale_a<false>(p);
  }
}

// --- kernels ----------------------------------------------------------------------------------

// Each of R sums over the `group` threads that share a task (a power of two; more than 32 are
// whole warps of the block): lanes of a warp by shuffles, then the warps' sums through shared
// memory, added in warp order, between two block barriers (every thread of the block calls this).
// Fixed orders: results do not vary between runs.
template <int R>
__device__ __forceinline__ void sum_over_group(float (&acc)[R], int group, float (&partial)[kNvfp4Threads / 32][R]) {
  const int width = group < 32 ? group : 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    for (int offset = width >> 1; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset, width);
  }
  if (group > 32) {
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    const int first_warp = warp & ~((group >> 5) - 1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
      for (int w = 0; w < (group >> 5); ++w) s += partial[first_warp + w][r];
      acc[r] = s;
    }
    __syncthreads();  // every warp has read `partial` before the next task writes it
  }
}

// A group of `group` threads computes a task: ROWS rows of one batch over one slice of K (the
// plan in nvfp4_gemv.h); the groups of the (resident) grid loop over the tasks. WIDE: every row
// of A and B starts 16-byte aligned and every scale row 2-byte aligned (always so for tensors
// allocated by torch); compiled for BPS blocks per SM. Otherwise the same math reads bytes (a
// fallback for offset views, BPS = 1: allowed more registers, its grid may then take two rounds
// of blocks, which the task loop absorbs).
template <int ROWS, bool WIDE, int BPS>
__global__ void __launch_bounds__(kNvfp4Threads, BPS)
    nvfp4_gemv_kernel(const Nvfp4GemvParams p, const int group, const int splits) {
  // Unrolled steps: 8 or 4 vectors of A in flight per thread (the plan's occupancy). The
  // byte-load path keeps one step: its vectors arrive as 16 separate bytes, which would not fit
  // the register budget 8 times over.
  constexpr int kInFlight = kNvfp4VectorsInFlight<BPS>;
  constexpr int U = WIDE ? (kInFlight >= ROWS ? kInFlight / ROWS : 1) : 1;
  __shared__ float partial[kNvfp4Threads / 32][ROWS];

  const int lane = threadIdx.x & (group - 1);
  const uint32_t groups_per_block = kNvfp4Threads / group;
  // Tasks fit in 31 bits (checked at launch): 32-bit index arithmetic is cheap and `round`
  // below cannot wrap.
  const uint32_t row_groups_per_batch = static_cast<uint32_t>((p.m + ROWS - 1) / ROWS);
  const uint32_t tasks = row_groups_per_batch * static_cast<uint32_t>(p.l) * static_cast<uint32_t>(splits);
  const int64_t nv = p.k / kNvfp4VectorElems;
  const int64_t per_slice = (nv + splits - 1) / splits;
  const Decoder dec = make_decoder();

  // Tasks are dealt to blocks in turn (task = round + group's index * blocks + block), so that
  // every block, and every SM, gets as many tasks as the next one, to within one. The loop bound
  // is uniform across the block (the shared-memory reduction has barriers): groups past the last
  // task run it with nothing to read.
  for (uint32_t round = 0; round < tasks; round += gridDim.x * groups_per_block) {
    const uint32_t task = round + (threadIdx.x / group) * gridDim.x + blockIdx.x;
    const bool active = task < tasks;
    const uint32_t t = active ? task : 0;
    const uint32_t slice = t % splits;
    const uint32_t row_group = t / splits;
    const int64_t batch = row_group / row_groups_per_batch;
    const int64_t m0 = int64_t(row_group % row_groups_per_batch) * ROWS;
    const int64_t v_begin = min64(nv, int64_t(slice) * per_slice);
    const int64_t v_end = active ? min64(nv, v_begin + per_slice) : v_begin;

    const uint8_t* a_rows[ROWS];
    const uint8_t* sa_rows[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t m = min64(m0 + r, p.m - 1);  // rows past M re-read the last one, unwritten
      a_rows[r] = static_cast<const uint8_t*>(p.a) + m * p.a_stride_m + batch * p.a_stride_l;
      sa_rows[r] = static_cast<const uint8_t*>(p.scale_a) + m * p.sa_stride_m + batch * p.sa_stride_l;
    }
    const uint8_t* b_row = static_cast<const uint8_t*>(p.b) + batch * p.b_stride_l;
    const uint8_t* sb_row = static_cast<const uint8_t*>(p.scale_b) + batch * p.sb_stride_l;

    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;

    for (int64_t v0 = v_begin + lane; v0 < v_end; v0 += int64_t(group) * U) {
      // Every load of the iteration first (steps past the slice read vector v0 again instead of
      // branching), so that 8 vectors of A per thread are in flight at once; then the math.
      uint4 av[U][ROWS], bv[U];
      unsigned short as[U][ROWS], bs[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t v = v0 + int64_t(u) * group;
        const int64_t vc = v < v_end ? v : v0;
        bv[u] = load_b<WIDE>(b_row + vc * 16);
        bs[u] = load_scale_b<WIDE>(sb_row + vc * 2);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          av[u][r] = load_a<WIDE>(a_rows[r] + vc * 16);
          as[u][r] = load_scale_a<WIDE>(sa_rows[r] + vc * 2);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (v0 + int64_t(u) * group >= v_end) break;
        DecodedB b;
        dec.decode_b(bv[u], b);
        float2 sb = e4m3x2_to_float2(bs[u]);
        sb.x *= kBlockUnit;  // exact: a power of two
        sb.y *= kBlockUnit;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const float2 s = dec.block_sums(av[u][r], b);
          const float2 sa = e4m3x2_to_float2(as[u][r]);
          // s * sa is exact (at most 12 by 4 significant bits); the fma rounds once, into acc.
          acc[r] = fmaf(s.x * sa.x, sb.x, acc[r]);
          acc[r] = fmaf(s.y * sa.y, sb.y, acc[r]);
        }
      }
    }

    sum_over_group(acc, group, partial);
    if (active && lane == 0) {
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
  }
}

// Second pass of a split plan: each output adds its slices' partial sums in slice order.
__global__ void __launch_bounds__(256) nvfp4_gemv_add_splits_kernel(const Nvfp4GemvParams p, const int splits) {
  const int64_t outputs = p.m * p.l;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < outputs; i += int64_t(gridDim.x) * blockDim.x) {
    float s = p.workspace[i];
    for (int j = 1; j < splits; ++j) s += p.workspace[int64_t(j) * outputs + i];
    const int64_t batch = i / p.m, m = i % p.m;
    static_cast<__half*>(p.out)[m * p.out_stride_m + batch * p.out_stride_l] = __float2half_rn(s);
  }
}

template <int ROWS>
void launch_rows(const Nvfp4GemvParams& p, const Nvfp4GemvPlan& plan, bool wide, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.blocks));
  if (!wide) {
    nvfp4_gemv_kernel<ROWS, false, 1><<<grid, kNvfp4Threads, 0, stream>>>(p, plan.group, plan.splits);
  } else if (plan.blocks_per_sm == kNvfp4WideBlocksPerSm) {
    nvfp4_gemv_kernel<ROWS, true, kNvfp4WideBlocksPerSm><<<grid, kNvfp4Threads, 0, stream>>>(p, plan.group, plan.splits);
  } else {
    nvfp4_gemv_kernel<ROWS, true, kNvfp4DeepBlocksPerSm><<<grid, kNvfp4Threads, 0, stream>>>(p, plan.group, plan.splits);
  }
}

// Whether every row (along K) of a and b starts on 16 bytes and every row of both scales on 2 (the
// vector loads of the WIDE kernels): the pointers and the strides of the dimensions that are
// walked (size > 1).
bool rows_aligned_for_vectors(const Nvfp4GemvParams& p) {
  auto aligned = [](int64_t align, const void* ptr, int64_t size_m, int64_t stride_m, int64_t size_l,
                    int64_t stride_l) {
    return reinterpret_cast<uintptr_t>(ptr) % align == 0 && (size_m <= 1 || stride_m % align == 0) &&
           (size_l <= 1 || stride_l % align == 0);
  };
  return aligned(16, p.a, p.m, p.a_stride_m, p.l, p.a_stride_l) && aligned(16, p.b, 1, 0, p.l, p.b_stride_l) &&
         aligned(2, p.scale_a, p.m, p.sa_stride_m, p.l, p.sa_stride_l) &&
         aligned(2, p.scale_b, 1, 0, p.l, p.sb_stride_l);
}

}  // namespace

int launch_nvfp4_gemv(const Nvfp4GemvParams& p, const Nvfp4GemvPlan& plan, int device, void* stream_ptr) {
  if (p.m == 0 || p.l == 0) return 0;
  if (plan.rows == 0 || plan.blocks <= 0 || plan.blocks > INT32_MAX ||
      (plan.blocks_per_sm != kNvfp4DeepBlocksPerSm && plan.blocks_per_sm != kNvfp4WideBlocksPerSm) ||
      nvfp4_gemv_tasks(p.m, p.l, plan.rows, plan.splits) > INT32_MAX) {
    return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  if (plan.splits > 1 && p.workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const bool wide = rows_aligned_for_vectors(p);
  switch (plan.rows) {
    case 1: launch_rows<1>(p, plan, wide, stream); break;
    case 2: launch_rows<2>(p, plan, wide, stream); break;
    case 4: launch_rows<4>(p, plan, wide, stream); break;
    default: return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  int err = last_launch_status();
  if (err != 0 || plan.splits == 1) return err;
  const int64_t blocks = std::min<int64_t>(nvfp4_cdiv(p.m * p.l, 256), int64_t(sm_count(device)) * 8);
  nvfp4_gemv_add_splits_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, plan.splits);
  return last_launch_status();
}

}  // namespace opforge::cuda
