"""Runs the Triton NVFP4 GEMV cases of test_nvfp4_triton_solution.py in a process of their own and
prints one JSON line: {case: {"ok": bool, "log": str}}.

Triton decides at import whether its own library functions (tl.zeros, tl.sum, ...) run in the
interpreter, so TRITON_INTERPRET=1 must be set before triton is first imported; a test process
may have imported it long before. Run as ``TRITON_INTERPRET=1 python nvfp4_triton_cases.py``.
"""

from __future__ import annotations

import json
import math
import traceback

import torch

from opforge.bench import compare_outputs, generate_inputs
from opforge.registry import build
from opforge.solutions import nvfp4_gemv_triton as kernel
from opforge.solutions import shipped_solutions
from opforge.trace import RandomInput, Workload
from opforge.trace.templates import TEMPLATES

TEMPLATE = TEMPLATES["nvfp4_gemv"]
#: (M, K, L): K of 64 to 256 (one K tile, a partial one, a few), M no multiple of the row tile.
#: L = 1 reads K as 32-bit words; L > 1 (the declared shape contiguous: K strided) byte by byte.
SHAPES = [(37, 64, 3), (16, 128, 1), (21, 192, 1), (50, 192, 2), (129, 256, 4)]
#: (splits, L): K split over programs, on both paths.
SPLITS = [(2, 2), (3, 1), (8, 2)]


def case(m: int, k: int, l: int, seed: int = 0):
    d = TEMPLATE.definition(M=m, K=k)
    w = Workload(uuid=f"L{l}", axes={"L": l}, inputs={n: RandomInput() for n in d.inputs}, seed=seed)
    inputs = generate_inputs(d, w)
    return d, inputs, d.reference_fn()(*inputs)


def poisoned(m: int, l: int) -> torch.Tensor:
    return torch.full((m, 1, l), math.nan, dtype=torch.float16)  # a row left unwritten fails


def judged(d, got, want, extra: str = "") -> dict:
    check = compare_outputs(d, got, want)
    return {"ok": check.passed and not extra, "log": f"{check.log or ''} {extra}".strip()}


def one_tuple(m, k, l):
    d, inputs, want = case(m, k, l, seed=m)
    c = poisoned(m, l)
    got = kernel.triton_kernel((*inputs, c))
    return judged(d, c, want, "" if got is c else "the entry did not return c")


def split(splits, l):
    m, k = 45, 1024
    d, inputs, want = case(m, k, l, seed=7)
    whole = kernel.nvfp4_gemv(*inputs[:4], poisoned(m, l), splits=1)
    parts = kernel.nvfp4_gemv(*inputs[:4], poisoned(m, l), splits=splits)
    close = torch.allclose(parts.float(), whole.float(), rtol=1e-3, atol=1e-3)
    return judged(d, parts, want, "" if close else "split and whole results differ")


def task_layout():
    # The task's tensors are views of [L, M, ...] buffers: K contiguous, the batch outermost (the
    # generated inputs' layout: the Definition's storage_orders), against the same values
    # contiguous in the declared shape, K strided.
    m, k, l = 33, 256, 3
    d, inputs, want = case(m, k, l, seed=3)
    plain = [t.contiguous() for t in inputs[:4]]
    c = torch.full((l, m, 1), math.nan, dtype=torch.float16).permute(1, 2, 0)
    kernel.nvfp4_gemv(*inputs[:4], c)
    c_plain = kernel.nvfp4_gemv(*plain, poisoned(m, l))
    same = torch.equal(c, c_plain)
    # The task's layout takes the word path; the contiguous one, K strided, the byte path.
    paths = kernel._word_aligned(inputs[0].view(torch.uint8)) and not kernel._word_aligned(plain[0].view(torch.uint8))
    why = "" if paths else "not the word path here and the byte path there"
    return judged(d, c, want, why or ("" if same else "the two layouts give different results"))


def registry():
    m, k, l = 40, 192, 2
    d, inputs, want = case(m, k, l, seed=1)
    (solution,) = shipped_solutions(d, "nvfp4_gemv")
    return judged(d, build(solution, d, "cpu")(*inputs), want)


CASES = {
    **{f"tuple-{m}-{k}-{l}": (one_tuple, (m, k, l)) for m, k, l in SHAPES},
    **{f"split-{s}-L{l}": (split, (s, l)) for s, l in SPLITS},
    "task-layout": (task_layout, ()),
    "registry": (registry, ()),
}


def main() -> None:
    results = {}
    for name, (fn, args) in CASES.items():
        try:
            results[name] = fn(*args)
        except Exception:  # reported per case; the others still run
            results[name] = {"ok": False, "log": traceback.format_exc()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
