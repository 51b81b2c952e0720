"""opforge's built-in fused ops. Each module is one op family (see its docstring)."""

from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, rmsnorm
from .nvfp4 import nvfp4_gemv
from .paged_decode_attention import paged_decode_attention
from .scale import scale

__all__ = [
    "scale",
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "nvfp4_gemv",
    "paged_decode_attention",
]
