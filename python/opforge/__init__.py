"""opforge: fused GPU ops for PyTorch, compiled ahead of time into one extension.

Importing opforge never touches a GPU. See README.md for the API and ``opforge.build_info()``
for what this build contains.
"""

from ._ext import CudaError, build_info
from .api_logging import opforge_api
from .backend import BackendError, backend_requirement, supported_compute_capability
from .ops import (
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    nvfp4_gemv,
    paged_decode_attention,
    rmsnorm,
    scale,
    silu_and_mul,
)

__version__ = build_info()["version"]


def _switch_on_from_environment() -> None:
    # OPFORGE_ENABLE_TRACING / OPFORGE_ENABLE_APPLY (opforge.config) trace or route a script's op
    # calls without editing it; without them nothing of the forge is imported here.
    import warnings

    from . import config

    try:
        wanted = config.tracing_enabled() or config.apply_enabled()
    except ValueError as exc:
        warnings.warn(f"opforge: {exc}; tracing and apply stay off", RuntimeWarning, stacklevel=3)
        return
    if wanted:
        from . import intercept

        intercept.enable_from_environment()


_switch_on_from_environment()

# The forge's entry points, imported on first use so that `import opforge` stays light.
_LAZY = {"BACKENDS": "registry", "register_solution": "registry", "TraceSet": "trace",
         "patch": "integrations.transformers",
         "enable_tracing": "tracing", "disable_tracing": "tracing", "TracingConfig": "tracing",
         "apply": "apply", "enable_apply": "apply", "disable_apply": "apply", "ApplyConfig": "apply"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ApplyConfig",
    "BACKENDS",
    "BackendError",
    "CudaError",
    "apply",
    "backend_requirement",
    "build_info",
    "disable_apply",
    "enable_apply",
    "disable_tracing",
    "enable_tracing",
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "nvfp4_gemv",
    "opforge_api",
    "paged_decode_attention",
    "patch",
    "rmsnorm",
    "scale",
    "silu_and_mul",
    "register_solution",
    "supported_compute_capability",
    "TraceSet",
    "TracingConfig",
]
