"""opforge's own NVFP4 GEMV as the built-in dataset runs it (its builtin Solution: the blocked
scales left out of the call) against the Definition's reference, on the inputs the runner
generates, in the layout its workers receive them (the task's: K contiguous, the batch outermost,
as the Definitions' storage_orders say) and contiguous in the declared shape."""

from __future__ import annotations

import pytest
import torch

from opforge.bench import compare_outputs, generate_inputs
from opforge.registry import build
from opforge.trace import RandomInput, Workload
from opforge.trace.builtin import builtin_solution_for
from opforge.trace.templates import TEMPLATES

TEMPLATE = TEMPLATES["nvfp4_gemv"]


@pytest.mark.parametrize("layout", ["task", "contiguous"])
def test_builtin_solution_matches_the_reference_with_batches(layout):
    d = TEMPLATE.definition(M=130, K=192)
    run = build(builtin_solution_for(d), d, "cpu")
    w = Workload(uuid="w", axes={"L": 3}, inputs={n: RandomInput() for n in d.inputs}, seed=4)
    inputs = generate_inputs(d, w)
    want = d.reference_fn()(*inputs)
    if layout == "contiguous":
        inputs = [t.contiguous() for t in inputs[:4]] + inputs[4:]
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


def test_generated_operands_have_the_tasks_layout_and_keep_it_through_the_wire(tmp_path):
    """K contiguous and L outermost, as seed 003's task lays them out, in the runner and in the
    worker that gets them over the wire (spilled to a file or sent inline)."""
    from opforge.bench import _wire

    d = TEMPLATE.definition(M=130, K=192)
    w = Workload(uuid="w", axes={"L": 3}, inputs={n: RandomInput() for n in d.inputs}, seed=1)
    inputs = generate_inputs(d, w)
    def layout(t):  # strides of the dimensions that have any (a size-1 one's is arbitrary)
        return [s for n, s in zip(t.shape, t.stride()) if n > 1]

    for t in inputs[:4]:
        rows, kb, l = t.shape
        assert layout(t) == [s for n, s in zip(t.shape, (kb, 1, rows * kb)) if n > 1], (t.shape, t.stride())
    assert all(t.is_contiguous() for t in inputs[4:])
    for spill in (None, tmp_path):
        received = _wire.loads(_wire.dumps(inputs, spill=spill), spill=spill)
        for sent, got in zip(inputs, received):
            assert layout(got) == layout(sent) and got.dtype == sent.dtype
            assert got.view(torch.uint8).equal(sent.view(torch.uint8))
