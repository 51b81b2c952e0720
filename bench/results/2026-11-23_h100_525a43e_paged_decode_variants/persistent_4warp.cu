// Paged GQA decode attention (see paged_decode_attention.h for the op and the plan).
//
// The op streams the KV cache: per request and KV head, every token's K and V rows are read once
// and used by all G query heads of that KV head. The arithmetic per byte is small but not
// negligible (2 * G FLOPs per element): on CUDA cores, G = 8 would need about as many issue
// slots as the memory system leaves. So a warp does it on tensor cores (mma.m16n8k16, fp32
// accumulation), with the query heads as the 16 rows of the tile:
//
//   S [16 heads x 16 tokens] = Q [16 x D] . K^T      (D / 16 k-steps per 8-token half)
//   online softmax on S in fp32, base 2 (sm_scale * log2(e) folded into one multiply)
//   O [16 heads x D] += P [16 x 16 tokens] . V       (P rounded to the input type, as any
//                                                     tensor-core attention does)
//
// The operands need no shared memory: fragments come straight from 16-byte loads. The order of the reduction
// dimension inside an mma is free as long as both operands follow it, so each lane loads
// contiguous 16-byte pieces and the head dimension is permuted consistently:
// * S = Q K^T: lane (g = lane / 4, c = lane % 4) loads K row (token) g of each 8-token half, the
//   16-byte pieces at dims 32 i + 8 c (4 lanes cover 64 contiguous bytes per instruction), and
//   the same pieces of Q rows g and g + 8; k-step j takes words 2 (j % 2) and 2 (j % 2) + 1 of
//   piece j / 2 as its slots {2c, 2c+1} and {2c+8, 2c+9}.
// * S's accumulator fragment is P's operand fragment (lane holds tokens 2c, 2c+1, 2c+8, 2c+9 of
//   rows g, g + 8), so P never leaves registers.
// * O += P V: lane (g, c) needs V of tokens 2c, 2c+1, 2c+8, 2c+9 at one dim per 8-dim tile; it
//   loads those four rows' pieces at dims 64 h + 8 g (8 lanes cover 128 contiguous bytes) and
//   tile j takes dim 64 (j / 8) + 8 g + j % 8, two tokens per register by a byte permute. O's
//   accumulator then holds dims 64 h + 16 c + [0, 16) of rows g and g + 8: two 16-byte stores.
//
// Work is cut into items (request, KV head, head chunk, chunk of tokens; paged_decode_attention.h
// says how the plan sizes them), and a grid of resident 4-warp CTAs loops over the items. Within
// an item the token warps take contiguous runs of 16-token steps, and at the item's end their
// softmax states (m, l, O) are combined through shared memory. (Staging K and V through shared
// memory with cp.async, two steps ahead, measured 15% slower on an H100: its L2 hit rate rose
// from 30% to 57%, a second L2 request per sector, and DRAM throughput fell from 90% to 77%.) A request cut into several chunks writes normalised partials
// and their lse; a second kernel merges them in chunk order, so results do not depend on
// scheduling. Page ids are fetched a step before their copies are issued: for page_size 1 every
// token is a dependent load.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "device.h"
#include "paged_decode_attention.h"
#include "vec.cuh"

namespace opforge::cuda {
namespace {

// Devices whose kernels had their shared-memory limit raised (device ordinals below this).
constexpr int kMaxDevices = 64;
constexpr float kLog2e = 1.4426950408889634f;
// -inf and NaN as bit patterns (CUDA's INFINITY is not a device constant expression everywhere).
#define OPFORGE_NEG_INF __int_as_float(0xff800000)

// D = C + A . B for one 16x8x16 tile (A 16x16 row-major fragment, B 16x8 column-major, fp32 C/D).
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the host never launches this kernel on a GPU below 8.0 (checked in Python)
#endif
}

// Two fp32 values as the two 16-bit halves of an operand register (lo: the lower k index).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, sizeof(u));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, sizeof(u));
  }
  return u;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// q is read by every split of a head: through L1/L2 like any reused data.
__device__ __forceinline__ uint4 load_q(const void* ptr) { return __ldg(static_cast<const uint4*>(ptr)); }

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Where the tokens of one request live: token t is slot t % page_size of page
// pages[t / page_size] (shifts when page_size is a power of two).
struct RequestPages {
  const int32_t* pages;
  int page_size;
  int shift;  // log2(page_size), or -1
  uint32_t num_pages;

  __device__ int index(int t) const { return shift >= 0 ? t >> shift : t / page_size; }
  __device__ int slot(int t) const { return shift >= 0 ? t & (page_size - 1) : t - index(t) * page_size; }
  // The page id of token t, or -1 past `end` (masked); a page id outside the cache is flagged.
  __device__ int32_t page(int t, int end, bool& bad) const {
    if (t >= end) return -1;
    const int32_t id = __ldg(pages + index(t));
    if (static_cast<uint32_t>(id) >= num_pages) {
      bad = true;
      return -1;
    }
    return id;
  }
};

// Page ids of a lane's tokens in one step starting at t0: K rows t0 + g and t0 + 8 + g; V rows
// t0 + 2c + {0, 1, 8, 9}. -1: masked (no load, a zero row).
struct StepPages {
  int32_t k[2];
  int32_t v[4];
};

__device__ __forceinline__ int v_token(int c, int i) { return 2 * c + (i & 1) + 8 * (i >> 1); }

__device__ __forceinline__ StepPages step_pages(const RequestPages& rp, int t0, int end, int g, int c, bool& bad) {
  StepPages s;
  s.k[0] = rp.page(t0 + g, end, bad);
  s.k[1] = rp.page(t0 + 8 + g, end, bad);
#pragma unroll
  for (int i = 0; i < 4; ++i) s.v[i] = rp.page(t0 + v_token(c, i), end, bad);
  return s;
}

// K and V rows are read exactly once: no L1 allocation, and L2 fetches whole 256-byte runs
// (a row of 128 bf16 values, or two heads' rows of 64).
__device__ __forceinline__ uint4 load_streamed(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// Barrier over the warps of one token group (the dims of one head_dim 256 row are split over two
// warps, which exchange S through shared memory every step); ids 1.. (0 is __syncthreads).
__device__ __forceinline__ void token_group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Compile-time shape of a CTA for head_dim D (paged_decode_warps / _token_warps on the device).
template <int D>
struct CtaShape {
  static constexpr int kDimWarps = D > 128 ? D / 128 : 1;   // warps side by side over a row's dims
  static constexpr int kTokenWarps = kPagedDecodeCtaWarps / kDimWarps;
  static constexpr int kDims = D / kDimWarps;               // head dims of a warp
  static constexpr int kKPieces = kDims / 32;               // 16-byte pieces of a K row per lane (4 lanes per row)
  static constexpr int kVPieces = kDims / 64;               // of a V row (8 lanes per row)
  static constexpr int kKSteps = kDims / 16;
  static constexpr int kTiles = kDims / 8;                  // 8-dim tiles of O
  // The item's end: each warp's softmax state (O fragments, then m and l of its two rows).
  static constexpr int kStateFloats = kTiles * 4 + 4;
  static constexpr int kStateBytes = kPagedDecodeCtaWarps * 32 * kStateFloats * 4;
  static constexpr int kSharedBytes = kStateBytes;
};

// The layout of request b: its first page entry, its token count, and whether it is invalid
// (kv_indptr decreasing or past num_indices, a last page length outside [1, page_size]).
struct RequestLayout {
  int32_t first;
  int n;
  bool bad;
};

__device__ __forceinline__ RequestLayout request_layout(const PagedDecodeParams& p, int64_t b) {
  RequestLayout r;
  r.first = __ldg(p.kv_indptr + b);
  const int32_t last = __ldg(p.kv_indptr + b + 1);
  r.bad = r.first < 0 || last < r.first || last > p.num_indices;
  r.n = 0;  // num_indices * page_size < 2^31, checked at launch
  if (!r.bad && last > r.first) {
    const int32_t tail = p.kv_last_page_len ? __ldg(p.kv_last_page_len + b) : static_cast<int32_t>(p.page_size);
    r.bad = tail < 1 || tail > p.page_size;
    if (!r.bad) r.n = static_cast<int>((last - r.first - 1) * p.page_size + tail);
  }
  return r;
}

// Chunks of a request in a scheduled plan: one at least (an empty or invalid request still
// writes its zeros or NaNs).
__device__ __forceinline__ int request_chunks(const RequestLayout& r, int64_t chunk_tokens) {
  return r.bad || r.n == 0 ? 1 : static_cast<int>((int64_t(r.n) + chunk_tokens - 1) / chunk_tokens);
}

// chunk_start[b] = chunks of the requests before b, b = 0..batch, into shared memory: each
// thread sums a run of requests, then the CTA scans the runs.
__device__ void number_chunks(const PagedDecodeParams& p, int64_t chunk_tokens, int* chunk_start) {
  __shared__ int run_sums[kPagedDecodeCtaWarps * 32];
  const int threads = kPagedDecodeCtaWarps * 32;
  const int batch = static_cast<int>(p.batch);
  const int per = (batch + threads - 1) / threads;
  const int lo = min(batch, static_cast<int>(threadIdx.x) * per), hi = min(batch, lo + per);
  int sum = 0;
  for (int b = lo; b < hi; ++b) sum += request_chunks(request_layout(p, b), chunk_tokens);
  run_sums[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {  // one warp scans the runs, 4 per lane
    constexpr int kPerLane = kPagedDecodeCtaWarps;
    int v[kPerLane], total = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) total += (v[i] = run_sums[threadIdx.x * kPerLane + i]);
    int incl = total;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, o);
      if (threadIdx.x >= o) incl += x;
    }
    int acc = incl - total;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      run_sums[threadIdx.x * kPerLane + i] = acc;
      acc += v[i];
    }
  }
  __syncthreads();
  int acc = run_sums[threadIdx.x];
  for (int b = lo; b < hi; ++b) {
    chunk_start[b] = acc;
    acc += request_chunks(request_layout(p, b), chunk_tokens);
  }
  if (hi == batch && lo < hi) chunk_start[batch] = acc;
  if (batch == 0 && threadIdx.x == 0) chunk_start[0] = 0;
  __syncthreads();
}

// The request whose chunks hold global chunk gc: the last b with chunk_start[b] <= gc.
__device__ __forceinline__ int request_of_chunk(const int* chunk_start, int batch, int gc) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (chunk_start[mid] <= gc) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The persistent kernel: each CTA loops over the plan's items (see paged_decode_attention.h). For
// an item, token warp tw computes the softmax state of whole steps [tw * per_warp, ...) of the
// chunk; the warps then combine their states through shared memory, each finishing one part of
// the rows' dims.
template <typename T, int D>
__global__ void __launch_bounds__(kPagedDecodeCtaWarps * 32, kPagedDecodeCtasPerSm)
    paged_decode_kernel(const PagedDecodeParams p, const PagedDecodePlan plan) {
  using S = CtaShape<D>;
  extern __shared__ __align__(16) uint8_t smem[];
  float* state = reinterpret_cast<float*>(smem);
  int* chunk_start = reinterpret_cast<int*>(smem + S::kSharedBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int dw = warp % S::kDimWarps, tw = warp / S::kDimWarps;
  const int dim0 = dw * S::kDims;

  const bool scheduled = plan.splits == 0;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t heads = p.num_kv_heads * plan.head_chunks;  // items per chunk
  int64_t items;
  if (scheduled) {
    number_chunks(p, plan.chunk_tokens, chunk_start);
    if (blockIdx.x == 0) {  // for the merge kernel
      int* ws_start = reinterpret_cast<int*>(p.workspace + plan.max_chunks * p.num_qo_heads * (D + 1));
      for (int64_t b = threadIdx.x; b <= p.batch; b += blockDim.x) ws_start[b] = chunk_start[b];
    }
    items = int64_t(chunk_start[p.batch]) * heads;
  } else {
    items = p.batch * heads * plan.splits;
  }
  const int64_t rows_total = p.batch * p.num_qo_heads;
  const float scale = p.sm_scale * kLog2e;
  const float kNegInf = OPFORGE_NEG_INF;
  const float nan = __int_as_float(0x7fffffff);
  const int page_size = static_cast<int>(p.page_size);
  const int shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    // --- what the item is: request b, KV head, head chunk, token range [begin, end) ---------
    int64_t b, hh, part;  // part: the request's chunk (scheduled) or split (static)
    int parts;            // chunks or splits of request b
    if (scheduled) {
      const int gc = static_cast<int>(item / heads);
      hh = item % heads;
      b = request_of_chunk(chunk_start, static_cast<int>(p.batch), gc);
      part = gc - chunk_start[b];
      parts = chunk_start[b + 1] - chunk_start[b];
    } else {
      part = item % plan.splits;
      hh = (item / plan.splits) % heads;
      b = item / plan.splits / heads;
      parts = plan.splits;
    }
    const int64_t kv_head = hh / plan.head_chunks;
    const int chunk = static_cast<int>(hh % plan.head_chunks);
    const int64_t head0 = kv_head * group + int64_t(chunk) * kPagedDecodeRows;
    const int rows = static_cast<int>(min64(kPagedDecodeRows, group - int64_t(chunk) * kPagedDecodeRows));
    const RequestLayout req = request_layout(p, b);
    bool bad = req.bad;
    const int n = req.n;
    int64_t span;  // tokens per part, whole steps
    if (scheduled) {
      span = plan.chunk_tokens;
    } else {
      const int64_t slice = (int64_t(n) + plan.splits - 1) / plan.splits;
      span = (slice + kPagedDecodeStep - 1) / kPagedDecodeStep * kPagedDecodeStep;
    }
    const int begin = static_cast<int>(min64(n, part * span));
    const int end = static_cast<int>(min64(n, begin + span));
    // This warp's whole steps of the part.
    const int steps = (end - begin + kPagedDecodeStep - 1) / kPagedDecodeStep;
    const int per_warp = (steps + S::kTokenWarps - 1) / S::kTokenWarps;
    const int wbegin = static_cast<int>(min64(end, begin + int64_t(tw) * per_warp * kPagedDecodeStep));
    const int wend = static_cast<int>(min64(end, wbegin + int64_t(per_warp) * kPagedDecodeStep));

    // Q as A fragments, one per k-step: rows g and g + 8 (zero past the chunk's heads).
    uint32_t qa[S::kKSteps][4];
    {
      const T* q_rows = static_cast<const T*>(p.q) + b * p.q_stride_b + head0 * p.q_stride_h + dim0;
#pragma unroll
      for (int i = 0; i < S::kKPieces; ++i) {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 r0 = g < rows ? load_q(q_rows + g * p.q_stride_h + 32 * i + 8 * c) : zero;
        const uint4 r1 = g + 8 < rows ? load_q(q_rows + (g + 8) * p.q_stride_h + 32 * i + 8 * c) : zero;
        qa[2 * i][0] = r0.x, qa[2 * i][1] = r1.x, qa[2 * i][2] = r0.y, qa[2 * i][3] = r1.y;
        qa[2 * i + 1][0] = r0.z, qa[2 * i + 1][1] = r1.z, qa[2 * i + 1][2] = r0.w, qa[2 * i + 1][3] = r1.w;
      }
    }

    const RequestPages rp{p.kv_indices + (bad ? 0 : req.first), page_size, shift, static_cast<uint32_t>(p.num_pages)};
    const T* k_head = static_cast<const T*>(p.k_cache) + kv_head * p.k_stride_head + dim0;
    const T* v_head = static_cast<const T*>(p.v_cache) + kv_head * p.v_stride_head + dim0;

    float o[S::kTiles][4];
#pragma unroll
    for (int j = 0; j < S::kTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {kNegInf, kNegInf};  // running max of rows g, g + 8 (base-2 logits)
    float l[2] = {0.f, 0.f};          // this lane's share of the running sums
    bool bad_page = false;
    // Parts of S from the dim warps (head_dim 256), double-buffered by step parity.
    __shared__ float4 s_parts[S::kDimWarps > 1 ? 2 : 1][kPagedDecodeCtaWarps][2][32];
    int parity = 0;

    StepPages cur = step_pages(rp, wbegin, wend, g, c, bad_page);
    for (int t0 = wbegin; t0 < wend; t0 += kPagedDecodeStep) {
      // Every load of the step first: K for S, V for later, then the next step's page ids.
      uint4 kr[2][S::kKPieces], vr[4][S::kVPieces];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t page = cur.k[h];
        const T* row =
            k_head + int64_t(page) * p.k_stride_page + int64_t(rp.slot(t0 + 8 * h + g)) * p.k_stride_slot + 8 * c;
#pragma unroll
        for (int i = 0; i < S::kKPieces; ++i) kr[h][i] = page >= 0 ? load_streamed(row + 32 * i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int32_t page = cur.v[t];
        const T* row =
            v_head + int64_t(page) * p.v_stride_page + int64_t(rp.slot(t0 + v_token(c, t))) * p.v_stride_slot + 8 * g;
#pragma unroll
        for (int i = 0; i < S::kVPieces; ++i) vr[t][i] = page >= 0 ? load_streamed(row + 64 * i) : make_uint4(0, 0, 0, 0);
      }
      if (t0 + kPagedDecodeStep < wend) cur = step_pages(rp, t0 + kPagedDecodeStep, wend, g, c, bad_page);

      // S = Q K^T: half h holds tokens t0 + 8 h + [0, 8); lane holds columns 2c, 2c + 1.
      float s[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0.f;
#pragma unroll
        for (int j = 0; j < S::kKSteps; ++j) {
          mma_16x8x16<T>(s[h], qa[j], word(kr[h][j / 2], 2 * (j % 2)), word(kr[h][j / 2], 2 * (j % 2) + 1));
        }
      }
      if constexpr (S::kDimWarps > 1) {
        s_parts[parity][warp][0][lane] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
        s_parts[parity][warp][1][lane] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
        token_group_sync(1 + tw, S::kDimWarps * 32);
        const int first_warp = tw * S::kDimWarps;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float4 sum = s_parts[parity][first_warp][h][lane];
#pragma unroll
          for (int w = 1; w < S::kDimWarps; ++w) {
            const float4 x = s_parts[parity][first_warp + w][h][lane];
            sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
          }
          s[h][0] = sum.x, s[h][1] = sum.y, s[h][2] = sum.z, s[h][3] = sum.w;
        }
        parity ^= 1;
      }
      // Online softmax in base 2: s[h][0..1] are row g's, s[h][2..3] row g + 8's.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[h][e] = t0 + 8 * h + 2 * c + (e & 1) < wend ? s[h][e] * scale : kNegInf;
        }
      }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[r], mx);
        const float base = m_new == kNegInf ? 0.f : m_new;  // nothing seen yet: keeps exp2 off -inf - -inf
        alpha[r] = exp2f(m[r] - base);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s[h][2 * r] = exp2f(s[h][2 * r] - base);
          s[h][2 * r + 1] = exp2f(s[h][2 * r + 1] - base);
        }
        l[r] = l[r] * alpha[r] + ((s[0][2 * r] + s[0][2 * r + 1]) + (s[1][2 * r] + s[1][2 * r + 1]));
        m[r] = m_new;
      }
      // O = alpha O + P V over the step's 16 tokens (k slot i <-> token t0 + i).
      const uint32_t pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]), pack2<T>(s[1][0], s[1][1]),
                              pack2<T>(s[1][2], s[1][3])};
#pragma unroll
      for (int j = 0; j < S::kTiles; ++j) {
        o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
        const int piece = j / 8, w = (j % 8) / 2;
        const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;  // the high or low halves of two words
        const uint32_t b0 = __byte_perm(word(vr[0][piece], w), word(vr[1][piece], w), sel);
        const uint32_t b1 = __byte_perm(word(vr[2][piece], w), word(vr[3][piece], w), sel);
        mma_16x8x16<T>(o[j], pa, b0, b1);
      }
    }

    // Row sums over the 4 lanes of each row; a bad page id anywhere spoils the whole item.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    bad = bad || __syncthreads_or(bad_page);  // also: the previous item's state has been read

    // --- combine the token warps' states; warp tw finishes (piece, row half) parts tw, tw + kTokenWarps, ...
    {
      float* mine = state + (warp * 32 + lane) * S::kStateFloats;
#pragma unroll
      for (int j = 0; j < S::kTiles; ++j) {
        reinterpret_cast<float4*>(mine)[j] = make_float4(o[j][0], o[j][1], o[j][2], o[j][3]);
      }
      reinterpret_cast<float4*>(mine)[S::kTiles] = make_float4(m[0], m[1], l[0], l[1]);
    }
    __syncthreads();
    for (int unit = tw; unit < 2 * S::kVPieces; unit += S::kTokenWarps) {
      const int piece = unit >> 1, r = unit & 1;
      const int row = g + 8 * r;
      float mx = kNegInf;
#pragma unroll
      for (int t = 0; t < S::kTokenWarps; ++t) {
        const float* st = state + ((t * S::kDimWarps + dw) * 32 + lane) * S::kStateFloats;
        mx = fmaxf(mx, st[4 * S::kTiles + r]);
      }
      float lo[8] = {0, 0, 0, 0, 0, 0, 0, 0}, hi[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      float total = 0.f;
#pragma unroll
      for (int t = 0; t < S::kTokenWarps; ++t) {
        const float* st = state + ((t * S::kDimWarps + dw) * 32 + lane) * S::kStateFloats;
        const float mt = st[4 * S::kTiles + r];
        const float w = mt == kNegInf ? 0.f : exp2f(mt - mx);  // a warp without tokens adds nothing
        total += w * st[4 * S::kTiles + 2 + r];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          lo[e] += w * st[4 * (8 * piece + e) + 2 * r];
          hi[e] += w * st[4 * (8 * piece + e) + 2 * r + 1];
        }
      }
      if (row >= rows) continue;
      const int64_t head = head0 + row;
      // total == 0: no token (a zero output, lse -inf); a NaN stays NaN.
      const float inv = bad ? nan : total == 0.f ? 0.f : 1.f / total;
      const float lse = bad ? nan : total == 0.f ? kNegInf : mx + log2f(total);
#pragma unroll
      for (int e = 0; e < 8; ++e) lo[e] *= inv, hi[e] *= inv;
      const int dim = dim0 + 64 * piece + 16 * c;  // dims 64 piece + 16 c + [0, 8) and + [8, 16)
      // Scheduled: partial row gc = chunk_start[b] + part; static: split `part`.
      const int64_t partial = scheduled ? (int64_t(chunk_start[b]) + part) * p.num_qo_heads + head
                                        : part * rows_total + b * p.num_qo_heads + head;
      const int64_t partial_rows = scheduled ? plan.max_chunks * p.num_qo_heads : int64_t(plan.splits) * rows_total;
      if (parts == 1) {
        T* out = static_cast<T*>(p.out) + b * p.out_stride_b + head * p.out_stride_h + dim;
        store_float<T, 8>(out, lo);
        store_float<T, 8>(out + 8, hi);
      } else {
        float4* ws = reinterpret_cast<float4*>(p.workspace + partial * D + dim);
        ws[0] = make_float4(lo[0], lo[1], lo[2], lo[3]);
        ws[1] = make_float4(lo[4], lo[5], lo[6], lo[7]);
        ws[2] = make_float4(hi[0], hi[1], hi[2], hi[3]);
        ws[3] = make_float4(hi[4], hi[5], hi[6], hi[7]);
      }
      if (c == 0 && dw == 0 && piece == 0) {
        if (parts == 1) {
          p.lse[b * p.lse_stride_b + head * p.lse_stride_h] = lse;
        } else {
          p.workspace[partial_rows * D + partial] = lse;
        }
      }
    }
    __syncthreads();  // the state is read before the next item's copies land there
  }
}

// Second pass: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse), lse = max +
// log2(sum w), over a request's parts in order. D / 4 threads per (request, head) row, 4 dims
// each. Scheduled plans: rows of one-chunk requests were written by the main kernel.
template <typename T, int D>
__global__ void __launch_bounds__(128) paged_decode_merge_kernel(const PagedDecodeParams p, const PagedDecodePlan plan) {
  constexpr int kLanes = D / 4;
  constexpr int kRowsPerBlock = 128 / kLanes;
  const int64_t rows_total = p.batch * p.num_qo_heads;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  if (row >= rows_total) return;
  const int64_t b = row / p.num_qo_heads, head = row % p.num_qo_heads;
  int64_t first, stride, partial_rows;
  int parts;
  if (plan.splits == 0) {
    const int* chunk_start = reinterpret_cast<const int*>(p.workspace + plan.max_chunks * p.num_qo_heads * (D + 1));
    const int cs = chunk_start[b];
    parts = chunk_start[b + 1] - cs;
    if (parts <= 1) return;
    first = int64_t(cs) * p.num_qo_heads + head;
    stride = p.num_qo_heads;
    partial_rows = plan.max_chunks * p.num_qo_heads;
  } else {
    parts = plan.splits;
    first = row;
    stride = rows_total;
    partial_rows = int64_t(plan.splits) * rows_total;
  }
  const int dim = (threadIdx.x % kLanes) * 4;
  const float* lse_s = p.workspace + partial_rows * D;
  const float kNegInf = OPFORGE_NEG_INF;
  const float nan = __int_as_float(0x7fffffff);
  float mx = kNegInf;
  bool bad = false;
  for (int s = 0; s < parts; ++s) {
    const float x = lse_s[first + s * stride];
    bad = bad || isnan(x);
    mx = fmaxf(mx, x);
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float total = 0.f;
  if (!bad && mx != kNegInf) {
    for (int s = 0; s < parts; ++s) {
      const float w = exp2f(lse_s[first + s * stride] - mx);  // an empty part: 2^-inf = 0
      float o[4];
      to_floats(load_vec<float, 4>(p.workspace + (first + s * stride) * D + dim), o);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = fmaf(w, o[e], acc[e]);
      total += w;
    }
  }
  const float inv = bad ? nan : total == 0.f ? 0.f : 1.f / total;
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] *= inv;
  store_float<T, 4>(static_cast<T*>(p.out) + b * p.out_stride_b + head * p.out_stride_h + dim, acc);
  if (dim == 0) {
    p.lse[b * p.lse_stride_b + head * p.lse_stride_h] = bad ? nan : total == 0.f ? kNegInf : mx + log2f(total);
  }
}

template <typename T, int D>
int launch_typed(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  using S = CtaShape<D>;
  static_assert(S::kDimWarps == paged_decode_warps(D), "the plan counts the kernel's warps");
  const int64_t shared = S::kSharedBytes + (plan.splits == 0 ? (p.batch + 1) * int64_t(sizeof(int)) : 0);
  auto kernel = paged_decode_kernel<T, D>;
  // Raised once per kernel and device, to what the largest scheduled batch asks.
  static std::atomic<bool> raised[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  if (!raised[device].load(std::memory_order_acquire)) {
    const int err = static_cast<int>(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        S::kSharedBytes + static_cast<int>((kPagedDecodeMaxScheduledBatch + 1) * sizeof(int))));
    if (err != 0) return err;
    raised[device].store(true, std::memory_order_release);
  }
  kernel<<<static_cast<unsigned>(plan.ctas), kPagedDecodeCtaWarps * 32, static_cast<size_t>(shared), stream>>>(p, plan);
  const int err = last_launch_status();
  if (err != 0) return err;
  // A merge when some request may have more than one part.
  const bool merge = plan.splits == 0 ? plan.max_chunks - p.batch > 1 : plan.splits > 1;
  if (!merge) return 0;
  constexpr int kRowsPerBlock = 128 / (D / 4);
  const int64_t blocks = paged_decode_cdiv(p.batch * p.num_qo_heads, kRowsPerBlock);
  paged_decode_merge_kernel<T, D><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(p, plan);
  return last_launch_status();
}

template <int D>
int launch_dim(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kBFloat16: return launch_typed<__nv_bfloat16, D>(p, plan, device, stream);
    case DType::kFloat16: return launch_typed<__half, D>(p, plan, device, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int launch_paged_decode_attention(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device,
                                  void* stream_ptr) {
  if (p.batch == 0 || p.num_qo_heads == 0) return 0;
  if (plan.head_chunks == 0 || plan.ctas <= 0 || plan.ctas > INT32_MAX ||
      p.num_indices * p.page_size > INT32_MAX || p.batch * p.num_qo_heads > INT32_MAX) {
    return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  if ((plan.splits == 0 || plan.splits > 1) && p.workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  if (plan.splits == 0 && p.batch > kPagedDecodeMaxScheduledBatch) return static_cast<int>(cudaErrorInvalidConfiguration);
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.head_dim) {
    case 64: return launch_dim<64>(p, plan, device, stream);
    case 128: return launch_dim<128>(p, plan, device, stream);
    case 256: return launch_dim<256>(p, plan, device, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace opforge::cuda
