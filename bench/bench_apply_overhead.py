"""What apply's routing costs per call, on top of calling the chosen function directly.

End-to-end cases (tiny tensors, so that the call path, not the math, is what is timed):

  op, apply off            opforge.rmsnorm(x, w, eps) with its hook off (the baseline of the next)
  op -> own op             apply on, opforge's own op measured fastest: the op hook, binding the
                           call to its Definition (opforge.trace.calls), the route lookup
  op -> solution           apply on, a contributed (identity) solution measured fastest, against
                           calling that solution's Runnable with the Definition's inputs
  @apply -> solution       an @apply function routed to an identity solution, against calling
                           its Runnable directly
  @apply, apply off        the decorated function with apply off, against the plain function

The router alone (a call already bound, opforge.intercept's part left out):

  route lookup             Router.run_builtin where opforge's own op won (it answers PROCEED and
                           the op runs on by itself), against an empty call
  route + checks           Router.run_builtin where a solution won, against the solution's
                           Runnable plus delivering its result (OpCall.finish): the lookup, the
                           check of the call's other tensors (weight, residual: dtype, shape,
                           contiguity, device kind) and the re-entry guard

    python bench/bench_apply_overhead.py            # prints ns per call and the overheads
    python -m pytest bench/bench_apply_overhead.py  # the end-to-end pairs under pytest-benchmark
"""

from __future__ import annotations

import os
import tempfile
import timeit

import pytest
import torch

import opforge
from opforge.apply import ApplyConfig, disable_apply, enable_apply, hardware_name
from opforge.trace import (AxisConst, AxisVar, BuildSpec, Correctness, Definition, Environment, Evaluation,
                           Performance, RandomInput, ScalarInput, Solution, SourceFile, TensorSpec, Trace, TraceSet,
                           Workload, utc_timestamp)
from opforge.trace.builtin import builtin_solution_for
from opforge.trace.templates import TEMPLATES

ROWS, HIDDEN = 4, 64
#: Where the calls run: apply's default device (traces are named after it, as the runner names them).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NORM = TEMPLATES["rmsnorm"].definition(dtype="float32", hidden_size=HIDDEN)
AXPY = Definition(name="axpy_d64", op_type="axpy",
                  axes={"rows": AxisVar(), "width": AxisConst(value=HIDDEN)},
                  inputs={"x": TensorSpec(shape=["rows", "width"], dtype="float32"),
                          "b": TensorSpec(shape=["width"], dtype="float32"),
                          "a": TensorSpec(shape=None, dtype="float32")},
                  outputs={"y": TensorSpec(shape=["rows", "width"], dtype="float32")},
                  reference="def run(x, b, a):\n    return a * x + b\n")


def _identity(name: str, definition: Definition) -> Solution:
    params = ", ".join(definition.inputs)
    first = next(iter(definition.inputs))
    return Solution(name=name, definition=definition.name, author="bench",
                    spec=BuildSpec(language="python", entry_point="main.py::run", destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=f"def run({params}):\n    return {first}\n")])


def _trace(definition: Definition, solution: str, latency_ms: float) -> Trace:
    inputs = {n: ScalarInput(value=1e-6) if s.shape is None else RandomInput() for n, s in definition.inputs.items()}
    axes = {definition.var_axes[0]: ROWS}
    return Trace(definition=definition.name, workload=Workload(uuid=f"{definition.name}-{ROWS}", axes=axes, inputs=inputs),
                 solution=solution,
                 evaluation=Evaluation(status="PASSED", environment=Environment(hardware=hardware_name()),
                                       timestamp=utc_timestamp(), correctness=Correctness(),
                                       performance=Performance(latency_ms=latency_ms)))


def _dataset(own_op_wins: bool) -> TraceSet:
    """rmsnorm_h64_f32 (an identity solution and opforge's own op; ``own_op_wins`` says which the
    traces make fastest) and axpy_d64 (an identity solution)."""
    ts = TraceSet()
    own = builtin_solution_for(NORM)
    for definition in (NORM, AXPY):
        ts.add_definition(definition)
        identity = _identity(f"{definition.name}_identity", definition)
        ts.add_solution(identity)
        timings = {identity.name: 2.0 if own_op_wins and definition is NORM else 1.0}
        if definition is NORM:
            ts.add_solution(own)
            timings[own.name] = 1.0 if own_op_wins else 2.0
        for name, ms in timings.items():
            trace = _trace(definition, name, ms)
            if not ts.workloads[definition.name]:
                ts.add_workload(definition.name, trace.workload)
            ts.add_trace(trace)
    return ts


def _time(fn, number: int = 20000, repeat: int = 7) -> float:
    """Nanoseconds per call: the fastest of ``repeat`` runs of ``number`` calls."""
    fn()
    return min(timeit.Timer(fn).repeat(repeat=repeat, number=number)) / number * 1e9


class _Calls:
    """The callables every case times (one set of tensors)."""

    def __init__(self):
        self.x, self.w, self.b = (torch.randn(ROWS, HIDDEN, device=DEVICE), torch.randn(HIDDEN, device=DEVICE),
                                  torch.randn(HIDDEN, device=DEVICE))
        self.routed_axpy = opforge.apply(AXPY.name)(self.plain_axpy)

    @staticmethod
    def plain_axpy(x, b, a):
        return x

    def op(self):
        return opforge.rmsnorm(self.x, self.w, 1e-6)

    def axpy(self):
        return self.routed_axpy(self.x, self.b, 2.0)

    def axpy_plain(self):
        return self.plain_axpy(self.x, self.b, 2.0)

    def runnables(self, handle):
        norm = handle.runnable(NORM.name, f"{NORM.name}_identity")
        axpy = handle.runnable(AXPY.name, f"{AXPY.name}_identity")
        return (lambda: norm(self.x, self.w, 1e-6)), (lambda: axpy(self.x, self.b, 2.0))


def measure() -> list[tuple[str, float, float]]:
    """(case, routed ns, direct ns) for every case of the module doc."""
    from opforge.trace.calls import bind_call

    os.environ.setdefault("OPFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="opforge-bench-apply-"))
    calls = _Calls()
    disable_apply()
    op_off = _time(calls.op)
    rows = [("op, apply off", op_off, op_off), ("@apply, apply off", _time(calls.axpy), _time(calls.axpy_plain))]
    args, kwargs = (calls.x, calls.w, 1e-6), {}
    bound = bind_call("rmsnorm", args, kwargs)
    stand_in = lambda *a, **k: calls.x  # noqa: E731
    with enable_apply(_dataset(own_op_wins=True)) as handle:
        rows.append(("op -> own op", _time(calls.op), op_off))
        rows.append(("route lookup", _time(lambda: handle.router.run_builtin(bound, stand_in, args, kwargs)),
                     _time(lambda: None)))
    with enable_apply(_dataset(own_op_wins=False), ApplyConfig(ahead_of_time=True)) as handle:
        norm_direct, axpy_direct = calls.runnables(handle)
        rows.append(("op -> solution", _time(calls.op), _time(norm_direct)))
        rows.append(("@apply -> solution", _time(calls.axpy), _time(axpy_direct)))
        rows.append(("route + checks", _time(lambda: handle.router.run_builtin(bound, stand_in, args, kwargs)),
                     _time(lambda: bound.finish((norm_direct(),)))))
    return rows


def main() -> None:
    print(f"torch {torch.__version__}, {DEVICE} tensors, {hardware_name()}; ns per call (best of 7 x 20000)")
    print(f"{'case':<22}{'routed':>10}{'direct':>10}{'overhead':>10}")
    for name, routed, direct in measure():
        print(f"{name:<22}{routed:>10.0f}{direct:>10.0f}{routed - direct:>10.0f}")


# --- pytest-benchmark ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routed_calls(tmp_path_factory):
    os.environ.setdefault("OPFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("apply-cache")))
    calls = _Calls()
    with enable_apply(_dataset(own_op_wins=False), ApplyConfig(ahead_of_time=True)) as handle:
        norm_direct, axpy_direct = calls.runnables(handle)
        yield {("op -> solution", "routed"): calls.op, ("op -> solution", "direct"): norm_direct,
               ("@apply -> solution", "routed"): calls.axpy, ("@apply -> solution", "direct"): axpy_direct}


@pytest.mark.parametrize("case", ["op -> solution", "@apply -> solution"])
@pytest.mark.parametrize("side", ["routed", "direct"])
def bench_apply_overhead(benchmark, routed_calls, case, side):
    result = benchmark(routed_calls[(case, side)])
    assert result.shape == (ROWS, HIDDEN)


if __name__ == "__main__":
    main()
