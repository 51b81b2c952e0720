"""Paged GQA decode attention in Triton: the FlashInfer-Trace ``gqa_paged_decode_*`` Definitions
(one query token per request over its pages of the KV cache; ``kv_last_page_len`` only where
page_size > 1).

One program takes one request, one KV head and one slice of the request's tokens, and every
query head of that KV head at once (the rows of a tensor-core tile, padded to 16), so each K and
V row is read once: per block of BLOCK_N tokens it looks up their pages, gathers the rows, and
runs S = Q K^T and O += P V on tensor cores with an online softmax in fp32, base 2 (the
probabilities rounded to the input type for P V). When requests x KV heads are too few to fill
the GPU, the tokens are split over programs that write normalised partial outputs and their
lse; PyTorch then merges them in split order. lse is the base-2 log-sum-exp; a request without
pages gives zeros and lse = -inf.

Self-contained (torch and triton only): this file is the source of the ``triton`` Solution that
opforge's built-in dataset ships for every gqa_paged_decode Definition.
"""

import math
import os

import torch
import triton
import triton.language as tl

#: Tokens per block of the main loop; programs per SM the split count aims at.
BLOCK_N = 32
PROGRAMS_PER_SM = 4
#: A split keeps at least this many tokens of an average request.
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64
LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, o_ptr, lse_ptr, scale_log2, batch,
                   num_qo_heads, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
                   stride_vh, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LAST: tl.constexpr, SPLITS: tl.constexpr,
                   DOT_FP32: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    first = tl.load(indptr_ptr + b)
    pages = tl.load(indptr_ptr + b + 1) - first
    if HAS_LAST:
        tail = tl.load(last_ptr + b)
    else:
        tail = PAGE_SIZE
    n = tl.where(pages > 0, (pages - 1) * PAGE_SIZE + tail, 0)
    per_split = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_N) * BLOCK_N
    begin = split * per_split
    end = tl.minimum(n, begin + per_split)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    rows = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=rows[:, None], other=0.0)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    for start in range(begin, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < end
        page = tl.load(indices_ptr + first + pos // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
        slot = (pos % PAGE_SIZE).to(tl.int64)
        k = tl.load(k_ptr + page[:, None] * stride_kp + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                    mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + page[:, None] * stride_vp + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                    mask=valid[:, None], other=0.0)
        if DOT_FP32:  # triton's CPU interpreter has no bf16 arithmetic: exact fp32 products there
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.dot(q.to(tl.float32), tl.trans(k), input_precision="ieee") * scale_log2
        else:
            s = tl.dot(q, tl.trans(k)) * scale_log2
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: no -inf - -inf
        alpha = tl.exp2(m - base)
        p = tl.exp2(s - base[:, None])
        l = l * alpha + tl.sum(p, 1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    inv = tl.where(l > 0, 1.0 / l, 0.0)
    lse = tl.where(l > 0, m + tl.log2(l), float("-inf"))
    row = (split * batch + b) * num_qo_heads + heads
    tl.store(o_ptr + row[:, None] * HEAD_DIM + d[None, :], acc * inv[:, None], mask=rows[:, None])
    tl.store(lse_ptr + row, lse, mask=rows)


def _splits(batch: int, num_kv_heads: int, tokens: int, device) -> int:
    programs = max(batch * num_kv_heads, 1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    by_length = max(tokens // max(batch, 1) // MIN_SPLIT_TOKENS, 1)
    return max(1, min(-(-PROGRAMS_PER_SM * sms // programs), by_length, MAX_SPLITS))


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len=None, sm_scale=None):
    batch, num_qo_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_qo_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    splits = _splits(batch, num_kv_heads, kv_indices.numel() * page_size, q.device)
    partial = torch.empty(splits, batch, num_qo_heads, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(splits, batch, num_qo_heads, dtype=torch.float32, device=q.device)
    if batch and num_qo_heads:
        _decode_kernel[(batch, num_kv_heads, splits)](
            q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len if kv_last_page_len is not None else kv_indptr,
            partial, partial_lse, float(sm_scale) * LOG2E, batch, num_qo_heads, q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), PAGE_SIZE=page_size, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, HAS_LAST=kv_last_page_len is not None, SPLITS=splits,
            DOT_FP32=os.environ.get("TRITON_INTERPRET") == "1")
    if splits == 1:
        return partial[0].to(q.dtype), partial_lse[0]
    # Merge in split order: weights 2^(lse_s - max), an empty split weighs 0.
    top = partial_lse.max(dim=0).values
    empty = torch.isinf(top)
    weights = torch.exp2(partial_lse - torch.where(empty, 0.0, top))
    total = weights.sum(dim=0)
    out = (weights[..., None] * partial).sum(dim=0) / torch.where(empty, 1.0, total)[..., None]
    lse = torch.where(empty, float("-inf"), top + torch.log2(total))
    return out.to(q.dtype), lse
