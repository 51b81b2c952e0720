"""The benchmark runner against adversarial solutions: one run survives all of them and records
each with the right status and log; honest solutions get complete, consistent measurements; the
traces land in the dataset and --resume skips them; solution code never runs in this process.
(The runner's other features: test_runner_features.py.)"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from adversaries import EXPECTED, LOG_WORDS  # noqa: E402
from runner_datasets import BATCHES, DEF, by_solution, config, make_dataset  # noqa: E402

from opforge.bench import Benchmark  # noqa: E402
from opforge.registry import CACHE_DIR_VAR  # noqa: E402
from opforge.trace import TraceSet  # noqa: E402


@pytest.fixture(scope="module")
def adversarial_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversarial") / "dataset"
    ts = make_dataset(root)
    seen = []
    bench = Benchmark(ts, config(), on_result=seen.append)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_VAR, str(root.parent / "cache"))  # the compile error is not cached elsewhere
        traces = bench.run_all()
    return root, ts, bench, traces, seen


def test_every_adversary_gets_its_status_on_every_workload(adversarial_run):
    _, _, bench, traces, seen = adversarial_run
    got = by_solution(traces)
    assert set(got) == set(EXPECTED)
    for name, want in EXPECTED.items():
        assert sorted(t.workload.uuid for t in got[name]) == ["b32", "b4"], name
        assert {t.evaluation.status.value for t in got[name]} == {want}, (name, [t.evaluation.log for t in got[name]])
    assert not bench.result.skipped
    assert len(seen) == len(traces)  # every result was reported as it finished


@pytest.mark.parametrize("name", sorted(LOG_WORDS))
def test_failures_say_what_went_wrong(adversarial_run, name):
    _, _, _, traces, _ = adversarial_run
    for trace in by_solution(traces)[name]:
        for word in LOG_WORDS[name]:
            assert word in trace.evaluation.log, (name, word, trace.evaluation.log)
        assert trace.evaluation.performance is None


def test_passed_traces_carry_consistent_measurements(adversarial_run):
    _, ts, bench, traces, _ = adversarial_run
    definition = ts.get_definition(DEF)
    for t in by_solution(traces)["honest"] + by_solution(traces)["honest_dps"]:
        ev, p = t.evaluation, t.evaluation.performance
        assert ev.correctness.max_absolute_error <= 1e-6
        assert ev.correctness.extra["input_sets"] == 4  # three before timing, one after
        assert ev.correctness.extra["fraction_within_tolerance"] == {"y": 1.0}
        assert ev.seed is not None and ev.device == "cpu"
        assert ev.definition_hash == definition.content_hash()
        assert ev.solution_hash == ts.get_solution(t.solution).content_hash()
        assert ev.environment.libs["torch"] == torch.__version__ and "opforge" in ev.environment.libs
        assert p.latency_ms > 0 and p.timing["method"] == "host_clock"
        assert p.timing["min_ms"] <= p.latency_ms <= p.timing["max_ms"]
        assert 1 <= p.timing["iterations"] <= 5
        nbytes = definition.bytes_moved(definition.full_axis_values(t.workload.axes))
        assert p.timing["bytes"] == nbytes
        assert math.isclose(p.achieved_gbps, nbytes / (p.latency_ms * 1e6))
        assert math.isclose(p.percent_of_peak, 100 * p.achieved_gbps / p.calibrated_gbps)
        assert p.reference_latency_ms > 0
        assert math.isclose(p.speedup_factor, p.reference_latency_ms / p.latency_ms)
        assert p.baseline_solution == f"{DEF}_honest"
        assert math.isclose(p.baseline_speedup_factor, p.baseline_latency_ms / p.latency_ms)
        if t.solution == f"{DEF}_honest":
            assert p.baseline_latency_ms == p.latency_ms
    # The same seed for every solution on a workload: they saw the same inputs.
    seeds = {(t.workload.uuid, t.evaluation.seed) for t in traces}
    assert len(seeds) == len(BATCHES)


def test_the_run_is_in_the_dataset_and_resume_skips_it(adversarial_run):
    root, ts, _, traces, _ = adversarial_run
    reloaded = TraceSet.load(root)
    assert not reloaded.load_errors
    saved = reloaded.get_traces(DEF)
    assert len(saved) == len(traces)
    assert sorted((t.solution, t.workload.uuid, t.evaluation.status.value) for t in saved) == \
        sorted((t.solution, t.workload.uuid, t.evaluation.status.value) for t in traces)
    again = Benchmark(reloaded, config(resume=True)).run_all()
    assert again == []
    logs = list((root / "logs").glob("worker-cpu-*.log"))
    assert len(logs) >= 4  # the crashes and hangs each cost a worker
