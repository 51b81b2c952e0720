"""Template of paged GQA decode attention: FlashInfer-Trace's
``gqa_paged_decode_h{num_qo_heads}_kv{num_kv_heads}_d{head_dim}_ps{page_size}`` Definitions
(op_type ``gqa_paged``), generated with the public names, axes, input order and dtypes:

* inputs ``(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)`` for page_size 1, and
  ``(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)`` above (the last
  page of a request may be partly filled);
* outputs ``output`` (q's dtype) and ``lse`` (float32, the base-2 log-sum-exp);
* axes batch_size, num_pages, len_indptr, num_kv_indices variable; the four in the name constant;
  constraints ``len_indptr == batch_size + 1`` and ``num_kv_indices == kv_indptr[-1].item()``.

The reference is plain PyTorch, per request, fp32 (as the public ones are); a request without
pages gives zeros and lse = -inf. The names leave bfloat16 unsaid (``_f16`` for float16).

opforge's additions (ignored by other readers): value domains so that generated inputs form a
valid layout (kv_indptr non-decreasing from 0 to num_kv_indices, cut at random points, so
lengths vary inside a batch and some requests may be empty; kv_indices distinct pages of the
cache, so pages come in random order; kv_last_page_len in [1, page_size]), the lse tolerance,
and the bytes a call moves: the KV rows of its pages (whole pages: an upper bound for a partly
filled last page) plus q, the outputs and the page table.
"""

from __future__ import annotations

from ... import ops
from ..extensions import Tolerance
from ..template import Const, Scalar, Tensor, TraceTemplate, Var


def _reference(consts: dict) -> str:
    h, kv, d, ps = consts["num_qo_heads"], consts["num_kv_heads"], consts["head_dim"], consts["page_size"]
    paged = ps > 1
    args = "q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale" if paged else \
        "q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale"
    lines = [
        "import math",
        "",
        "import torch",
        "",
        "",
        "@torch.no_grad()",
        f"def run({args}):",
        "    batch_size, num_qo_heads, head_dim = q.shape",
        "    _, page_size, num_kv_heads, _ = k_cache.shape",
        f"    assert (num_qo_heads, num_kv_heads, head_dim, page_size) == ({h}, {kv}, {d}, {ps})",
        "    assert kv_indptr.shape[0] == batch_size + 1",
        "    assert kv_indices.shape[0] == int(kv_indptr[-1].item())",
        "    group = num_qo_heads // num_kv_heads",
        "    output = torch.zeros_like(q)",
        "    lse = torch.full((batch_size, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)",
        "    for b in range(batch_size):",
        "        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].to(torch.long)",
        "        if pages.numel() == 0:",
        "            continue  # no tokens: a zero output, lse = -inf",
    ]
    if paged:
        lines += [
            "        # Every page is full but the last, which holds kv_last_page_len[b] tokens.",
            "        tokens = (pages.numel() - 1) * page_size + int(kv_last_page_len[b])",
        ]
    else:
        lines += ["        tokens = pages.numel()  # one token per page"]
    lines += [
        "        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:tokens].to(torch.float32)",
        "        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:tokens].to(torch.float32)",
        "        # Query head h reads KV head h // group.",
        "        k = k.repeat_interleave(group, dim=1)  # [tokens, num_qo_heads, head_dim]",
        "        v = v.repeat_interleave(group, dim=1)",
        "        logits = torch.einsum('hd,thd->ht', q[b].to(torch.float32), k) * sm_scale",
        "        lse[b] = torch.logsumexp(logits, dim=-1) / math.log(2.0)  # base 2",
        "        output[b] = torch.einsum('ht,thd->hd', torch.softmax(logits, dim=-1), v).to(q.dtype)",
        "    return output, lse",
    ]
    return "\n".join(lines) + "\n"


def _description(consts: dict) -> str:
    return (f"Batched Grouped Query Attention decode with a paged KV cache (page_size={consts['page_size']}): "
            f"{consts['num_qo_heads']} query heads share {consts['num_kv_heads']} KV heads, head_dim="
            f"{consts['head_dim']}. One query token per request; lse is the base-2 log-sum-exp of the scaled "
            "logits (-inf for a request without pages).")


def _extras(consts: dict) -> dict:
    domains = {
        "kv_indptr": {"kind": "indptr", "total": "num_kv_indices"},
        "kv_indices": {"kind": "range", "low": 0, "high": "num_pages", "unique": True},
    }
    if consts["page_size"] > 1:
        domains["kv_last_page_len"] = {"kind": "range", "low": 1, "high": "page_size + 1"}
    return {
        "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"],
        # The output's tolerance is its dtype's default; lse is fp32 from fp32 sums of
        # differently ordered products.
        "tolerances": {"lse": Tolerance(atol=1e-3, rtol=1e-4)},
        "value_domains": domains,
        "bytes": ("2 * num_kv_indices * page_size * num_kv_heads * head_dim * k_cache_itemsize"
                  " + batch_size * num_qo_heads * head_dim * (q_itemsize + output_itemsize)"
                  " + batch_size * num_qo_heads * lse_itemsize + (len_indptr + num_kv_indices) * 4"),
        "flops": "4 * num_kv_indices * page_size * num_qo_heads * head_dim",
    }


_Q = ["batch_size", "num_qo_heads", "head_dim"]
_CACHE = ["num_pages", "page_size", "num_kv_heads", "head_dim"]

paged_decode_attention_template = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="gqa_paged_decode",
    op=ops.paged_decode_attention,
    axes={
        "batch_size": Var(description="Total number of query tokens."),
        "num_qo_heads": Const(abbrev="h", description="Number of query/output attention heads."),
        "num_kv_heads": Const(abbrev="kv", description="Number of key-value attention heads."),
        "head_dim": Const(abbrev="d", description="Dimension of each attention head."),
        "num_pages": Var(description="Total number of allocated pages in the KV cache."),
        "page_size": Const(abbrev="ps", description="Number of tokens stored per page."),
        "len_indptr": Var(description="Length of kv_indptr array."),
        "num_kv_indices": Var(description="Total number of KV page indices."),
    },
    inputs={
        "q": Tensor(_Q, fold_leading=False, description="Query tensor for decode."),
        "k_cache": Tensor(_CACHE, dtype_from="q", fold_leading=False, description="Paged key cache."),
        "v_cache": Tensor(_CACHE, dtype_from="q", fold_leading=False, description="Paged value cache."),
        "kv_indptr": Tensor(["len_indptr"], dtype="int32", description="KV page offsets for each sequence."),
        "kv_indices": Tensor(["num_kv_indices"], dtype="int32", description="Page IDs for KV cache lookups."),
        "kv_last_page_len": Tensor(["batch_size"], dtype="int32",
                                   description="Number of valid tokens in the last page for each sequence."),
        "sm_scale": Scalar(description="Softmax scale. Default is (1/sqrt(head_dim))."),
    },
    outputs={
        "output": Tensor(_Q, param="out", dtype_from="q", fold_leading=False, description="Attention output tensor."),
        "lse": Tensor(["batch_size", "num_qo_heads"], dtype="float32",
                      description="The 2-based log-sum-exp of attention logits."),
    },
    reference=_reference,
    description=_description,
    tags=["stage:decode", "status:verified", "fi_api:opforge.paged_decode_attention"],
    # Page size 1 has no partly filled pages, and the public Definitions no such input.
    omit=lambda consts: ("kv_last_page_len",) if consts["page_size"] == 1 else (),
    extras=_extras,
)

TEMPLATES = [paged_decode_attention_template]
