"""RMSNorm family: rmsnorm, fused_add_rmsnorm and their Gemma forms (weight applied as 1 + w).

One compiled kernel serves all four (cuda/norm.cu, cpp/norm.cpp). Math is fp32; results are
rounded to the input dtype once, round-to-nearest-even.

fused_add_rmsnorm computes, per row, in fp32::

    s            = input + residual                  (unrounded fp32 sum)
    residual_out = round(s)                          (the new residual stream)
    out          = round(s * rsqrt(mean(s * s) + eps) * weight)

so the norm sees the *unrounded* sum, not ``residual_out``. Passing ``out=input,
residual_out=residual`` updates both in place, as serving engines do.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _ext, _hooks
from ..api_logging import opforge_api
from ..backend import backend_requirement, fast_entry
from ._common import BACKEND_CHECKS, LIBRARY, check_bool, check_float, check_tensors, native_backend, refuse_grad

_C = _ext._C
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


def _op_name(add: bool, gemma: bool) -> str:
    return ("gemma_" if gemma else "") + ("fused_add_rmsnorm" if add else "rmsnorm")


def norm_reference(input, weight, eps, gemma=False, residual=None):
    """Plain-PyTorch fp32 formula (the "torch" backend); returns (out, residual_out or None)."""
    s = input.float()
    if residual is not None:
        s = s + residual.float()
    rstd = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    out = (s * rstd * w).to(input.dtype)
    return out, (s.to(input.dtype) if residual is not None else None)


def _run(out, input, residual, residual_out, weight, eps, gemma, backend, pdl=False):
    # The binding validates shapes, dtypes, devices, strides, storages and aliasing before
    # anything runs; for the "torch" backend it only validates (launch=False), then the
    # reference computes.
    launch = backend != "torch"
    _C.norm(out, input, residual, residual_out, weight, eps, gemma, None, launch, -1, pdl)
    if not launch:
        ref_out, ref_res = norm_reference(input, weight, eps, gemma, residual)
        if ref_res is not None:
            residual_out.copy_(ref_res)
        out.copy_(ref_out)


# --- torch.library registration: how torch.compile and CUDA graphs see the ops ---------------


@torch.library.custom_op(f"{LIBRARY}::norm", mutates_args=("out", "residual_out"))
def _norm_op(
    out: torch.Tensor,
    input: torch.Tensor,
    residual: Optional[torch.Tensor],
    residual_out: Optional[torch.Tensor],
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
    pdl: bool = False,
) -> None:
    _run(out, input, residual, residual_out, weight, eps, gemma, "auto", pdl)


@_norm_op.register_fake
def _norm_fake(out, input, residual, residual_out, weight, eps, gemma, pdl=False) -> None:
    if input.shape != out.shape or weight.shape != input.shape[-1:]:
        raise ValueError(
            f"opforge norm: input {tuple(input.shape)}, weight {tuple(weight.shape)} and out "
            f"{tuple(out.shape)} do not match"
        )


def _traced_norm(gemma: bool):
    prefix = f"opforge.{_op_name(False, gemma)}: "

    def traced(input, weight, eps=1e-6, out=None, *, backend="auto", enable_pdl=False):
        refuse_grad(_NORM_ARGS, (input, weight, out), prefix)
        out = torch.empty_like(input) if out is None else out
        _norm_op(out, input, None, None, weight, float(eps), gemma, bool(enable_pdl))
        return out

    return traced


def _traced_add_norm(gemma: bool):
    prefix = f"opforge.{_op_name(True, gemma)}: "

    def traced(input, residual, weight, eps=1e-6, out=None, residual_out=None, *, backend="auto", enable_pdl=False):
        refuse_grad(_ADD_NORM_ARGS, (input, residual, weight, out, residual_out), prefix)
        out = torch.empty_like(input) if out is None else out
        residual_out = torch.empty_like(residual) if residual_out is None else residual_out
        _norm_op(out, input, residual, residual_out, weight, float(eps), gemma, bool(enable_pdl))
        return out, residual_out

    return traced


# --- public API ----------------------------------------------------------------------------


_NORM_ARGS = ("input", "weight", "out")
_ADD_NORM_ARGS = ("input", "residual", "weight", "out", "residual_out")


def _check_norm(input, weight, eps=1e-6, out=None, *, backend="auto", enable_pdl=False):
    check_tensors(_NORM_ARGS, (input, weight, out), 2)
    check_float("eps", eps)
    check_bool("enable_pdl", enable_pdl)
    return True


def _check_add_norm(input, residual, weight, eps=1e-6, out=None, residual_out=None, *, backend="auto",
                    enable_pdl=False):
    check_tensors(_ADD_NORM_ARGS, (input, residual, weight, out, residual_out), 3)
    check_float("eps", eps)
    check_bool("enable_pdl", enable_pdl)
    return True


def _requirement(check, traced):
    return backend_requirement(BACKEND_CHECKS, common_check=check, heuristic_func=native_backend, traced=traced,
                               auto_by_device=True)


@_requirement(_check_norm, _traced_norm(False))
def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: Optional[torch.Tensor] = None, *,
            backend: str = "auto", enable_pdl: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension: ``out = input * rsqrt(mean(input^2) + eps) * weight``.

    input: [..., hidden] fp16/bf16/fp32, CUDA or CPU; rows may be strided (last dim contiguous).
    weight: [hidden], same dtype and device. out: optional preallocated result (may be input).
    backend: "auto" (the kernel for the tensors' device), "cuda", "cpu" or "torch" (plain
    PyTorch). skip_check=True skips the Python-level checks. enable_pdl=True launches the CUDA
    kernel with programmatic dependent launch (compute capability 9.0+): it may start while the
    previous kernel on the stream finishes, which shortens back-to-back decode-size calls (off by
    default: alone, or after a kernel that does not release it early, it gains nothing).

    >>> y = opforge.rmsnorm(x, w)                  # new tensor
    >>> opforge.rmsnorm(x, w, out=x)               # in place
    """
    out = torch.empty_like(input) if out is None else out
    _run(out, input, None, None, weight, float(eps), False, backend, enable_pdl)
    return out


@_requirement(_check_norm, _traced_norm(True))
def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: Optional[torch.Tensor] = None, *,
                  backend: str = "auto", enable_pdl: bool = False) -> torch.Tensor:
    """Gemma's RMSNorm: like :func:`rmsnorm` with the weight applied as ``(1 + weight)``."""
    out = torch.empty_like(input) if out is None else out
    _run(out, input, None, None, weight, float(eps), True, backend, enable_pdl)
    return out


@_requirement(_check_add_norm, _traced_add_norm(False))
def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      out: Optional[torch.Tensor] = None, residual_out: Optional[torch.Tensor] = None, *,
                      backend: str = "auto", enable_pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add fused with RMSNorm; returns ``(out, residual_out)``.

    ``residual_out = round(input + residual)`` and ``out`` is the RMSNorm of the *unrounded*
    fp32 sum (see the module doc). ``out=input, residual_out=residual`` works in place.
    """
    out = torch.empty_like(input) if out is None else out
    residual_out = torch.empty_like(residual) if residual_out is None else residual_out
    _run(out, input, residual, residual_out, weight, float(eps), False, backend, enable_pdl)
    return out, residual_out


@_requirement(_check_add_norm, _traced_add_norm(True))
def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                            out: Optional[torch.Tensor] = None, residual_out: Optional[torch.Tensor] = None, *,
                            backend: str = "auto", enable_pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_add_rmsnorm` with the weight applied as ``(1 + weight)``."""
    out = torch.empty_like(input) if out is None else out
    residual_out = torch.empty_like(residual) if residual_out is None else residual_out
    _run(out, input, residual, residual_out, weight, float(eps), True, backend, enable_pdl)
    return out, residual_out


# --- the fast entries: what a plain call costs on the host ----------------------------------


def _fast_norm(slow, gemma: bool):
    def fast(input, weight, eps=1e-6, out=None, *, backend="auto", enable_pdl=False, skip_check=False):
        if (backend != "auto" or _hooks.active or type(input) is not _Tensor or type(weight) is not _Tensor
                or type(eps) is not float or (out is not None and type(out) is not _Tensor)
                or type(enable_pdl) is not bool or _is_compiling()):
            return slow(input, weight, eps, out, backend=backend, enable_pdl=enable_pdl, skip_check=skip_check)
        if out is None:
            out = torch.empty_like(input)
        _C.norm(out, input, None, None, weight, eps, gemma, None, True, -1, enable_pdl)
        return out

    return fast_entry(slow, fast)


def _fast_add_norm(slow, gemma: bool):
    def fast(input, residual, weight, eps=1e-6, out=None, residual_out=None, *, backend="auto", enable_pdl=False,
             skip_check=False):
        if (backend != "auto" or _hooks.active or type(input) is not _Tensor or type(residual) is not _Tensor
                or type(weight) is not _Tensor or type(eps) is not float
                or (out is not None and type(out) is not _Tensor)
                or (residual_out is not None and type(residual_out) is not _Tensor)
                or type(enable_pdl) is not bool or _is_compiling()):
            return slow(input, residual, weight, eps, out, residual_out, backend=backend, enable_pdl=enable_pdl,
                        skip_check=skip_check)
        if out is None:
            out = torch.empty_like(input)
        if residual_out is None:
            residual_out = torch.empty_like(residual)
        _C.norm(out, input, residual, residual_out, weight, eps, gemma, None, True, -1, enable_pdl)
        return out, residual_out

    return fast_entry(slow, fast)


rmsnorm = opforge_api(_fast_norm(rmsnorm, False))
gemma_rmsnorm = opforge_api(_fast_norm(gemma_rmsnorm, True))
fused_add_rmsnorm = opforge_api(_fast_add_norm(fused_add_rmsnorm, False))
gemma_fused_add_rmsnorm = opforge_api(_fast_add_norm(gemma_fused_add_rmsnorm, True))
