"""The numbers of the summary and best tables, their terminal form and their JSON form."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from opforge.report import best, print_best, print_summary, rows_to_json, summarize
from opforge.trace import TraceSet
from report_data import trace_set  # noqa: F401 (a fixture)
from report_data import (BROKEN, BUILTIN, DEF, EVIL, FAST, FLAKY, KERNEL, REF, SLOW, STEADY, SUSPECT_REASON, UNTRACED,
                         UNUSED, mul_definition, passed, solution)


def _by_solution(rows):
    return {r.solution: r for r in rows}


def test_summary_has_one_row_per_solution_of_each_traced_definition(trace_set):
    rows = summarize(trace_set)
    assert [(r.definition, r.solution) for r in rows] == [
        (DEF, s) for s in (REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, BROKEN, EVIL, UNUSED)]


def test_summary_of_a_solution_with_a_suspect_timing(trace_set):
    fast = _by_solution(summarize(trace_set))[FAST]
    # Five workloads in the dataset, one of them never run: 4 of 5 passed, not 4 of 4.
    assert (fast.workloads, fast.passed, fast.failed, fast.suspect) == (5, 4, 0, 1)
    assert fast.not_run == [f"batch={UNTRACED}"]
    assert fast.statuses == {"PASSED": 4}
    # The suspect 0.0001 ms at batch=1 is left out of every average.
    assert fast.median_latency_ms == pytest.approx(0.020)
    assert fast.median_gbps == pytest.approx(1000.0)
    assert fast.median_percent_of_peak == pytest.approx(30.0)
    assert fast.speedup_vs_reference == pytest.approx((0.020 / 0.006 * 0.080 / 0.020 * 1.0 / 0.25) ** (1 / 3))
    assert fast.speedup_vs_baseline == pytest.approx((0.008 / 0.006 * 2.0 * 2.0) ** (1 / 3))
    assert fast.baseline == BUILTIN
    assert fast.hardware == ["NVIDIA H200"]
    assert (fast.author, fast.language) == ("tests", "python")


def test_summary_medians_and_geomeans(trace_set):
    rows = _by_solution(summarize(trace_set))
    steady = rows[STEADY]
    assert steady.median_latency_ms == pytest.approx((0.007 + 0.025) / 2)
    assert steady.median_gbps == pytest.approx((90 + 800) / 2)
    assert steady.median_percent_of_peak is None
    speedups = [0.01 / 0.004, 0.02 / 0.007, 0.08 / 0.025, 1 / 0.3]
    assert steady.speedup_vs_reference == pytest.approx(math.prod(speedups) ** 0.25)
    builtin = rows[BUILTIN]
    assert builtin.median_percent_of_peak == pytest.approx((2.0 + 10.0) / 2)
    assert builtin.speedup_vs_baseline == pytest.approx(1.0)
    assert rows[REF].speedup_vs_reference == pytest.approx(1.0)


def test_summary_counts_failures_by_status(trace_set):
    rows = _by_solution(summarize(trace_set))
    flaky = rows[FLAKY]
    assert (flaky.workloads, flaky.passed, flaky.failed) == (5, 2, 2)
    assert flaky.statuses == {"PASSED": 2, "INCORRECT_NUMERICAL": 1, "RUNTIME_ERROR": 1}
    assert flaky.median_latency_ms == pytest.approx((0.0035 + 0.28) / 2)
    assert rows[SLOW].statuses == {"PASSED": 3, "TIMEOUT": 1}
    broken = rows[BROKEN]
    assert broken.statuses == {"COMPILE_ERROR": 4} and broken.passed == 0
    assert broken.median_latency_ms is broken.speedup_vs_reference is broken.speedup_vs_baseline is None
    assert rows[EVIL].statuses == {"PASSED": 1, "RUNTIME_ERROR": 1}
    assert rows[EVIL].not_run == ["batch=256", "batch=4096", f"batch={UNTRACED}"] and rows[EVIL].failed == 1
    unused = rows[UNUSED]
    # A row is about one GPU model, run there or not.
    assert (unused.workloads, unused.passed, unused.failed, unused.statuses, unused.hardware) == \
        (5, 0, 0, {}, ["NVIDIA H200"])
    assert len(unused.not_run) == 5


def test_summary_names_the_dtypes(trace_set):
    from opforge.report.fmt import dtype_detail, dtype_label
    from opforge.trace import AxisConst, AxisVar, Definition, TensorSpec

    assert {r.dtype for r in summarize(trace_set)} == {"float32 → float32"}
    definition = Definition(
        name=DEF, op_type="mul", axes={"batch": AxisVar(), "hidden": AxisConst(value=8)},
        inputs={"x": TensorSpec(shape=["batch", "hidden"], dtype="bfloat16"),
                "w": TensorSpec(shape=["hidden"], dtype="float32"), "idx": TensorSpec(shape=["batch"], dtype="int32"),
                "eps": TensorSpec(shape=None, dtype="float32")},
        outputs={"y": TensorSpec(shape=["batch", "hidden"], dtype="bfloat16")},
        reference="def run(x, w, idx, eps):\n    return x * w\n")
    # Distinct tensor dtypes in order; the scalar eps is left out of the short form only.
    assert dtype_label(definition) == "bfloat16, float32, int32 → bfloat16"
    assert dtype_detail(definition) == ("inputs: x bfloat16, w float32, idx int32, eps float32 (scalar); "
                                        "outputs: y bfloat16")


def test_best_per_workload_leaves_suspect_timings_out(trace_set):
    rows = {r.workload: r for r in best(trace_set) if not r.overall}
    assert list(rows) == ["batch=1", "batch=16", "batch=256", "batch=4096"]
    one = rows["batch=1"]
    # FAST's 0.0001 ms is suspect; FLAKY (which fails elsewhere) is fastest on this workload.
    assert (one.solution, one.latency_ms, one.runner_up, one.runner_up_latency_ms) == (FLAKY, 0.0035, STEADY, 0.004)
    assert one.margin_pct == pytest.approx((0.004 / 0.0035 - 1) * 100)
    assert one.suspect == [FAST]
    assert one.candidates == 5  # reference, builtin, steady, flaky, slow
    assert one.speedup_vs_baseline == pytest.approx(0.005 / 0.0035)
    assert one.speedup_vs_reference == pytest.approx(0.010 / 0.0035)
    big = rows["batch=4096"]
    assert (big.solution, big.runner_up) == (FAST, FLAKY)
    assert big.margin_pct == pytest.approx(12.0)
    assert (big.gbps, big.percent_of_peak, big.baseline) == (4000.0, 80.0, BUILTIN)
    assert big.speedup_vs_baseline == pytest.approx(2.0) and big.speedup_vs_reference == pytest.approx(4.0)
    assert (rows["batch=16"].solution, rows["batch=16"].runner_up) == (FAST, STEADY)
    assert rows["batch=16"].margin_pct == pytest.approx(100 / 6)
    assert rows["batch=256"].margin_pct == pytest.approx(25.0)


def test_best_overall_only_among_solutions_passing_every_workload(trace_set):
    (overall,) = [r for r in best(trace_set) if r.overall]
    assert overall.definition == DEF and overall.workload == "(overall)" and overall.uuid is None
    # FLAKY and SLOW fail somewhere; batch=1 is left out because FAST's timing there is suspect.
    assert overall.candidates == 4 and overall.workloads_compared == 3
    assert overall.solution == FAST and overall.latency_ratio == pytest.approx(1.0)
    assert overall.runner_up == STEADY
    steady_ratio = (0.007 / 0.006 * 0.025 / 0.020 * 0.3 / 0.25) ** (1 / 3)
    assert overall.runner_up_latency_ratio == pytest.approx(steady_ratio)
    assert overall.margin_pct == pytest.approx((steady_ratio - 1) * 100)
    assert overall.speedup_vs_baseline == pytest.approx((0.008 / 0.006 * 2 * 2) ** (1 / 3))
    assert overall.suspect == [FAST] and "batch=1" in overall.note


def test_best_among_chosen_solutions_only(trace_set):
    rows = best(trace_set, solutions=[FAST, STEADY])
    one = rows[0]
    assert (one.solution, one.runner_up, one.margin_pct, one.suspect) == (STEADY, None, None, [FAST])
    assert rows[-1].overall and rows[-1].solution == FAST


def test_no_winner_is_explained(trace_set):
    rows = best(trace_set, solutions=[BROKEN, FAST])
    assert rows[0].solution is None and rows[0].note == "only suspect timings"
    assert rows[-1].solution == FAST and rows[-1].runner_up is None
    rows = best(trace_set, solutions=[BROKEN, FLAKY])
    assert rows[1].solution is None and rows[1].note == "no solution passed"
    assert rows[-1].solution is None and rows[-1].note == "no solution passed every workload"
    only_suspect = TraceSet(definitions=[mul_definition(DEF)])
    only_suspect.add_solution(solution(FAST, KERNEL, definition=DEF))
    only_suspect.add_trace(passed(FAST, 1, 0.0001, suspect=SUSPECT_REASON))
    assert best(only_suspect)[-1].note == "every workload has a suspect timing"


def test_terminal_tables_print_names_as_written(trace_set):
    # A name that is rich markup must not be taken as markup.
    trace_set.add_solution(solution(f"{DEF}_[bold]loud", KERNEL, definition=DEF))
    trace_set.add_trace(passed(f"{DEF}_[bold]loud", 16, 0.01, minute=9))
    console = Console(record=True, width=300, color_system=None)
    print_summary(summarize(trace_set), console=console)
    print_best(best(trace_set), console=console)
    text = console.export_text()
    assert f"{DEF}_[bold]loud" in text and EVIL in text
    assert "1 wrong values, 1 runtime error" in text and "4 compile error" in text
    assert "+14.3%" in text and "suspect: " + FAST in text
    assert "left out for suspect timings: batch=1" in text
    assert "20.00" in text  # FAST's median latency in µs
    assert "workloads) on NVIDIA H200" in text and "hardware" not in text  # one machine: named in the title


def test_several_gpu_models_are_reported_one_table_each(trace_set):
    """A dataset measured on two GPU models (a cluster run measures every pair on each): each
    model's latest traces are its own rows, in a table of their own; neither hides the other."""
    trace_set.add_trace(passed(FAST, 16, 0.012, timestamp="2026-04-01T00:00:00Z", hardware="NVIDIA H100 80GB HBM3"))
    rows = summarize(trace_set)
    fast = [r for r in rows if r.solution == FAST]
    assert [(r.hardware, r.passed) for r in fast] == [(["NVIDIA H200"], 4), (["NVIDIA H100 80GB HBM3"], 1)]
    assert fast[1].median_latency_ms == pytest.approx(0.012)  # its own number, not H200's
    console = Console(record=True, width=300, color_system=None)
    print_summary(rows, console=console)
    print_best(best(trace_set), console=console)
    text = console.export_text()
    assert "workloads) on NVIDIA H200" in text and "workloads) on NVIDIA H100 80GB HBM3" in text
    assert "per workload (suspect timings left out) on NVIDIA H100 80GB HBM3" in text
    h100_summary = text[text.index("workloads) on NVIDIA H100"):].split("Fastest", 1)[0]
    assert "12.00" in h100_summary and "20.00" not in h100_summary  # FAST's H100 median; H200's is 20 µs
    h100_best = text[text.index("left out) on NVIDIA H100"):].split("Best overall", 1)[0]
    winners = [(row.split("│")[2].strip(), row.split("│")[3].strip()) for row in h100_best.splitlines()
               if row.startswith("│")]
    assert winners == [("batch=16", FAST)]  # the one workload measured there, against nothing from H200


def test_rows_as_json(trace_set):
    summary = json.loads(json.dumps(rows_to_json(summarize(trace_set)), allow_nan=False))
    assert summary[2]["solution"] == FAST and summary[2]["suspect"] == 1
    assert summary[2]["median_latency_ms"] == pytest.approx(0.02)
    rows = json.loads(json.dumps(rows_to_json(best(trace_set)), allow_nan=False))
    assert rows[0]["axes"] == {"batch": 1} and rows[0]["solution"] == FLAKY
    assert rows[-1]["overall"] is True and rows[-1]["solution"] == FAST
