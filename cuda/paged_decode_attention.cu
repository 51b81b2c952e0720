// Paged GQA decode attention (see paged_decode_attention.h for the op and the plan).
//
// The op streams the KV cache: per request and KV head, every token's K and V rows are read once
// and used by all G query heads of that KV head. The arithmetic per byte is small but not
// negligible (2 * G FLOPs per element): on CUDA cores, G = 8 would need about as many issue
// slots as the memory system leaves. So a warp does it on tensor cores (mma.m16n8k16, fp32
// accumulation), with the query heads as the N dimension of the tiles (8 per tile; one tile when
// a KV head has at most 8 query heads, as in h32_kv8 and h32_kv4, else two):
//
//   S^T [16 tokens x 8 heads] = K [16 x D] . Q^T     (D / 16 k-steps)
//   online softmax on S in fp32, base 2 (sm_scale * log2(e) folded into one multiply)
//   O^T [D x 8 heads] += V^T [D x 16 tokens] . P^T   (P rounded to the input type, as any
//                                                     tensor-core attention does)
//
// With 16 heads as the M dimension, G = 4 used a quarter of each tile and twice the mma and
// rescaling instructions per step (a lone warp's step was measured bound by its own instruction
// chain, not by waiting for memory).
//
// Per task (request, KV head, head chunk, split) one warp per 128 head dims (or per run of the
// task's tokens) streams its tokens in steps of 16 through a ring of kStages steps in shared memory:
// * Copies: each step's 16 K rows and 16 V rows are copied by cp.async, whole rows per
//   instruction (16 lanes x 16 bytes cover a 256-byte row), one commit group per step, kStages - 1
//   steps in flight while the warp computes one. A register-only design (16-byte loads straight
//   into mma fragments) needs per-lane address arithmetic for every piece, asks the memory system
//   for 64-byte pieces, and makes a lone warp wait a round trip per step; this ring halves a lone
//   warp's time per step (bench/results/2026-11-26_h100_*_paged_decode_ring/). Page ids are fetched
//   a step before their copies are issued and checked only there, so the warp never waits on
//   them. Tokens past a split's end and rows of a bad page id are zero-filled by the copy itself
//   (source size 0), so P V stays finite where P is 0.
// * Fragments: ldmatrix in the mma layouts, so the head dimension keeps its natural order.
//   S^T = K Q^T: ldmatrix.x4 of K rows (tokens) gives the A fragment of one 16-dim k-step (even
//   and odd k-steps accumulate apart: two shorter dependent chains); Q^T's B fragments are read
//   once from global memory. Lane (g = lane / 4, c = lane % 4) of S^T holds tokens g, g + 8 of
//   heads 2c, 2c + 1, so a head's max and sum reduce over the 8 lanes of its c. P^T's B fragment
//   wants tokens 2c, 2c + 1 (+ 8) of head g: each 8x8 half of P, packed to the input type, is
//   transposed in registers (movmatrix). O^T += V^T P^T: ldmatrix.x4.trans of V rows gives the A
//   fragment of a 16-dim tile; O^T's tile i holds dims 16 i + g, 16 i + g + 8 of heads 2c, 2c + 1.
//   Each row's 16-byte chunks are permuted by an xor with the row index (RingLayout::offset), so
//   the 8 rows of an ldmatrix fall in distinct banks and a copy's 128-byte lines stay whole in
//   shared memory (rows padded by 16 bytes instead split each line in two: 1.5x the L2 sector
//   reads, and the L2, not DRAM, was the busiest unit).
//
// The plan cuts each request's tokens into enough parts to fill the GPU: up to 4 warps of one
// CTA share a task's slice (equal runs of whole steps, each warp with its own ring; the first
// warp combines their states through shared memory at the end), and beyond that the slices are
// split across CTAs, whose normalised partial outputs and lse a second kernel merges. Both
// combine in a fixed order, so results do not depend on scheduling.
// A caller that says its batch is skewed gets page ranges instead (PagedDecodePlan::ranges): equal
// runs of the batch's pages, one CTA each, the parts of a request cut into runs for its warps as a
// task's slice is, and the requests that cross a run's edge merged by a second kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device.h"
#include "launch.cuh"
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

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Where the tokens of one request live: token t is slot t % page_size of page
// pages[t / page_size] (shifts when page_size is a power of two); ids below num_pages are valid.
struct RequestPages {
  const int32_t* pages;
  int page_size;
  int shift;  // log2(page_size), or -1
  uint32_t num_pages;

  // The pages of a request starting at `pages` (shifts worked out from page_size).
  __device__ static RequestPages of(const int32_t* pages, int page_size, int64_t num_pages) {
    return {pages, page_size, (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1,
            static_cast<uint32_t>(num_pages)};
  }
  __device__ int index(int t) const { return shift >= 0 ? t >> shift : t / page_size; }
  __device__ int slot(int t) const { return shift >= 0 ? t & (page_size - 1) : t - index(t) * page_size; }
};

// paged_decode_warps(D) as a device-side constant (launch_typed checks that they agree).
template <int D>
constexpr int kWarpsOf = D > 128 ? D / 128 : 1;

// The ring's geometry for one warp (kDims head dims of a row; see the file comment).
template <typename T, int D>
struct RingLayout {
  static constexpr int kDims = D / kWarpsOf<D>;
  static constexpr int kRowBytes = kDims * int(sizeof(T));
  static constexpr int kStageBytes = 2 * kPagedDecodeStep * kRowBytes;  // 16 K rows, then 16 V rows
  // Byte offset of 16-byte chunk `chunk` of row `row` in a stage: chunk indices are xor-ed with
  // row % 8, which keeps every 128-byte line of a row in one 128-byte line of shared memory
  // (so a copy instruction's lines map whole onto shared memory) while the 8 rows that one
  // ldmatrix reads at the same chunk fall in distinct banks.
  __device__ static uint32_t offset(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }
  static constexpr int kLanesPerRow = kRowBytes / 16;                 // 8 or 16
  static constexpr int kRowsPerCopy = 32 / kLanesPerRow;              // rows of one warp instruction
  static constexpr int kTokensPerLane = kPagedDecodeStep / kRowsPerCopy;
};

// Stages of the ring: two steps in flight while one is computed (24 KB per warp at 128 dims, so
// the kPagedDecodeWarpsPerSm warps of an SM fit its shared memory on sm_90).
constexpr int kRingStages = 3;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory in mma fragment layout (kTrans: transposed).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#endif
}

// An 8x8 b16 matrix held as mma fragments (lane (g, c): row g, columns 2c, 2c + 1) transposed
// across the warp: lane (g, c) gets rows 2c, 2c + 1 of column g.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
#endif
  return d;
}

// 16 bytes global -> shared, bypassing L1; `bytes` 0 writes zeros and reads nothing. No L2
// prefetch-size hint: with .L2::256B the L2 handled a third more sectors than the KV bytes (hit
// rate 26% on data read once) and was the busiest unit; without it a long batch runs 5-7% faster
// on an H200 (bench/results/2026-11-27_h200_9485f2f_paged_decode_l2_hint/).
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Q^T as B fragments of request b, one per k-step and 8-head tile: head head0 + 8 nt + g (zero
// past the chunk's `rows` heads), dims dim0 + 16 j + 2c (+1) and dim0 + 16 j + 8 + 2c (+1).
template <typename T, int kKSteps, int kHeadTiles>
__device__ __forceinline__ void load_q(const PagedDecodeParams& p, int64_t b, int64_t head0, int rows, int dim0,
                                       uint32_t (&qb)[kKSteps][kHeadTiles][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const T* q_rows = static_cast<const T*>(p.q) + b * p.q_stride_b + head0 * p.q_stride_h + dim0 + 2 * c;
#pragma unroll
  for (int j = 0; j < kKSteps; ++j) {
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      const bool in = 8 * nt + g < rows;
      const uint32_t* row = reinterpret_cast<const uint32_t*>(q_rows + (8 * nt + g) * p.q_stride_h + 16 * j);
      qb[j][nt][0] = in ? __ldg(row) : 0u;
      qb[j][nt][1] = in ? __ldg(row + 4) : 0u;
    }
  }
}

// Warp `warp` of `warps` sharing tokens [first, last): its equal run of whole steps, [begin, end).
__device__ __forceinline__ void warp_run(int first, int last, int warps, int warp, int& begin, int& end) {
  const int run = (last - first + warps * kPagedDecodeStep - 1) / (warps * kPagedDecodeStep) * kPagedDecodeStep;
  begin = min(last, first + warp * run);
  end = min(last, begin + run);
}

// Streams tokens [begin, end) of one request (its pages `rp`) through this warp's ring for the
// query heads whose Q^T fragments are `qb`, into O^T, the running max and this lane's share of the
// running sum (layouts in paged_decode_ring_kernel), noting an out-of-range page id in bad_page.
// kWarpsOf<D> > 1: the warps of a CTA that share the head dims call it together (a barrier per
// step adds their parts of S).
template <typename T, int D, int kStages, int kHeadTiles>
__device__ __forceinline__ void stream_part(const PagedDecodeParams& p, const RequestPages& rp, const int64_t kv_head,
                                            const int begin, const int end, const uint32_t ring,
                                            const uint32_t (&qb)[D / kWarpsOf<D> / 16][kHeadTiles][2],
                                            float (&o)[D / kWarpsOf<D> / 16][kHeadTiles][4], float (&m)[kHeadTiles][2],
                                            float (&l)[kHeadTiles][2], bool& bad_page) {
  using L = RingLayout<T, D>;
  constexpr int kWarps = kWarpsOf<D>;
  constexpr int kDims = L::kDims;
  constexpr int kKSteps = kDims / 16;
  constexpr int kDimTiles = kDims / 16;
  constexpr int kStageBytes = L::kStageBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dim_warp = warp % kWarps;
  const int g = lane >> 2;
  const int dim0 = dim_warp * kDims;
  const int page_size = static_cast<int>(p.page_size);
  const int steps = (end - begin + kPagedDecodeStep - 1) / kPagedDecodeStep;
  // Copies: lane L moves 16-byte column L % kLanesPerRow of the K and V rows of tokens
  // L / kLanesPerRow + kRowsPerCopy i of a step. Page ids are fetched a step before their copies
  // are issued and checked only there, so the warp never waits on the fetch. When pages hold a
  // multiple of 16 tokens a step lies in one page (steps start at multiples of 16): every lane
  // fetches that page's id and its rows are a fixed stride apart; otherwise lane i < 16 fetches
  // the id of token i and the copying lanes read it with a shuffle.
  const int piece = lane % L::kLanesPerRow, col = piece * 16;
  const int tok0 = lane / L::kLanesPerRow;
  const unsigned char* k_base =
      reinterpret_cast<const unsigned char*>(p.k_cache) + (kv_head * p.k_stride_head + dim0) * int64_t(sizeof(T)) + col;
  const unsigned char* v_base =
      reinterpret_cast<const unsigned char*>(p.v_cache) + (kv_head * p.v_stride_head + dim0) * int64_t(sizeof(T)) + col;
  const int64_t k_page = p.k_stride_page * int64_t(sizeof(T)), k_slot = p.k_stride_slot * int64_t(sizeof(T));
  const int64_t v_page = p.v_stride_page * int64_t(sizeof(T)), v_slot = p.v_stride_slot * int64_t(sizeof(T));
  const bool whole_pages = page_size % kPagedDecodeStep == 0;
  const int fetch_tok = whole_pages ? 0 : lane & 15;
  auto fetch = [&](int s) -> int32_t {
    const int t = begin + s * kPagedDecodeStep + fetch_tok;
    return s < steps && t < end ? __ldg(rp.pages + rp.index(t)) : -1;
  };
  // This lane's 16 bytes of token `tok`'s K and V rows, at slot `slot` of page `pg`, into the
  // step's stage; `bytes` 0 zero-fills them and reads nothing.
  auto copy_token = [&](uint32_t stage, int tok, int64_t pg, int slot, int bytes) {
    copy16(stage + L::offset(tok, piece), k_base + pg * k_page + slot * k_slot, bytes);
    copy16(stage + L::offset(kPagedDecodeStep + tok, piece), v_base + pg * v_page + slot * v_slot, bytes);
  };
  // A page id per token: where the pages lie one after another in token rows (page stride =
  // page_size x slot stride, as in a plain [num_pages, page_size, ...] cache), with fewer than
  // 2^31 rows and row strides below 4 GiB, token t is row page * page_size + slot of the cache.
  // The lane that fetched the token's page id works that row out once per step, and a copying
  // lane's address is one wide multiply-add on it; the general form costs 64-bit page and slot
  // products (and a branch between the shift and the division for the slot) for each of a lane's
  // tokens, which made page size 1 execute 1.75x the instructions of page size 16 (h32_kv4
  // 128 x 2048, Nsight Compute).
  const bool token_rows = !whole_pages && k_slot >= 0 && v_slot >= 0 && k_slot <= UINT32_MAX && v_slot <= UINT32_MAX &&
                          p.k_stride_page == p.page_size * p.k_stride_slot &&
                          p.v_stride_page == p.page_size * p.v_stride_slot &&
                          p.num_pages <= INT32_MAX / p.page_size;
  const uint32_t k_row = static_cast<uint32_t>(k_slot), v_row = static_cast<uint32_t>(v_slot);
  // Where lane i < 16 fetched the page id of token t0 + i (pages shorter than a step): whether
  // that token is to be copied, i.e. within the split and its id in range (an id out of range is
  // noted in bad_page).
  auto lane_token_copied = [&](int t0, int32_t id) -> bool {
    const bool live = t0 + (lane & 15) < end;
    const bool ok = !live || static_cast<uint32_t>(id) < rp.num_pages;
    bad_page = bad_page || !ok;
    return live && ok;
  };
  auto issue = [&](int s, int32_t id) {
    if (s < steps) {
      const int t0 = begin + s * kPagedDecodeStep;
      const uint32_t stage = ring + (s % kStages) * kStageBytes;
      if (token_rows) {
        const int32_t row = lane_token_copied(t0, id) ? id * page_size + rp.slot(t0 + (lane & 15)) : -1;
#pragma unroll
        for (int i = 0; i < L::kTokensPerLane; ++i) {
          const int tok = tok0 + L::kRowsPerCopy * i;
          const int32_t r = __shfl_sync(0xffffffffu, row, tok);
          const uint64_t at = r >= 0 ? static_cast<uint32_t>(r) : 0u;
          copy16(stage + L::offset(tok, piece), k_base + at * k_row, r >= 0 ? 16 : 0);
          copy16(stage + L::offset(kPagedDecodeStep + tok, piece), v_base + at * v_row, r >= 0 ? 16 : 0);
        }
      } else if (whole_pages) {
        const bool ok = static_cast<uint32_t>(id) < rp.num_pages;
        bad_page = bad_page || !ok;
        const int64_t pg = ok ? id : 0;
        const int slot = rp.slot(t0) + tok0;
#pragma unroll
        for (int i = 0; i < L::kTokensPerLane; ++i) {
          const int tok = tok0 + L::kRowsPerCopy * i;
          copy_token(stage, tok, pg, slot + L::kRowsPerCopy * i, ok && t0 + tok < end ? 16 : 0);
        }
      } else {
        const int32_t mine = lane_token_copied(t0, id) ? id : -1;
#pragma unroll
        for (int i = 0; i < L::kTokensPerLane; ++i) {
          const int tok = tok0 + L::kRowsPerCopy * i;
          const int32_t page = __shfl_sync(0xffffffffu, mine, tok);
          copy_token(stage, tok, page >= 0 ? page : 0, rp.slot(t0 + tok), page >= 0 ? 16 : 0);
        }
      }
    }
    copy_commit();  // one group per step, empty past the end, so the waits count steps
  };

  // Steps 0 .. kStages - 2 in flight before the loop; `ahead` holds the page id of step kStages - 1.
  {
    int32_t ids[kStages - 1];
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) ids[s] = fetch(s);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, ids[s]);
  }
  int32_t ahead = fetch(kStages - 1);

  const float scale = p.sm_scale * kLog2e;
  const float kNegInf = OPFORGE_NEG_INF;
  // O^T tiles: o[i][nt] holds dims 16 i + g (elements 0, 1) and 16 i + g + 8 (2, 3) of heads
  // 8 nt + 2c (elements 0, 2) and 8 nt + 2c + 1 (1, 3).
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) {
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) o[i][nt][0] = o[i][nt][1] = o[i][nt][2] = o[i][nt][3] = 0.f;
  }
  // Per head 8 nt + 2c + h: the running max (base-2 logits; the same in every lane of the head)
  // and this lane's share of the running sum (its tokens g and g + 8 of each step).
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) m[nt][0] = m[nt][1] = kNegInf, l[nt][0] = l[nt][1] = 0.f;
  // Parts of S^T from every warp (kWarps > 1), double-buffered by step parity: a warp writes the
  // next step's buffer only after all have passed this step's barrier.
  __shared__ float4 s_parts[kWarps > 1 ? 2 : 1][kWarps][kHeadTiles][kWarps > 1 ? 32 : 1];
  int parity = 0;

  // ldmatrix row addresses of this lane inside a stage. K as A (tokens x dims): matrices (tokens
  // 0-7, dims + 0), (tokens 8-15, + 0), (0-7, + 8), (8-15, + 8), so lane L points at token
  // 8 ((L / 8) % 2) + L % 8, 16-byte chunk L / 16 of the k-step. V^T as A (dims x tokens, read
  // transposed): matrices (tokens 0-7, dims + 0), (0-7, + 8), (8-15, + 0), (8-15, + 8).
  const int ld_k_row = ((lane >> 3) & 1) * 8 + (lane & 7), ld_k_chunk = lane >> 4;
  const int ld_v_row = kPagedDecodeStep + (lane >> 4) * 8 + (lane & 7), ld_v_chunk = (lane >> 3) & 1;

  for (int s = 0; s < steps; ++s) {
    const int t0 = begin + s * kPagedDecodeStep;
    // Refill the stage computed on the last iteration (every lane is past it) kStages - 1 steps
    // ahead, then wait for this step's group.
    __syncwarp();
    issue(s + kStages - 1, ahead);
    ahead = fetch(s + kStages);
    copy_wait<kStages - 1>();
    __syncwarp();
    const uint32_t base = ring + (s % kStages) * kStageBytes;

    // S^T = K Q^T (tokens x heads), even and odd k-steps in separate accumulators (two shorter
    // dependent chains).
    float acc[2][kHeadTiles][4] = {};
#pragma unroll
    for (int j = 0; j < kKSteps; ++j) {
      uint32_t ka[4];
      ldmatrix_x4<false>(ka, base + L::offset(ld_k_row, 2 * j + ld_k_chunk));
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) mma_16x8x16<T>(acc[j & 1][nt], ka, qb[j][nt][0], qb[j][nt][1]);
    }
    // sc[nt]: tokens t0 + g (elements 0, 1) and t0 + g + 8 (2, 3) of heads 8 nt + 2c (0, 2) and
    // 8 nt + 2c + 1 (1, 3).
    float sc[kHeadTiles][4];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = acc[0][nt][e] + acc[1][nt][e];
    }
    if constexpr (kWarps > 1) {
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        s_parts[parity][dim_warp][nt][lane] = make_float4(sc[nt][0], sc[nt][1], sc[nt][2], sc[nt][3]);
      }
      __syncthreads();
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        float4 sum = s_parts[parity][0][nt][lane];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
          const float4 part = s_parts[parity][w][nt][lane];
          sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
        }
        sc[nt][0] = sum.x, sc[nt][1] = sum.y, sc[nt][2] = sum.z, sc[nt][3] = sum.w;
      }
      parity ^= 1;
    }
    // Online softmax in base 2, per head over the 8 lanes that share c (one token pair each).
    const bool live_lo = t0 + g < end, live_hi = t0 + g + 8 < end;
    float alpha[kHeadTiles][2];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& lo = sc[nt][h];
        float& hi = sc[nt][2 + h];
        lo = live_lo ? lo * scale : kNegInf;
        hi = live_hi ? hi * scale : kNegInf;
        float mx = fmaxf(lo, hi);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m[nt][h], mx);
        const float base_m = m_new == kNegInf ? 0.f : m_new;  // nothing seen yet: keeps exp2 off -inf - -inf
        alpha[nt][h] = exp2f(m[nt][h] - base_m);
        lo = exp2f(lo - base_m);
        hi = exp2f(hi - base_m);
        l[nt][h] = l[nt][h] * alpha[nt][h] + (lo + hi);
        m[nt][h] = m_new;
      }
    }
    // P^T as B fragments: the accumulator holds P's tokens g, g + 8 by heads 2c, 2c + 1; a B
    // fragment wants tokens 2c, 2c + 1 (and + 8) by head g, i.e. each 8x8 half transposed.
    uint32_t pb[kHeadTiles][2];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      pb[nt][0] = movmatrix_trans(pack2<T>(sc[nt][0], sc[nt][1]));
      pb[nt][1] = movmatrix_trans(pack2<T>(sc[nt][2], sc[nt][3]));
    }
    // O^T = alpha O^T + V^T P^T over the step's 16 tokens (k slot i <-> token t0 + i).
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      uint32_t va[4];
      ldmatrix_x4<true>(va, base + L::offset(ld_v_row, 2 * i + ld_v_chunk));
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        float(&acc_o)[4] = o[i][nt];
        acc_o[0] *= alpha[nt][0], acc_o[1] *= alpha[nt][1], acc_o[2] *= alpha[nt][0], acc_o[3] *= alpha[nt][1];
        mma_16x8x16<T>(acc_o, va, pb[nt][0], pb[nt][1]);
      }
    }
  }
}

// A warp's state for the query heads of its chunk as results: each head's sum over its 8 lanes,
// then for row (head of the chunk) < rows its normalised output, this lane's dims 16 i + g and
// 16 i + g + 8, at out + row * out_row (type Out: the op's dtype, or fp32 partials) and, from
// the lane with g = 0 when `writes_lse`, its lse at lse + row * lse_row. bad: NaN everywhere; a
// head without tokens (l == 0) gets zeros and lse -inf; a NaN l stays NaN.
template <typename Out, int kDimTiles, int kHeadTiles>
__device__ __forceinline__ void store_rows(const float (&o)[kDimTiles][kHeadTiles][4], const float (&m)[kHeadTiles][2],
                                           float (&l)[kHeadTiles][2], bool bad, int rows, bool writes_lse, Out* out,
                                           int64_t out_row, float* lse, int64_t lse_row) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const float nan = __int_as_float(0x7fffffff);
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[nt][h] += __shfl_xor_sync(0xffffffffu, l[nt][h], 4);
      l[nt][h] += __shfl_xor_sync(0xffffffffu, l[nt][h], 8);
      l[nt][h] += __shfl_xor_sync(0xffffffffu, l[nt][h], 16);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 8 * nt + 2 * c + h;
      if (row >= rows) continue;
      const float inv = bad ? nan : l[nt][h] == 0.f ? 0.f : 1.f / l[nt][h];
      Out* dst = out + row * out_row + g;
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        dst[16 * i] = from_float<Out>(o[i][nt][h] * inv);
        dst[16 * i + 8] = from_float<Out>(o[i][nt][2 + h] * inv);
      }
      if (g == 0 && writes_lse) {
        lse[row * lse_row] = bad ? nan : l[nt][h] == 0.f ? OPFORGE_NEG_INF : m[nt][h] + log2f(l[nt][h]);
      }
    }
  }
}

// kTokenWarps > 1: the CTA's warps, each with its state for its run of the same task, fold
// them into warp 0's (true there, false elsewhere): each warp parks its state (o, m, l per head,
// its bad-page flag) in its own ring, drained by now, as [value][lane]; warp 0 folds the others
// into its own in warp order (fixed: results do not depend on scheduling). The rings are busy
// until warp 0 is done with them: a caller that streams again first waits at a barrier.
template <typename T, int D, int kStages, int kHeadTiles, int kTokenWarps>
__device__ __forceinline__ bool fold_token_warps(unsigned char* ring_all,
                                                 float (&o)[D / kWarpsOf<D> / 16][kHeadTiles][4],
                                                 float (&m)[kHeadTiles][2], float (&l)[kHeadTiles][2],
                                                 bool& bad_page) {
  if constexpr (kTokenWarps == 1) {
    return true;
  } else {
    constexpr int kDimTiles = D / kWarpsOf<D> / 16;
    constexpr int kStageBytes = RingLayout<T, D>::kStageBytes;
    const float kNegInf = OPFORGE_NEG_INF;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    copy_wait<0>();
    constexpr int kValues = kDimTiles * kHeadTiles * 4 + kHeadTiles * 4 + 1;
    static_assert(kValues * 32 * int(sizeof(float)) <= kStages * kStageBytes, "a warp's state fits its ring");
    auto state_of = [&](int w) { return reinterpret_cast<float*>(ring_all + w * kStages * kStageBytes) + lane; };
    // f(element, its value index, its tile of heads, its head's parity) over o, in one order.
    auto each_o = [&](auto&& f) {
      int v = 0;
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
#pragma unroll
        for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e, ++v) f(o[i][nt][e], v, nt, e & 1);
        }
      }
    };
    {
      float* mine = state_of(warp);
      each_o([&](float& x, int v, int, int) { mine[32 * v] = x; });
      int v = kDimTiles * kHeadTiles * 4;
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) mine[32 * v++] = m[nt][h], mine[32 * v++] = l[nt][h];
      }
      mine[32 * v] = bad_page ? 1.f : 0.f;
    }
    __syncthreads();
    if (warp != 0) return false;
#pragma unroll 1
    for (int w = 1; w < kTokenWarps; ++w) {
      const float* theirs = state_of(w);
      constexpr int kFirstHeadValue = kDimTiles * kHeadTiles * 4;
      float keep[kHeadTiles][2], take[kHeadTiles][2];
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int v = kFirstHeadValue + 4 * nt + 2 * h;
          const float m_w = theirs[32 * v], l_w = theirs[32 * (v + 1)];
          const float m_new = fmaxf(m[nt][h], m_w);
          const float base_m = m_new == kNegInf ? 0.f : m_new;  // both empty: weights 2^-inf = 0
          keep[nt][h] = exp2f(m[nt][h] - base_m);
          take[nt][h] = exp2f(m_w - base_m);
          l[nt][h] = l[nt][h] * keep[nt][h] + l_w * take[nt][h];
          m[nt][h] = m_new;
        }
      }
      each_o([&](float& x, int v, int nt, int h) { x = x * keep[nt][h] + theirs[32 * v] * take[nt][h]; });
      bad_page = bad_page || theirs[32 * (kFirstHeadValue + 4 * kHeadTiles)] != 0.f;
    }
    return true;
  }
}

// One task per CTA: the query heads head0 .. head0 + rows - 1 (one KV head's, at most 16) of
// request b over the tokens of one split, the heads as the N dimension of the tiles
// (kHeadTiles tiles of 8: 1 when a KV head has at most 8 query heads, else 2). Head dims above 128 are shared out over warps, 128
// each (the accumulators of 256 dims would not fit one warp's registers), each with its own ring;
// each warp computes its part of S, and the parts are added through shared memory in warp order,
// so every warp holds the same S. kTokenWarps > 1 (head dims up to 128): that many warps take
// equal runs of whole steps of the split, each with its own ring, and warp 0 combines their
// states in warp order at the end. See the file comment for the layouts.
template <typename T, int D, int kStages, int kHeadTiles, int kTokenWarps>
__global__ void __launch_bounds__(kTokenWarps * kWarpsOf<D> * 32, kPagedDecodeWarpsPerSm / (kTokenWarps * kWarpsOf<D>))
    paged_decode_ring_kernel(const PagedDecodeParams p, const int head_chunks, const int splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = RingLayout<T, D>;
  constexpr int kWarps = kWarpsOf<D>;
  static_assert(kTokenWarps == 1 || kWarps == 1, "token warps never wait on each other: no shared S parts");
  constexpr int kDims = L::kDims;
  constexpr int kKSteps = kDims / 16;    // k-steps of S^T = K Q^T
  constexpr int kDimTiles = kDims / 16;  // 16-dim tiles of O^T
  constexpr int kStageBytes = L::kStageBytes;
  static_assert(kHeadTiles == 1 || kHeadTiles * 8 == kPagedDecodeRows, "two tiles hold a whole chunk of heads");
  const int warp = threadIdx.x >> 5;
  const int dim_warp = warp % kWarps, token_warp = warp / kWarps;
  const int dim0 = dim_warp * kDims;

  // Task and head indices in 32 bits (the host keeps batch x num_qo_heads below 2^31): 64-bit
  // divisions are a runtime call, ahead of the first load.
  uint32_t task = blockIdx.x;
  const int split = static_cast<int>(task % splits);
  task /= splits;
  const int chunk = static_cast<int>(task % head_chunks);
  task /= head_chunks;
  const uint32_t kv_heads = static_cast<uint32_t>(p.num_kv_heads);
  const int64_t kv_head = task % kv_heads;
  const int64_t b = task / kv_heads;
  const int64_t group = static_cast<uint32_t>(p.num_qo_heads) / kv_heads;
  const int64_t head0 = kv_head * group + int64_t(chunk) * kPagedDecodeRows;
  const int rows = static_cast<int>(min64(kPagedDecodeRows, group - int64_t(chunk) * kPagedDecodeRows));

  extern __shared__ __align__(128) unsigned char ring_all[];
  const uint32_t ring = smem_addr(ring_all + warp * kStages * kStageBytes);

  // The request's layout (uniform across the warp). Invalid layouts give NaN, never a read
  // outside kv_indices or the caches. Its three loads and Q's go out together, ahead of any use:
  // the last page's length read only for a request with pages (a branch on kv_indptr) cost a
  // second memory round trip before the page ids could be fetched, and Q's loads waited behind
  // both.
  const int32_t first = __ldg(p.kv_indptr + b), last = __ldg(p.kv_indptr + b + 1);
  const int32_t tail = p.kv_last_page_len ? __ldg(p.kv_last_page_len + b) : static_cast<int32_t>(p.page_size);

  uint32_t qb[kKSteps][kHeadTiles][2];
  load_q<T>(p, b, head0, rows, dim0, qb);

  bool bad = first < 0 || last < first || last > p.num_indices;
  int n = 0;
  if (!bad && last > first) {
    bad = tail < 1 || tail > p.page_size;
    if (!bad) n = static_cast<int>((last - first - 1) * p.page_size + tail);
  }
  // This split's tokens: equal slices of whole steps; this warp's, equal runs of whole steps of
  // the slice.
  const int64_t slice = (int64_t(n) + splits - 1) / splits;
  const int64_t per_split = (slice + kPagedDecodeStep - 1) / kPagedDecodeStep * kPagedDecodeStep;
  const int split_begin = static_cast<int>(min64(n, split * per_split));
  const int split_end = static_cast<int>(min64(n, split_begin + per_split));
  int begin, end;
  warp_run(split_begin, split_end, kTokenWarps, token_warp, begin, end);

  const RequestPages rp = RequestPages::of(p.kv_indices + (bad ? 0 : first), static_cast<int>(p.page_size), p.num_pages);
  const float kNegInf = OPFORGE_NEG_INF;
  float o[kDimTiles][kHeadTiles][4], m[kHeadTiles][2], l[kHeadTiles][2];
  bool bad_page = false;
  stream_part<T, D, kStages, kHeadTiles>(p, rp, kv_head, begin, end, ring, qb, o, m, l, bad_page);

  if (!fold_token_warps<T, D, kStages, kHeadTiles, kTokenWarps>(ring_all, o, m, l, bad_page)) return;

  // Every warp fetched the same page ids, so each one's flag is the task's.
  bad = bad || __any_sync(0xffffffffu, bad_page);
  const int64_t rows_total = p.batch * p.num_qo_heads;
  if (splits == 1) {
    store_rows<T>(o, m, l, bad, rows, dim_warp == 0,
                  static_cast<T*>(p.out) + b * p.out_stride_b + head0 * p.out_stride_h + dim0, p.out_stride_h,
                  p.lse + b * p.lse_stride_b + head0 * p.lse_stride_h, p.lse_stride_h);
  } else {
    const int64_t row0 = int64_t(split) * rows_total + b * p.num_qo_heads + head0;
    store_rows<float>(o, m, l, bad, rows, dim_warp == 0, p.workspace + row0 * D + dim0, D,
                      p.workspace + int64_t(splits) * rows_total * D + row0, 1);
  }
#else
  __trap();  // the host never launches this kernel on a GPU below 8.0 (checked in Python)
#endif
}

// The part of request b (its pages from kv_indices[first]) a page-range CTA takes: tokens
// [part_begin, part_end), cut into equal runs of whole steps for its kPagedDecodeRangeWarps warps,
// folded in warp order as a token-warp task's are, and written by warp 0: to out where the part
// is the whole request, else as a partial to workspace slot `slot` (of `slots`). The rings are
// busy until warp 0 has read the other warps' states: a caller that streams again first waits
// at a barrier.
template <typename T, int D, int kStages, int kHeadTiles>
__device__ __forceinline__ void ranges_part(const PagedDecodeParams& p, unsigned char* ring_all, int64_t b,
                                            int32_t first, int64_t kv_head, int64_t head0, int rows, int part_begin,
                                            int part_end, bool whole, int64_t slot, int64_t slots) {
  using L = RingLayout<T, D>;
  constexpr int kWarps = kPagedDecodeRangeWarps;
  const int warp = threadIdx.x >> 5;
  int begin, end;
  warp_run(part_begin, part_end, kWarps, warp, begin, end);
  uint32_t qb[L::kDims / 16][kHeadTiles][2];
  load_q<T>(p, b, head0, rows, 0, qb);
  const RequestPages rp = RequestPages::of(p.kv_indices + first, static_cast<int>(p.page_size), p.num_pages);
  float o[L::kDims / 16][kHeadTiles][4], m[kHeadTiles][2], l[kHeadTiles][2];
  bool bad_page = false;
  const uint32_t ring = smem_addr(ring_all + warp * kStages * L::kStageBytes);
  stream_part<T, D, kStages, kHeadTiles>(p, rp, kv_head, begin, end, ring, qb, o, m, l, bad_page);
  if (!fold_token_warps<T, D, kStages, kHeadTiles, kWarps>(ring_all, o, m, l, bad_page)) return;
  bad_page = __any_sync(0xffffffffu, bad_page);
  if (whole) {
    store_rows<T>(o, m, l, bad_page, rows, true,
                  static_cast<T*>(p.out) + b * p.out_stride_b + head0 * p.out_stride_h, p.out_stride_h,
                  p.lse + b * p.lse_stride_b + head0 * p.lse_stride_h, p.lse_stride_h);
  } else {
    store_rows<float>(o, m, l, bad_page, rows, true, p.workspace + slot * kPagedDecodeRows * D, D,
                      p.workspace + slots * kPagedDecodeRows * D + slot * kPagedDecodeRows, 1);
  }
}

// Whether a request (kv_indptr values x, next) is too long for runs per request
// (PagedDecodePlan::even_splits): more than kPagedDecodeRunsMaxNum / kPagedDecodeRunsMaxDen of the
// batch's average pages (`total` pages in all). The one test both kernels of a page-range plan
// use, so that they agree on the schedule.
__device__ __forceinline__ bool too_long_for_runs(int32_t x, int32_t next, int64_t batch, int64_t total) {
  return kPagedDecodeRunsMaxDen * int64_t(next - x) * batch > kPagedDecodeRunsMaxNum * total;
}

// The work index of CTA `cta` of a grid of `ctas` on `sms` multiprocessors, so that consecutive
// work indices lie on distinct SMs: a grid of more CTAs than SMs is dealt out ceil(ctas / sms)
// consecutive CTAs to an SM (an H200's block scheduler, found with %smid), so a dense prefix of
// working CTAs would share half the SMs and leave the rest idle. Slot-major over the SMs dealt
// to; a bijection of [0, ctas) whatever the scheduler does (only the speed depends on it).
__device__ __forceinline__ int spread_over_sms(uint32_t cta, uint32_t ctas, uint32_t sms) {
  const uint32_t per_sm = (ctas + sms - 1) / sms, used = (ctas + per_sm - 1) / per_sm;
  const uint32_t sm = cta / per_sm, slot = cta % per_sm;
  const uint32_t last_full = ctas - (used - 1) * per_sm;  // CTAs dealt to the last SM
  // The last SM lacks slots last_full .. per_sm - 1: each earlier one of them skips an index.
  const uint32_t missing = slot > last_full ? slot - last_full : 0;
  return static_cast<int>(slot * used + sm - missing);
}

// Page ranges (see PagedDecodePlan::ranges): CTA x takes range x % ranges of group x / ranges (a
// group: one KV head's chunk of query heads) and, for each request its pages meet, the tokens of
// the request on those pages (ranges_part). A request whose pages all lie in the range gets its
// output here; the part of one that crosses the range's edge goes to the workspace (slot 0: the
// part holding the range's first page, slot 1: one starting after it) for
// paged_decode_ranges_merge_kernel. With even_splits > 0 and a batch found balanced, range r takes
// page run r % even_splits of request r / even_splits instead (slot 0). A request whose last page
// length is out of range is skipped (the merge writes NaN), and so is every request of a batch
// whose kv_indptr is not monotone or leaves [0, num_indices]: the cut assumes it.
template <typename T, int D, int kStages, int kHeadTiles>
__global__ void __launch_bounds__(kPagedDecodeRangeWarps * 32, kPagedDecodeWarpsPerSm / kPagedDecodeRangeWarps)
    paged_decode_ranges_kernel(const PagedDecodeParams p, const int head_chunks, const int ranges,
                               const int even_splits, const int sms) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(kWarpsOf<D> == 1, "token warps need one warp of head dims");
  using L = RingLayout<T, D>;

  extern __shared__ __align__(128) unsigned char ring_all[];
  constexpr int kRingBytes = kPagedDecodeRangeWarps * kStages * L::kStageBytes;
  int32_t* indptr = reinterpret_cast<int32_t*>(ring_all + kRingBytes);
  // The last page lengths beside kv_indptr, loaded in the same round trip: read only once a
  // request is known, each cost a memory round trip between kv_indptr's and the page ids'.
  int32_t* tails = indptr + kPagedDecodeRangesMaxBatch + 1;
  const int batch = static_cast<int>(p.batch);
  const int32_t full = static_cast<int32_t>(p.page_size);
  bool bad = false;
  for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
    const int32_t x = __ldg(p.kv_indptr + i);
    const int32_t tail = i == batch || !p.kv_last_page_len ? full : __ldg(p.kv_last_page_len + i);
    indptr[i] = x;
    tails[i] = tail;
    bad = bad || x < 0 || x > p.num_indices;
  }
  __syncthreads();
  const int64_t base = indptr[0], pages = int64_t(indptr[batch]) - base;
  bool uneven = false;
  for (int i = threadIdx.x; i < batch; i += blockDim.x) {
    bad = bad || indptr[i] > indptr[i + 1];
    uneven = uneven || too_long_for_runs(indptr[i], indptr[i + 1], batch, pages);
  }
  if (__syncthreads_or(bad)) return;
  // This CTA's group and range r in it: CTA group x ranges + r. A balanced batch takes
  // batch x even_splits runs per group instead, numbered in the order of a cut's tasks (the
  // groups of one run side by side) and spread over the SMs (the CTAs past them return at once):
  // numbered densely from CTA 0, the 128 working CTAs of 264 (h32_kv4 32 requests, one run each)
  // shared 64 SMs (page size 16, public call: 32 x 2048 44.6 -> 41.6 us, 32 x 8192 136.0 -> 131.8;
  // bench/results/2026-11-28_h200_20d18d7_paged_decode_spread_runs/).
  const bool runs = even_splits > 0 && !__syncthreads_or(uneven);
  // One run per request leaves the merge nothing but rows without pages: its blocks may be
  // scheduled now, into what is left of each SM, and read the layout while this kernel streams.
  // Otherwise they are scheduled as this grid ends (the default), spread over idle SMs: placed
  // early they had merges of many partials (one long request among short ones) stacked on the
  // few SMs with room, 4-5 us slower (bench/results/2026-11-28_h200_65959d2_paged_decode_merge_launch/).
  // Every CTA takes the same branch (kv_indptr is the same for all).
  if (runs && even_splits == 1) allow_next_grid();
  const int groups = gridDim.x / ranges;
  const int work = runs ? spread_over_sms(blockIdx.x, gridDim.x, sms) : blockIdx.x;
  if (runs && work >= groups * batch * even_splits) return;
  const int group = runs ? work % groups : work / ranges;
  const int r = runs ? work / groups : work % ranges;
  const int chunk = group % head_chunks;
  const int64_t kv_head = group / head_chunks;
  const int64_t heads_per_kv = p.num_qo_heads / p.num_kv_heads;
  const int64_t head0 = kv_head * heads_per_kv + int64_t(chunk) * kPagedDecodeRows;
  const int rows = static_cast<int>(min64(kPagedDecodeRows, heads_per_kv - int64_t(chunk) * kPagedDecodeRows));
  const int64_t slots = int64_t(p.num_kv_heads) * head_chunks * ranges * 2;
  const int64_t slot0 = (int64_t(group) * ranges + r) * 2;

  // This range's pages, [q0, q1) of kv_indices, and the request holding q0 (`lo`). For a
  // balanced batch: page run j = r % even_splits of request r / even_splits (equal runs of its
  // pages).
  int64_t q0, q1;
  int lo = 0;
  if (runs) {
    lo = r / even_splits;
    const int64_t first = indptr[lo], n_pages = indptr[lo + 1] - first, j = r % even_splits;
    q0 = first + paged_decode_range_start(j, n_pages, even_splits);
    q1 = first + paged_decode_range_start(j + 1, n_pages, even_splits);
    if (q0 >= q1) return;  // the whole CTA: no barrier below is reached (the merge skips it too)
  } else {
    q0 = base + paged_decode_range_start(r, pages, ranges);
    q1 = base + paged_decode_range_start(r + 1, pages, ranges);
    if (q0 >= q1) return;
    // The last b with indptr[b] <= q0 (it has pages, as q0 < indptr[batch]).
    int hi = batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (indptr[mid] <= q0) lo = mid; else hi = mid - 1;
    }
  }
  for (int b = lo; b < batch && indptr[b] < q1; ++b) {
    const int32_t first = indptr[b], last = indptr[b + 1];
    if (last == first) continue;  // no pages: the merge writes it
    const int32_t tail = tails[b];
    if (tail < 1 || tail > p.page_size) continue;  // the merge writes NaN (uniform over the CTA)
    const int64_t part0 = first > q0 ? first : q0, part1 = last < q1 ? last : q1;
    const int n = static_cast<int>((last - first - 1) * p.page_size + tail);
    const int part_begin = static_cast<int>((part0 - first) * p.page_size);
    const int part_end = static_cast<int>(min64(n, (part1 - first) * p.page_size));
    // Written whole where the merge finds one range for the request: with runs per request only
    // at even_splits == 1 (a request of fewer pages than runs has its pages in one run, and the
    // merge still combines its runs).
    const bool whole = runs ? even_splits == 1 : part0 == first && part1 == last;
    ranges_part<T, D, kStages, kHeadTiles>(p, ring_all, b, first, kv_head, head0, rows, part_begin, part_end, whole,
                                           slot0 + (part0 == q0 ? 0 : 1), slots);
    __syncthreads();  // warp 0 has read the other rings' states: they may stream again
  }
#else
  __trap();  // the host never launches this kernel on a GPU below 8.0 (checked in Python)
#endif
}

// Second pass of a split plan: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse),
// lse = max + log2(sum w). A NaN lse in any split (a bad page in its slice) makes the row NaN; a
// row whose splits are all empty gets zeros and lse -inf. Threads own 4 dims of a row each (D / 4
// threads per row) and merge online, in a fixed order of splits, so the result does not depend on
// scheduling. Launched with PDL where the GPU has it: its launch overlaps the first kernel's tail,
// and it waits for that kernel's writes before reading them. Two shapes:
// * rows enough for a block of them on every SM and up to kMergeRowSplits splits (short
//   contexts, large batches): 256 / (D / 4) rows per block, each thread loading every split of
//   its dims at once, then merging them in split order: one memory round trip, no shared
//   memory, no barrier (128 x 512 tokens on an H200: 90.5 -> 86.8 us in all);
// * otherwise (few rows, or many splits: few long requests): one block per row, spread over
//   every SM, group k of D / 4 threads taking splits k, k + kGroups, ... (their loads do not
//   wait on each other), the groups combined in group order through shared memory.
constexpr int kMergeThreads = 256;
constexpr int kMergeRowSplits = 16;

struct MergeState {
  float m, total, acc[4];
  bool bad;

  __device__ __forceinline__ MergeState() {
    m = OPFORGE_NEG_INF, total = 0.f, bad = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.f;
  }

  // Adds split partial (lse x, o) with weight 2^x.
  __device__ __forceinline__ void add(float x, const float (&o)[4]) {
    bad = bad || isnan(x);
    if (x == OPFORGE_NEG_INF || isnan(x)) return;  // an empty split (or a bad one: the row is NaN anyway)
    const float m_new = fmaxf(m, x);
    const float keep = exp2f(m - m_new), w = exp2f(x - m_new);  // keep = 0 while m is -inf
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = fmaf(w, o[e], acc[e] * keep);
    total = fmaf(total, keep, w);
    m = m_new;
  }

  // Writes dims dim..dim+3 of the merged row, and its lse from the row's first thread.
  template <typename T>
  __device__ __forceinline__ void write(const PagedDecodeParams& p, int64_t row, int dim, bool first_thread) const {
    const float inv = bad ? __int_as_float(0x7fffffff) : total == 0.f ? 0.f : 1.f / total;
    float out[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = acc[e] * inv;
    const int64_t b = row / p.num_qo_heads, head = row % p.num_qo_heads;
    store_float<T, 4>(static_cast<T*>(p.out) + b * p.out_stride_b + head * p.out_stride_h + dim, out);
    if (first_thread) {
      p.lse[b * p.lse_stride_b + head * p.lse_stride_h] =
          bad ? __int_as_float(0x7fffffff) : total == 0.f ? OPFORGE_NEG_INF : m + log2f(total);
    }
  }
};

// The first kernel's split partials in the workspace: o as [split][row][D] fp32, then lse as
// [split][row].
template <int D>
struct SplitPartials {
  const float* o;
  const float* lse;
  int64_t rows;

  __device__ __forceinline__ SplitPartials(const PagedDecodeParams& p, int splits)
      : o(p.workspace), lse(p.workspace + int64_t(splits) * p.batch * p.num_qo_heads * D),
        rows(p.batch * p.num_qo_heads) {}

  // Split s's lse of `row`, and its output's dims dim..dim+3 into `out`.
  __device__ __forceinline__ float load(int64_t s, int64_t row, int dim, float (&out)[4]) const {
    to_floats(load_vec<float, 4>(o + (s * rows + row) * D + dim), out);
    return lse[s * rows + row];
  }
};

template <typename T, int D>
__global__ void __launch_bounds__(kMergeThreads)
    paged_decode_merge_rows_kernel(const PagedDecodeParams p, const int splits) {
  wait_for_previous_grid();
  constexpr int kLanes = D / 4;
  constexpr int kRowsPerBlock = kMergeThreads / kLanes;
  const SplitPartials<D> parts(p, splits);
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  if (row >= parts.rows) return;
  const int dim = (threadIdx.x % kLanes) * 4;
  // Every load first (splits past the count re-read the last one and are not added).
  float x[kMergeRowSplits], o[kMergeRowSplits][4];
#pragma unroll
  for (int s = 0; s < kMergeRowSplits; ++s) x[s] = parts.load(s < splits ? s : splits - 1, row, dim, o[s]);
  MergeState state;
#pragma unroll
  for (int s = 0; s < kMergeRowSplits; ++s) {
    if (s < splits) state.add(x[s], o[s]);
  }
  state.write<T>(p, row, dim, dim == 0);
}

template <typename T, int D>
__global__ void __launch_bounds__(kMergeThreads)
    paged_decode_merge_kernel(const PagedDecodeParams p, const int splits) {
  wait_for_previous_grid();
  constexpr int kLanes = D / 4;
  constexpr int kGroups = kMergeThreads / kLanes;
  const SplitPartials<D> parts(p, splits);
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int dim = lane * 4;
  MergeState mine;
#pragma unroll 4
  for (int s = group; s < splits; s += kGroups) {
    float o[4];
    const float x = parts.load(s, row, dim, o);
    mine.add(x, o);
  }
  __shared__ float part_acc[kGroups][D];
  __shared__ float part_m[kGroups], part_total[kGroups];
  __shared__ bool part_bad[kGroups];
#pragma unroll
  for (int e = 0; e < 4; ++e) part_acc[group][dim + e] = mine.acc[e];
  if (lane == 0) part_m[group] = mine.m, part_total[group] = mine.total, part_bad[group] = mine.bad;
  __syncthreads();
  if (group != 0) return;
  MergeState all;
#pragma unroll
  for (int k = 0; k < kGroups; ++k) all.m = fmaxf(all.m, part_m[k]), all.bad = all.bad || part_bad[k];
  if (all.m != OPFORGE_NEG_INF) {
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const float w = exp2f(part_m[k] - all.m);  // a group without splits: 2^-inf = 0
#pragma unroll
      for (int e = 0; e < 4; ++e) all.acc[e] = fmaf(w, part_acc[k][dim + e], all.acc[e]);
      all.total = fmaf(w, part_total[k], all.total);
    }
  }
  all.write<T>(p, row, dim, lane == 0);
}

// Second pass of a page-range plan: one group of D / 4 threads per (request, query head) row,
// 256 / (D / 4) rows per block. A row whose request lies in one range was written by that range's
// CTA and is left alone; otherwise the partials of ranges range_of(first) .. range_of(last - 1)
// are merged in range order (for a batch found balanced, with even_splits > 1: the request's runs in
// order; with one, every row with pages was written). Rows of requests without pages get
// zeros and lse -inf; those of a request whose last page length is out of range, and every row
// of a batch whose kv_indptr is not monotone or leaves [0, num_indices] (each block checks the
// whole array: the first kernel wrote nothing then), get NaN.
template <typename T, int D>
__global__ void __launch_bounds__(kMergeThreads)
    paged_decode_ranges_merge_kernel(const PagedDecodeParams p, const int head_chunks, const int ranges,
                                     const int even_splits) {
  // The layout checks read only inputs: they go ahead of the wait for the first kernel's writes,
  // which this kernel's blocks may start before that kernel ends where it lets them (one run per
  // request), else as it ends.
  constexpr int kLanes = D / 4;
  constexpr int kRowsPerBlock = kMergeThreads / kLanes;
  const int batch = static_cast<int>(p.batch);
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const bool in_batch = row < p.batch * p.num_qo_heads;
  const int dim = (threadIdx.x % kLanes) * 4;
  const int64_t b = in_batch ? row / p.num_qo_heads : 0, head = row % p.num_qo_heads;
  // The row's request first, in the same round trip as the scan of kv_indptr below (after the
  // wait, this prologue is on the call's critical path where the blocks start as the first
  // kernel ends).
  const int32_t first = __ldg(p.kv_indptr + b), last = __ldg(p.kv_indptr + b + 1);
  const int32_t tail = p.kv_last_page_len ? __ldg(p.kv_last_page_len + b) : static_cast<int32_t>(p.page_size);
  const int64_t base = __ldg(p.kv_indptr), pages = int64_t(__ldg(p.kv_indptr + batch)) - base;
  bool bad_batch = false, uneven = false;
  for (int i = threadIdx.x; i <= batch; i += blockDim.x) {
    const int32_t x = __ldg(p.kv_indptr + i);
    bad_batch = bad_batch || x < 0 || x > p.num_indices;
    if (i < batch) {
      const int32_t next = __ldg(p.kv_indptr + i + 1);
      bad_batch = bad_batch || x > next;
      uneven = uneven || too_long_for_runs(x, next, batch, pages);
    }
  }
  bad_batch = __syncthreads_or(bad_batch);
  const bool even = even_splits > 0 && !__syncthreads_or(uneven);
  wait_for_previous_grid();
  if (!in_batch) return;
  MergeState state;
  if (bad_batch) {
    state.bad = true;
  } else if (last > first) {
    const int64_t r0 = even ? b * even_splits : paged_decode_range_of(first - base, pages, ranges);
    const int64_t r1 = even ? r0 + even_splits - 1 : paged_decode_range_of(last - 1 - base, pages, ranges);
    if (tail < 1 || tail > p.page_size) {
      state.bad = true;
    } else if (r0 == r1) {
      return;  // written by its range's CTA
    } else {
      const int64_t heads_per_kv = p.num_qo_heads / p.num_kv_heads;
      const int64_t kv_head = head / heads_per_kv, in_kv = head % heads_per_kv;
      const int64_t group = kv_head * head_chunks + in_kv / kPagedDecodeRows;
      const int64_t chunk_row = in_kv % kPagedDecodeRows;
      const int64_t slots = int64_t(p.num_kv_heads) * head_chunks * ranges * 2;
      const float* lse_of = p.workspace + slots * kPagedDecodeRows * D;
#pragma unroll 4
      for (int64_t r = r0; r <= r1; ++r) {
        // A range without pages wrote nothing; the first range's part is in slot 1 where the
        // request starts inside it (never for the runs of a balanced batch, each of one request).
        const int64_t start = even ? paged_decode_range_start(r - r0, last - first, even_splits)
                                   : paged_decode_range_start(r, pages, ranges);
        const int64_t next = even ? paged_decode_range_start(r - r0 + 1, last - first, even_splits)
                                  : paged_decode_range_start(r + 1, pages, ranges);
        if (start == next) continue;
        const bool starts_inside = !even && r == r0 && first - base != start;
        const int64_t slot = (group * ranges + r) * 2 + (starts_inside ? 1 : 0);
        float o[4];
        to_floats(load_vec<float, 4>(p.workspace + (slot * kPagedDecodeRows + chunk_row) * D + dim), o);
        state.add(lse_of[slot * kPagedDecodeRows + chunk_row], o);
      }
    }
  }
  state.write<T>(p, row, dim, dim == 0);
}

// The dynamic shared memory a ring kernel launches with on `device`: its warps' rings
// (`ring_bytes`), padded where more CTAs than the plan counts on (kPagedDecodeWarpsPerSm warps
// per SM) would otherwise be resident. The plan sizes its waves for that many; one-warp CTAs of
// 24 KB leave room for 9 on an H200's 228 KB, so 2048 CTAs made 1.7 waves instead of 2 and,
// with the faster heads-as-N step, cost up to 8% (128 x 8192, 2 splits: 1096 us with 9
// resident, 1028 with 8; bench/results/2026-11-26_h200_00c5d5f_paged_decode_heads_as_n/).
// Opts the kernel in to that much (past 48 KB at head_dim 256 or with token warps). `warps`: the
// kernel's warps per CTA. Minus a CUDA error on failure.
template <typename Kernel>
int ring_smem(Kernel kernel, int ring_bytes, int warps, int device) {
  int per_sm = 0, reserved = 0, per_block = 0;
  cudaFuncAttributes attr{};
  cudaError_t e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return -static_cast<int>(e);
  const int fixed = reserved + static_cast<int>(attr.sharedSizeBytes);
  // With per_sm / ctas bytes each, ctas fit an SM and ctas + 1 do not (rounded down to the
  // 128-byte allocation unit, which per_sm / ctas exceeds many times over).
  const int ctas = kPagedDecodeWarpsPerSm / warps;
  int bytes = (per_sm / ctas - fixed) / 128 * 128;
  if (bytes > per_block - static_cast<int>(attr.sharedSizeBytes)) bytes = per_block - static_cast<int>(attr.sharedSizeBytes);
  if (bytes < ring_bytes) bytes = ring_bytes;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return e == cudaSuccess ? bytes : -static_cast<int>(e);
}

// The ring kernel of one instantiation, launched with its shared memory (worked out once per
// device).
template <typename T, int D, int kHeadTiles, int kTokenWarps>
int launch_ring(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  if constexpr (kTokenWarps > 1 && kWarpsOf<D> > 1) {
    return static_cast<int>(cudaErrorInvalidConfiguration);  // the plan never asks for it
  } else {
    constexpr int kWarps = kTokenWarps * kWarpsOf<D>;
    const auto kernel = paged_decode_ring_kernel<T, D, kRingStages, kHeadTiles, kTokenWarps>;
    static PerDevice smem_of;  // bytes, else minus the error
    const int smem = smem_of.get(device, [&] {
      return ring_smem(kernel, kWarps * kRingStages * RingLayout<T, D>::kStageBytes, kWarps, device);
    });
    if (smem < 0) return -smem;
    kernel<<<static_cast<unsigned>(plan.ctas), kWarps * 32, smem, stream>>>(p, plan.head_chunks, plan.splits);
    return last_launch_status();
  }
}

// A page-range plan: the ranges kernel (its rings and copies of kv_indptr and kv_last_page_len in
// shared memory), then the merge, with PDL where the GPU has it.
// The dynamic shared memory of the ranges kernel: its warps' rings and the two copies (112 KB at
// 128 dims: two CTAs still fit an sm_90 SM, as the plan's wave counts).
template <typename T, int D>
constexpr int kRangesSmemBytes =
    (kPagedDecodeRangeWarps * kRingStages * RingLayout<T, D>::kStageBytes +
     2 * (int(kPagedDecodeRangesMaxBatch) + 1) * 4 + 127) / 128 * 128;

template <typename T, int D, int kHeadTiles>
int launch_ranges(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  if constexpr (kWarpsOf<D> > 1) {
    return static_cast<int>(cudaErrorInvalidConfiguration);  // the plan never asks for it
  } else {
    const auto kernel = paged_decode_ranges_kernel<T, D, kRingStages, kHeadTiles>;
    static PerDevice smem_of;
    const int smem = smem_of.get(device, [&] {
      return ring_smem(kernel, kRangesSmemBytes<T, D>, kPagedDecodeRangeWarps, device);
    });
    if (smem < 0) return -smem;
    kernel<<<static_cast<unsigned>(plan.ctas), kPagedDecodeRangeWarps * 32, smem, stream>>>(
        p, plan.head_chunks, plan.ranges, plan.even_splits, sm_count(device));
    const int err = last_launch_status();
    if (err != 0) return err;
    constexpr int kRowsPerBlock = kMergeThreads / (D / 4);
    const int64_t blocks = (p.batch * p.num_qo_heads + kRowsPerBlock - 1) / kRowsPerBlock;
    const auto merge = paged_decode_ranges_merge_kernel<T, D>;
    const bool pdl = image_waits_for_previous_grid<paged_decode_ranges_merge_kernel<T, D>>(device);
    return static_cast<int>(launch_kernel(merge, dim3(static_cast<unsigned>(blocks)), dim3(kMergeThreads), 0, stream,
                                          pdl, p, plan.head_chunks, plan.ranges, plan.even_splits));
  }
}

template <typename T, int D, int kHeadTiles>
int launch_ring_warps(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  switch (plan.token_warps) {
    case 1: return launch_ring<T, D, kHeadTiles, 1>(p, plan, device, stream);
    case 2: return launch_ring<T, D, kHeadTiles, 2>(p, plan, device, stream);
    case kPagedDecodeMaxTokenWarps: return launch_ring<T, D, kHeadTiles, kPagedDecodeMaxTokenWarps>(p, plan, device, stream);
    default: return static_cast<int>(cudaErrorInvalidConfiguration);
  }
}

template <typename T, int D>
int launch_typed(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, cudaStream_t stream) {
  static_assert(kWarpsOf<D> == paged_decode_warps(D), "the plan counts the kernel's warps");
  // One tile of 8 heads when a KV head has at most 8 query heads (h32_kv8, h32_kv4: half the
  // tensor-core work of a 16-head tile), else two.
  const bool one_tile = p.num_qo_heads / p.num_kv_heads <= 8;
  if (plan.ranges > 0) {
    return one_tile ? launch_ranges<T, D, 1>(p, plan, device, stream) : launch_ranges<T, D, 2>(p, plan, device, stream);
  }
  const int err = one_tile ? launch_ring_warps<T, D, 1>(p, plan, device, stream)
                           : launch_ring_warps<T, D, 2>(p, plan, device, stream);
  if (err != 0 || plan.splits == 1) return err;
  const int64_t rows = p.batch * p.num_qo_heads;
  constexpr int kRowsPerBlock = kMergeThreads / (D / 4);
  const int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (plan.splits <= kMergeRowSplits && row_blocks >= sm_count(device)) {
    const bool pdl = image_waits_for_previous_grid<paged_decode_merge_rows_kernel<T, D>>(device);
    return static_cast<int>(launch_kernel(paged_decode_merge_rows_kernel<T, D>, dim3(static_cast<unsigned>(row_blocks)),
                                          dim3(kMergeThreads), 0, stream, pdl, p, plan.splits));
  }
  const bool pdl = image_waits_for_previous_grid<paged_decode_merge_kernel<T, D>>(device);
  return static_cast<int>(launch_kernel(paged_decode_merge_kernel<T, D>, dim3(static_cast<unsigned>(rows)),
                                        dim3(kMergeThreads), 0, stream, pdl, p, plan.splits));
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

bool paged_decode_ranges_fit(int device, int64_t head_dim) {
  static PerDevice per_block_of;  // asked once per device: the check runs on the call path
  const int per_block = per_block_of.get(device, [&] {
    int bytes = 0;
    return cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? bytes : -1;
  });
  // The kernel's static shared memory is a few dozen bytes; 1 KB of margin covers it.
  const int need = head_dim == 64    ? kRangesSmemBytes<__nv_bfloat16, 64>
                   : head_dim == 128 ? kRangesSmemBytes<__nv_bfloat16, 128>
                                     : INT32_MAX - 1024;  // no page ranges at 256 dims
  return need + 1024 <= per_block;
}

int launch_paged_decode_attention(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device,
                                  void* stream_ptr) {
  if (p.batch == 0 || p.num_qo_heads == 0) return 0;
  if (plan.head_chunks == 0 || plan.ctas <= 0 || plan.ctas > INT32_MAX ||
      p.num_indices * p.page_size > INT32_MAX || p.batch * p.num_qo_heads > INT32_MAX) {
    return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  if ((plan.splits > 1 || plan.ranges > 0) && p.workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  if (plan.ranges > 0 && (p.batch > kPagedDecodeRangesMaxBatch || plan.even_splits < 0 ||
                          p.batch * plan.even_splits > plan.ranges)) {
    return static_cast<int>(cudaErrorInvalidConfiguration);
  }
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
