"""The Triton NVFP4 GEMV that opforge ships, on CPU in triton's interpreter (TRITON_INTERPRET=1):
against the Definition's reference on the runner's own inputs (K of 64 to 256, M no multiple of
the row tile, several batches), with K split over programs, on the task's memory layout, built
through the registry from the shipped Solution, and benchmarked by the runner end to end.

The kernel cases run in a child process (nvfp4_triton_cases.py): the interpreter must be on
before triton is first imported, which this process may have done already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from conftest import interpreter_only  # noqa: E402

from opforge.bench import Benchmark, BenchmarkConfig, Settings, generate_inputs  # noqa: E402
from opforge.registry import CACHE_DIR_VAR  # noqa: E402
from opforge.solutions import nvfp4_gemv_triton, shipped_solutions  # noqa: E402
from opforge.trace import RandomInput, TraceSet, Workload  # noqa: E402
from opforge.trace.templates import TEMPLATES  # noqa: E402

CASES = Path(__file__).with_name("nvfp4_triton_cases.py")
sys.path.insert(0, str(CASES.parent))
from nvfp4_triton_cases import CASES as CASE_NAMES  # noqa: E402

TEMPLATE = TEMPLATES["nvfp4_gemv"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    env = dict(os.environ, TRITON_INTERPRET="1")
    env[CACHE_DIR_VAR] = str(tmp_path_factory.mktemp("nvfp4_cache"))
    proc = subprocess.run([sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@interpreter_only
@pytest.mark.parametrize("name", list(CASE_NAMES))
def test_kernel_case(results, name):
    assert name in results, sorted(results)
    assert results[name]["ok"], results[name]["log"]


def test_wrong_arguments_are_refused_by_name():
    d = TEMPLATE.definition(M=16, K=64)
    w = Workload(uuid="w", axes={"L": 1}, inputs={n: RandomInput() for n in d.inputs})
    a, b, scale_a, scale_b = generate_inputs(d, w)[:4]
    c = torch.empty(16, 1, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="scale_a has shape"):
        nvfp4_gemv_triton.nvfp4_gemv(a, b, scale_b, scale_b, c)
    with pytest.raises(TypeError, match="c has dtype torch.float32"):
        nvfp4_gemv_triton.nvfp4_gemv(a, b, scale_a, scale_b, c.float())
    with pytest.raises(TypeError, match="a has dtype torch.uint8"):
        nvfp4_gemv_triton.nvfp4_gemv(a.view(torch.uint8), b, scale_a, scale_b, c)


@interpreter_only
def test_runner_benchmarks_the_shipped_solution_on_cpu(tmp_path, monkeypatch):
    # The whole path: inputs drawn in the runner (blocked scales derived), sent to a worker
    # (which imports triton afresh, interpreted), the one-tuple entry called there, outputs
    # judged against the reference here.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "cache"))
    d = TEMPLATE.definition(M=40, K=128)
    root = tmp_path / "dataset"
    ts = TraceSet(root)
    ts.add_definition(d)
    for l in (1, 3):
        ts.add_workload(d.name, Workload(uuid=f"L{l}", axes={"L": l}, inputs={n: RandomInput() for n in d.inputs}))
    ts.add_solution(shipped_solutions(d, "nvfp4_gemv")[0])
    ts.save(root)
    fast = Settings(iterations=3, warmup=1, max_time_s=0.2, timeout_s=120, cuda_graph=False)
    traces = Benchmark(TraceSet.load(root), BenchmarkConfig(devices=["cpu"], seed=5, defaults=fast)).run_all()
    assert len(traces) == 2
    for trace in traces:
        assert trace.evaluation.status.value == "PASSED", trace.evaluation.log
