"""Template of NVFP4 GEMV: ``c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l]`` for L independent
matrix-vector products, A and B in NVFP4 (ops/nvfp4_format.py says what the bytes mean).

Definitions ``nvfp4_gemv_m{M}_k{K}`` (op_type ``gemv``: the format is in the name, as the public
dataset names ``moe_fp8_block_scale_...`` under ``moe``). Inputs in the order every NVFP4 GEMV
kernel takes them, ``(a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted)``, output
``c``:

* ``a`` [M, K/2, L], ``b`` [1, K/2, L]: ``float4_e2m1`` (FlashInfer-Bench's spelling; torch
  ``float4_e2m1fn_x2`` tensors), two values per byte along K, so the declared shape is the torch
  tensor's (the packed axis ``K_packed`` is K/2);
* ``scale_a`` [M, K/16, L], ``scale_b`` [1, K/16, L]: FP8 E4M3 block scales, one per 16 values;
* ``scale_a_permuted``, ``scale_b_permuted``: the same scales in the blocked 128x4 layout
  [32, 4, ceil(rows/128), 4, K/64, L] (zero padded) for kernels that read that one. Their value
  domains declare them derived from the plain scales, so generated inputs always agree;
* ``c`` [M, 1, L] float16.

The four plain operands are stored with L outermost and K contiguous (``storage_orders``), the
layout of seed 003's task, which generated inputs follow.

Workload inputs are built to find bugs (value domains; bench/inputs.py draws them): A and B
uniform over all 16 codes in both nibbles; scales log-uniform over the E4M3 binades from the
smallest subnormal (2^-9) up to ``sqrt(65504 / (36 K))``, so that even with every product at
its largest (|6 * scale_a * 6 * scale_b| summed over K) c stays finite in fp16. Tolerance
1e-3 absolute and relative against an fp64 reference.

The op (``opforge.nvfp4_gemv(a, b, scale_a, scale_b, out=None)``) takes the plain scales; its
builtin solution passes the permuted ones nowhere.
"""

from __future__ import annotations

from ... import ops
from ...ops.nvfp4_format import BLOCK, E2M1_VALUES, K_MULTIPLE
from ..extensions import Tolerance
from ..template import DEFAULT_DTYPE, Const, Tensor, TraceTemplate, Var

#: The smallest positive FP8 E4M3 value (a subnormal), the largest finite fp16, the largest |E2M1|.
E4M3_SMALLEST = 2.0 ** -9
FP16_MAX = 65504.0
E2M1_MAX = max(E2M1_VALUES)

_E4M3 = "float8_e4m3fn"
_FP4X2 = "float4_e2m1"  # a torch float4_e2m1fn_x2 tensor (trace/dtypes.py)
_BLOCKED = ["tile_rows", "tile_row_groups", "{tiles}", "tile_blocks", "K_tiles", "L"]


def _blocked(tiles: str) -> list:
    return [tiles if axis == "{tiles}" else axis for axis in _BLOCKED]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _derive(values: dict) -> dict:
    """Every axis that follows from M and K (or from the packed / block counts a call shows)."""
    out = {"N": 1, "N_tiles": 1, "tile_rows": 32, "tile_row_groups": 4, "tile_blocks": 4}
    k = values.get("K") or 2 * values.get("K_packed", 0) or BLOCK * values.get("K_blocks", 0)
    if k:
        if k % K_MULTIPLE:
            raise ValueError(f"nvfp4_gemv: K={k} is not a multiple of {K_MULTIPLE}")
        out.update(K=k, K_packed=k // 2, K_blocks=k // BLOCK, K_tiles=k // K_MULTIPLE)
    if values.get("M"):
        out["M_tiles"] = _cdiv(values["M"], 128)
    return out


def scale_bound(k: int) -> float:
    """The largest block scale of A and of B that keeps c finite in fp16 for any codes:
    K * (6 * s)^2 <= 65504. The Definition's value domains say the same as an expression."""
    return (FP16_MAX / (E2M1_MAX * E2M1_MAX * k)) ** 0.5


def _reference(consts: dict) -> str:
    m, k = consts["M"], consts["K"]
    return "\n".join([
        "import torch",
        "",
        "# FP4 E2M1 code -> value (bit 3 sign, bits 2-1 exponent, bit 0 mantissa; code 8 is -0).",
        "E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)",
        "",
        "",
        "def dequantize(packed, scale):",
        '    """[rows, K/2, L] packed FP4 (the even element along K in the low nibble) with',
        '    [rows, K/16, L] E4M3 scales -> [rows, K, L] float64."""',
        "    raw = packed.view(torch.uint8).long()",
        "    table = torch.tensor(E2M1, dtype=torch.float64, device=packed.device)",
        "    values = torch.stack((table[raw & 15], table[raw >> 4]), dim=2).flatten(1, 2)",
        f"    return values * scale.to(torch.float64).repeat_interleave({BLOCK}, dim=1)",
        "",
        "",
        "@torch.no_grad()",
        "def run(a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted):",
        f"    assert a.shape[:2] == ({m}, {k // 2}) and scale_a.shape[:2] == ({m}, {k // BLOCK})",
        "    # The permuted scales repeat scale_a / scale_b in another layout: not read here.",
        "    # Products are exact in float64 and the sum nearly so; c is rounded to fp16 once.",
        "    c = torch.einsum('mkl,nkl->mnl', dequantize(a, scale_a), dequantize(b, scale_b))",
        "    return c.to(torch.float16)",
    ]) + "\n"


def _extras(consts: dict) -> dict:
    scale_domain = {"kind": "log_uniform", "low": E4M3_SMALLEST,
                    "high": f"sqrt({FP16_MAX:g} / ({E2M1_MAX * E2M1_MAX:g} * K))"}
    return {
        "constraints": [f"K % {K_MULTIPLE} == 0", "K_packed * 2 == K", f"K_blocks * {BLOCK} == K",
                        f"K_tiles * {K_MULTIPLE} == K", "M_tiles == cdiv(M, 128)"],
        "tolerances": {"c": Tolerance(atol=1e-3, rtol=1e-3)},
        "value_domains": {
            "scale_a": scale_domain,
            "scale_b": scale_domain,
            "scale_a_permuted": {"kind": "derived", "source": "scale_a", "transform": "blocked_128x4"},
            "scale_b_permuted": {"kind": "derived", "source": "scale_b", "transform": "blocked_128x4"},
        },
        # As seed 003's task hands them over: K contiguous, the batch L outermost ([L, rows, K/2]
        # storage), so kernels are measured on that layout rather than on L innermost, where
        # K-major kernels would first have to copy A.
        "storage_orders": {name: [2, 0, 1] for name in ("a", "b", "scale_a", "scale_b")},
        # What a kernel must move: A, B and one copy of their scales in, c out (the blocked
        # copies repeat the plain scales; a kernel reads one or the other).
        "bytes": ("(M + N) * K_packed * L * a_itemsize + (M + N) * K_blocks * L * scale_a_itemsize"
                  " + M * N * L * c_itemsize"),
        "flops": "2 * M * N * K * L",
    }


class NVFP4Template(TraceTemplate):
    """Every tensor has a fixed dtype, so a name carries no dtype suffix whatever dtype a call
    or a caller names (the first input of a call is float4_e2m1fn_x2, no template dtype)."""

    def name(self, dtype: str = DEFAULT_DTYPE, **consts) -> str:
        return super().name(DEFAULT_DTYPE, **consts)


nvfp4_gemv_template = NVFP4Template(
    op_type="gemv",
    name_prefix="nvfp4_gemv",
    op=ops.nvfp4_gemv,
    axes={
        "M": Const(abbrev="m", description="rows of A and of c"),
        "K": Const(abbrev="k", description="FP4 values per row of A and of B (a multiple of 64)"),
        "L": Var(description="independent matrix-vector products (the batch)"),
        "N": Const(description="columns of c: 1"),
        "K_packed": Const(description="bytes per row of A and of B: K / 2"),
        "K_blocks": Const(description="scales per row: K / 16"),
        "M_tiles": Const(description="128-row tiles of A's blocked scales: ceil(M / 128)"),
        "N_tiles": Const(description="128-row tiles of B's blocked scales: 1"),
        "K_tiles": Const(description="4-scale columns of the blocked scales: K / 64"),
        "tile_rows": Const(description="row within a 32-row group of a 128-row tile: 32"),
        "tile_row_groups": Const(description="32-row group within a 128-row tile: 4"),
        "tile_blocks": Const(description="scale within a 4-scale tile column: 4"),
    },
    inputs={
        "a": Tensor(["M", "K_packed", "L"], dtype=_FP4X2, fold_leading=False,
                    description="A: FP4 E2M1, two per byte along K (the even element in the low nibble)"),
        "b": Tensor(["N", "K_packed", "L"], dtype=_FP4X2, fold_leading=False,
                    description="B: FP4 E2M1, two per byte along K"),
        "scale_a": Tensor(["M", "K_blocks", "L"], dtype=_E4M3, fold_leading=False,
                          description="A's scale of each 16 consecutive values along K"),
        "scale_b": Tensor(["N", "K_blocks", "L"], dtype=_E4M3, fold_leading=False,
                          description="B's scale of each 16 consecutive values along K"),
        "scale_a_permuted": Tensor(_blocked("M_tiles"), dtype=_E4M3, fold_leading=False,
                                   description="scale_a in the blocked 128x4 layout: element (i, j, l) at "
                                               "[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, l]"),
        "scale_b_permuted": Tensor(_blocked("N_tiles"), dtype=_E4M3, fold_leading=False,
                                   description="scale_b in the blocked 128x4 layout (rows padded to 128)"),
    },
    outputs={"c": Tensor(["M", "N", "L"], param="out", dtype="float16", fold_leading=False,
                         description="c = A @ B per batch, rounded to fp16 once")},
    reference=_reference,
    description=lambda c: (f"NVFP4 GEMV, M={c['M']}, K={c['K']}: c = A @ B per batch l, each FP4 E2M1 value "
                           "times its FP8 E4M3 block scale (16 values along K), accumulated in fp32 or "
                           "wider, fp16 out. scale_*_permuted repeat the scales in the blocked 128x4 layout."),
    tags=["status:verified", "fi_api:opforge.nvfp4_gemv", "quantization:nvfp4"],
    derive=_derive,
    extras=_extras,
)

TEMPLATES = [nvfp4_gemv_template]
