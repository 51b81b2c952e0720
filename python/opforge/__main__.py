"""``python -m opforge``: what this build contains, and a self-check of every op on every device
here against the plain-PyTorch reference (exit status 1 if any op disagrees); also
``opforge selfcheck``. ``python -m opforge <command> ...`` runs the ``opforge`` command."""

from __future__ import annotations

import json
import sys

import torch

import opforge
from opforge.ops.activation import act_and_mul_reference
from opforge.ops import nvfp4_format
from opforge.ops.norm import norm_reference
from opforge.ops.paged_decode_attention import paged_decode_attention_torch
from opforge.ops.scale import scale_reference

_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _cases(device: str, dtype: torch.dtype):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(7, 4096, device=device, dtype=dtype, generator=g)
    r = torch.randn(7, 4096, device=device, dtype=dtype, generator=g)
    w = torch.randn(4096, device=device, dtype=dtype, generator=g)
    yield "scale", opforge.scale(x, 0.5), scale_reference(x, 0.5)
    yield "rmsnorm", opforge.rmsnorm(x, w), norm_reference(x, w, 1e-6)[0]
    yield "gemma_rmsnorm", opforge.gemma_rmsnorm(x, w), norm_reference(x, w, 1e-6, gemma=True)[0]
    out, res = opforge.fused_add_rmsnorm(x, r, w)
    ref_out, ref_res = norm_reference(x, w, 1e-6, residual=r)
    yield "fused_add_rmsnorm", torch.cat([out, res]), torch.cat([ref_out, ref_res])
    out, res = opforge.gemma_fused_add_rmsnorm(x, r, w)
    ref_out, ref_res = norm_reference(x, w, 1e-6, gemma=True, residual=r)
    yield "gemma_fused_add_rmsnorm", torch.cat([out, res]), torch.cat([ref_out, ref_res])
    for act in ("silu", "gelu", "gelu_tanh"):
        yield f"{act}_and_mul", getattr(opforge, f"{act}_and_mul")(x), act_and_mul_reference(x, act)
    if dtype is torch.float16:  # NVFP4 operands, fp16 result: once per device
        yield "nvfp4_gemv", *_nvfp4_case(device, g)
    if dtype is not torch.float32:
        yield "paged_decode_attention", *_paged_decode_case(device, dtype, g)


def _nvfp4_case(device: str, g: torch.Generator):
    """M not a multiple of the row tile, L = 2, every FP4 code, scales 2^-6..2^2, in the task's
    layout (permuted from [L, rows, K/n], K contiguous)."""
    m, k, l = 300, 1024, 2

    def task(t):
        return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)

    def scales(rows):
        exponents = torch.randint(-6, 3, (rows, k // 16, l), device=device, generator=g)
        return task(torch.exp2(exponents.float()).to(torch.float8_e4m3fn))

    a = task(nvfp4_format.encode_fp4(torch.randint(16, (m, k, l), device=device, generator=g)))
    b = task(nvfp4_format.encode_fp4(torch.randint(16, (1, k, l), device=device, generator=g)))
    scale_a, scale_b = scales(m), scales(1)
    return opforge.nvfp4_gemv(a, b, scale_a, scale_b), nvfp4_format.nvfp4_gemv_reference(a, b, scale_a, scale_b)


def _paged_decode_case(device: str, dtype: torch.dtype, g: torch.Generator):
    """GQA 8:2, pages of 16 in random order, requests of 37, 0, 300 and 1 tokens (partly filled
    last pages) in a kv_indices buffer longer than they use (unused entries -1, as a serving
    engine's preallocated one may hold), which makes the GPU plan split the tokens; out and lse
    side by side (lse's -inf for the empty request as a large finite value on both sides)."""
    lengths, page_size, num_pages = [37, 0, 300, 1], 16, 40
    pages = [-(-n // page_size) for n in lengths]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=device)
    indices = torch.full((80,), -1, dtype=torch.int32, device=device)
    indices[: sum(pages)] = torch.randperm(num_pages, device=device, generator=g)[: sum(pages)].int()
    last = torch.tensor([n - (p - 1) * page_size if p else 1 for n, p in zip(lengths, pages)], dtype=torch.int32,
                        device=device)
    q = torch.randn(len(lengths), 8, 128, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(num_pages, page_size, 2, 128, device=device, dtype=dtype, generator=g) for _ in range(2))
    args = (q, k, v, indptr, indices, 0.1)
    got = opforge.paged_decode_attention(*args, kv_last_page_len=last)
    want = paged_decode_attention_torch(*args, kv_last_page_len=last)

    def flat(out, lse):
        return torch.cat([out.float().flatten(), torch.where(torch.isinf(lse), -1e4, lse).flatten()])

    return flat(*got), flat(*want)


def main() -> int:
    info = opforge.build_info()
    print(json.dumps(info, indent=2))
    devices = ["cpu"]
    if info["cuda"] and torch.cuda.is_available():
        devices.append("cuda")
    failed = 0
    with torch.inference_mode():
        for device in devices:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for name, got, want in _cases(device, dtype):
                    err = ((got.float() - want.float()).abs() / (want.float().abs() + 1)).max().item()
                    ok = err <= _TOL[dtype]
                    failed += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {name:<24} {device:<5} {str(dtype)[6:]:<9} max rel err {err:.2e}")
    print(f"{'all ops agree with the reference' if not failed else f'{failed} checks FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    # `python -m opforge <command> ...` is the `opforge` command; alone, the self-check (also
    # `opforge selfcheck`).
    if len(sys.argv) > 1:
        from opforge.cli import main as cli_main

        sys.exit(cli_main(sys.argv[1:]))
    sys.exit(main())
