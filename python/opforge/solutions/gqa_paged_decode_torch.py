"""Paged GQA decode attention in plain PyTorch, batched: the FlashInfer-Trace
``gqa_paged_decode_*`` Definitions (one query token per request over its pages of the KV
cache; ``kv_last_page_len`` only where page_size > 1) without a loop over requests.

Every request's tokens are gathered into a [requests, tokens, kv heads, head_dim] block padded
to the longest request of a chunk of requests (chunks keep the fp32 block below about 256 MB),
the logits of each query head against its KV head (query head h reads KV head h // group) are
one batched matmul in fp32, padded tokens are masked to -inf, and the output is the softmax
times V, rounded once to q's dtype. lse is the base-2 log-sum-exp; a request without pages gives
zeros and lse = -inf.

Self-contained (torch only): this file is the source of the ``pytorch`` Solution that opforge's
built-in dataset ships for every gqa_paged_decode Definition.
"""

import math

import torch

#: fp32 elements of one gathered K block (requests x tokens x kv heads x head_dim) per chunk.
MAX_BLOCK_ELEMS = 1 << 26


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len=None, sm_scale=None):
    batch, num_qo_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    out = torch.zeros_like(q)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    indptr = kv_indptr.long()
    pages = indptr[1:] - indptr[:-1]
    tail = kv_last_page_len.long() if kv_last_page_len is not None else torch.full_like(pages, page_size)
    lengths = torch.where(pages > 0, (pages - 1) * page_size + tail, torch.zeros_like(pages))
    lengths_host = lengths.tolist()
    start = 0
    while start < batch:
        # The next chunk of requests whose padded block fits MAX_BLOCK_ELEMS.
        stop, longest = start, 0
        while stop < batch:
            longest_next = max(longest, lengths_host[stop])
            if stop > start and (stop + 1 - start) * longest_next * num_kv_heads * head_dim > MAX_BLOCK_ELEMS:
                break
            stop, longest = stop + 1, longest_next
        if longest:
            _chunk(q, k_cache, v_cache, indptr, kv_indices, lengths, start, stop, longest, sm_scale, out, lse)
        start = stop
    return out, lse


def _chunk(q, k_cache, v_cache, indptr, kv_indices, lengths, start, stop, tokens, sm_scale, out, lse):
    """Requests start .. stop - 1, padded to `tokens` tokens, into out and lse."""
    page_size, num_kv_heads, head_dim = k_cache.shape[1:]
    num_qo_heads = q.shape[1]
    group = num_qo_heads // num_kv_heads
    t = torch.arange(tokens, device=q.device)
    valid = t[None, :] < lengths[start:stop, None]                       # [n, T]
    entry = indptr[start:stop, None] + torch.div(t, page_size, rounding_mode="floor")[None, :]
    entry = torch.where(valid, entry, torch.zeros_like(entry))           # padding: some entry, then page 0
    page = torch.where(valid, kv_indices.long()[entry], torch.zeros_like(entry))
    slot = (t % page_size)[None, :].expand_as(page)
    k = k_cache[page, slot].float()                                      # [n, T, kv heads, D]
    v = v_cache[page, slot].float()
    qg = q[start:stop].float().view(-1, num_kv_heads, group, head_dim)   # [n, kv heads, G, D]
    logits = torch.einsum("nhgd,nthd->nhgt", qg, k) * sm_scale
    logits = logits.masked_fill(~valid[:, None, None, :], -math.inf)
    row_lse = torch.logsumexp(logits, dim=-1)                            # -inf for an empty request
    probs = torch.exp(logits - torch.where(torch.isinf(row_lse), 0.0, row_lse)[..., None])
    o = torch.einsum("nhgt,nthd->nhgd", probs, v)
    out[start:stop] = o.reshape(-1, num_qo_heads, head_dim).to(q.dtype)
    lse[start:stop] = (row_lse / math.log(2.0)).reshape(-1, num_qo_heads)
