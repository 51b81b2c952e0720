// Binding of paged_decode_attention (GQA decode over a paged KV cache) and its CPU
// implementation. The CUDA kernels are in cuda/paged_decode_attention.cu, which also says what
// the op computes.
#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "paged_decode_attention.h"
#include "tensor_view.h"
#ifdef OPFORGE_WITH_CUDA
#include "device.h"
#endif

namespace opforge {
namespace {

using cuda::PagedDecodeParams;
using cuda::PagedDecodePlan;
using Code = nb::dlpack::dtype_code;

const OpContext kCtx{"paged_decode_attention"};
const std::string kPrefix = "opforge.paged_decode_attention: ";

std::string str(int64_t v) { return std::to_string(v); }

// --- CPU implementation -----------------------------------------------------------------------

// Per request and KV head: the base-2 logits of its G query heads over every token, then one
// pass over V. fp32 throughout (the products of two 16-bit values are exact), rounded once.
template <typename T>
void paged_decode_cpu(const PagedDecodeParams& p) {
  const int64_t group = p.num_qo_heads / p.num_kv_heads, d = p.head_dim, s = p.page_size;
  const float scale = p.sm_scale * 1.4426950408889634f;  // log2(e): exp2 and a base-2 lse
  const auto* q = static_cast<const T*>(p.q);
  const auto* kc = static_cast<const T*>(p.k_cache);
  const auto* vc = static_cast<const T*>(p.v_cache);
  auto* out = static_cast<T*>(p.out);
  const auto gd = static_cast<size_t>(group * d);
  std::vector<float> qf(gd), acc(gd), row(static_cast<size_t>(d)), mx(static_cast<size_t>(group)),
      sum(static_cast<size_t>(group)), logits;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t first = p.kv_indptr[b], pages = p.kv_indptr[b + 1] - first;
    const int64_t tail = pages == 0 ? 0 : p.kv_last_page_len ? p.kv_last_page_len[b] : s;
    const int64_t n = pages == 0 ? 0 : (pages - 1) * s + tail;
    logits.resize(size_t(n * group));
    for (int64_t kvh = 0; kvh < p.num_kv_heads; ++kvh) {
      const int64_t head0 = kvh * group;
      for (int64_t g = 0; g < group; ++g) {
        const T* qrow = q + b * p.q_stride_b + (head0 + g) * p.q_stride_h;
        for (int64_t i = 0; i < d; ++i) qf[size_t(g * d + i)] = cpu::to_float(qrow[i]);
        mx[size_t(g)] = -std::numeric_limits<float>::infinity();
        sum[size_t(g)] = 0.f;
      }
      const auto token_row = [&](const T* cache, int64_t sp, int64_t ss, int64_t sh, int64_t t) {
        return cache + int64_t(p.kv_indices[first + t / s]) * sp + (t % s) * ss + kvh * sh;
      };
      for (int64_t t = 0; t < n; ++t) {
        const T* k = token_row(kc, p.k_stride_page, p.k_stride_slot, p.k_stride_head, t);
        for (int64_t i = 0; i < d; ++i) row[size_t(i)] = cpu::to_float(k[i]);
        for (int64_t g = 0; g < group; ++g) {
          // 8 interleaved partial sums (head_dim is a multiple of 64): vectorisable.
          float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          const float* qg = &qf[size_t(g * d)];
          for (int64_t i = 0; i < d; i += 8) {
            for (int j = 0; j < 8; ++j) part[j] += qg[i + j] * row[size_t(i + j)];
          }
          const float dot = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
          const float l = dot * scale;
          logits[size_t(t * group + g)] = l;
          mx[size_t(g)] = std::max(mx[size_t(g)], l);
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const T* v = token_row(vc, p.v_stride_page, p.v_stride_slot, p.v_stride_head, t);
        for (int64_t i = 0; i < d; ++i) row[size_t(i)] = cpu::to_float(v[i]);
        for (int64_t g = 0; g < group; ++g) {
          const float w = std::exp2(logits[size_t(t * group + g)] - mx[size_t(g)]);
          sum[size_t(g)] += w;
          float* a = &acc[size_t(g * d)];
          for (int64_t i = 0; i < d; ++i) a[i] += w * row[size_t(i)];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = head0 + g;
        const float total = sum[size_t(g)], inv = total == 0.f ? 0.f : 1.f / total;
        T* o = out + b * p.out_stride_b + head * p.out_stride_h;
        for (int64_t i = 0; i < d; ++i) o[i] = cpu::from_float<T>(acc[size_t(g * d + i)] * inv);
        p.lse[b * p.lse_stride_b + head * p.lse_stride_h] =
            total == 0.f ? -std::numeric_limits<float>::infinity() : mx[size_t(g)] + std::log2(total);
      }
    }
  }
}

// --- validation -------------------------------------------------------------------------------

// One tensor argument with the checks that concern it alone.
struct Arg : SizedArg {
  bool empty() const { return numel() == 0; }
  const int32_t* ints() const { return reinterpret_cast<const int32_t*>(data()); }
};

enum class Kind { kQuery, kAttn, kInt32, kLse, kWorkspace };

const char* layout_of(const char* name) {
  const std::string n = name;
  if (n == "q" || n == "out") return "[batch, num_qo_heads, head_dim]";
  if (n == "k_cache" || n == "v_cache") return "[num_pages, page_size, num_kv_heads, head_dim]";
  if (n == "kv_indptr") return "[batch + 1]";
  if (n == "kv_indices") return "[num_indices]";
  if (n == "kv_last_page_len") return "[batch]";
  if (n == "lse") return "[batch, num_qo_heads]";
  return "[n]";
}

// dtype: `attn` is q's (fp16 or bf16) for kAttn arguments. Rank and non-negative strides.
Arg arg(nb::handle obj, const char* name, Kind kind, nb::dlpack::dtype attn, size_t rank) {
  Arg a{{tensor_arg(kCtx, obj, name)}};
  const nb::dlpack::dtype dt = a.t.dtype();
  const std::string given = kPrefix + name + " has dtype " + dtype_name(dt);
  switch (kind) {
    case Kind::kQuery:
      if (!has_dtype(dt, Code::Float, 16) && !has_dtype(dt, Code::Bfloat, 16)) {
        throw_type_error(given + "; accepted: float16, bfloat16");
      }
      a.elem_bytes = 2;
      break;
    case Kind::kAttn:
      if (!(dt == attn)) throw_type_error(given + " but q has " + dtype_name(attn) + "; q, k_cache, v_cache and out "
                                                  "share one dtype (float16 or bfloat16)");
      a.elem_bytes = 2;
      break;
    case Kind::kInt32:
      if (!has_dtype(dt, Code::Int, 32)) {
        throw_type_error(given + "; accepted: int32 (e.g. " + name + ".to(torch.int32))");
      }
      a.elem_bytes = 4;
      break;
    case Kind::kLse:
    case Kind::kWorkspace:
      if (!has_dtype(dt, Code::Float, 32)) throw_type_error(given + "; accepted: float32");
      a.elem_bytes = 4;
      break;
  }
  check_rank(kCtx, a, rank, layout_of(name));
  return a;
}

void check_shape(const Arg& a, std::initializer_list<int64_t> want) { check_dims(kCtx, a, want, layout_of(a.name())); }

// The last dimension (head_dim) is read and written as whole rows.
void check_rows_contiguous(const Arg& a) {
  const size_t last = a.t.ndim() - 1;
  if (a.shape(last) > 1 && a.stride(last) != 1) {
    throw_value_error(kPrefix + a.name() + " has stride " + str(a.stride(last)) + " along head_dim (its last "
                      "dimension); head_dim must be contiguous (stride 1), the other strides are free");
  }
}

void check_contiguous_1d(const Arg& a) {
  if (a.shape(0) > 1 && a.stride(0) != 1) {
    throw_value_error(kPrefix + a.name() + " has stride " + str(a.stride(0)) + "; accepted: a contiguous 1-d "
                      "tensor (pass " + a.name() + ".contiguous())");
  }
}

void check_rows_aligned(const Arg& a, std::initializer_list<size_t> walked) {
  bool ok = reinterpret_cast<uintptr_t>(a.data()) % 16 == 0;
  std::string strides;
  for (size_t i = 0; i < a.t.ndim(); ++i) strides += (i ? ", " : "") + str(a.stride(i));
  for (size_t i : walked) ok = ok && (a.shape(i) <= 1 || (a.stride(i) * a.elem_bytes) % 16 == 0);
  if (!ok) {
    throw_value_error(kPrefix + a.name() + " has rows that do not start on 16 bytes (data pointer % 16 = " +
                      str(int64_t(reinterpret_cast<uintptr_t>(a.data()) % 16)) + ", strides (" + strides +
                      ") elements); the CUDA kernel reads and writes 16-byte vectors: pass " + a.name() +
                      ".contiguous()");
  }
}

// The page layout itself, read on the CPU (CUDA tensors are checked in Python, where one
// synchronisation covers them; the kernel turns what slips through into NaN, never a bad read).
void check_layout_values(const Arg& indptr, const Arg& indices, const Arg* last_len, int64_t num_pages,
                         int64_t page_size) {
  const int32_t* ip = indptr.ints();
  const int64_t batch = indptr.shape(0) - 1, nnz = indices.shape(0);
  if (ip[0] < 0) throw_value_error(kPrefix + "kv_indptr[0] = " + str(ip[0]) + "; accepted: offsets >= 0");
  for (int64_t b = 0; b < batch; ++b) {
    if (ip[b + 1] < ip[b]) {
      throw_value_error(kPrefix + "kv_indptr is not non-decreasing: kv_indptr[" + str(b) + "] = " + str(ip[b]) +
                        " > kv_indptr[" + str(b + 1) + "] = " + str(ip[b + 1]) + "; request " + str(b) +
                        "'s pages are kv_indices[kv_indptr[b]:kv_indptr[b + 1]]");
    }
  }
  if (ip[batch] > nnz) {
    throw_value_error(kPrefix + "kv_indptr[-1] = " + str(ip[batch]) + " but kv_indices has only " + str(nnz) +
                      " entries; accepted: kv_indptr[-1] <= len(kv_indices)");
  }
  const int32_t* idx = indices.ints();
  for (int64_t i = ip[0]; i < ip[batch]; ++i) {
    if (idx[i] < 0 || idx[i] >= num_pages) {
      throw_value_error(kPrefix + "kv_indices[" + str(i) + "] = " + str(idx[i]) + " is not a page of the cache; "
                        "accepted: page ids in [0, num_pages = " + str(num_pages) + ")");
    }
  }
  if (last_len == nullptr) return;
  const int32_t* ll = last_len->ints();
  for (int64_t b = 0; b < batch; ++b) {
    if (ip[b + 1] > ip[b] && (ll[b] < 1 || ll[b] > page_size)) {
      throw_value_error(kPrefix + "kv_last_page_len[" + str(b) + "] = " + str(ll[b]) + "; accepted: 1 .. page_size = " +
                        str(page_size) + " for a request with pages (the valid tokens of its last page)");
    }
  }
}

PagedDecodePlan forced_or_chosen_plan(int64_t batch, int64_t hq, int64_t hkv, int64_t head_dim, int64_t tokens,
                                      int64_t page_size, int64_t max_tokens, int sms, int splits, int token_warps,
                                      int even_splits, bool page_ranges = true) {
  if (even_splits != -1 && splits != 0) {
    throw_value_error(kPrefix + "even_splits=" + str(even_splits) + " is for page ranges (splits=0) only");
  }
  if (max_tokens < 0) {
    throw_value_error(kPrefix + "max_kv_len = " + str(max_tokens) + "; accepted: the longest request's tokens "
                      "(>= 0; 0 or None: not known)");
  }
  if (splits == -1 && token_warps == -1) {
    return page_ranges ? cuda::choose_paged_decode_plan(batch, hq, hkv, head_dim, tokens, page_size, sms, max_tokens)
                       : cuda::paged_decode_cut(batch, hq, hkv, head_dim, tokens, page_size, sms, max_tokens);
  }
  if (splits == 0) {  // page ranges: token_warps of them per KV head and head chunk (-1: a wave's)
    const int ranges = token_warps == -1 ? cuda::paged_decode_wave_ranges(hq, hkv, sms) : token_warps;
    const int even = even_splits != -1
                         ? even_splits
                         : cuda::paged_decode_even_splits(batch, hq, hkv, head_dim, tokens, page_size, sms, ranges);
    const PagedDecodePlan plan = cuda::paged_decode_ranges_plan(batch, hq, hkv, head_dim, ranges, even);
    if (plan.head_chunks == 0) {
      throw_value_error(kPrefix + "splits=0 (page ranges) with " + str(ranges) + " ranges and even_splits=" +
                        str(even) + " is not valid; accepted: 1 to " + str(cuda::kPagedDecodeMaxRanges) +
                        " ranges, head_dim <= 128, batch <= " + str(cuda::kPagedDecodeRangesMaxBatch) +
                        ", even_splits 0 (none) to " + str(cuda::kPagedDecodeMaxSplits) +
                        " with batch x even_splits <= ranges, or -1 (the plan's)");
    }
    return plan;
  }
  const PagedDecodePlan plan =
      splits == -1 ? PagedDecodePlan{} : cuda::paged_decode_plan(batch, hq, hkv, head_dim, splits, token_warps == -1 ? 1 : token_warps);
  if (plan.head_chunks == 0) {
    throw_value_error(kPrefix + "splits=" + str(splits) + ", token_warps=" + str(token_warps) +
                      " is not valid; accepted: splits 1.." + str(cuda::kPagedDecodeMaxSplits) +
                      " with token_warps 1, 2 or " + str(cuda::kPagedDecodeMaxTokenWarps) +
                      " (2 and up at head_dim <= 128; -1: 1), splits 0 for page ranges (token_warps: how many"
                      " per KV head, -1: a wave's), or both -1: the plan's choice");
  }
  return plan;
}

// Validates everything, then computes into out and lse (launch) or only validates (the "torch"
// backend). Returns 0 when done, or, for a CUDA plan with splits and no workspace given, the
// fp32 elements of workspace to call again with (nothing is written then).
int64_t paged_decode_attention(nb::handle out_obj, nb::handle lse_obj, nb::handle q_obj, nb::handle k_obj,
                               nb::handle v_obj, nb::handle indptr_obj, nb::handle indices_obj, nb::handle last_obj,
                               nb::handle workspace_obj, double sm_scale, std::optional<uintptr_t> stream, bool launch, int splits,
                               int token_warps, int64_t max_tokens, int even_splits) {
  const Arg q = arg(q_obj, "q", Kind::kQuery, {}, 3);
  const nb::dlpack::dtype attn = q.t.dtype();
  check_device_supported(kCtx, q.device_view());
  const Arg k = arg(k_obj, "k_cache", Kind::kAttn, attn, 4);
  const Arg v = arg(v_obj, "v_cache", Kind::kAttn, attn, 4);
  const Arg indptr = arg(indptr_obj, "kv_indptr", Kind::kInt32, attn, 1);
  const Arg indices = arg(indices_obj, "kv_indices", Kind::kInt32, attn, 1);
  std::optional<Arg> last;
  if (!last_obj.is_none()) last = arg(last_obj, "kv_last_page_len", Kind::kInt32, attn, 1);
  const Arg out = arg(out_obj, "out", Kind::kAttn, attn, 3);
  const Arg lse = arg(lse_obj, "lse", Kind::kLse, attn, 2);
  for (const Arg* a : {&k, &v, &indptr, &indices, &out, &lse}) check_same_device(kCtx, q, *a);
  if (last) check_same_device(kCtx, q, *last);

  const int64_t batch = q.shape(0), hq = q.shape(1), head_dim = q.shape(2);
  const int64_t num_pages = k.shape(0), page_size = k.shape(1), hkv = k.shape(2);
  std::string differ;
  const char* cache_dims[4] = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
  for (size_t i = 0; i < 4; ++i) {
    if (v.shape(i) != k.shape(i)) differ += std::string(differ.empty() ? "" : ", ") + cache_dims[i];
  }
  if (!differ.empty()) {
    throw_value_error(kPrefix + "v_cache has shape " + shape_string(v.t) + " but k_cache has shape " +
                      shape_string(k.t) + "; they must be equal " + layout_of("k_cache") + " (their " + differ +
                      " differ)");
  }
  if (k.shape(3) != head_dim) {
    throw_value_error(kPrefix + "k_cache has head_dim " + str(k.shape(3)) + " (shape " + shape_string(k.t) +
                      ") but q has " + str(head_dim) + " (shape " + shape_string(q.t) + "); they must be equal");
  }
  if (!cuda::paged_decode_head_dim_supported(head_dim)) {
    throw_value_error(kPrefix + "q has head_dim " + str(head_dim) + "; accepted: 64, 128, 256");
  }
  if (page_size < 1) {
    throw_value_error(kPrefix + "k_cache has page_size 0 (shape " + shape_string(k.t) + "); accepted: >= 1");
  }
  if (hkv < 1 || hq % hkv != 0) {
    throw_value_error(kPrefix + "num_qo_heads = " + str(hq) + " (q.shape[1]) is not a multiple of num_kv_heads = " +
                      str(hkv) + " (k_cache.shape[2]); each KV head serves the same number of query heads");
  }
  check_shape(indptr, {batch + 1});
  if (last) check_shape(*last, {batch});
  check_shape(out, {batch, hq, head_dim});
  check_shape(lse, {batch, hq});
  for (const Arg* a : {&q, &k, &v, &out}) check_rows_contiguous(*a);
  check_contiguous_1d(indptr);
  check_contiguous_1d(indices);
  if (last) check_contiguous_1d(*last);
  for (const Arg* a : {&out, &lse}) {
    if (overlaps_itself(*a)) {
      throw_value_error(kPrefix + a->name() + " has strides that make some of its elements overlap (an expanded or "
                        "broadcast tensor cannot be written)");
    }
  }
  for (const Arg* o : {&out, &lse}) {
    for (const Arg* a : {&q, &k, &v, &indptr, &indices}) check_separate(kCtx, *o, *a);
    if (last) check_separate(kCtx, *o, *last);
  }
  check_separate(kCtx, out, lse);
  const int64_t num_indices = indices.shape(0);
  int64_t tokens = 0;
  if (__builtin_mul_overflow(num_indices, page_size, &tokens) || tokens > INT32_MAX || batch * hq > INT32_MAX) {
    throw_value_error(kPrefix + "kv_indices has " + str(num_indices) + " entries of " + str(page_size) +
                      " tokens and q has " + str(batch) + " x " + str(hq) + " heads; accepted: fewer than 2^31 "
                      "tokens and 2^31 query rows");
  }
  const bool on_cpu = !q.device_view().is_cuda();
  if (on_cpu && batch > 0) check_layout_values(indptr, indices, last ? &*last : nullptr, num_pages, page_size);

  PagedDecodeParams p;
  p.out = out.data();
  p.lse = reinterpret_cast<float*>(lse.data());
  p.q = q.data();
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.kv_indptr = indptr.ints();
  p.kv_indices = indices.ints();
  p.kv_last_page_len = last ? last->ints() : nullptr;
  p.dtype = has_dtype(attn, Code::Float, 16) ? DType::kFloat16 : DType::kBFloat16;
  p.batch = batch;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = head_dim;
  p.num_pages = num_pages;
  p.page_size = page_size;
  p.num_indices = num_indices;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k_stride_page = k.stride(0);
  p.k_stride_slot = k.stride(1);
  p.k_stride_head = k.stride(2);
  p.v_stride_page = v.stride(0);
  p.v_stride_slot = v.stride(1);
  p.v_stride_head = v.stride(2);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.lse_stride_b = lse.stride(0);
  p.lse_stride_h = lse.stride(1);
  p.sm_scale = static_cast<float>(sm_scale);
  if (!launch || batch == 0 || hq == 0) return 0;  // launch=false: validate only

  if (on_cpu) {
    std::optional<nb::gil_scoped_release> release;
    if (tokens * hkv * head_dim >= cpu::kReleaseGilElems) release.emplace();
    if (p.dtype == DType::kFloat16) {
      paged_decode_cpu<cpu::Half>(p);
    } else {
      paged_decode_cpu<cpu::BFloat16>(p);
    }
  } else {
#ifdef OPFORGE_WITH_CUDA
    check_rows_aligned(q, {0, 1});
    check_rows_aligned(k, {0, 1, 2});
    check_rows_aligned(v, {0, 1, 2});
    check_rows_aligned(out, {0, 1});
    const int device = q.t.device_id();
    PagedDecodePlan plan = forced_or_chosen_plan(batch, hq, hkv, head_dim, tokens, page_size, max_tokens,
                                                 cuda::sm_count(device), splits, token_warps, even_splits);
    if (plan.ranges > 0 && !cuda::paged_decode_ranges_fit(device, head_dim)) {
      if (splits != -1) {
        throw_value_error(kPrefix + "page ranges (splits=0) need more shared memory per block than this GPU has");
      }
      // The cut that the plan's page ranges replace.
      plan = cuda::paged_decode_cut(batch, hq, hkv, head_dim, tokens, page_size, cuda::sm_count(device), max_tokens);
    }
    if (plan.ctas > INT32_MAX) {
      throw_value_error(kPrefix + "batch x num_kv_heads x splits = " + str(plan.ctas) + " tasks exceed the grid");
    }
    const int64_t need = cuda::paged_decode_workspace_elems(plan, batch, hq, head_dim);
    if (need > 0) {
      if (workspace_obj.is_none()) return need;
      const Arg ws = arg(workspace_obj, "workspace", Kind::kWorkspace, attn, 1);
      check_same_device(kCtx, q, ws);
      if (ws.shape(0) < need || (ws.shape(0) > 1 && ws.stride(0) != 1) ||
          reinterpret_cast<uintptr_t>(ws.data()) % 16 != 0) {
        throw_value_error(kPrefix + "workspace has shape " + shape_string(ws.t) + "; expected a contiguous, 16-byte "
                          "aligned float32 tensor of at least " + str(need) + " elements");
      }
      for (const Arg* a : {&q, &k, &v, &indptr, &indices, &out, &lse}) check_separate(kCtx, ws, *a);
      if (last) check_separate(kCtx, ws, *last);
      p.workspace = reinterpret_cast<float*>(ws.data());
    }
    check_launch(kCtx, cuda::launch_paged_decode_attention(p, plan, device, launch_stream(stream, device)), device);
#endif
  }
  mark_written({out_obj, lse_obj});
  return 0;
}

nb::dict plan_dict(int64_t batch, int64_t hq, int64_t hkv, int64_t head_dim, int64_t tokens, int64_t page_size,
                   int sms, int splits, int token_warps, int64_t max_tokens, int even_splits, bool page_ranges) {
  if (batch < 0 || hkv < 1 || hq % hkv != 0 || tokens < 0 || page_size < 1 || sms < 1 ||
      !cuda::paged_decode_head_dim_supported(head_dim)) {
    throw_value_error(kPrefix + "plan needs batch >= 0, num_qo_heads a multiple of num_kv_heads >= 1, head_dim "
                      "64, 128 or 256, tokens >= 0, page_size >= 1 and sms >= 1");
  }
  const PagedDecodePlan plan = forced_or_chosen_plan(batch, hq, hkv, head_dim, tokens, page_size, max_tokens, sms,
                                                     splits, token_warps, even_splits, page_ranges);
  nb::dict d;
  d["head_chunks"] = plan.head_chunks;
  d["splits"] = plan.splits;
  d["token_warps"] = plan.token_warps;
  d["ranges"] = plan.ranges;
  d["even_splits"] = plan.even_splits;
  d["ctas"] = plan.ctas;
  d["warps_per_cta"] = cuda::paged_decode_warps(head_dim) * plan.token_warps;
  d["workspace"] = cuda::paged_decode_workspace_elems(plan, batch, hq, head_dim);
  return d;
}

}  // namespace

void bind_paged_decode_attention(nb::module_& m) {
  m.def("paged_decode_attention", &paged_decode_attention, nb::arg("out"), nb::arg("lse"), nb::arg("q"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("kv_indptr"), nb::arg("kv_indices"),
        nb::arg("kv_last_page_len").none(), nb::arg("workspace").none(), nb::arg("sm_scale"), nb::arg("stream").none(),
        nb::arg("launch"), nb::arg("splits") = -1, nb::arg("token_warps") = -1, nb::arg("max_tokens") = 0,
        nb::arg("even_splits") = -1,
        "GQA decode over a paged KV cache into out and lse; see opforge.ops.paged_decode_attention. Returns 0, or the\n"
        "float32 workspace elements a CUDA plan with splits needs (call again with it; nothing was written).\n"
        "splits (with token_warps, the warps of a CTA that share its slice) force the CUDA plan (for tuning and\n"
        "tests); splits 0: page ranges, token_warps of them per KV head (-1: a wave's), even_splits the splits\n"
        "per request they take for a batch the GPU finds balanced (0: none; -1: the plan's); -1: the heuristic.\n"
        "max_tokens: the longest request's tokens if the caller knows it (a hint for the\n"
        "heuristic; 0: not known).");
  m.def("paged_decode_attention_plan", &plan_dict, nb::arg("batch"), nb::arg("num_qo_heads"), nb::arg("num_kv_heads"),
        nb::arg("head_dim"), nb::arg("tokens"), nb::arg("page_size"), nb::arg("sms"), nb::arg("splits") = -1,
        nb::arg("token_warps") = -1, nb::arg("max_tokens") = 0, nb::arg("even_splits") = -1,
        nb::arg("page_ranges") = true,
        "The CUDA launch plan of paged_decode_attention (tokens: num_indices * page_size; max_tokens: the longest\n"
        "request's tokens, 0 if not known). page_ranges=False: the plan of a GPU without the shared memory for\n"
        "page ranges (the cut they replace).");
}

}  // namespace opforge
