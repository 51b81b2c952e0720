"""What NVFP4 bytes mean, in plain PyTorch: the reference every NVFP4 kernel is checked against.

NVFP4 stores a tensor as FP4 E2M1 values, two per byte (``torch.float4_e2m1fn_x2``; the element
at the even index in the low nibble), and one FP8 E4M3 scale per 16 consecutive elements along
K. A value is ``e2m1(code) * e4m3(scale)``.

E2M1 codes (bit 3 sign, bits 2-1 exponent, bit 0 mantissa): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
their negatives (code 8 is -0).

Scale layouts of a [rows, K/16, L] scale tensor:

* plain: ``scale[i, j, l]`` for row i and K-block j (K/16 blocks; contiguous along j per row);
* blocked (cuBLAS block-scaled GEMM's 128x4 tiles): a [32, 4, ceil(rows/128), 4, ceil(K/64), L]
  tensor with element (i, j, l) at ``[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, l]``;
  the padding (rows to a multiple of 128, blocks to a multiple of 4) holds zeros.
"""

from __future__ import annotations

import torch

#: The value of each E2M1 code 0..15.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: Elements per scale along K, and K's required multiple (one 128x4 tile column of scales).
BLOCK = 16
K_MULTIPLE = 64


def _codes(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] packed fp4x2 (or uint8) -> [..., 2n] int64 codes, low nibble first."""
    raw = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    raw = raw.to(torch.int64)
    return torch.stack((raw & 0xF, raw >> 4), dim=-1).flatten(-2)


def decode_fp4(packed: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """FP4 E2M1 values of ``packed`` (fp4x2 or uint8 bytes) as fp32, unpacked along ``dim``
    (its size doubles)."""
    moved = packed.movedim(dim, -1)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    return table[_codes(moved)].movedim(-1, dim)


def encode_fp4(codes: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Integer codes 0..15 -> packed fp4x2 along ``dim`` (its size halves; must be even)."""
    moved = codes.movedim(dim, -1).to(torch.uint8)
    if moved.shape[-1] % 2:
        raise ValueError(f"encode_fp4: dimension {dim} has odd size {moved.shape[-1]}")
    pairs = moved.reshape(*moved.shape[:-1], -1, 2)
    packed = (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)
    return packed.view(torch.float4_e2m1fn_x2).movedim(-1, dim)


def blocked_shape(rows: int, k: int, l: int) -> tuple[int, ...]:
    """Shape of the blocked scale layout for a [rows, k] operand (k in elements), l batches."""
    return (32, 4, -(-rows // 128), 4, -(-(k // BLOCK) // 4), l)


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """Plain [rows, K/16, L] scales -> the blocked layout (module doc), zero padded."""
    rows, blocks, l = scale.shape
    r_tiles, b_tiles = -(-rows // 128), -(-blocks // 4)
    padded = torch.zeros((r_tiles * 128, b_tiles * 4, l), dtype=scale.dtype, device=scale.device)
    padded[:rows, :blocks] = scale
    # [rt, 4, 32, bt, 4, l]: row i = rt*128 + q*32 + p; block j = bt*4 + s.
    tiles = padded.view(r_tiles, 4, 32, b_tiles, 4, l)
    return tiles.permute(2, 1, 0, 4, 3, 5).contiguous()


def from_blocked(blocked: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The blocked layout -> plain [rows, blocks, L] scales (contiguous)."""
    p, q, r_tiles, s, b_tiles, l = blocked.shape
    if (p, q, s) != (32, 4, 4) or r_tiles * 128 < rows or b_tiles * 4 < blocks:
        raise ValueError(f"from_blocked: shape {tuple(blocked.shape)} is not the blocked layout of "
                         f"{rows} rows x {blocks} scale blocks")
    plain = blocked.permute(2, 1, 0, 4, 3, 5).reshape(r_tiles * 128, b_tiles * 4, l)
    return plain[:rows, :blocks].contiguous()


def dequantize(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[rows, K/2, L] fp4x2 with plain [rows, K/16, L] e4m3 scales -> [rows, K, L] fp32."""
    values = decode_fp4(packed, dim=1)
    factors = scale.to(torch.float32).repeat_interleave(BLOCK, dim=1)
    return values * factors


def nvfp4_gemv_reference(a, b, scale_a, scale_b) -> torch.Tensor:
    """c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l], decoded to fp32, accumulated in fp64 and
    rounded to fp16 once: [M, 1, L] fp16."""
    a_values = dequantize(a, scale_a).double()
    b_values = dequantize(b, scale_b).double()
    return torch.einsum("mkl,nkl->mnl", a_values, b_values).to(torch.float16)
