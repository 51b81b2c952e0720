"""scale: ``out = x * factor`` in fp32, rounded once to x's dtype (cuda/scale.cu, cpp/elementwise.cpp)."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _ext, _hooks
from ..api_logging import opforge_api
from ..backend import backend_requirement, fast_entry
from ._common import BACKEND_CHECKS, LIBRARY, check_float, check_tensors, native_backend, refuse_grad

_C = _ext._C
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


def scale_reference(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Plain-PyTorch formula (the "torch" backend)."""
    return (x.float() * factor).to(x.dtype)


def _run(out, x, factor: float, backend: str) -> None:
    launch = backend != "torch"
    # For the "torch" backend the binding only validates (launch=False); the reference computes.
    _C.scale(out, x, factor, None, launch)
    if not launch:
        out.copy_(scale_reference(x, factor))


@torch.library.custom_op(f"{LIBRARY}::scale", mutates_args=("out",))
def _scale_op(out: torch.Tensor, x: torch.Tensor, factor: float) -> None:
    _run(out, x, factor, "auto")


@_scale_op.register_fake
def _scale_fake(out, x, factor) -> None:
    if out.shape != x.shape:
        raise ValueError(f"opforge.scale: x {tuple(x.shape)} and out {tuple(out.shape)} do not match")


def _traced(x, factor, out=None, *, backend="auto"):
    refuse_grad(_ARGS, (x, out), "opforge.scale: ")
    out = torch.empty_like(x) if out is None else out
    _scale_op(out, x, float(factor))
    return out


_ARGS = ("x", "out")


def _check(x, factor, out=None, *, backend="auto"):
    check_tensors(_ARGS, (x, out), 1)
    check_float("factor", factor)
    return True


@backend_requirement(BACKEND_CHECKS, common_check=_check, heuristic_func=native_backend, traced=_traced,
                     auto_by_device=True)
def scale(x: torch.Tensor, factor: float, out: Optional[torch.Tensor] = None, *, backend: str = "auto") -> torch.Tensor:
    """Element-wise ``out = x * factor`` (fp32 math, one rounding), any shape whose rows are
    evenly strided with a contiguous last dimension. out may be x (in place).

    >>> y = opforge.scale(x, 0.5)
    """
    out = torch.empty_like(x) if out is None else out
    _run(out, x, float(factor), backend)
    return out


def _fast(slow):
    def fast(x, factor, out=None, *, backend="auto", skip_check=False):
        # The plain call in one frame (see backend.fast_entry); anything else takes the checked path.
        if (backend != "auto" or _hooks.active or type(x) is not _Tensor or type(factor) is not float
                or (out is not None and type(out) is not _Tensor) or _is_compiling()):
            return slow(x, factor, out, backend=backend, skip_check=skip_check)
        if out is None:
            out = torch.empty_like(x)
        _C.scale(out, x, factor, None, True)
        return out

    return fast_entry(slow, fast)


scale = opforge_api(_fast(scale))
