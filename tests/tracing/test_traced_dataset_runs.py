"""A traced folder is a dataset the runner takes as it is: `opforge run --dataset` benchmarks
opforge's builtin solution of every traced Definition on the traced workloads, and the runner
reads the saved tensors back as they were captured."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracing_helpers import load  # noqa: E402

import opforge  # noqa: E402
from opforge.bench import generate_inputs  # noqa: E402
from opforge.cli import main  # noqa: E402
from opforge.tracing import TracingConfig, enable_tracing  # noqa: E402

H = 64
CONFIGS = {
    f"rmsnorm_h{H}_f32": TracingConfig("dump_all", "shape_only"),
    f"fused_add_rmsnorm_h{H}_f32": TracingConfig(["residual"], "keep_first_k", k=2),
}


def test_opforge_run_benchmarks_a_traced_folder(tmp_path, rng, capsys):
    root = tmp_path / "traced"
    w = rng.randn(H)
    captured = {}
    with enable_tracing(dataset_dir=root, tracing_configs=CONFIGS):
        for rows in (3, 8, 3):
            x = rng.randn(rows, H)
            captured.setdefault(rows, x.clone())
            opforge.rmsnorm(x, w)
        x, r = rng.randn(5, H), rng.randn(5, H)
        r0 = r.clone()
        opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
        opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
        opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
    ts = load(root)
    assert sum(len(v) for v in ts.workloads.values()) == 4
    # What the runner feeds a solution: the tensors as captured, before any in-place update.
    norm = ts.definitions[f"rmsnorm_h{H}_f32"]
    for trace in ts.get_workloads(norm.name):
        values = generate_inputs(norm, trace.workload, trace_set=ts)
        assert torch.equal(values[0], captured[trace.workload.axes["batch_size"]]) and torch.equal(values[1], w)
    add = ts.definitions[f"fused_add_rmsnorm_h{H}_f32"]
    first = ts.get_workloads(add.name)[0].workload
    assert torch.equal(generate_inputs(add, first, trace_set=ts)[1], r0)

    code = main(["run", "--dataset", str(root), "--devices", "cpu", "--iterations", "3", "--warmup", "1",
                 "--seed", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "4 passed, 0 failed, 0 skipped" in out
    traces = load(root).traces
    assert {name: len(v) for name, v in traces.items()} == {name: n for name, n in zip(CONFIGS, (2, 2))}
    assert all(t.is_successful() and t.solution == f"{t.definition}_builtin" for v in traces.values() for t in v)
