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

// A CTA computes one task: the query heads of one KV head (up to kPagedDecodeRows of them: two
// 8-head tensor-core tiles, or one when the KV head has at most 8) of one request over one slice
// of its tokens, reading each K and V row of that slice once for all of those heads. It is one
// warp per 128 head dims (two for head_dim 256), times the token warps of the plan below.
constexpr int kPagedDecodeRows = 16;
constexpr int paged_decode_warps(int64_t head_dim) { return head_dim > 128 ? static_cast<int>(head_dim / 128) : 1; }
// Tokens per step of the main loop: one 16-deep k-step of the V^T.P^T product.
constexpr int kPagedDecodeStep = 16;
// Warps resident per SM that the plan counts on: a warp holds about 200 registers per thread and
// a 24 KB ring of K and V rows in shared memory at 128 dims, so 8 fit an sm_90 SM (fewer where
// shared memory is smaller: the plan then makes more waves than it counts).
constexpr int kPagedDecodeWarpsPerSm = 8;
// A part of a request (a split, or one warp's run of it) keeps at least this many tokens of an
// average request (eight steps): shorter parts spend more on each warp's start and on combining
// than they gain in parallelism...
constexpr int64_t kPagedDecodeMinPartTokens = 128;
// ...unless there is at most one task per four SMs: the GPU is then mostly idle, the time is
// latency, and parts this short still pay where they are warps of one CTA (batch 1 x 512 tokens,
// h32_kv8_d128 on an H200: 10.3 us in 64 parts of 8 tokens, 11.3 in 4 of 128), or
// kPagedDecodeSplitTokenFactor x as long where they are splits, merged through memory (head_dim
// 256: h8_kv1 1 x 512 9.7 us in 16 splits, 11.8 in 64;
// bench/results/2026-11-27_h200_388744d_paged_decode_batch1/). At batch 8 of h32_kv8 (64 tasks) they do
// not pay: 8 x 512 takes 13.3 us in 4 parts, 15.2 in 16.
constexpr int64_t kPagedDecodeFewTaskMinPartTokens = 8;
// How many times the tokens a part that is a split (its partial output merged through memory)
// needs, against a part that is a token warp (folded in shared memory).
constexpr int64_t kPagedDecodeSplitTokenFactor = 4;
// With few tasks, a full wave of CTAs (rather than four warps per SM) where the parts of an
// average request keep this many tokens: long requests need the bytes in flight, short ones gain
// nothing from the second four warps (h32_kv4 8 x 2048, page size 1: 20.6 us in 32 parts of 64
// tokens, 23.0 in 16; h32_kv8 1 x 8192: 20.7 in 64 parts, 21.1 in 128 of 64 tokens),
// kPagedDecodeSplitTokenFactor x as many where the parts are splits (h8_kv1_d256 8 x 8192: 31.9 us
// at 32 splits of 256 tokens, 33.6 at 64).
constexpr int64_t kPagedDecodeFullWavePartTokens = 64;
// Parts per request always allowed, so that one long request among short ones is still shared
// out (the lengths are not known on the host).
constexpr int kPagedDecodeSkewParts = 16;
// The most splits of any plan (a caller may force up to this many).
constexpr int kPagedDecodeMaxSplits = 128;

// Requests whose lengths are known to be even: the caller's longest (max_tokens) at most
// kPagedDecodeEvenNum / kPagedDecodeEvenDen of the average.
constexpr int64_t kPagedDecodeEvenNum = 5;
constexpr int64_t kPagedDecodeEvenDen = 4;
// Even batches with at least kPagedDecodeEvenTasksNum / kPagedDecodeEvenTasksDen tasks per SM
// (2/3) and at most one (a CTA per SM at one split, so no SM holds more than another) take one
// split where a step's rows lie in one page (page_size a multiple of kPagedDecodeStep: one page
// id per step, rows a fixed stride apart), else two: with a page id per token, one CTA per SM
// keeps too few rows in flight (h32_kv4, page size 1, 32 x 2048: 54.8 us at 1 x 4, 49.6 at 2 x 4,
// 51.8 at 4 x 4). Between one and 1.75 tasks per SM, one split leaves some SMs two CTAs and the
// rest one, which long requests pay for (h32_kv4 page size 16 40 x 32768: 687.7 us at 1 x 4, 629.8
// at 4 x 4): the cuts of the shapes serve there.
constexpr int64_t kPagedDecodeEvenTasksNum = 2;
constexpr int64_t kPagedDecodeEvenTasksDen = 3;
// Requests whose lengths are known to be skewed: the caller's longest at least
// kPagedDecodeSkewedNum / kPagedDecodeSkewedDen of the average (rule 5 below).
constexpr int64_t kPagedDecodeSkewedNum = 4;
constexpr int64_t kPagedDecodeSkewedDen = 1;

// Most warps that share one task's slice inside a CTA (head_dim <= 128; one at 256, whose two
// warps already share each step's dims).
constexpr int kPagedDecodeMaxTokenWarps = 4;

// How the work is cut: head_chunks = ceil(G / 16) tasks per KV head (more than 16 query heads
// per KV head read the KV rows once per chunk), `splits` slices of every request's tokens
// (equal slices of whole steps; a slice past a short request's end is empty), `ctas` tasks in
// all (one CTA each). Inside a CTA, `token_warps` warps take equal runs of whole steps of the
// slice, each with its own ring, and the first combines their states in warp order: parallelism
// without a second kernel. splits > 1 writes normalised partial outputs and their lse to the
// workspace, which a second kernel merges.
struct PagedDecodePlan {
  int head_chunks = 0;  // 0: no valid plan
  int splits = 0;
  int token_warps = 0;
  int64_t ctas = 0;
  int ranges = 0;       // > 0: page ranges per KV head and head chunk (below) instead of splits
  int even_splits = 0;  // with ranges: the runs per request the kernels take for a batch they find balanced
};

// Page ranges: a schedule that does not depend on how the batch's tokens are spread over its
// requests. The batch's pages, kv_indices[kv_indptr[0] .. kv_indptr[batch]), are cut into `ranges`
// equal runs per KV head and head chunk, range r taking positions floor(r P / ranges) ..
// floor((r + 1) P / ranges) - 1 of the P pages; one CTA of kPagedDecodeRangeWarps warps per range
// streams the parts of the requests its pages hold, each part cut into equal runs for its warps
// and folded as token warps are. A request held by one range gets its output from that CTA; the
// parts of one held by several are written to the workspace as partial outputs (slot 0 of a
// range: the part holding its first page; slot 1: a part starting after it) and a second kernel
// merges them in range order, and writes the rows of requests without pages and of a batch whose
// kv_indptr is not monotone (NaN). A CTA keeps copies of kv_indptr and kv_last_page_len in shared
// memory, so batches are limited to kPagedDecodeRangesMaxBatch requests.
// Equal runs of pages rarely start where requests do, so a batch of even lengths would pay for
// partials and a merge it does not need (every request crossing an edge) where a cut would read
// each request whole. A plan with even_splits > 0 has the kernels check the lengths first (both
// hold kv_indptr already): where the longest request has at most kPagedDecodeRunsMaxNum /
// kPagedDecodeRunsMaxDen of the average pages, range r of every KV head takes run r % even_splits
// of request r / even_splits instead (equal runs of the request's pages, cut into runs for the
// warps as before), partials merged where even_splits > 1, and the CTAs past batch x
// even_splits return at once (the plan keeps batch x even_splits within the wave's ranges, so
// they cost no second wave). The bound is looser than the plan's even batches (5/4): in one wave
// of memory-bound CTAs the longer requests' CTAs take the bandwidth the shorter ones leave, so
// lengths up to 1.6 x the average still run faster per request than in equal page runs (h32_kv8
// page size 16 32 x uniform lengths, longest 1.64 x the average: 79.5 us at 1 x 4 against 88.3 in
// page runs; h32_kv4 page size 1: 49.6 at 2 x 4 against 54.8; H200), while one request 1.94 x the
// average among 31 even ones already wants the page runs (h32_kv8 page size 16: 88.8 us in runs,
// 80.4 in page runs; h32_kv4 page size 1 56.5 against 51.4, page size 16 59.0 against 51.1;
// bench/results/2026-11-28_h200_6305437_paged_decode_fused_merge/): 7/4 lies between the two.
constexpr int64_t kPagedDecodeRunsMaxNum = 7;
constexpr int64_t kPagedDecodeRunsMaxDen = 4;
constexpr int kPagedDecodeRangeWarps = 4;
constexpr int64_t kPagedDecodeRangesMaxBatch = 2048;
constexpr int kPagedDecodeMaxRanges = 4096;

#ifdef __CUDACC__
#define OPFORGE_RANGE_FN __host__ __device__ inline constexpr  // the kernels cut as the host tests do
#else
#define OPFORGE_RANGE_FN inline constexpr
#endif
OPFORGE_RANGE_FN int64_t paged_decode_range_of(int64_t q, int64_t pages, int64_t ranges) {
  const int64_t r = ((q + 1) * ranges - 1) / pages;
  return r < ranges - 1 ? r : ranges - 1;
}
OPFORGE_RANGE_FN int64_t paged_decode_range_start(int64_t r, int64_t pages, int64_t ranges) { return r * pages / ranges; }

inline int64_t paged_decode_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Completes a plan from its choices; head_chunks = 0 when they are out of range.
inline PagedDecodePlan paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                                         int splits, int token_warps = 1) {
  PagedDecodePlan p;
  if (splits < 1 || splits > kPagedDecodeMaxSplits || num_kv_heads < 1 || num_qo_heads % num_kv_heads != 0) return p;
  if (token_warps != 1 && (paged_decode_warps(head_dim) != 1 ||
                           (token_warps != 2 && token_warps != kPagedDecodeMaxTokenWarps))) {
    return p;
  }
  const int64_t group = num_qo_heads / num_kv_heads;
  p.head_chunks = static_cast<int>(group == 0 ? 1 : paged_decode_cdiv(group, kPagedDecodeRows));
  p.splits = splits;
  p.token_warps = token_warps;
  p.ctas = batch * num_kv_heads * p.head_chunks * splits;
  return p;
}

// A page-range plan with `ranges` per KV head and head chunk and `even_splits` splits per request
// for a batch the GPU finds balanced (0: none); head_chunks = 0 when out of range (1 .. kPagedDecodeMaxRanges,
// head_dim <= 128, at most kPagedDecodeRangesMaxBatch requests, batch x even_splits <= ranges).
inline PagedDecodePlan paged_decode_ranges_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                int64_t head_dim, int ranges, int even_splits = 0) {
  PagedDecodePlan p = paged_decode_plan(batch, num_qo_heads, num_kv_heads, head_dim, 1);
  if (p.head_chunks == 0 || ranges < 1 || ranges > kPagedDecodeMaxRanges || paged_decode_warps(head_dim) != 1 ||
      batch > kPagedDecodeRangesMaxBatch || even_splits < 0 || even_splits > kPagedDecodeMaxSplits ||
      batch * even_splits > ranges) {
    return PagedDecodePlan{};
  }
  p.ranges = ranges;
  p.even_splits = even_splits;
  p.token_warps = kPagedDecodeRangeWarps;
  p.ctas = num_kv_heads * p.head_chunks * ranges;
  return p;
}

// The ranges per KV head and head chunk that make one wave of resident CTAs on `sms`
// multiprocessors (equal runs of pages finish together), at least one.
inline int paged_decode_wave_ranges(int64_t num_qo_heads, int64_t num_kv_heads, int sms) {
  const int64_t group = num_kv_heads >= 1 ? num_qo_heads / num_kv_heads : 1;
  const int64_t groups = num_kv_heads * paged_decode_cdiv(group < 1 ? 1 : group, kPagedDecodeRows);
  int64_t r = int64_t(sms) * (kPagedDecodeWarpsPerSm / kPagedDecodeRangeWarps) / (groups < 1 ? 1 : groups);
  if (r < 1) r = 1;
  return static_cast<int>(r > kPagedDecodeMaxRanges ? kPagedDecodeMaxRanges : r);
}

// The cut of a call on a GPU with `sms` multiprocessors (the plan, unless rule 5 below takes page
// ranges), from the shapes alone (the lengths live on the GPU; reading them would cost a
// synchronisation): `tokens` is num_indices * page_size, an upper bound of the tokens in the
// batch (kv_indices may be a larger buffer).
// There are batch * num_kv_heads * head_chunks tasks, and a wave of resident warps is
// sms * kPagedDecodeWarpsPerSm. Each request's tokens are cut into `parts`, the fewest of:
// 1. enough for the tasks' warps to make four waves (later waves even out unequal lengths). Also
//    where every part is a split (head_dim 256), whose partial output goes through memory: one
//    wave would serve uniform batches better (h8_kv1_d256 128 x 2048: 81.2 us at 4 splits, 89.7
//    at 16) but leave skewed ones 3x slower (h16_kv8_d256 32 x tail: 626.6 us at 2, 187.9 at 8);
// 2. four warps per SM in CTAs of the most parts one CTA can take (4 x floor(sms / tasks) parts
//    with token warps, floor(2 sms / tasks) splits of two-warp CTAs at 256 dims), or eight where
//    the parts of an average request keep kPagedDecodeFullWavePartTokens tokens, or
//    kPagedDecodeSkewParts if more: with few tasks, CTAs past a whole number per SM put more on
//    some SMs and leave the rest waiting for them (batch 1 x 32768: 48.3 us at 16 splits x 4 warps
//    = 128 CTAs, 50.4 at 17 x 4 = 136); short requests gain nothing from the second four warps
//    (1 x 512: 10.3 us at 128 CTAs, 11.0 at 256), long ones need them to keep enough bytes in
//    flight (h32_kv4, page size 1, 8 x 32768: 185.3 us at 128 CTAs, 142.5 at 256);
// 3. kPagedDecodeMinPartTokens tokens per part of an average request (with at most one task per
//    four SMs, kPagedDecodeFewTaskMinPartTokens, x kPagedDecodeSplitTokenFactor for splits alone);
//    kPagedDecodeMaxSplits splits;
// 4. no more than one CTA takes (no split) where the tasks' token warps make a wave without; and
//    where the caller says how long the longest request is (max_tokens > 0; 0: not known), that
//    is within kPagedDecodeEvenNum / kPagedDecodeEvenDen of the average, and the tasks give three
//    quarters of the SMs two CTAs: later waves have nothing to even out then (the cuts rules 1-3
//    hedge with cost uniform batches 4-17%: h32_kv8 32 x 2048 76.3 us at 1 x 4 warps, 82.6 at
//    4 x 4; h32_kv4 page size 1 64 x 2048 77.3 against 91.6). Even batches of 2/3 to one task per
//    SM take one split where pages hold whole steps, two where not (kPagedDecodeEvenTasksNum;
//    h32_kv4 page size 16 24 x 2048: 39.2 us at 1 x 4 against 43.2 at 4 x 4, 32 x 8192 135.6
//    against 143.5; page size 1 32 x 8192 140.4 at 2 x 4 against 144.6 at 4 x 4, 183.0 at 1 x 4;
//    bench/results/2026-11-27_h200_4c5b98f_paged_decode_even_pages/). `tokens` stands for the batch's
//    total there, so a kv_indices buffer much larger than the pages in use makes the average an
//    overestimate (a slower plan, never a wrong result). (Forced cuts with 8 token warps,
//    bench/results/2026-11-27_h200_7931d11_paged_decode_token_warps8/: better on skewed batches at 32
//    parts, worse on uniform ones at the 16 the plan hedges with.)
// Up to four parts are warps of one CTA (head_dim <= 128), the rest splits across CTAs: warps
// that share a CTA's slice need no second kernel, and one with an empty run costs little.
// Measured on an H200 against every forced cut up to 4 splits x 4 warps
// (bench/results/2026-11-27_h200_dbceec5_paged_decode_token_warps/) and, at batch 1 and at 256 dims,
// more (bench/results/2026-11-27_h200_388744d_paged_decode_batch1/): uniform batches of 32 lose up to
// 9% against their best cut (1 split x 4 warps) for the sake of skewed ones (a 32768-token
// request among 31 of 512 is 2.5x faster at 16 parts than at 4); batch 1 takes 64 parts at every
// context.
// Examples on 132 SMs, h32_kv8_d128: batch 128 x 2048 tokens -> 4 parts (1 split x 4 warps);
// batch 32 x 2048 -> 16 (4 x 4); batch 32 x 512 -> 4 (1 x 4); batch 8 x 8192 -> 16 (4 x 4);
// batch 1 x 512 .. 8192 -> 64 (16 x 4), x 32768 -> 132 (33 x 4); batch 128 x 64 -> 1 (1 x 1).
// h32_kv4_d128: batch 1 x 32768 -> 264 (66 x 4); batch 8 x 512 -> 16 (4 x 4), x 2048 .. 32768
// -> 32 (8 x 4); batch 128 -> 4 (1 x 4). h8_kv1_d256: batch 128 x 2048 -> 16 splits; batch 8 x
// 2048 -> 33; batch 1 x 512 -> 16, x 32768 -> 128. h16_kv8_d256: batch 128 -> 2 splits.
inline PagedDecodePlan paged_decode_cut(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                                        int64_t tokens, int64_t page_size, int sms, int64_t max_tokens = 0) {
  PagedDecodePlan one = paged_decode_plan(batch, num_qo_heads, num_kv_heads, head_dim, 1);
  if (one.head_chunks == 0 || batch < 1 || one.ctas < 1 || sms < 1) return one;
  const int64_t warps = paged_decode_warps(head_dim);
  const int64_t wave = int64_t(sms) * kPagedDecodeWarpsPerSm;  // resident warps
  // The parts one CTA can take: token warps where a task has one warp of dims, else one split
  // (whose parts then need kPagedDecodeSplitTokenFactor x the tokens).
  const bool token_warps_fit = warps == 1;
  const int64_t per_cta = token_warps_fit ? kPagedDecodeMaxTokenWarps : 1;
  const int64_t token_factor = token_warps_fit ? 1 : kPagedDecodeSplitTokenFactor;
  const int64_t avg_tokens = paged_decode_cdiv(tokens, batch);
  int64_t parts = 4 * wave / warps / one.ctas;
  // Few tasks: the parts of whole CTAs that fill `resident` warps (a wave, or half of one).
  auto parts_filling = [&](int64_t resident) { return per_cta * (resident / (warps * per_cta) / one.ctas); };
  int64_t spread = parts_filling(wave);
  if (spread < 1 || avg_tokens / spread < token_factor * kPagedDecodeFullWavePartTokens) {
    spread = parts_filling(wave / 2);
  }
  if (spread < kPagedDecodeSkewParts) spread = kPagedDecodeSkewParts;
  const bool few_tasks = kPagedDecodeMaxTokenWarps * one.ctas <= sms;
  const int64_t by_length =
      avg_tokens / (few_tasks ? token_factor * kPagedDecodeFewTaskMinPartTokens : kPagedDecodeMinPartTokens);
  for (const int64_t cap : {spread, by_length, per_cta * kPagedDecodeMaxSplits}) {
    if (parts > cap) parts = cap;
  }
  // Rule 4: no split (or few) where there is nothing for one to even out, as its merge pass costs
  // more than later waves gain: tasks whose token warps alone fill a wave (h32_kv4 128 x 2048:
  // 139.4 us at 1 x 4, 148.4 at 2 x 4; the mixed batch too, 147.5 against 149.6), or lengths the
  // caller says are even. Not without token warps, where a split is what evens out unequal
  // lengths (h16_kv8_d256 128 x uniform: 541.0 us at 1 split, 518.2 at 2).
  const bool even = max_tokens > 0 && max_tokens * kPagedDecodeEvenDen <= avg_tokens * kPagedDecodeEvenNum;
  if (token_warps_fit && parts > per_cta) {
    const int64_t sm = sms;
    if (one.ctas * per_cta >= wave || (even && 4 * one.ctas >= 7 * sm)) {
      parts = per_cta;
    } else if (even && kPagedDecodeEvenTasksDen * one.ctas >= kPagedDecodeEvenTasksNum * sm && one.ctas <= sm) {
      const int64_t splits = page_size % kPagedDecodeStep == 0 ? 1 : 2;
      if (parts > per_cta * splits) parts = per_cta * splits;
    }
  }
  if (parts < 1) parts = 1;
  int token_warps = 1;
  while (token_warps_fit && token_warps < kPagedDecodeMaxTokenWarps && 2 * token_warps <= parts) token_warps *= 2;
  const PagedDecodePlan cut = paged_decode_plan(batch, num_qo_heads, num_kv_heads, head_dim,
                                                static_cast<int>(paged_decode_cdiv(parts, token_warps)), token_warps);
  return cut;
}

// The even_splits of a page-range plan of `ranges` per KV head and head chunk: the splits of the
// cut for a batch whose lengths are all the average, where that cut has kPagedDecodeRangeWarps
// warps per CTA and batch x its splits fit the ranges; else 0 (page runs whatever the lengths).
inline int paged_decode_even_splits(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                                    int64_t tokens, int64_t page_size, int sms, int ranges) {
  if (batch < 1 || tokens < 1) return 0;
  const PagedDecodePlan even = paged_decode_cut(batch, num_qo_heads, num_kv_heads, head_dim, tokens, page_size, sms,
                                                paged_decode_cdiv(tokens, batch));
  return even.head_chunks != 0 && even.token_warps == kPagedDecodeRangeWarps && batch * even.splits <= ranges
             ? even.splits
             : 0;
}

// The plan: the cut above, or page ranges (rule 5) where that cut has splits, the tasks give
// three quarters of the SMs one, and the caller says the batch is skewed (its longest request at
// least kPagedDecodeSkewedNum / kPagedDecodeSkewedDen x the average) or does not say how long
// its longest request is. Page ranges bound the worst case: one long request among short ones
// streams over every SM instead of a few (h32_kv8 page size 16, 32 x tail, 21.6 x the average:
// 116.5 us in the cut, 79.4-86.2 in ranges; h32_kv4 page size 1: 147.4 -> 65.2-77.4; H200). Without
// the hint the kernels also check the lengths (even_splits: the even cut's splits, where that cut
// has kPagedDecodeRangeWarps warps per CTA and fits the wave), and a batch whose longest request
// has at most 7/4 of the average pages takes runs per request instead of equal page runs. Against
// the cut the shapes alone give (same run, H200, bench/results/2026-11-28_h200_9bb02b9_paged_decode_balanced_runs/):
// even batches 0.94-1.02x the time (h32_kv8 32 x 2048: 75.5 -> 71.3 us), skewed ones 0.68-0.94x
// (0.53-0.74x against the plan's own cut of them, 3 x 4, timed in an earlier run), but lengths
// spread uniformly up to 1.6 x the average 1.06-1.16x (h32_kv8 32 x uniform: 81.7
// -> 86.5 us; its four waves of splits even them out better than one wave can); a caller who
// knows the batch is neither skewed nor even (max_kv_len) keeps the cut. Fewer tasks keep it
// too: each range's partials are then merged through memory for most rows (8 x 2048 h32_kv4:
// 20.7 us cut, 30.4 ranges).
inline PagedDecodePlan choose_paged_decode_plan(int64_t batch, int64_t num_qo_heads, int64_t num_kv_heads,
                                                int64_t head_dim, int64_t tokens, int64_t page_size, int sms,
                                                int64_t max_tokens = 0) {
  const PagedDecodePlan cut =
      paged_decode_cut(batch, num_qo_heads, num_kv_heads, head_dim, tokens, page_size, sms, max_tokens);
  if (cut.head_chunks == 0 || cut.splits < 2) return cut;
  const int64_t avg_tokens = paged_decode_cdiv(tokens, batch);
  const bool skewed = max_tokens > 0 && max_tokens * kPagedDecodeSkewedDen >= avg_tokens * kPagedDecodeSkewedNum;
  const int64_t tasks = batch * num_kv_heads * cut.head_chunks;
  if (!(skewed || max_tokens == 0) || 4 * tasks < 3 * int64_t(sms)) return cut;
  const int ranges = paged_decode_wave_ranges(num_qo_heads, num_kv_heads, sms);
  const int even_splits = max_tokens == 0 ? paged_decode_even_splits(batch, num_qo_heads, num_kv_heads, head_dim,
                                                                     tokens, page_size, sms, ranges)
                                          : 0;
  const PagedDecodePlan ranged =
      paged_decode_ranges_plan(batch, num_qo_heads, num_kv_heads, head_dim, ranges, even_splits);
  return ranged.head_chunks != 0 ? ranged : cut;
}

// fp32 elements of workspace a plan needs: a normalised output row and its lse per split and
// query head (0 without a split).
inline int64_t paged_decode_workspace_elems(const PagedDecodePlan& plan, int64_t batch, int64_t num_qo_heads,
                                            int64_t head_dim) {
  if (plan.ranges > 0) return 2 * plan.ctas * kPagedDecodeRows * (head_dim + 1);  // two slots of a chunk's rows per range
  return plan.splits > 1 ? int64_t(plan.splits) * batch * num_qo_heads * (head_dim + 1) : 0;
}

// Head dimensions the kernels are compiled for.
inline bool paged_decode_head_dim_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// Whether `device` gives a CTA the shared memory of a page-range plan at head_dim (four warps'
// rings and copies of kv_indptr and kv_last_page_len for kPagedDecodeRangesMaxBatch requests: about
// 112 KB at 128 dims; an sm_86 or sm_89 GPU allows 99 KB per block).
bool paged_decode_ranges_fit(int device, int64_t head_dim);

// Launches on `stream` (a cudaStream_t) of `device`; returns a cudaError_t value (0 = success).
// Every row of q, the caches and out must start on 16 bytes. A request whose layout is invalid
// (kv_indptr decreasing or past num_indices, a last page length outside [1, page_size], a page
// id outside [0, num_pages)) gets NaN in out and lse rather than a read out of bounds.
int launch_paged_decode_attention(const PagedDecodeParams& p, const PagedDecodePlan& plan, int device, void* stream);

}  // namespace opforge::cuda
