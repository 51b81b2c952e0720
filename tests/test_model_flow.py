"""The whole loop on a model, as a user runs it: patch a transformers model, run it with tracing
on, benchmark the captured dataset with `opforge run`, enable apply on the results, serve.

Tiny random Llama on the CPU (no downloads); the same flow runs on CUDA where one is visible.
"""

from __future__ import annotations

import copy
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

import opforge  # noqa: E402
from opforge import intercept  # noqa: E402
from opforge.apply import ApplyConfig, disable_apply, enable_apply  # noqa: E402
from opforge.cli import main  # noqa: E402
from opforge.registry import CACHE_DIR_VAR  # noqa: E402
from opforge.trace import BuildSpec, Solution, SourceFile, TraceSet  # noqa: E402
from opforge.tracing import TracingConfig, disable_tracing, enable_tracing  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and opforge.build_info()["cuda"] else [])
HIDDEN, INTERMEDIATE = 64, 96


def _model(device: str, seed: int):
    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval()


def _generate(model, prompt):
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)


@pytest.fixture(autouse=True)
def _clean(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "build-cache"))
    yield
    disable_apply()
    disable_tracing()
    assert intercept.tracer() is None and intercept.router() is None


def _contributed_norm(definition: str) -> Solution:
    """A user's solution for the traced norm (plain PyTorch), to compete with opforge's own."""
    source = textwrap.dedent("""
        import torch

        def run(hidden_states, weight, eps):
            x = hidden_states.float()
            return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(hidden_states.dtype)
    """)
    return Solution(name=f"{definition}_torch", definition=definition, author="a user",
                    spec=BuildSpec(language="pytorch", entry_point="main.py::run", destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=source)])


def _fastest(trace_set: TraceSet, definition: str, batch_size: int) -> str:
    timed = [(t.evaluation.performance.latency_ms, t.solution) for t in trace_set.traces.get(definition, [])
             if t.is_successful() and t.workload.axes.get("batch_size") == batch_size]
    return min(timed)[1]


@pytest.mark.parametrize("device", DEVICES)
def test_patch_trace_benchmark_apply_serve(device, tmp_path, capsys):
    seed = int(torch.randint(0, 10**6, ()).item())
    plain = _model(device, seed)
    model = opforge.patch(copy.deepcopy(plain))
    prompt = torch.randint(1, 128, (2, 5), device=device)
    expected = _generate(plain, prompt)

    # 1. Capture: every op call of the patched model, the integer-free float inputs as random data,
    #    the norm's inputs dumped whole.
    root = tmp_path / "captured"
    norm = "rmsnorm_h64_f32"  # eps 1e-6 at a hidden size with no public name: eps is an input
    with enable_tracing(dataset_dir=root, tracing_configs={
            norm: TracingConfig("dump_all", "shape_only"),
            "fused_add_rmsnorm_h64_f32": TracingConfig(),
            f"silu_and_mul_d{INTERMEDIATE}_f32": TracingConfig()}):
        assert torch.equal(_generate(model, prompt), expected)
    captured = TraceSet.from_path(root, strict=True)
    assert set(captured.definitions) == {norm, "fused_add_rmsnorm_h64_f32", f"silu_and_mul_d{INTERMEDIATE}_f32"}
    batches = {w.workload.axes["batch_size"] for w in captured.get_workloads(norm)}
    assert batches == {10, 2}  # the prefill's 2 x 5 rows, then one row per sequence per step

    # 2. A user's kernel joins, then the captured dataset is benchmarked as it is.
    captured.add_solution(_contributed_norm(norm))
    captured.save_dataset(root, overwrite=True)
    code = main(["run", "--dataset", str(root), "--devices", device, "--iterations", "5", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    measured = TraceSet.from_path(root, strict=True)
    assert {t.solution for t in measured.traces[norm]} == {f"{norm}_builtin", f"{norm}_torch"}

    # 3. Apply serves each captured shape with the solution measured fastest for it, and the model,
    #    traced again at the same time, still makes the same tokens.
    with enable_apply(root, ApplyConfig(ahead_of_time=True, device=device)) as handle:
        for batch in batches:
            assert handle.choices(norm, batch_size=batch)[0] == _fastest(measured, norm, batch)
        with enable_tracing(dataset_dir=tmp_path / "again"):
            assert torch.equal(_generate(model, prompt), expected)
    again = TraceSet.from_path(tmp_path / "again", strict=True)
    assert {w.workload.axes["batch_size"] for w in again.get_workloads(norm)} == batches
