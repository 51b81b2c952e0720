"""The aliasing rule of the bindings, checked against a brute-force element comparison: an output
may be its input exactly (in place) or share no element with it; any other overlap is refused."""

from __future__ import annotations

import random

import pytest
import torch

import opforge


def _elements(view: torch.Tensor, base: torch.Tensor) -> set[int]:
    offset = view.storage_offset() - base.storage_offset()
    rows, cols = view.shape
    return {offset + r * view.stride(0) + c for r in range(rows) for c in range(cols)}


def _random_view(buf: torch.Tensor, rng: random.Random, rows: int, cols: int) -> torch.Tensor:
    stride = rng.choice([cols, cols + rng.randint(0, 5), 2 * cols])
    span = (rows - 1) * stride + cols
    start = rng.randint(0, buf.numel() - span)
    return buf.as_strided((rows, cols), (stride, 1), start)


@pytest.mark.parametrize("seed", range(300))
def test_overlap_rule_matches_brute_force(seed):
    rng = random.Random(seed)
    buf = torch.randn(200)
    rows, cols = rng.randint(1, 4), rng.randint(1, 12)
    x = _random_view(buf, rng, rows, cols)
    if seed % 2:  # same stride, shifted by less than a row: interleaved rows, overlapping or not
        stride = max(x.stride(0), cols)
        shift = rng.randint(-stride, stride)
        start = min(max(x.storage_offset() + shift, 0), buf.numel() - ((rows - 1) * stride + cols))
        out = buf.as_strided((rows, cols), (stride, 1), start)
    else:
        out = _random_view(buf, rng, rows, cols)
    same_view = x.data_ptr() == out.data_ptr() and x.stride() == out.stride()
    overlap = bool(_elements(x, buf) & _elements(out, buf))
    expected = x.float() * 3.0
    if overlap and not same_view:
        with pytest.raises(ValueError, match=r"opforge\.scale: out overlaps x"):
            opforge.scale(x, 3.0, out=out)
    else:
        opforge.scale(x, 3.0, out=out)
        torch.testing.assert_close(out, expected)
