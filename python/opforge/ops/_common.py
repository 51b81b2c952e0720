"""What every built-in op shares: argument checks that only Python can make, the backend checks
("cuda", "cpu", "torch"), the heuristic for ``backend="auto"``, and the torch.library namespace.

Shape, dtype, device, stride, storage and aliasing checks live in the compiled bindings (one
source of truth, microseconds cheaper than Python, and kept by skip_check=True); the "torch"
backend runs them too, without launching.
"""

from __future__ import annotations

import torch

from .. import _ext
from ..backend import supported_compute_capability

LIBRARY = "opforge"

Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled


def first_tensor(args: tuple) -> torch.Tensor:
    # backend_requirement moves the first parameter to args[0] when it comes by keyword.
    value = args[0] if args else None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"the first argument must be a torch.Tensor, got {type(value).__name__}")
    return value


def _type_error(name: str, value, optional: bool) -> TypeError:
    accepted = "a torch.Tensor or None" if optional else "a torch.Tensor"
    return TypeError(f"{name} must be {accepted}, got {type(value).__name__}")


def check_tensors(names: tuple[str, ...], values: tuple, required: int) -> None:
    """The first ``required`` values are tensors, the rest tensors or None. (A tensor that needs
    grad is refused by the binding, which every tensor of every op passes through.)

    Written for the call path: a loop over a tuple, no allocation when all is well.
    """
    i = 0
    for value in values:
        if not isinstance(value, Tensor) and (i < required or value is not None):
            raise _type_error(names[i], value, i >= required)
        i += 1


def refuse_grad(names: tuple[str, ...], values: tuple, prefix: str = "") -> None:
    """Autograd cannot see through the compiled kernels: refuse tensors that need grad while grad
    mode is on, instead of silently returning results with no gradient. Also run while
    torch.compile traces a call (``prefix`` names the op there), where it fails the compile."""
    if _grad_enabled():
        for i, value in enumerate(values):
            if value is not None and value.requires_grad:
                raise ValueError(
                    f"{prefix}{names[i]} requires grad, but opforge ops have no backward; call under "
                    f"torch.no_grad() / torch.inference_mode() or pass {names[i]}.detach()"
                )


def check_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            raise ValueError(f"{name} is an integer of {len(str(abs(value)))} digits, too large for a float; "
                             "accepted: a float (at most 1.8e308 in magnitude)") from None


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")


@supported_compute_capability(_ext.build_runs_on)
def cuda_check(*args, **kwargs) -> bool:
    t = first_tensor(args)
    if not t.is_cuda:
        raise ValueError(f"needs CUDA tensors; the input is on {t.device}")
    problem = _ext.arch_problem(t.get_device())
    if problem is not None:
        raise RuntimeError(problem)
    return True


def cpu_check(*args, **kwargs) -> bool:
    t = first_tensor(args)
    if not t.is_cpu:
        raise ValueError(f"needs CPU tensors; the input is on {t.device}")
    return True


def torch_check(*args, **kwargs) -> bool:
    return True


_CUDA_FIRST, _CPU_FIRST = ("cuda",), ("cpu",)


def native_backend(backends, *args, **kwargs) -> tuple[str, ...]:
    """``auto`` runs opforge's own kernel for the tensors' device; the plain-PyTorch "torch"
    backend is only ever used when asked for, never as a silent fallback."""
    return _CUDA_FIRST if first_tensor(args).is_cuda else _CPU_FIRST


BACKEND_CHECKS = {"cuda": cuda_check, "cpu": cpu_check, "torch": torch_check}
