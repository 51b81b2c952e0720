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


def test_a_traced_nvfp4_call_is_replayed_from_its_fp4_blob(tmp_path, capsys):
    """FP4 tensors dumped by tracing (safetensors F4, which counts 4-bit values) load back bit for
    bit as the Definition's float4_e2m1fn_x2 inputs, in their [M, K/2, L] shape, and the runner
    benchmarks opforge's op on them."""
    gen = torch.Generator().manual_seed(7)
    m, k, l = 8, 128, 2

    def nvfp4(rows, cols, dtype, low=0, high=256):  # [rows, cols, L] laid out K-contiguous, L outermost
        raw = torch.randint(low, high, (l, rows, cols), generator=gen, dtype=torch.uint8)
        return raw.permute(1, 2, 0).view(dtype)

    fp4, e4m3 = torch.float4_e2m1fn_x2, torch.float8_e4m3fn
    a, b = nvfp4(m, k // 2, fp4), nvfp4(1, k // 2, fp4)
    scale_a, scale_b = nvfp4(m, k // 16, e4m3, 0x30, 0x40), nvfp4(1, k // 16, e4m3, 0x30, 0x40)
    name = f"nvfp4_gemv_m{m}_k{k}"
    root = tmp_path / "traced"
    with enable_tracing(dataset_dir=root, tracing_configs={name: TracingConfig("dump_all", "shape_only")}):
        opforge.nvfp4_gemv(a, b, scale_a, scale_b)
    ts = load(root)
    (trace,) = ts.get_workloads(name)
    values = generate_inputs(ts.definitions[name], trace.workload, trace_set=ts)
    for got, want in zip(values, (a, b, scale_a, scale_b)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))

    code = main(["run", "--dataset", str(root), "--devices", "cpu", "--iterations", "3", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "1 passed, 0 failed, 0 skipped" in out, out
