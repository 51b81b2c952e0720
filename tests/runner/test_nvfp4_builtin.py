"""opforge's own NVFP4 GEMV as the built-in dataset runs it (its builtin Solution: the blocked
scales left out of the call) against the Definition's reference, on the inputs the runner
generates, in the layout its workers receive them (the declared shape, contiguous) and in the
task's layout (K contiguous, the batch outermost)."""

from __future__ import annotations

import pytest

from opforge.bench import compare_outputs, generate_inputs
from opforge.registry import build
from opforge.trace import RandomInput, Workload
from opforge.trace.builtin import builtin_solution_for
from opforge.trace.templates import TEMPLATES

TEMPLATE = TEMPLATES["nvfp4_gemv"]


def task_layout(t):
    return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)


@pytest.mark.parametrize("layout", ["task", "contiguous"])
def test_builtin_solution_matches_the_reference_with_batches(layout):
    d = TEMPLATE.definition(M=130, K=192)
    run = build(builtin_solution_for(d), d, "cpu")
    w = Workload(uuid="w", axes={"L": 3}, inputs={n: RandomInput() for n in d.inputs}, seed=4)
    inputs = generate_inputs(d, w)
    want = d.reference_fn()(*inputs)
    if layout == "task":
        inputs = [task_layout(t) for t in inputs[:4]] + inputs[4:]
    check = compare_outputs(d, run(*inputs), want)
    assert check.passed, check.log


@pytest.mark.parametrize("m, k", [(37, 64), (128, 256), (300, 1024)])
def test_builtin_solution_matches_the_reference_single_batch(m, k):
    d = TEMPLATE.definition(M=m, K=k)
    run = build(builtin_solution_for(d), d, "cpu")
    w = Workload(uuid="w", axes={"L": 1}, inputs={n: RandomInput() for n in d.inputs}, seed=m)
    inputs = generate_inputs(d, w)
    check = compare_outputs(d, run(*inputs), d.reference_fn()(*inputs))
    assert check.passed, check.log
