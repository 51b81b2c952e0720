// Paged GQA decode attention: launcher interface (plain C++; the kernels live in
// paged_decode_attention.cu) and the launch plan as inline C++, so that it can be inspected and
// tested without a GPU (opforge._C.paged_decode_attention_plan exposes it).
//
// One query token per request b attends to that request's KV cache, stored in pages:
//
//   pages of b:  kv_indices[kv_indptr[b] .. kv_indptr[b + 1])           (page ids into the caches)
//   tokens of b: every page full (page_size tokens) except the last, which holds
//                kv_last_page_len[b] (page_size when no such array is given)
//   s_t  = sm_scale * q[b, hq] . k_cache[page(t), slot(t), hq / G]      (G = num_qo_heads / num_kv_heads)
//   out[b, hq] = sum_t softmax(s)_t v_cache[page(t), slot(t), hq / G]
//   lse[b, hq] = log2(sum_t exp(s_t))                                   (base 2, as FlashInfer-Trace)
//
// A request without pages gives out = 0, lse = -inf.
#pragma once
#include <cstdint>

#include "dtype.h"

namespace opforge::cuda {

// Strides are in elements; the head dimension is contiguous in q, the caches and out.
struct PagedDecodeParams {
  void* out = nullptr;                           // [batch, num_qo_heads, head_dim], q's dtype
  float* lse = nullptr;                          // [batch, num_qo_heads]
  const void* q = nullptr;                       // [batch, num_qo_heads, head_dim]
  const void* k_cache = nullptr;                 // [num_pages, page_size, num_kv_heads, head_dim]
  const void* v_cache = nullptr;                 // same shape as k_cache
  const int32_t* kv_indptr = nullptr;            // [batch + 1]
  const int32_t* kv_indices = nullptr;           // [num_indices]
  const int32_t* kv_last_page_len = nullptr;     // [batch], or null: every last page is full
  float* workspace = nullptr;                    // split partials (paged_decode_workspace_elems)
  DType dtype = DType::kBFloat16;                // of q, the caches and out (fp16 or bf16)
  int64_t batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t num_pages = 0, page_size = 0, num_indices = 0;
  int64_t q_stride_b = 0, q_stride_h = 0;
  int64_t k_stride_page = 0, k_stride_slot = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_slot = 0, v_stride_head = 0;
  int64_t out_stride_b = 0, out_stride_h = 0;
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  float sm_scale = 0.f;
};

// A CTA computes one task: the query heads of one KV head (up to kPagedDecodeRows of them: the
// rows of one tensor-core tile) of one request over one slice of its tokens, reading each K and
// V row of that slice once for all of those heads. It is one warp per 128 head dims (two for
// head_dim 256).
constexpr int kPagedDecodeRows = 16;
constexpr int paged_decode_warps(int64_t head_dim) { return head_dim > 128 ? static_cast<int>(head_dim / 128) : 1; }
// Tokens per step of the main loop: one 16-deep k-step of the P.V product.
constexpr int kPagedDecodeStep = 16;
// Warps resident per SM that the plan counts on (a warp holds about 210 registers per thread
// at 128 dims, so 9 fit; the launch bounds ask for 8).
constexpr int kPagedDecodeWarpsPerSm = 8;
// A chunk has at least this many tokens (4 steps): below that the merge and the partials'
// traffic cost more than the parallelism gains.
constexpr int64_t kPagedDecodeMinSplitTokens = 64;
constexpr int kPagedDecodeMaxSplits = 128;

// How the work is cut, in one of two ways. A task (one CTA) is the query heads of one KV head
// (up to 16: head_chunks = ceil(G / 16) tasks per KV head; more read the KV rows once per chunk)
// of one request over one part of its tokens.
// * scheduled (splits == 0): the parts are chunks of C tokens, C chosen on the GPU from the
//   actual lengths by a first, one-CTA kernel (paged_decode_chunk_tokens below), which also
//   numbers every request's chunks and lists which request each chunk belongs to. A long request
//   then makes more tasks than a short one, and the plan needs no synchronisation. The grid is
//   the bound `ctas` (a wave's worth plus one chunk per request and head); tasks past the
//   actual chunks return at once. A request of one chunk writes out and lse directly; the others
//   write normalised partials and their lse, which a merge kernel adds in chunk order.
// * static (splits >= 1): every request cut into `splits` equal slices of whole steps (a slice
//   past a short request's end is empty), fixed without the lengths: forced split counts, for
//   tuning and tests.
struct PagedDecodePlan {
  int head_chunks = 0;  // 0: no valid plan
  int splits = 0;       // 0: scheduled
  int64_t slots = 0;    // scheduled: CTAs in a wave, which the GPU-side choice of C aims at
  int64_t chunk_tokens = 0;  // scheduled: C forced (tuning and tests), or 0: chosen on the GPU
  int64_t max_chunks = 0;    // scheduled: bound of the batch's chunks
  int64_t max_partials = 0;  // scheduled: bound of the chunks of requests with more than one (workspace rows)
  int64_t ctas = 0;
};

// The chunk choice runs on the GPU too.
#ifdef __CUDACC__
#define OPFORGE_HOST_DEVICE __host__ __device__
#else
#define OPFORGE_HOST_DEVICE
#endif

OPFORGE_HOST_DEVICE inline int64_t paged_decode_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CTAs of a wave on a GPU with `sms` multiprocessors.
inline int64_t paged_decode_slots(int64_t head_dim, int sms) {
  return int64_t(sms) * kPagedDecodeWarpsPerSm / paged_decode_warps(head_dim);
}

// A static plan of `splits` slices; head_chunks = 0 when out of range.
inline PagedDecodePlan paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int splits) {
  PagedDecodePlan p;
  if (splits < 1 || splits > kPagedDecodeMaxSplits || num_kv_heads < 1 || num_qo_heads % num_kv_heads != 0) return p;
  const int64_t group = num_qo_heads / num_kv_heads;
  p.head_chunks = static_cast<int>(group == 0 ? 1 : paged_decode_cdiv(group, kPagedDecodeRows));
  p.splits = splits;
  p.ctas = batch * num_kv_heads * p.head_chunks * splits;
  return p;
}

// The chunk length C of a scheduled plan, chosen on the GPU from the batch's actual token count
// `total` and its longest request `longest` (plain C++ so that it can be tested without a GPU):
// 1. C0 = total * heads / slots, the chunk that makes one wave of tasks (heads: tasks per chunk);
// 2. the longest request cut into q = floor(longest / C0) equal pieces (at least 1): C =
//    ceil(longest / q), so that a batch of equal lengths makes exactly q chunks per request;
// 3. C rounded up to a whole step, and at least kPagedDecodeMinSplitTokens.
// C >= C0 always, so the chunks number at most slots / heads + batch (one partial chunk per
// request): the bound the grid and the workspace are sized for.
OPFORGE_HOST_DEVICE inline int64_t paged_decode_chunk_tokens(int64_t total, int64_t longest, int64_t heads,
                                                            int64_t slots) {
  const int64_t c0 = total > 0 ? paged_decode_cdiv(total * heads, slots) : 1;
  int64_t q = longest / c0;
  if (q < 1) q = 1;
  int64_t c = paged_decode_cdiv(longest > 0 ? longest : 1, q);
  if (c < c0) c = c0;
  c = paged_decode_cdiv(c, kPagedDecodeStep) * kPagedDecodeStep;
  return c < kPagedDecodeMinSplitTokens ? kPagedDecodeMinSplitTokens : c;
}

// A scheduled plan, its chunk length chosen on the GPU (chunk_tokens = 0) or forced (a positive
// multiple of kPagedDecodeStep; `tokens` = num_indices * page_size bounds the batch's tokens);
// head_chunks = 0 when out of range.
inline PagedDecodePlan paged_decode_scheduled_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                   int64_t head_dim, int sms, int64_t chunk_tokens = 0,
                                                   int64_t tokens = 0) {
  PagedDecodePlan p = paged_decode_plan(batch, num_qo_heads, num_kv_heads, 1);
  if (p.head_chunks == 0 || sms < 1 || chunk_tokens < 0 || chunk_tokens % kPagedDecodeStep != 0) {
    return PagedDecodePlan{};
  }
  const int64_t heads = num_kv_heads * p.head_chunks;
  p.splits = 0;
  p.slots = paged_decode_slots(head_dim, sms);
  p.chunk_tokens = chunk_tokens;
  // Chunks: at most total / C + batch (each request adds one partial chunk at most), and total /
  // C <= slots / heads for a C chosen on the GPU. Chunks of requests cut in several: each such
  // request has n > C tokens, so fewer than 2 n / C chunks: fewer than 2 total / C in all.
  if (chunk_tokens > 0) {
    p.max_chunks = paged_decode_cdiv(tokens, chunk_tokens) + batch;
    p.max_partials = 2 * paged_decode_cdiv(tokens, chunk_tokens);
  } else {
    p.max_chunks = p.slots / heads + batch;
    p.max_partials = 2 * p.slots / heads;
  }
  p.ctas = p.max_chunks * heads;
  return p;
}

// The plan for a call on a GPU with `sms` multiprocessors: scheduled (the lengths live on the
// GPU; reading them on the host would cost a synchronisation).
inline PagedDecodePlan choose_paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                int64_t head_dim, int64_t /*tokens*/, int sms) {
  return paged_decode_scheduled_plan(batch, num_qo_heads, num_kv_heads, head_dim, sms);
}

// Scheduled plans keep a small header and the chunks' numbering in the workspace, after the
// partial rows and their lse (int32): [C, chunk count], chunk_start[batch + 1] (chunks before
// each request), partial_start[batch] (partial rows before it), chunk_request[max_chunks].
inline int64_t paged_decode_schedule_elems(const PagedDecodePlan& plan, int64_t batch) {
  return 2 + (batch + 1) + batch + plan.max_chunks;
}

// fp32 elements of workspace a plan needs: a normalised output row and its lse per part and
// query head, and a scheduled plan's numbering (0 for a static plan without splits).
inline int64_t paged_decode_workspace_elems(const PagedDecodePlan& plan, int64_t batch, int64_t num_qo_heads,
                                            int64_t head_dim) {
  if (plan.splits == 0) {
    return plan.max_partials * num_qo_heads * (head_dim + 1) + paged_decode_schedule_elems(plan, batch);
  }
  return plan.splits > 1 ? int64_t(plan.splits) * batch * num_qo_heads * (head_dim + 1) : 0;
}

// Head dimensions the kernels are compiled for.
inline bool paged_decode_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// Launches on `stream` (a cudaStream_t) of `device`; returns a cudaError_t value (0 = success).
// Every row of q, the caches and out must start on 16 bytes. A request whose layout is invalid
// (kv_indptr decreasing or past num_indices, a last page length outside [1, page_size], a page
// id outside [0, num_pages)) gets NaN in out and lse rather than a read out of bounds.
int launch_paged_decode_attention(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, void* stream);

}  // namespace opforge::cuda
