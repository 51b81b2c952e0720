"""What every built-in op shares: argument checks that only Python can make, the backend checks
("cuda", "cpu", "torch"), the heuristic for ``backend="auto"``, and the torch.library namespace.

Shape, dtype, device, stride and aliasing checks live in the compiled bindings (one source of
truth, microseconds cheaper than Python); the "torch" backend runs them too, without launching.
"""

from __future__ import annotations

import torch

from .. import _ext
from ..backend import supported_compute_capability

#: Every compute capability CUDA 13 compiles for; whether *this* build has code for the GPU is
#: checked separately (``_ext.arch_problem``), with the rebuild command in the message.
CUDA_CCS = (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121)

LIBRARY = "opforge"

Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    value = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"the first argument must be a torch.Tensor, got {type(value).__name__}")
    return value


def _type_error(name: str, value, optional: bool) -> TypeError:
    accepted = "a torch.Tensor or None" if optional else "a torch.Tensor"
    return TypeError(f"{name} must be {accepted}, got {type(value).__name__}")


def check_tensors(names: tuple[str, ...], values: tuple, required: int) -> None:
    """The first ``required`` values are tensors, the rest tensors or None, and none needs grad.

    Written for the call path: a loop over a tuple, no allocation when all is well.
    """
    i = 0
    for value in values:
        if not isinstance(value, Tensor) and (i < required or value is not None):
            raise _type_error(names[i], value, i >= required)
        i += 1
    # Autograd cannot see through the compiled kernels: refuse instead of silently returning
    # results with no gradient.
    if _grad_enabled():
        for i, value in enumerate(values):
            if value is not None and value.requires_grad:
                raise ValueError(
                    f"{names[i]} requires grad, but opforge ops have no backward; call under "
                    f"torch.no_grad() / torch.inference_mode() or pass {names[i]}.detach()"
                )


def check_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")


@supported_compute_capability(CUDA_CCS)
def cuda_check(*args, **kwargs) -> bool:
    t = first_tensor(args, kwargs)
    if not t.is_cuda:
        raise ValueError(f"needs CUDA tensors; the input is on {t.device}")
    problem = _ext.arch_problem(t.get_device())
    if problem is not None:
        raise RuntimeError(problem)
    return True


def cpu_check(*args, **kwargs) -> bool:
    t = first_tensor(args, kwargs)
    if not t.is_cpu:
        raise ValueError(f"needs CPU tensors; the input is on {t.device}")
    return True


def torch_check(*args, **kwargs) -> bool:
    return True


_CUDA_FIRST, _CPU_FIRST = ("cuda",), ("cpu",)


def native_backend(backends, *args, **kwargs) -> tuple[str, ...]:
    """``auto`` runs opforge's own kernel for the tensors' device; the plain-PyTorch "torch"
    backend is only ever used when asked for, never as a silent fallback."""
    return _CUDA_FIRST if first_tensor(args, kwargs).is_cuda else _CPU_FIRST


BACKEND_CHECKS = {"cuda": cuda_check, "cpu": cpu_check, "torch": torch_check}


def raise_unexportable(op: str, *named: tuple[str, object]):
    """Explain why a tensor could not be handed to the kernels (called only after the export failed)."""
    for name, value in named:
        if isinstance(value, Tensor) and value.device.type not in ("cpu", "cuda"):
            raise ValueError(f"opforge.{op}: {name} is on {value.device}; accepted: cpu or cuda tensors")
    for name, value in named:
        if isinstance(value, Tensor):
            try:
                torch._C._to_dlpack(value)
            except (BufferError, RuntimeError) as exc:
                raise ValueError(f"opforge.{op}: {name} cannot be passed to the kernels: {exc}") from None
    raise ValueError(f"opforge.{op}: the arguments cannot be passed to the kernels")
