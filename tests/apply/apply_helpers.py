"""Helpers of the apply tests: small datasets written inline (Definitions from opforge's op
templates or made here, python Solutions, fabricated traces measured "on this machine"), and
the fixture every test module imports by name: ``isolated`` (autouse: one build cache for the
whole pytest run, apply off and the tracer restored after each test)."""

from __future__ import annotations

import textwrap
import uuid as uuid_lib

import pytest

from opforge import intercept
from opforge.apply import api, disable_apply, hardware_name, matching
from opforge.registry import CACHE_DIR_VAR, device_info
from opforge.trace import (AxisConst, AxisVar, BuildSpec, Correctness, Definition, Environment, Evaluation,
                           Performance, RandomInput, ScalarInput, Solution, SourceFile, TensorSpec, Trace, TraceSet,
                           Workload, utc_timestamp)
from opforge.trace.builtin import builtin_solution_for
from opforge.trace.templates import TEMPLATES

#: These tests run on CPU tensors, also where a GPU is visible: traces are "measured" on the CPU
#: and apply's default device is the CPU while they run.
HW = hardware_name(device_info("cpu"))
OTHER_HW = "NVIDIA Imaginary 9000"


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path_factory.getbasetemp() / "apply-build-cache"))
    monkeypatch.setattr(api, "resolve_device", lambda device=None: matching.resolve_device(device or "cpu"))
    tracer = intercept.tracer()
    yield
    disable_apply()
    intercept.set_tracer(tracer)


def template_definition(prefix: str, dtype: str = "float32", **consts) -> Definition:
    return TEMPLATES[prefix].definition(dtype=dtype, **consts)


def builtin(definition: Definition) -> Solution:
    return builtin_solution_for(definition)


def python_solution(name: str, definition: Definition, source: str, *, dps: bool = False) -> Solution:
    return Solution(name=name, definition=definition.name, author="tests",
                    spec=BuildSpec(language="python", entry_point="main.py::run", destination_passing_style=dps),
                    sources=[SourceFile(path="main.py", content=textwrap.dedent(source))])


def tagging(name: str, definition: Definition, tag: float) -> Solution:
    """A solution whose every output is ``tag`` everywhere (shaped like the first input), so a
    result tells which solution computed it."""
    params = ", ".join(definition.inputs)
    first = next(iter(definition.inputs))
    outs = ", ".join(f"torch.full_like({first}, {tag!r})" for _ in definition.outputs)
    return python_solution(name, definition, f"import torch\n\ndef run({params}):\n    return {outs}\n")


def counting_reference(name: str, definition: Definition, *, dps: bool = False) -> Solution:
    """The Definition's reference as a solution that counts its calls in ``CALLS[0]`` (a
    module of its own per Solution made: equal sources would share one imported module)."""
    reference = definition.reference.replace("def run(", "def _reference(")
    params = ", ".join(definition.inputs)
    if not dps:
        run = f"def run({params}):\n    CALLS[0] += 1\n    return _reference({params})\n"
    else:
        outs = ", ".join(definition.outputs)
        run = (f"def run({params}, {outs}):\n    CALLS[0] += 1\n    result = _reference({params})\n"
               f"    result = result if isinstance(result, tuple) else (result,)\n"
               f"    for dest, value in zip(({outs},), result):\n        dest.copy_(value)\n")
    return python_solution(name, definition, f"# {uuid_lib.uuid4()}\n{reference}\nCALLS = [0]\n\n{run}", dps=dps)


def calls_of(handle, definition: str, solution: str) -> int:
    runnable = handle.runnable(definition, solution)
    return 0 if runnable is None else runnable.fn.__globals__["CALLS"][0]


def workload(definition: Definition, axes: dict, uid: str | None = None) -> Workload:
    inputs = {n: ScalarInput(value=1e-6) if s.shape is None else RandomInput() for n, s in definition.inputs.items()}
    label = ",".join(f"{k}={v}" for k, v in axes.items())
    return Workload(uuid=uid or str(uuid_lib.uuid5(uuid_lib.NAMESPACE_OID, f"{definition.name}/{label}")),
                    axes=axes, inputs=inputs)


def measured(definition: Definition, solution: str, axes: dict, latency_ms: float, *, hardware: str = HW,
             status: str = "PASSED", suspect: str | None = None, uid: str | None = None) -> Trace:
    """A trace of ``solution`` on the workload with ``axes`` (status PASSED unless said)."""
    passed = status == "PASSED"
    evaluation = Evaluation(
        status=status, environment=Environment(hardware=hardware), timestamp=utc_timestamp(),
        correctness=Correctness() if status in ("PASSED", "INCORRECT_NUMERICAL") else None,
        performance=Performance(latency_ms=latency_ms, suspect=suspect) if passed else None)
    return Trace(definition=definition.name, workload=workload(definition, axes, uid), solution=solution,
                 evaluation=evaluation)


def dataset(definitions, solutions, traces) -> TraceSet:
    ts = TraceSet()
    for d in definitions:
        ts.add_definition(d)
    for s in solutions:
        ts.add_solution(s)
    seen = set()
    for t in traces:
        if t.workload.uuid not in seen:
            seen.add(t.workload.uuid)
            ts.add_workload(t.definition, Trace(definition=t.definition, workload=t.workload))
        ts.add_trace(t)
    return ts


def axpy_definition(name: str = "axpy_d16") -> Definition:
    """A user Definition: ``y = a * x + b`` over rows of 16 (fp32)."""
    return Definition(
        name=name, op_type="axpy",
        axes={"rows": AxisVar(), "width": AxisConst(value=16)},
        inputs={"x": TensorSpec(shape=["rows", "width"], dtype="float32"),
                "b": TensorSpec(shape=["width"], dtype="float32"),
                "a": TensorSpec(shape=None, dtype="float32")},
        outputs={"y": TensorSpec(shape=["rows", "width"], dtype="float32")},
        reference="import torch\n\ndef run(x, b, a):\n    return a * x + b\n",
    )
