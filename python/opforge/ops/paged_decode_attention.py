"""paged_decode_attention: GQA decode over a paged KV cache (cuda/paged_decode_attention.cu,
cpp/paged_decode_attention.cpp), the FlashInfer-Trace ``gqa_paged_decode_*`` Definitions.

One query token per request attends to that request's KV cache, stored in pages:

* ``q`` [batch, num_qo_heads, head_dim], ``k_cache`` / ``v_cache`` [num_pages, page_size,
  num_kv_heads, head_dim]: float16 or bfloat16, one dtype; head_dim 64, 128 or 256, contiguous
  (every other stride free: k_cache and v_cache may be views of one [num_pages, 2, ...] buffer);
  num_qo_heads a multiple of num_kv_heads (query head h reads KV head h // (num_qo_heads //
  num_kv_heads)).
* ``kv_indptr`` [batch + 1] and ``kv_indices`` int32: request b's pages are
  ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` (non-decreasing offsets from >= 0 up to at most
  ``len(kv_indices)``: a larger preallocated buffer is fine; page ids in [0, num_pages)).
* ``kv_last_page_len`` [batch] int32: the valid tokens of each request's last page, in
  [1, page_size]; None means every page is full (and page_size 1 needs none).
* ``sm_scale``: the logits' scale, default ``1 / sqrt(head_dim)``.

Results: ``out`` [batch, num_qo_heads, head_dim] in q's dtype and ``lse`` [batch, num_qo_heads]
float32, the log-sum-exp of the scaled logits in base 2 (natural lse / ln 2), as FlashInfer-Trace
defines it. A request without pages gives a zero output and lse = -inf.

Arithmetic: CPU: fp32 logits and softmax, fp32 sums, one rounding of the output. CUDA: logits
from tensor cores (exact products, fp32 sums), online softmax in fp32, the probabilities
rounded to the input dtype for the P.V product (as every tensor-core attention does: about one
ulp of the input type relative to each weight), fp32 sums; the parts of a request cut across
warps or CTAs merged in fp32 in a fixed order (results do not vary between runs).

Validation: shapes, dtypes, strides, devices, aliasing are checked by the binding on every call.
The page layout's values (offsets, page ids, last-page lengths) are read by the binding for CPU
tensors; for CUDA tensors they are checked here with one synchronisation, which
``skip_check=True`` skips (and CUDA-graph capture, where a synchronisation is not allowed). The
kernel itself never reads out of bounds: a request whose layout is invalid gets NaN.

The "torch" backend is the plain-PyTorch formula (fp32, per request): meant for checking.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .. import _ext
from ..api_logging import opforge_api
from ..backend import backend_requirement, supported_compute_capability
from ._common import (LIBRARY, check_float, check_tensors, cpu_check, cuda_check, first_tensor,
                      native_backend, refuse_grad, torch_check)

_C = _ext._C
_Tensor = torch.Tensor
_PREFIX = "opforge.paged_decode_attention: "
_LN2 = math.log(2.0)


def paged_decode_attention_torch(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, kv_last_page_len=None):
    """The "torch" backend: per request, gather its tokens, fp32 logits and softmax, one rounding.
    Returns (out, lse) like the op."""
    batch, num_qo_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_qo_heads // num_kv_heads
    out = torch.zeros_like(q)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    offsets = kv_indptr.tolist()
    tails = kv_last_page_len.tolist() if kv_last_page_len is not None else [page_size] * batch
    for b in range(batch):
        pages = kv_indices[offsets[b]:offsets[b + 1]].long()
        if not pages.numel():
            continue
        n = (pages.numel() - 1) * page_size + tails[b]
        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].float().repeat_interleave(group, dim=1)
        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:n].float().repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,thd->ht", q[b].float(), k) * sm_scale
        lse[b] = torch.logsumexp(logits, dim=-1) / _LN2
        out[b] = torch.einsum("ht,thd->hd", torch.softmax(logits, dim=-1), v).to(q.dtype)
    return out, lse


# --- the page layout's values (CUDA tensors: one synchronisation) ---------------------------


def _describe_layout_problem(indptr: list, indices: torch.Tensor, last: Optional[list], num_pages: int,
                             page_size: int) -> str:
    """The first thing wrong with a layout known to be wrong, in the binding's words."""
    if indptr[0] < 0:
        return f"kv_indptr[0] = {indptr[0]}; accepted: offsets >= 0"
    for b in range(len(indptr) - 1):
        if indptr[b + 1] < indptr[b]:
            return (f"kv_indptr is not non-decreasing: kv_indptr[{b}] = {indptr[b]} > kv_indptr[{b + 1}] = "
                    f"{indptr[b + 1]}; request {b}'s pages are kv_indices[kv_indptr[b]:kv_indptr[b + 1]]")
    if indptr[-1] > indices.numel():
        return (f"kv_indptr[-1] = {indptr[-1]} but kv_indices has only {indices.numel()} entries; accepted: "
                "kv_indptr[-1] <= len(kv_indices)")
    used = indices[indptr[0]:indptr[-1]].cpu()
    bad = torch.nonzero((used < 0) | (used >= num_pages))
    if bad.numel():
        i = int(bad[0])
        return (f"kv_indices[{indptr[0] + i}] = {int(used[i])} is not a page of the cache; accepted: page ids in "
                f"[0, num_pages = {num_pages})")
    for b in range(len(indptr) - 1):
        if indptr[b + 1] > indptr[b] and not 1 <= last[b] <= page_size:
            return (f"kv_last_page_len[{b}] = {last[b]}; accepted: 1 .. page_size = {page_size} for a request with "
                    "pages (the valid tokens of its last page)")
    return "the page layout is not valid"


def _layout_problem(k_cache, kv_indptr, kv_indices, kv_last_page_len) -> Optional[str]:
    """What is wrong with the page layout's values, or None; one synchronisation when all is
    well. Arguments the binding will refuse for their shape or type are left to it."""
    tensors = (kv_indptr, kv_indices) + ((kv_last_page_len,) if kv_last_page_len is not None else ())
    if not (isinstance(k_cache, _Tensor) and k_cache.dim() == 4 and all(
            isinstance(t, _Tensor) and t.dim() == 1 and t.dtype == torch.int32 and t.device == k_cache.device
            for t in tensors) and kv_indptr.numel() >= 1):
        return None
    if kv_last_page_len is not None and kv_last_page_len.numel() != kv_indptr.numel() - 1:
        return None
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    ip = kv_indptr.long()
    pos = torch.arange(kv_indices.numel(), device=ip.device)
    used = (pos >= ip[0]) & (pos < ip[-1])
    flags = [ip[0] < 0, (ip[1:] < ip[:-1]).any(), ip[-1] > kv_indices.numel(),
             (used & ((kv_indices < 0) | (kv_indices >= num_pages))).any()]
    if kv_last_page_len is not None:
        has_pages = ip[1:] > ip[:-1]
        flags.append((has_pages & ((kv_last_page_len < 1) | (kv_last_page_len > page_size))).any())
    if not bool(torch.stack(flags).any()):
        return None
    last = kv_last_page_len.tolist() if kv_last_page_len is not None else None
    return _describe_layout_problem(kv_indptr.tolist(), kv_indices, last, num_pages, page_size)


# --- running --------------------------------------------------------------------------------


def _run(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale: float,
         backend: str, max_tokens: int = 0) -> None:
    # The binding validates dtypes, shapes, strides, devices, storages and aliasing (and, for
    # CPU tensors, the layout's values) before anything runs; for the "torch" backend it only
    # validates (launch=False), then the formula computes.
    launch = backend != "torch"
    need = _C.paged_decode_attention(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, None,
                                     sm_scale, None, launch, max_tokens=max_tokens)
    if need:
        # The CUDA plan splits the requests' tokens: fp32 partials in a workspace from torch's
        # allocator (on this stream, so capture and reuse are safe).
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
        _C.paged_decode_attention(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, workspace,
                                  sm_scale, None, launch, max_tokens=max_tokens)
    if not launch:
        if q.is_cuda:  # the formula indexes with these values: never with invalid ones
            problem = _layout_problem(k_cache, kv_indptr, kv_indices, kv_last_page_len)
            if problem is not None:
                raise ValueError(_PREFIX + problem)
        ref_out, ref_lse = paged_decode_attention_torch(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale,
                                                        kv_last_page_len)
        out.copy_(ref_out)
        lse.copy_(ref_lse)


def _scale(q, sm_scale) -> float:
    if sm_scale is not None:
        return float(sm_scale)
    # A q the binding will refuse gets any scale: the error names q.
    return 1.0 / math.sqrt(q.shape[-1]) if isinstance(q, _Tensor) and q.dim() and q.shape[-1] else 1.0


def _outputs(q, out, lse) -> tuple:
    """The given outputs, or new contiguous ones shaped after q (placeholders when q is not a
    3-d tensor: the binding then says what is wrong with q)."""
    if out is not None and lse is not None:
        return out, lse
    if isinstance(q, _Tensor) and q.dim() == 3:
        shape, device, dtype = q.shape, q.device, q.dtype
    else:
        shape, device, dtype = (0, 0, 0), q.device if isinstance(q, _Tensor) else "cpu", torch.bfloat16
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    if lse is None:
        lse = torch.empty(shape[:2], dtype=torch.float32, device=device)
    return out, lse


# --- torch.library registration: how torch.compile and CUDA graphs see the op ----------------


@torch.library.custom_op(f"{LIBRARY}::paged_decode_attention", mutates_args=("out", "lse"))
def _paged_decode_op(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                     kv_last_page_len: Optional[torch.Tensor], sm_scale: float, max_tokens: int = 0) -> None:
    _run(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale, "auto", max_tokens)


@_paged_decode_op.register_fake
def _paged_decode_fake(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale,
                       max_tokens=0) -> None:
    ok = q.dim() == 3 and k_cache.dim() == 4 and k_cache.shape == v_cache.shape and kv_indptr.dim() == 1
    if ok:
        batch, num_qo_heads, head_dim = q.shape
        ok = (k_cache.shape[3] == head_dim and tuple(out.shape) == tuple(q.shape)
              and tuple(lse.shape) == (batch, num_qo_heads) and kv_indptr.shape[0] == batch + 1
              and (kv_last_page_len is None or tuple(kv_last_page_len.shape) == (batch,)))
    if not ok:
        raise ValueError(
            f"{_PREFIX}q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}, kv_indptr "
            f"{tuple(kv_indptr.shape)}, out {tuple(out.shape)} and lse {tuple(lse.shape)} do not match ([batch, "
            "num_qo_heads, head_dim], [num_pages, page_size, num_kv_heads, head_dim] twice, [batch + 1], q's shape, "
            "[batch, num_qo_heads])"
        )


def _traced(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None, kv_last_page_len=None, *, out=None,
            lse=None, max_kv_len=None, backend="auto"):
    refuse_grad(_ARGS, (q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, lse), _PREFIX)
    out, lse = _outputs(q, out, lse)
    _paged_decode_op(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, _scale(q, sm_scale),
                     max_kv_len or 0)
    return out, lse


# --- public API ----------------------------------------------------------------------------

_ARGS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "out", "lse")


@supported_compute_capability(lambda cc: cc >= 80 and _ext.build_runs_on(cc))
def _cuda_check(*args, **kwargs) -> bool:
    cuda_check(*args, **kwargs)
    cc = _ext.compute_capability(first_tensor(args).get_device())
    if cc < 80:
        raise RuntimeError(f"needs a GPU of compute capability 8.0 or newer (fp16/bf16 tensor cores); this one is "
                           f"{cc // 10}.{cc % 10}")
    return True


_BACKENDS = {"cuda": _cuda_check, "cpu": cpu_check, "torch": torch_check}


def _check(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None, kv_last_page_len=None, *, out=None, lse=None,
           max_kv_len=None, backend="auto"):
    check_tensors(_ARGS, (q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, lse), 5)
    if sm_scale is not None:
        check_float("sm_scale", sm_scale)
    if max_kv_len is not None:
        if isinstance(max_kv_len, bool) or not isinstance(max_kv_len, int):
            raise TypeError(f"max_kv_len must be an int or None, got {type(max_kv_len).__name__}")
        if not 0 <= max_kv_len < 2**63:
            raise ValueError(f"max_kv_len = {max_kv_len}; accepted: the longest request's tokens, 0 .. 2**63 - 1 "
                             "(None or 0: not known)")
    # CPU layouts are read by the binding; a CUDA one costs a synchronisation, which capture forbids.
    if q.is_cuda and not torch.cuda.is_current_stream_capturing():
        problem = _layout_problem(k_cache, kv_indptr, kv_indices, kv_last_page_len)
        if problem is not None:
            raise ValueError(problem)
    return True


@opforge_api
@backend_requirement(_BACKENDS, common_check=_check, heuristic_func=native_backend, traced=_traced,
                     auto_by_device=True)
def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indptr: torch.Tensor,
                           kv_indices: torch.Tensor, sm_scale: Optional[float] = None,
                           kv_last_page_len: Optional[torch.Tensor] = None, *, out: Optional[torch.Tensor] = None,
                           lse: Optional[torch.Tensor] = None, max_kv_len: Optional[int] = None,
                           backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """GQA decode attention over a paged KV cache; returns ``(out, lse)`` (see the module doc for
    the layout, the arithmetic and the checks).

    q: [batch, num_qo_heads, head_dim]; k_cache, v_cache: [num_pages, page_size, num_kv_heads,
    head_dim] (fp16 or bf16, head_dim 64/128/256); kv_indptr [batch + 1], kv_indices,
    kv_last_page_len [batch] (optional): int32. sm_scale defaults to 1 / sqrt(head_dim).
    out: optional preallocated [batch, num_qo_heads, head_dim] in q's dtype; lse: optional
    [batch, num_qo_heads] float32 (base-2 log-sum-exp). max_kv_len: the longest request's tokens,
    if the caller knows it (as a serving loop that schedules the batch does; flash-attn's
    max_seqlen_k): the CUDA plan reads no lengths from the GPU, so with it a batch of even
    lengths is cut for its own sake, one of lengths spread less than 4x its average keeps the cut
    that evens them out in waves, and one whose longest request is 4x its average or more is cut
    into equal runs of its pages (page ranges). Without it, batches large enough for page ranges
    take them, and the kernels look at the lengths: runs per request where the longest request
    has at most 7/4 of the average pages, equal page runs where it has more. Only the speed
    depends on it: any value gives the same results. backend: "auto" (the kernel for the
    tensors' device), "cuda", "cpu" or "torch" (plain PyTorch). skip_check=True skips the
    Python-level checks, including the synchronising check of a CUDA layout's values.

    >>> out, lse = opforge.paged_decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices)
    """
    out, lse = _outputs(q, out, lse)
    _run(out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, _scale(q, sm_scale), backend,
         max_kv_len or 0)
    return out, lse
