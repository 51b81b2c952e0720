"""Which traces a report counts (the latest per definition, workload and solution), how
workloads are labelled and ordered, and the filters."""

from __future__ import annotations

import pytest

from opforge.report import collect, latest_traces, workload_label
from opforge.trace import AxisConst, AxisVar, Definition, EvaluationStatus, TensorSpec, TraceSet, Workload
from report_data import trace_set  # noqa: F401 (a fixture)
from report_data import (BATCHES, BROKEN, BUILTIN, DEF, EVIL, FAST, FLAKY, KERNEL, REF, SLOW, STEADY, UNUSED,
                         build_trace_set, passed, solution, uuid_of, workload)


def _latest(ts, **kwargs) -> dict:
    return {(t.solution, t.workload.axes["batch"]): t for t in latest_traces(ts, **kwargs)}


def test_one_trace_per_definition_workload_and_solution(trace_set):
    latest = latest_traces(trace_set)
    assert len(latest) == 7 * len(BATCHES) + 2  # seven solutions on every workload, EVIL on two
    assert len({(t.definition, t.workload.uuid, t.solution) for t in latest}) == len(latest)


def test_the_latest_timestamp_wins_compared_as_times_not_text(trace_set):
    latest = _latest(trace_set)
    # The stale RUNTIME_ERROR was added later and its text "2026-03-01T11:30:00+02:00" sorts after
    # "2026-03-01T10:40:00Z", but it is an hour older.
    fast_256 = latest[(FAST, 256)]
    assert fast_256.evaluation.status == EvaluationStatus.PASSED
    assert fast_256.evaluation.performance.latency_ms == 0.020
    # A newer failure replaces an older pass.
    assert latest[(SLOW, 4096)].evaluation.status == EvaluationStatus.TIMEOUT


def test_equal_timestamps_the_trace_added_last_wins(trace_set):
    assert _latest(trace_set)[(STEADY, 4096)].evaluation.performance.latency_ms == 0.3


def test_an_unreadable_timestamp_loses_to_a_readable_one():
    ts = build_trace_set()
    ts.add_trace(passed(FAST, 16, 0.5, timestamp="sometime yesterday"))
    assert _latest(ts)[(FAST, 16)].evaluation.performance.latency_ms == 0.006


def test_hardware_filter_is_applied_before_picking_the_latest():
    ts = build_trace_set()
    ts.add_trace(passed(FAST, 16, 0.012, timestamp="2026-04-01T00:00:00Z", hardware="NVIDIA H100 80GB HBM3"))
    assert _latest(ts)[(FAST, 16)].evaluation.performance.latency_ms == 0.012
    on_h200 = _latest(ts, hardware="h200")  # a case-insensitive part of the name
    assert on_h200[(FAST, 16)].evaluation.performance.latency_ms == 0.006
    assert {t.evaluation.environment.hardware for t in on_h200.values()} == {"NVIDIA H200"}


def test_collect_arranges_solutions_by_workloads(trace_set):
    (view,) = collect(trace_set)  # mul_idle has no traces, so it is left out
    assert view.name == DEF
    assert [w.label for w in view.workloads] == ["batch=1", "batch=16", "batch=256", "batch=4096"]
    # The reference and the builtin first, then the dataset's order; an untraced solution stays.
    assert [s.name for s in view.solutions] == [REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, BROKEN, EVIL, UNUSED]
    assert view.traces_of(UNUSED) == []
    assert [t.workload.axes["batch"] for t in view.traces_of(EVIL)] == [1, 16]
    assert view.trace(SLOW, uuid_of(4096)).evaluation.status == EvaluationStatus.TIMEOUT


def test_filters_take_names_and_globs(trace_set):
    (view,) = collect(trace_set, definitions=["mul_*"], solutions=["*_fast", STEADY])
    assert [s.name for s in view.solutions] == [FAST, STEADY]
    assert {t.solution for t in view.cells.values()} == {FAST, STEADY}
    assert collect(trace_set, definitions=["mul_idle"]) == []  # chosen, but nothing traced


def test_a_filter_matching_nothing_is_an_error(trace_set):
    with pytest.raises(ValueError, match=r"no definition matches 'mul_h9'.*did you mean 'mul_h8'"):
        collect(trace_set, definitions=["mul_h9"])
    with pytest.raises(ValueError, match="no solution matches 'nothing_like_this'"):
        collect(trace_set, solutions=["nothing_like_this"])


def _two_axis_definition() -> Definition:
    return Definition(name="mul2", op_type="mul",
                      axes={"batch": AxisVar(), "seq": AxisVar(), "hidden": AxisConst(value=8)},
                      inputs={"x": TensorSpec(shape=["batch", "seq", "hidden"], dtype="float32"),
                              "w": TensorSpec(shape=["hidden"], dtype="float32")},
                      outputs={"y": TensorSpec(shape=["batch", "seq", "hidden"], dtype="float32")},
                      reference="def run(x, w):\n    return x * w\n")


def test_several_variable_axes_label_and_order_by_every_axis():
    d = _two_axis_definition()
    assert workload_label(d, {"seq": 64, "batch": 2}) == "batch=2,seq=64"
    ts = TraceSet(definitions=[d])
    ts.add_solution(solution("mul2_a", KERNEL, definition="mul2"))
    base = passed(FAST, 1, 0.01)
    for uuid, batch, seq in (("u1", 2, 8), ("u2", 1, 64), ("u3", 1, 8), ("u4", 1, 8)):
        w = Workload(uuid=uuid, axes={"batch": batch, "seq": seq}, inputs=workload(1).inputs)
        ts.add_trace(base.model_copy(update={"definition": "mul2", "solution": "mul2_a", "workload": w}))
    (view,) = collect(ts)
    # Two workloads with the same axes are told apart by their uuids.
    assert [w.label for w in view.workloads] == ["batch=1,seq=8 (u3)", "batch=1,seq=8 (u4)", "batch=1,seq=64",
                                                 "batch=2,seq=8"]
