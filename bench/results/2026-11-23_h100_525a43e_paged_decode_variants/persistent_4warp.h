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

// Work items. An item is the query heads of one KV head (up to kPagedDecodeRows of them: the
// rows of one tensor-core tile) of one request over one chunk of its tokens; it reads each K and
// V row of that chunk once for all of those heads. A CTA is 4 warps: kPagedDecodeTokenWarps
// warps share out the chunk's tokens (whole 16-token steps), each covering 128 head dims (two
// warps side by side for head_dim 256), and their partial softmax states are combined at the
// end of the item. CTAs stay resident and loop over the items.
constexpr int kPagedDecodeRows = 16;
constexpr int paged_decode_warps(int64_t head_dim) { return head_dim > 128 ? static_cast<int>(head_dim / 128) : 1; }
constexpr int kPagedDecodeCtaWarps = 4;
constexpr int paged_decode_token_warps(int64_t head_dim) { return kPagedDecodeCtaWarps / paged_decode_warps(head_dim); }
// Tokens per step of the main loop: one 16-deep k-step of the P.V product.
constexpr int kPagedDecodeStep = 16;
// CTAs resident per SM that the plan counts on (8 warps of about 210 registers).
constexpr int kPagedDecodeCtasPerSm = 2;
// Scheduled items: at least this many tokens (one step per warp), and about this many items per
// resident CTA, so that items of unequal requests even out.
constexpr int64_t kPagedDecodeMinChunk = kPagedDecodeStep * kPagedDecodeCtaWarps;
constexpr int64_t kPagedDecodeItemsPerCta = 4;
// The scheduled plan keeps every request's chunk count in shared memory: up to this batch.
constexpr int64_t kPagedDecodeMaxScheduledBatch = 2048;
constexpr int kPagedDecodeMaxSplits = 128;

// How the work is cut, in one of two ways:
// * scheduled (splits == 0): every request is cut into chunks of chunk_tokens tokens (its last
//   chunk shorter), so a long request makes more items than a short one. The lengths live on the
//   GPU: each CTA reads them and numbers the chunks (a prefix sum over the batch), so the plan
//   needs no synchronisation. A request of one chunk writes out and lse directly; the others
//   write normalised partials and their lse, which a second kernel merges in chunk order.
// * static (splits >= 1): every request cut into `splits` equal slices of whole steps (a slice
//   past a short request's end is empty), the shape of the work fixed without the lengths; used
//   past kPagedDecodeMaxScheduledBatch and when a split count is forced (tuning, tests).
// head_chunks = ceil(G / 16) items per KV head (more than 16 query heads per KV head read the
// KV rows once per chunk). max_chunks bounds the chunks of the whole batch (workspace rows);
// ctas is the grid.
struct PagedDecodePlan {
  int head_chunks = 0;  // 0: no valid plan
  int splits = 0;
  int64_t chunk_tokens = 0;
  int64_t max_chunks = 0;
  int64_t ctas = 0;
};

inline int64_t paged_decode_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t paged_decode_resident_ctas(int sms) { return int64_t(sms) * kPagedDecodeCtasPerSm; }

// A static plan of `splits` slices; head_chunks = 0 when out of range.
inline PagedDecodePlan paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int splits,
                                         int sms) {
  PagedDecodePlan p;
  if (splits < 1 || splits > kPagedDecodeMaxSplits || num_kv_heads < 1 || num_qo_heads % num_kv_heads != 0 ||
      sms < 1) {
    return p;
  }
  const int64_t group = num_qo_heads / num_kv_heads;
  p.head_chunks = static_cast<int>(group == 0 ? 1 : paged_decode_cdiv(group, kPagedDecodeRows));
  p.splits = splits;
  const int64_t items = batch * num_kv_heads * p.head_chunks * splits;
  p.ctas = items < paged_decode_resident_ctas(sms) ? items : paged_decode_resident_ctas(sms);
  return p;
}

// A scheduled plan of chunks of `chunk_tokens` tokens (a multiple of kPagedDecodeStep) for a
// batch whose tokens number at most `tokens` (num_indices * page_size); head_chunks = 0 when out
// of range.
inline PagedDecodePlan paged_decode_scheduled_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                   int64_t tokens, int64_t chunk_tokens, int sms) {
  PagedDecodePlan p = paged_decode_plan(batch, num_qo_heads, num_kv_heads, 1, sms);
  if (p.head_chunks == 0 || chunk_tokens < kPagedDecodeStep || chunk_tokens % kPagedDecodeStep != 0 ||
      batch > kPagedDecodeMaxScheduledBatch) {
    return PagedDecodePlan{};
  }
  p.splits = 0;
  p.chunk_tokens = chunk_tokens;
  // Every request has at least one chunk; each adds at most one partly filled chunk.
  p.max_chunks = paged_decode_cdiv(tokens, chunk_tokens) + batch;
  const int64_t items = p.max_chunks * num_kv_heads * p.head_chunks;
  p.ctas = items < paged_decode_resident_ctas(sms) ? items : paged_decode_resident_ctas(sms);
  return p;
}

// The plan for a call on a GPU with `sms` multiprocessors, from the shapes alone: `tokens` is
// num_indices * page_size, an upper bound of the batch's tokens (kv_indices may be a larger
// buffer). Scheduled up to kPagedDecodeMaxScheduledBatch requests: chunks sized so that the
// tokens make about kPagedDecodeItemsPerCta items per resident CTA (rounded up to whole steps
// of every token warp, at least kPagedDecodeMinChunk). Beyond, static without splits (the batch
// alone then fills the GPU many times over).
// Examples on 132 SMs (264 resident CTAs), h32_kv8, d128: batch 32 x 2048 tokens -> chunks of
// 512; batch 1 x 32768 -> 256; batch 128 x 2048 -> 2048 (one chunk per request).
inline PagedDecodePlan choose_paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                int64_t head_dim, int64_t tokens, int sms) {
  PagedDecodePlan one = paged_decode_plan(batch, num_qo_heads, num_kv_heads, 1, sms);
  if (one.head_chunks == 0 || batch < 1 || sms < 1 || batch > kPagedDecodeMaxScheduledBatch) return one;
  const int64_t granule = kPagedDecodeStep * paged_decode_token_warps(head_dim);
  const int64_t items = paged_decode_resident_ctas(sms) * kPagedDecodeItemsPerCta;
  const int64_t heads = num_kv_heads * one.head_chunks;
  int64_t chunk = paged_decode_cdiv(paged_decode_cdiv(tokens * heads, items), granule) * granule;
  if (chunk < kPagedDecodeMinChunk) chunk = kPagedDecodeMinChunk;
  return paged_decode_scheduled_plan(batch, num_qo_heads, num_kv_heads, tokens, chunk, sms);
}

// fp32 elements of workspace a plan needs: a normalised output row and its lse per chunk (or
// split) and query head, and for a scheduled plan the chunks' numbering (batch + 1 int32).
inline int64_t paged_decode_workspace_elems(const PagedDecodePlan& plan, int64_t batch, int64_t num_qo_heads,
                                            int64_t head_dim) {
  if (plan.splits == 0) return plan.max_chunks * num_qo_heads * (head_dim + 1) + batch + 1;
  return plan.splits > 1 ? int64_t(plan.splits) * batch * num_qo_heads * (head_dim + 1) : 0;
}

// Head dimensions the kernels are compiled for.
inline bool paged_decode_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// Launches on `stream` (a cudaStream_t) of `device`; returns a cudaError_t value (0 = success).
// p.workspace must hold paged_decode_workspace_elems(plan, ...) floats. Every row of q, the caches and out must start on 16 bytes. A request whose layout is invalid
// (kv_indptr decreasing or past num_indices, a last page length outside [1, page_size], a page
// id outside [0, num_pages)) gets NaN in out and lse rather than a read out of bounds.
int launch_paged_decode_attention(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, void* stream);

}  // namespace opforge::cuda
