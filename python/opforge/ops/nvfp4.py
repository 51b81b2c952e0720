"""nvfp4_gemv: L independent matrix-vector products of NVFP4 operands (cuda/nvfp4_gemv.cu,
cpp/nvfp4_gemv.cpp), ``c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l]``.

Operands (ops/nvfp4_format.py says what the bytes mean):

* ``a`` [M, K/2, L] and ``b`` [1, K/2, L]: ``torch.float4_e2m1fn_x2``, two FP4 E2M1 codes per
  byte along K (the even element in the low nibble). The kernels read K contiguously (stride 1
  along dimension 1) with M and L strides free, so a tensor permuted from [L, M, K/2] (the
  task's layout) is used as it is. An operand strided along K (e.g. a contiguous [M, K/2, L]
  with L > 1) is first copied into that layout: correct, at the cost of one more pass over A.
  Bytes held as uint8 are refused rather than guessed at: pass
  ``a.view(torch.float4_e2m1fn_x2)``.
* ``scale_a`` [M, K/16, L] and ``scale_b`` [1, K/16, L]: ``torch.float8_e4m3fn`` block scales,
  one per 16 values along K, in the plain layout (``nvfp4_format.from_blocked`` converts the
  blocked 128x4 one), K/16 contiguous (copied into it, like a and b, when strided along K).
* K a multiple of 64 (``nvfp4_format.K_MULTIPLE``); M = 0 or L = 0 give an empty result, K = 0
  zeros.
* result ``c`` [M, 1, L] float16.

Arithmetic (the same on CPU and GPU): every 16-value block's dot product of E2M1 values is exact,
so is its product with ``scale_a * scale_b``; these block terms are summed in fp32 and the sum is
rounded to fp16 once. Only the order of the fp32 additions differs between the backends (CPU:
eight interleaved partial sums; CUDA: per thread, then a fixed tree over threads), so results
agree with the fp64 reference (``nvfp4_format.nvfp4_gemv_reference``) to within fp16 rounding
plus a few fp32 ulps of the block terms' magnitudes.

The "torch" backend is the plain-PyTorch formula: both operands dequantized to fp32 (exact),
multiplied and summed by ``torch.einsum`` in fp32 (element products summed in whatever order
the matmul uses: the same roundings as above up to order), rounded to fp16. It materialises
the dequantized A (4 bytes per value): meant for checking, not speed.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _ext
from ..api_logging import opforge_api
from ..backend import backend_requirement
from ._common import BACKEND_CHECKS, LIBRARY, check_tensors, native_backend, refuse_grad
from .nvfp4_format import dequantize

_C = _ext._C
_Tensor = torch.Tensor


def nvfp4_gemv_torch(a, b, scale_a, scale_b) -> torch.Tensor:
    """The "torch" backend: dequantize to fp32 (exact), fp32 einsum, one rounding to fp16."""
    c = torch.einsum("mkl,nkl->mnl", dequantize(a, scale_a), dequantize(b, scale_b))
    return c.to(torch.float16)


def _empty_out(a) -> torch.Tensor:
    """A new [M, 1, L] fp16 result in a's order of the M and L dimensions (as empty_like keeps a
    layout: a permuted from [L, M, K/2] gets c permuted from [L, M, 1])."""
    if not isinstance(a, _Tensor) or a.dim() != 3:
        # The binding names what is wrong with `a`; a placeholder out lets it get that far.
        return torch.empty(0, dtype=torch.float16, device=a.device if isinstance(a, _Tensor) else "cpu")
    m, _, l = a.shape
    if l > 1 and m > 1 and a.stride(2) > a.stride(0):
        return torch.empty((l, m, 1), dtype=torch.float16, device=a.device).permute(1, 2, 0)
    return torch.empty((m, 1, l), dtype=torch.float16, device=a.device)


def _run(out, a, b, scale_a, scale_b, backend: str) -> None:
    # The binding validates dtypes, shapes, strides, devices, storages and aliasing before
    # anything runs; for the "torch" backend it only validates (launch=False).
    launch = backend != "torch"
    need = _C.nvfp4_gemv(out, a, b, scale_a, scale_b, None, None, launch)
    if need:
        # The CUDA plan splits K across blocks (M * L small against the GPU): fp32 partial sums
        # in a workspace from torch's allocator (on this stream, so capture and reuse are safe).
        workspace = torch.empty(need, dtype=torch.float32, device=a.device)
        _C.nvfp4_gemv(out, a, b, scale_a, scale_b, workspace, None, launch)
    if not launch:
        out.copy_(nvfp4_gemv_torch(a, b, scale_a, scale_b))


# --- torch.library registration: how torch.compile and CUDA graphs see the op ----------------


@torch.library.custom_op(f"{LIBRARY}::nvfp4_gemv", mutates_args=("out",))
def _nvfp4_gemv_op(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                   scale_b: torch.Tensor) -> None:
    _run(out, a, b, scale_a, scale_b, "auto")


@_nvfp4_gemv_op.register_fake
def _nvfp4_gemv_fake(out, a, b, scale_a, scale_b) -> None:
    shapes_ok = a.dim() == b.dim() == scale_a.dim() == scale_b.dim() == out.dim() == 3
    if shapes_ok:
        m, half_k, l = a.shape
        blocks = half_k // 8
        shapes_ok = (tuple(b.shape) == (1, half_k, l) and tuple(scale_a.shape) == (m, blocks, l)
                     and tuple(scale_b.shape) == (1, blocks, l) and tuple(out.shape) == (m, 1, l)
                     and half_k % 32 == 0)
    if not shapes_ok:
        raise ValueError(
            f"opforge.nvfp4_gemv: a {tuple(a.shape)}, b {tuple(b.shape)}, scale_a {tuple(scale_a.shape)}, "
            f"scale_b {tuple(scale_b.shape)} and out {tuple(out.shape)} do not match ([M, K/2, L], [1, K/2, L], "
            "[M, K/16, L], [1, K/16, L], [M, 1, L] with K a multiple of 64)"
        )


def _k_contiguous(t):
    """``t`` with K contiguous: as it is when it already is, else a copy laid out as the task's
    tensors are (permuted from a contiguous [L, rows, K/n]). Anything that is not a 3-d tensor
    is left for the binding to refuse."""
    if isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[1] > 1 and t.stride(1) != 1:
        return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    return t


def _operands(a, b, scale_a, scale_b) -> tuple:
    """The four operands with K contiguous (see _k_contiguous). On the call path: the common
    case, every operand already K-contiguous, costs four stride reads."""
    try:
        if a.stride(1) == 1 and b.stride(1) == 1 and scale_a.stride(1) == 1 and scale_b.stride(1) == 1:
            return a, b, scale_a, scale_b
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return a, b, scale_a, scale_b  # not 3-d tensors: the binding says what is wrong
    return _k_contiguous(a), _k_contiguous(b), _k_contiguous(scale_a), _k_contiguous(scale_b)


def _traced(a, b, scale_a, scale_b, out=None, *, backend="auto"):
    refuse_grad(_ARGS, (a, b, scale_a, scale_b, out), "opforge.nvfp4_gemv: ")
    a, b, scale_a, scale_b = _operands(a, b, scale_a, scale_b)
    out = _empty_out(a) if out is None else out
    _nvfp4_gemv_op(out, a, b, scale_a, scale_b)
    return out


# --- public API ----------------------------------------------------------------------------

_ARGS = ("a", "b", "scale_a", "scale_b", "out")


def _check(a, b, scale_a, scale_b, out=None, *, backend="auto"):
    check_tensors(_ARGS, (a, b, scale_a, scale_b, out), 4)
    return True


@opforge_api
@backend_requirement(BACKEND_CHECKS, common_check=_check, heuristic_func=native_backend, traced=_traced,
                     auto_by_device=True)
def nvfp4_gemv(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               out: Optional[torch.Tensor] = None, *, backend: str = "auto") -> torch.Tensor:
    """Batched GEMV of NVFP4 operands: ``c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l]`` (see the
    module doc for the layouts and the arithmetic).

    a: [M, K/2, L] float4_e2m1fn_x2; b: [1, K/2, L] float4_e2m1fn_x2; scale_a: [M, K/16, L] and
    scale_b: [1, K/16, L] float8_e4m3fn (plain layout); all on one device (CUDA or CPU).
    out: optional preallocated [M, 1, L] float16 result (any strides, separate from the inputs);
    without it a new one is returned, in a's order of the M and L dimensions.
    backend: "auto" (the kernel for the tensors' device), "cuda", "cpu" or "torch" (plain
    PyTorch, fp32 einsum). skip_check=True skips the Python-level checks.

    >>> c = opforge.nvfp4_gemv(a, b, scale_a, scale_b)
    """
    a, b, scale_a, scale_b = _operands(a, b, scale_a, scale_b)
    out = _empty_out(a) if out is None else out
    _run(out, a, b, scale_a, scale_b, backend)
    return out
