"""Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

input [..., 2d] holds ``[x, gate]``; out [..., d] = ``act(x) * gate``, computed in fp32 and
rounded once (cuda/activation.cu, cpp/elementwise.cpp).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import _ext, _hooks
from ..api_logging import opforge_api
from ..backend import backend_requirement, fast_entry
from ._common import BACKEND_CHECKS, LIBRARY, check_bool, check_tensors, native_backend, refuse_grad

_C = _ext._C
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling

#: Activation codes understood by the binding, and the fp32 formula each one computes.
ACTIVATIONS = {
    "silu": (0, F.silu),
    "gelu": (1, lambda x: F.gelu(x, approximate="none")),
    "gelu_tanh": (2, lambda x: F.gelu(x, approximate="tanh")),
}


def act_and_mul_reference(input: torch.Tensor, activation: str) -> torch.Tensor:
    """Plain-PyTorch fp32 formula (the "torch" backend)."""
    d = input.shape[-1] // 2
    x = input.float()
    return (ACTIVATIONS[activation][1](x[..., :d]) * x[..., d:]).to(input.dtype)


def _out_like(input: torch.Tensor, name: str) -> torch.Tensor:
    shape = input.shape
    if not shape:
        raise ValueError(f"opforge.{name}: input is a 0-d tensor; it needs a last dimension of [x, gate]")
    return torch.empty((*shape[:-1], shape[-1] // 2), dtype=input.dtype, device=input.device)


def _run(out, input, activation: str, backend: str, pdl: bool = False) -> None:
    launch = backend != "torch"
    # For the "torch" backend the binding only validates (launch=False); the reference computes.
    _C.act_and_mul(out, input, ACTIVATIONS[activation][0], None, launch, pdl)
    if not launch:
        out.copy_(act_and_mul_reference(input, activation))


@torch.library.custom_op(f"{LIBRARY}::act_and_mul", mutates_args=("out",))
def _act_and_mul_op(out: torch.Tensor, input: torch.Tensor, activation: str, pdl: bool = False) -> None:
    _run(out, input, activation, "auto", pdl)


@_act_and_mul_op.register_fake
def _act_and_mul_fake(out, input, activation, pdl=False) -> None:
    if input.shape[-1] % 2 or out.shape != (*input.shape[:-1], input.shape[-1] // 2):
        raise ValueError(f"opforge {activation}_and_mul: input {tuple(input.shape)} and out {tuple(out.shape)} do not match")


_ARGS = ("input", "out")


def _check(input, out=None, *, backend="auto", enable_pdl=False):
    check_tensors(_ARGS, (input, out), 1)
    check_bool("enable_pdl", enable_pdl)
    return True


def _make(activation: str, doc: str):
    """The public op for one activation (the three differ only in the formula)."""
    name = f"{activation}_and_mul"

    def traced(input, out=None, *, backend="auto", enable_pdl=False):
        refuse_grad(_ARGS, (input, out), f"opforge.{name}: ")
        out = _out_like(input, name) if out is None else out
        _act_and_mul_op(out, input, activation, bool(enable_pdl))
        return out

    def op(input: torch.Tensor, out: Optional[torch.Tensor] = None, *, backend: str = "auto",
           enable_pdl: bool = False) -> torch.Tensor:
        out = _out_like(input, name) if out is None else out
        _run(out, input, activation, backend, enable_pdl)
        return out

    # Named before decorating: the decorators put the name into every error message.
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    slow = backend_requirement(BACKEND_CHECKS, common_check=_check, heuristic_func=native_backend, traced=traced,
                               auto_by_device=True)(op)
    code = ACTIVATIONS[activation][0]

    def fast(input, out=None, *, backend="auto", enable_pdl=False, skip_check=False):
        # The plain call in one frame (see backend.fast_entry); anything else takes the checked path.
        if (backend != "auto" or _hooks.active or type(input) is not _Tensor
                or (out is not None and type(out) is not _Tensor) or type(enable_pdl) is not bool
                or _is_compiling()):
            return slow(input, out, backend=backend, enable_pdl=enable_pdl, skip_check=skip_check)
        if out is None:
            out = _out_like(input, name)
        _C.act_and_mul(out, input, code, None, True, enable_pdl)
        return out

    return opforge_api(fast_entry(slow, fast))


_DOC = """``out = {formula} * input[..., d:]`` for input [..., 2d] -> out [..., d].

input: fp16/bf16/fp32, CUDA or CPU, rows may be strided (last dim contiguous). out: optional
preallocated [..., d] result (must not overlap input). backend: "auto", "cuda", "cpu", "torch".
enable_pdl=True: programmatic dependent launch on a GPU of compute capability 9.0+ (see
:func:`opforge.rmsnorm`).
"""

silu_and_mul = _make("silu", _DOC.format(formula="silu(input[..., :d])"))
gelu_and_mul = _make("gelu", _DOC.format(formula="gelu(input[..., :d]) (erf form)"))
gelu_tanh_and_mul = _make("gelu_tanh", _DOC.format(formula="gelu(input[..., :d], approximate='tanh')"))
