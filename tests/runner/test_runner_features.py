"""The benchmark runner's features on small CPU runs: --resume after changes, per-Definition
settings and tolerances, module solutions (run only in workers), refusals and skips with their
reasons, single-file datasets, recorded safetensors inputs, a build failure built once, and
stop() with and without kill. (The adversarial run: test_runner.py.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from adversaries import LOG_WORDS, SOURCES  # noqa: E402
from registry_helpers import mul_definition, solution  # noqa: E402
from runner_datasets import BATCHES, DEF, FAST, config, make_dataset  # noqa: E402

from opforge.bench import Benchmark  # noqa: E402
from opforge.registry import CACHE_DIR_VAR  # noqa: E402
from opforge.trace import TraceSet, Workload  # noqa: E402


def test_resume_runs_what_changed(tmp_path):
    ts = make_dataset(tmp_path / "ds", names={"honest", "constant"})
    assert len(Benchmark(ts, config()).run_all()) == 4
    ts = TraceSet.load(tmp_path / "ds")
    ts.add_workload(DEF, Workload(uuid="b64", axes={"batch": 64}, inputs={"x": {"type": "random"},
                                                                          "w": {"type": "random"}}), persist=True)
    new = Benchmark(ts, config(resume=True)).run_all()
    assert sorted((t.solution, t.workload.uuid) for t in new) == [(f"{DEF}_constant", "b64"), (f"{DEF}_honest", "b64")]


def test_config_tolerance_and_selection(tmp_path):
    ts = make_dataset(tmp_path / "ds", names={"honest", "wrong_values", "constant"})
    cfg = config(definition_settings={DEF: {"atol": 0.02, "rtol": 0.0}}, solutions=[f"{DEF}_wrong_values"])
    traces = Benchmark(ts, cfg).run_all()
    assert {t.solution for t in traces} == {f"{DEF}_wrong_values"}
    assert all(t.is_successful() for t in traces)  # 0.01 off is inside atol 0.02
    assert all(t.evaluation.performance.baseline_latency_ms is None for t in traces)  # baseline not run


MODULE = """
import os
from pathlib import Path
from opforge.registry import BACKENDS

Path(os.environ["OPFORGE_TEST_PIDS"], f"import-{os.getpid()}").touch()

def mul(x, w):
    Path(os.environ["OPFORGE_TEST_PIDS"], f"call-{os.getpid()}-one").touch()
    return x * w

def mul_too(x, w):
    Path(os.environ["OPFORGE_TEST_PIDS"], f"call-{os.getpid()}-two").touch()
    return x * w

BACKENDS.register("mul_h8_from_module", mul, "x * w from a module", "pytorch", definition="mul_h8")
BACKENDS.register("mul_h8_from_module_too", mul_too, "the same again", "pytorch", definition="mul_h8")
"""


@pytest.mark.parametrize("isolate", [False, True])
def test_module_solutions_run_only_in_workers(tmp_path, monkeypatch, isolate):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("OPFORGE_TEST_PIDS", str(pids))
    module = tmp_path / "my_kernels.py"
    module.write_text(MODULE)
    ts = make_dataset(tmp_path / "ds", names=set())
    traces = Benchmark(ts, config(modules=[str(module)], isolate=isolate)).run_all()
    assert sorted(t.solution for t in traces) == sorted([f"{DEF}_from_module", f"{DEF}_from_module_too"] * 2)
    assert all(t.is_successful() for t in traces), [t.evaluation.log for t in traces]
    assert "my_kernels" not in sys.modules
    seen = {p.name for p in pids.iterdir()}
    assert not any(n.split("-")[1] == str(os.getpid()) for n in seen)
    calls = [n.split("-")[1:] for n in seen if n.startswith("call-")]
    # No worker serves two solutions; with isolate, a fresh one for each workload too.
    served = {pid: {name for p, name in calls if p == pid} for pid, _ in calls}
    assert all(len(names) == 1 for names in served.values()), served
    assert {name for _, name in calls} == {"one", "two"}
    assert len(served) >= (4 if isolate else 2)
    # The module's solutions are now part of the dataset, so the traces reload.
    assert len(TraceSet.load(tmp_path / "ds").get_traces(DEF)) == 4


def test_unknown_definition_is_refused(tmp_path):
    ts = make_dataset(tmp_path / "ds", names={"honest"})
    with pytest.raises(ValueError, match="no definition named nope"):
        Benchmark(ts, config(definitions=["nope"])).run_all()


def test_workloads_too_large_for_the_cpu_are_skipped(tmp_path):
    ts = make_dataset(tmp_path / "ds", names={"honest"})
    bench = Benchmark(ts, config(max_elements=100))
    traces = bench.run_all()
    assert [t.workload.uuid for t in traces] == ["b4"]
    assert [(s.workload, "max_elements 100" in s.reason) for s in bench.result.skipped] == [("batch=32", True)]


def test_a_broken_reference_skips_the_workload(tmp_path):
    ts = TraceSet(tmp_path / "ds")
    d = mul_definition().model_copy(update={"reference": "def run(x, w):\n    raise ValueError('bad ref')\n"})
    ts.add_definition(d)
    ts.add_workload(DEF, Workload(uuid="b4", axes={"batch": 4}, inputs={"x": {"type": "random"},
                                                                        "w": {"type": "random"}}))
    ts.add_solution(solution(f"{DEF}_honest", SOURCES["honest"]))
    bench = Benchmark(ts, config(), persist=False)
    assert bench.run_all() == []
    assert "bad ref" in bench.result.skipped[0].reason


def test_single_file_datasets_are_saved_at_the_end(tmp_path):
    make_dataset(tmp_path / "ds", names={"honest"}).save(tmp_path / "set.json")
    ts = TraceSet.load(tmp_path / "set.json")
    Benchmark(ts, config(log_dir=str(tmp_path / "logs"))).run_all()
    data = json.loads((tmp_path / "set.json").read_text())
    assert len(data["traces"][DEF]) == 2
    assert not (tmp_path / "traces").exists()


def test_recorded_inputs_from_safetensors(tmp_path):
    """A workload captured with its tensors: the runner loads them (shape-checked) instead of
    drawing random ones, and a solution is judged on exactly those values."""
    from opforge.trace.blob import save_safetensors_blob, workload_blob_relpath

    root = tmp_path / "ds"
    ts = make_dataset(root, names={"honest", "cached"})
    x = torch.full((5, 8), 2.0)
    x[0, 0] = 1e30  # a value no random draw gives: the result shows the blob was used
    path = save_safetensors_blob(root, workload_blob_relpath("mul", DEF, "rec"), {"x": x})
    ts.add_workload(DEF, Workload(uuid="rec", axes={"batch": 5}, inputs={
        "x": {"type": "safetensors", "path": path, "tensor_key": "x"}, "w": {"type": "random"}}), persist=True)
    probe = "def run(x, w):\n    assert x.shape[0] != 5 or float(x[0, 0]) > 1e29, 'not the blob'\n    return x * w\n"
    ts.add_solution(solution(f"{DEF}_probe", probe))
    ts.save()
    ts = TraceSet.load(root)
    traces = Benchmark(ts, config(definitions=[DEF])).run_all()
    rec = {t.solution: t for t in traces if t.workload.uuid == "rec"}
    for name in ("honest", "probe"):
        assert rec[f"{DEF}_{name}"].is_successful(), rec[f"{DEF}_{name}"].evaluation.log
    # w stays random per input set, so a cached result still fails on the recorded workload.
    assert rec[f"{DEF}_cached"].evaluation.status.value == "INCORRECT_NUMERICAL"
    # A blob whose shape does not fit the workload is refused before anything runs.
    bad = save_safetensors_blob(root, "blob/bad.safetensors", {"x": torch.ones(3, 8)})
    ts.add_workload(DEF, Workload(uuid="bad", axes={"batch": 5}, inputs={
        "x": {"type": "safetensors", "path": bad, "tensor_key": "x"}, "w": {"type": "random"}}))
    bench = Benchmark(ts, config(solutions=[f"{DEF}_honest"], resume=True), persist=False)
    assert bench.run_all() == []
    assert len(bench.result.skipped) == 1 and "shape" in bench.result.skipped[0].reason


def test_a_solution_that_fails_to_build_is_built_once_per_run(tmp_path, monkeypatch):
    """Every workload of a solution that does not compile gets the compile error, from one build
    (a broken worker is not asked again per workload)."""
    from opforge.bench import device as device_module

    builds = []
    real = device_module.Device.build
    monkeypatch.setattr(device_module.Device, "build",
                        lambda self, solution, *a, **k: builds.append(solution.name) or real(self, solution, *a, **k))
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "cache"))
    ts = make_dataset(tmp_path / "ds", names={"honest", "compile_error", "import_error"})
    # Its worker dies while importing it: the worker restarts, the solution is not built again.
    ts.add_solution(solution(f"{DEF}_dies_at_import", "import os\nos._exit(3)\n\ndef run(x, w):\n    return x * w\n"))
    traces = Benchmark(ts, config(definitions=[DEF])).run_all()
    words = {**LOG_WORDS, "dies_at_import": ["exit code 3"]}
    for name in ("compile_error", "import_error", "dies_at_import"):
        mine = [t for t in traces if t.solution == f"{DEF}_{name}"]
        assert len(mine) == len(BATCHES) and all(t.evaluation.status.value == "COMPILE_ERROR" for t in mine)
        assert all(words[name][0] in t.evaluation.log for t in mine), mine[0].evaluation.log
        assert builds.count(f"{DEF}_{name}") == 1, builds


def test_a_workload_whose_blob_is_not_there_is_skipped_saying_which_file(tmp_path):
    """A captured workload whose safetensors file was never fetched: loading keeps it, the run
    skips it for every solution (naming the file) and runs the rest, and the dataset keeps it."""
    from opforge.trace.blob import save_safetensors_blob, workload_blob_relpath

    root = tmp_path / "ds"
    ts = make_dataset(root, names={"honest"})
    path = save_safetensors_blob(root, workload_blob_relpath("mul", DEF, "rec"), {"x": torch.ones(5, 8)})
    ts.add_workload(DEF, Workload(uuid="rec", axes={"batch": 5}, inputs={
        "x": {"type": "safetensors", "path": path, "tensor_key": "x"}, "w": {"type": "random"}}), persist=True)
    ts.save()
    (root / path).unlink()
    ts = TraceSet.load(root)
    bench = Benchmark(ts, config(definitions=[DEF]))
    traces = bench.run_all()
    assert traces and all(t.workload.uuid != "rec" for t in traces)
    skipped = [k for k in bench.result.skipped if k.workload.startswith("batch=5") or "rec" in k.reason]
    assert skipped and all("inputs not there" in k.reason and path in k.reason for k in skipped), bench.result.skipped
    assert "rec" in {w.workload.uuid for w in TraceSet.load(root).get_workloads(DEF)}


def test_stop_finishes_what_is_in_flight_and_records_nothing_after(tmp_path):
    ts = make_dataset(tmp_path / "ds", names={"honest", "constant", "honest_dps"})
    seen = []

    def first_then_stop(item):
        seen.append(item)
        bench.stop()

    bench = Benchmark(ts, config(), on_result=first_then_stop)
    traces = bench.run_all()
    assert len(traces) == 1 and seen == traces
    assert len(TraceSet.load(tmp_path / "ds").get_traces(DEF)) == 1
    # What was not run is still to do: resume picks it up.
    rest = Benchmark(TraceSet.load(tmp_path / "ds"), config(resume=True)).run_all()
    assert len(rest) == 5


def test_stop_with_kill_abandons_a_hanging_call(tmp_path, monkeypatch):
    import threading
    import time

    # The solution says when its call has started hanging: the stop comes while it is in flight.
    started = tmp_path / "started"
    monkeypatch.setenv("OPFORGE_TEST_MARK", str(started))
    hangs = "import os, time\n\ndef run(x, w):\n    open(os.environ['OPFORGE_TEST_MARK'], 'w').close()\n" \
            "    while True:\n        time.sleep(0.05)\n"
    ts = make_dataset(tmp_path / "ds", names=set())
    ts.add_solution(solution(f"{DEF}_hangs", hangs))
    bench = Benchmark(ts, config(defaults=FAST.model_copy(update={"timeout_s": 300})))

    def stop_once_in_flight():
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        bench.stop(kill=True)

    threading.Thread(target=stop_once_in_flight, daemon=True).start()
    start = time.monotonic()
    assert bench.run_all() == []  # the killed call is not blamed on the solution
    assert started.exists()
    assert time.monotonic() - start < 60
