"""Triton solutions on CPU in triton's interpreter (TRITON_INTERPRET=1), and languages whose
package is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from opforge.registry import UNSUPPORTED, BuildError, build
from registry_helpers import cache, mul_definition, solution  # noqa: F401 (cache is a fixture)

TRITON_MUL = """
import torch
import triton
import triton.language as tl


@triton.jit
def _mul_kernel(x_ptr, w_ptr, y_ptr, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(y_ptr + row * hidden + cols, x * w, mask=mask)


def launch(x, w, y):
    _mul_kernel[(x.shape[0],)](x, w, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
"""


@pytest.fixture
def interpreted(cache, monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_triton_value_returning(interpreted):
    sources = {"kernel.py": "import torch\nfrom .mul import launch\n\ndef run(x, w):\n"
                            "    y = torch.empty_like(x)\n    launch(x, w, y)\n    return y\n",
               "mul.py": TRITON_MUL}
    # Targets a GPU: the interpreter emulates one, so the hardware check lets it run on CPU.
    run = build(solution("tri_value", sources, language="triton", target=("cuda",), deps=("triton",)),
                mul_definition(), "cpu")
    x, w = torch.randn(5, 8), torch.randn(8)
    torch.testing.assert_close(run(x, w), x * w)


def test_triton_destination_passing(interpreted):
    src = TRITON_MUL + "\n\ndef run(x, w, y):\n    launch(x, w, y)\n"
    run = build(solution("tri_dps", src, language="triton", dps=True, target=("sm_90",)), mul_definition(), "cpu")
    x, w = torch.randn(3, 8), torch.randn(8)
    torch.testing.assert_close(run(x, w), x * w)


@pytest.mark.parametrize("language, package", [("tilelang", "tilelang"), ("cutedsl", "cutlass")])
def test_language_package_missing(cache, language, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    src = "def run(x, w):\n    return x * w\n"
    with pytest.raises(BuildError, match=f"language {language} needs the {package} package") as info:
        build(solution("pkg", src, language=language, target=("cpu",)), mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED
