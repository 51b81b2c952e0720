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
// A CTA is one task (request, KV head, head chunk, split), one warp per 128 head dims; the plan picks enough
// splits to fill the GPU, and a second kernel merges split partials (normalised outputs and
// their lse) in split order, so results do not depend on scheduling. Page ids of the next
// 16-token step are fetched while the current one computes: for page_size 1 every token is a
// dependent load.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device.h"
#include "paged_decode_attention.h"
#include "vec.cuh"

namespace opforge::cuda {
namespace {

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

// K and V rows are read exactly once: no L1 allocation, and L2 fetches whole 256-byte runs
// (a row of 128 bf16 values, or two heads' rows of 64).
__device__ __forceinline__ uint4 load_streamed(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
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

// The layout of request b: its first page entry, its token count, and whether it is invalid
// (kv_indptr decreasing or past num_indices, a last page length outside [1, page_size]).
struct RequestLayout {
  int32_t first;
  int n;  // num_indices * page_size < 2^31, checked at launch
  bool bad;
};

__device__ __forceinline__ RequestLayout request_layout(const PagedDecodeParams& p, int64_t b) {
  RequestLayout r;
  r.first = __ldg(p.kv_indptr + b);
  const int32_t last = __ldg(p.kv_indptr + b + 1);
  r.bad = r.first < 0 || last < r.first || last > p.num_indices;
  r.n = 0;
  if (!r.bad && last > r.first) {
    const int32_t tail = p.kv_last_page_len ? __ldg(p.kv_last_page_len + b) : static_cast<int32_t>(p.page_size);
    r.bad = tail < 1 || tail > p.page_size;
    if (!r.bad) r.n = static_cast<int>((last - r.first - 1) * p.page_size + tail);
  }
  return r;
}

// A scheduled plan's numbering, in the workspace after the partial rows and their lse
// (paged_decode_schedule_elems).
struct PagedDecodeSchedule {
  int32_t* base;
  int64_t batch;
  __device__ PagedDecodeSchedule(const PagedDecodeParams& p, const PagedDecodePlan& plan)
      : base(reinterpret_cast<int32_t*>(p.workspace + plan.max_partials * p.num_qo_heads * (p.head_dim + 1))),
        batch(p.batch) {}
  __device__ int64_t chunk_tokens() const { return base[0]; }
  __device__ int64_t chunks() const { return base[1]; }
  __device__ int64_t start(int64_t b) const { return base[2 + b]; }
  __device__ int64_t partial_start(int64_t b) const { return base[2 + batch + 1 + b]; }
  __device__ int64_t request(int64_t gc) const { return base[2 + 2 * batch + 1 + gc]; }
  __device__ int32_t* starts() const { return base + 2; }
  __device__ int32_t* partial_starts() const { return base + 2 + batch + 1; }
  __device__ int32_t* requests() const { return base + 2 + 2 * batch + 1; }
};

// Chunks of a request: one at least (an empty or invalid request still writes its zeros or NaNs).
__device__ __forceinline__ int request_chunks(const RequestLayout& r, int64_t chunk_tokens) {
  return r.bad || r.n == 0 ? 1 : static_cast<int>((int64_t(r.n) + chunk_tokens - 1) / chunk_tokens);
}

constexpr int kScheduleThreads = 1024;

// Block-wide exclusive prefix sum of one int per thread; returns it and sets `total`.
__device__ int block_exclusive_sum(int v, int& total) {
  __shared__ int warp_sums[kScheduleThreads / 32];
  __shared__ int grand;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_sums[lane];
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += x;
    }
    warp_sums[lane] = wi - w;  // exclusive
    if (lane == 31) grand = wi;
  }
  __syncthreads();
  const int result = warp_sums[warp] + incl - v;
  total = grand;
  __syncthreads();  // every thread has read warp_sums and grand before the next call writes them
  return result;
}

// First kernel of a scheduled plan (one CTA): reads every request's length, chooses the chunk
// length C (paged_decode_chunk_tokens, unless the plan forces one), numbers the chunks and
// lists their requests.
__global__ void __launch_bounds__(kScheduleThreads) paged_decode_schedule_kernel(const PagedDecodeParams p,
                                                                                 const PagedDecodePlan plan) {
  __shared__ unsigned long long s_total;
  __shared__ int s_longest, s_chunk;
  if (threadIdx.x == 0) s_total = 0, s_longest = 0;
  __syncthreads();
  unsigned long long total = 0;
  int longest = 0;
  for (int64_t b = threadIdx.x; b < p.batch; b += kScheduleThreads) {
    const RequestLayout r = request_layout(p, b);
    total += r.n;
    longest = max(longest, r.n);
  }
  atomicAdd(&s_total, total);
  atomicMax(&s_longest, longest);
  __syncthreads();
  const int64_t heads = p.num_kv_heads * plan.head_chunks;
  if (threadIdx.x == 0) {
    s_chunk = static_cast<int>(plan.chunk_tokens > 0 ? plan.chunk_tokens
                                                     : paged_decode_chunk_tokens(static_cast<int64_t>(s_total),
                                                                                 s_longest, heads, plan.slots));
  }
  __syncthreads();
  const int64_t chunk_tokens = s_chunk;
  const PagedDecodeSchedule sched(p, plan);
  int32_t* start = sched.starts();
  int32_t* partial_start = sched.partial_starts();
  int32_t* request = sched.requests();
  int carry = 0, partial_carry = 0;
  for (int64_t b0 = 0; b0 < p.batch; b0 += kScheduleThreads) {
    const int64_t b = b0 + threadIdx.x;
    const int count = b < p.batch ? request_chunks(request_layout(p, b), chunk_tokens) : 0;
    int tile_total, tile_partials;
    const int first = carry + block_exclusive_sum(count, tile_total);
    const int first_partial = partial_carry + block_exclusive_sum(count > 1 ? count : 0, tile_partials);
    partial_carry += tile_partials;
    if (b < p.batch) {
      start[b] = first;
      partial_start[b] = first_partial;
      // The chunks never outnumber plan.max_chunks (paged_decode_chunk_tokens); the bound is
      // kept anyway, so that the workspace is never overrun.
      for (int j = 0; j < count && first + j < plan.max_chunks; ++j) request[first + j] = static_cast<int32_t>(b);
    }
    carry += tile_total;
  }
  if (threadIdx.x == 0) {
    start[p.batch] = carry;
    sched.base[0] = s_chunk;
    sched.base[1] = carry;
  }
}

// paged_decode_warps(D) as a device-side constant (launch_typed checks that they agree).
template <int D>
constexpr int kWarpsOf = D > 128 ? D / 128 : 1;

// One task per CTA: the query heads head0 .. head0 + rows - 1 (one KV head's, at most 16) of
// request b over the tokens of one split. Head dims above 128 are shared out over warps, 128
// each (the accumulators of 256 dims would not fit one warp's registers); each warp computes its
// part of S, and the parts are added through shared memory in warp order, so every warp holds
// the same S. See the file comment for the fragment layouts.
template <typename T, int D>
__global__ void __launch_bounds__(kWarpsOf<D> * 32, kPagedDecodeWarpsPerSm / kWarpsOf<D>)
    paged_decode_kernel(const PagedDecodeParams p, const PagedDecodePlan plan) {
  constexpr int kWarps = kWarpsOf<D>;
  constexpr int kDims = D / kWarps;         // head dims of this warp
  constexpr int kKPieces = kDims / 32;      // 16-byte pieces of a K row per lane (4 lanes per row)
  constexpr int kVPieces = kDims / 64;      // of a V row (8 lanes per row)
  constexpr int kKSteps = kDims / 16;
  constexpr int kTiles = kDims / 8;         // 8-dim tiles of O
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int dim0 = warp * kDims;

  const int head_chunks = plan.head_chunks;
  const int64_t heads = p.num_kv_heads * head_chunks;  // tasks per part
  const int64_t rows_total = p.batch * p.num_qo_heads;
  // Static: tasks numbered ((b * num_kv_heads + kv_head) * head_chunks + chunk) * splits + split
  // (the splits of one head next to each other). Scheduled: task = gc * heads + kv_head *
  // head_chunks + chunk for the batch's chunk gc, which the schedule kernel numbered.
  uint32_t task = blockIdx.x;
  int64_t b, hh, part, span;
  int parts;
  const PagedDecodeSchedule sched(p, plan);  // (read only by scheduled plans)
  if (plan.splits == 0) {
    const int64_t gc = task / heads;
    if (gc >= sched.chunks()) return;  // the grid is a bound
    hh = task % heads;
    b = sched.request(gc);
    part = gc - sched.start(b);
    parts = static_cast<int>(sched.start(b + 1) - sched.start(b));
    span = sched.chunk_tokens();
  } else {
    part = task % plan.splits;
    hh = (task / plan.splits) % heads;
    b = task / plan.splits / heads;
    parts = plan.splits;
    span = 0;  // below, from the request's length
  }
  const int chunk = static_cast<int>(hh % head_chunks);
  const int64_t kv_head = hh / head_chunks;
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  const int64_t head0 = kv_head * group + int64_t(chunk) * kPagedDecodeRows;
  const int rows = static_cast<int>(min64(kPagedDecodeRows, group - int64_t(chunk) * kPagedDecodeRows));

  // The request's layout (uniform across the warp). Invalid layouts give NaN, never a read
  // outside kv_indices or the caches.
  const RequestLayout req = request_layout(p, b);
  const int32_t first = req.first;
  bool bad = req.bad;
  const int n = req.n;
  if (plan.splits > 0) {  // static: equal slices of whole steps
    const int64_t slice = (int64_t(n) + plan.splits - 1) / plan.splits;
    span = (slice + kPagedDecodeStep - 1) / kPagedDecodeStep * kPagedDecodeStep;
  }
  const int begin = static_cast<int>(min64(n, part * span));
  const int end = static_cast<int>(min64(n, begin + span));

  // Q as A fragments, one per k-step: rows g and g + 8 (zero past the chunk's heads).
  uint32_t qa[kKSteps][4];
  {
    const T* q_rows = static_cast<const T*>(p.q) + b * p.q_stride_b + head0 * p.q_stride_h + dim0;
#pragma unroll
    for (int i = 0; i < kKPieces; ++i) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 r0 = g < rows ? load_q(q_rows + g * p.q_stride_h + 32 * i + 8 * c) : zero;
      const uint4 r1 = g + 8 < rows ? load_q(q_rows + (g + 8) * p.q_stride_h + 32 * i + 8 * c) : zero;
      qa[2 * i][0] = r0.x, qa[2 * i][1] = r1.x, qa[2 * i][2] = r0.y, qa[2 * i][3] = r1.y;
      qa[2 * i + 1][0] = r0.z, qa[2 * i + 1][1] = r1.z, qa[2 * i + 1][2] = r0.w, qa[2 * i + 1][3] = r1.w;
    }
  }

  const int page_size = static_cast<int>(p.page_size);
  const RequestPages rp{p.kv_indices + (bad ? 0 : first), page_size,
                        (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1,
                        static_cast<uint32_t>(p.num_pages)};
  const T* k_head = static_cast<const T*>(p.k_cache) + kv_head * p.k_stride_head + dim0;
  const T* v_head = static_cast<const T*>(p.v_cache) + kv_head * p.v_stride_head + dim0;
  const float scale = p.sm_scale * kLog2e;
  const float kNegInf = OPFORGE_NEG_INF;

  float o[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {kNegInf, kNegInf};  // running max of rows g, g + 8 (base-2 logits)
  float l[2] = {0.f, 0.f};          // this lane's share of the running sums
  bool bad_page = false;
  // Parts of S from every warp (kWarps > 1), double-buffered by step parity: a warp writes the
  // next step's buffer only after all have passed this step's barrier.
  __shared__ float4 s_parts[kWarps > 1 ? 2 : 1][kWarps][2][32];
  int parity = 0;

  StepPages cur = step_pages(rp, begin, end, g, c, bad_page);
  for (int t0 = begin; t0 < end; t0 += kPagedDecodeStep) {
    // Every load of the step first: K for S, V for later, then the next step's page ids.
    uint4 kr[2][kKPieces], vr[4][kVPieces];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t page = cur.k[h];
      const T* row =
          k_head + int64_t(page) * p.k_stride_page + int64_t(rp.slot(t0 + 8 * h + g)) * p.k_stride_slot + 8 * c;
#pragma unroll
      for (int i = 0; i < kKPieces; ++i) kr[h][i] = page >= 0 ? load_streamed(row + 32 * i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int32_t page = cur.v[t];
      const T* row =
          v_head + int64_t(page) * p.v_stride_page + int64_t(rp.slot(t0 + v_token(c, t))) * p.v_stride_slot + 8 * g;
#pragma unroll
      for (int i = 0; i < kVPieces; ++i) vr[t][i] = page >= 0 ? load_streamed(row + 64 * i) : make_uint4(0, 0, 0, 0);
    }
    if (t0 + kPagedDecodeStep < end) cur = step_pages(rp, t0 + kPagedDecodeStep, end, g, c, bad_page);

    // S = Q K^T: half h holds tokens t0 + 8 h + [0, 8); lane holds columns 2c, 2c + 1.
    float s[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0.f;
#pragma unroll
      for (int j = 0; j < kKSteps; ++j) {
        mma_16x8x16<T>(s[h], qa[j], word(kr[h][j / 2], 2 * (j % 2)), word(kr[h][j / 2], 2 * (j % 2) + 1));
      }
    }
    if constexpr (kWarps > 1) {
      s_parts[parity][warp][0][lane] = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
      s_parts[parity][warp][1][lane] = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
      __syncthreads();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float4 sum = s_parts[parity][0][h][lane];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
          const float4 part = s_parts[parity][w][h][lane];
          sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
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
        s[h][e] = t0 + 8 * h + 2 * c + (e & 1) < end ? s[h][e] * scale : kNegInf;
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
    for (int j = 0; j < kTiles; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
      const int piece = j / 8, w = (j % 8) / 2;
      const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;  // the high or low halves of two words
      const uint32_t b0 = __byte_perm(word(vr[0][piece], w), word(vr[1][piece], w), sel);
      const uint32_t b1 = __byte_perm(word(vr[2][piece], w), word(vr[3][piece], w), sel);
      mma_16x8x16<T>(o[j], pa, b0, b1);
    }
  }

  // Row sums over the 4 lanes of each row; a bad page id anywhere spoils the whole task.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // Every warp fetched the same page ids, so each one's flag is the task's.
  bad = bad || __any_sync(0xffffffffu, bad_page);
  const float nan = __int_as_float(0x7fffffff);
  // Partial rows of this part (+ head): the chunk's (scheduled) or the split's (static).
  const int64_t partial_rows = plan.splits == 0 ? plan.max_partials * p.num_qo_heads : int64_t(plan.splits) * rows_total;
  const int64_t partial0 = plan.splits == 0 ? (sched.partial_start(b) + part) * p.num_qo_heads
                                            : part * rows_total + b * p.num_qo_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= rows) continue;
    const int64_t head = head0 + row;
    // l == 0: no token (a zero output, lse -inf); a NaN l stays NaN.
    const float inv = bad ? nan : l[r] == 0.f ? 0.f : 1.f / l[r];
    const float lse = bad ? nan : l[r] == 0.f ? kNegInf : m[r] + log2f(l[r]);
#pragma unroll
    for (int piece = 0; piece < kVPieces; ++piece) {
      float lo[8], hi[8];  // dims 64 piece + 16 c + [0, 8) and + [8, 16)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        lo[e] = o[8 * piece + e][2 * r] * inv;
        hi[e] = o[8 * piece + e][2 * r + 1] * inv;
      }
      const int dim = dim0 + 64 * piece + 16 * c;
      if (parts == 1) {
        T* out = static_cast<T*>(p.out) + b * p.out_stride_b + head * p.out_stride_h + dim;
        store_float<T, 8>(out, lo);
        store_float<T, 8>(out + 8, hi);
      } else {
        float4* ws = reinterpret_cast<float4*>(p.workspace + (partial0 + head) * D + dim);
        ws[0] = make_float4(lo[0], lo[1], lo[2], lo[3]);
        ws[1] = make_float4(lo[4], lo[5], lo[6], lo[7]);
        ws[2] = make_float4(hi[0], hi[1], hi[2], hi[3]);
        ws[3] = make_float4(hi[4], hi[5], hi[6], hi[7]);
      }
    }
    if (c == 0 && warp == 0) {
      if (parts == 1) {
        p.lse[b * p.lse_stride_b + head * p.lse_stride_h] = lse;
      } else {
        p.workspace[partial_rows * D + (partial0 + head)] = lse;
      }
    }
  }
}

// Second pass: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse), lse = max +
// log2(sum w), over a request's parts in order. D / 4 threads per (request, head) row, 4 dims
// each. Scheduled plans: the rows of one-chunk requests were written by the main kernel.
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
    const PagedDecodeSchedule sched(p, plan);
    parts = static_cast<int>(sched.start(b + 1) - sched.start(b));
    if (parts <= 1) return;
    first = sched.partial_start(b) * p.num_qo_heads + head;
    stride = p.num_qo_heads;
    partial_rows = plan.max_partials * p.num_qo_heads;
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
int launch_typed(const PagedDecodeParams& p, const PagedDecodePlan& plan, cudaStream_t stream) {
  static_assert(kWarpsOf<D> == paged_decode_warps(D), "the plan counts the kernel's warps");
  if (plan.splits == 0) {
    paged_decode_schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(p, plan);
    const int err = last_launch_status();
    if (err != 0) return err;
  }
  paged_decode_kernel<T, D><<<static_cast<unsigned>(plan.ctas), kWarpsOf<D> * 32, 0, stream>>>(p, plan);
  const int err = last_launch_status();
  if (err != 0 || plan.splits == 1) return err;
  constexpr int kRowsPerBlock = 128 / (D / 4);
  const int64_t blocks = paged_decode_cdiv(p.batch * p.num_qo_heads, kRowsPerBlock);
  paged_decode_merge_kernel<T, D><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(p, plan);
  return last_launch_status();
}

template <int D>
int launch_dim(const PagedDecodeParams& p, const PagedDecodePlan& plan, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kBFloat16: return launch_typed<__nv_bfloat16, D>(p, plan, stream);
    case DType::kFloat16: return launch_typed<__half, D>(p, plan, stream);
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
  if (plan.splits != 1 && p.workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.head_dim) {
    case 64: return launch_dim<64>(p, plan, stream);
    case 128: return launch_dim<128>(p, plan, stream);
    case 256: return launch_dim<256>(p, plan, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace opforge::cuda
