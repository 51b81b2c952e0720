"""Tracing CUDA calls: tensors saved as they were before the op even when the op and the kernels
after it overwrite them while the transfer to the host is still running, on the default stream
and on a stream of one's own; shapes only while a CUDA graph is captured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracing_helpers import kinds, load  # noqa: E402

from conftest import capture_graph  # noqa: E402

import opforge  # noqa: E402
from opforge.trace.calls import bind_call  # noqa: E402
from opforge.tracing import TracingConfig, enable_tracing  # noqa: E402

pytestmark = pytest.mark.gpu
H = 4096
ALL = TracingConfig("dump_all", "keep_all")


@pytest.mark.parametrize("own_stream", [False, True], ids=["default-stream", "own-stream"])
def test_inputs_overwritten_in_place_and_after_are_saved_as_before_the_op(tmp_path, rng, own_stream):
    # 64 MiB per tensor: the copy to the host takes milliseconds, the kernels that overwrite the
    # inputs right after the op take microseconds; a copy not ordered before them would see them.
    x = rng.randn(8192, H, dtype=torch.bfloat16, device="cuda")
    r = rng.randn(8192, H, dtype=torch.bfloat16, device="cuda")
    w = rng.randn(H, dtype=torch.bfloat16, device="cuda")
    name = bind_call("fused_add_rmsnorm", (x, r, w, 1e-5), {}).definition
    stream = torch.cuda.Stream() if own_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    before = []
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs={name: ALL}), torch.cuda.stream(stream):
        for _ in range(3):
            before.append((x.cpu(), r.cpu()))
            opforge.fused_add_rmsnorm(x, r, w, eps=1e-5, out=x, residual_out=r)
            x.mul_(3.0)
            r.add_(1.0)
    torch.cuda.synchronize()
    ts = load(tmp_path / "ds")
    saved = [t.workload for t in ts.get_workloads(name)]
    assert len(saved) == 3
    for (x0, r0), workload in zip(before, saved):
        assert torch.equal(ts.load_input_tensor(name, workload, "hidden_states"), x0)
        assert torch.equal(ts.load_input_tensor(name, workload, "residual"), r0)


def test_graph_capture_records_shapes_only_and_the_graph_still_computes(tmp_path, rng):
    x = rng.randn(8, H, dtype=torch.bfloat16, device="cuda")
    w = rng.randn(H, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    name = bind_call("rmsnorm", (x, w, 1e-5), {}).definition
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs={name: ALL}) as tracer:
        # The warm-up call runs outside the capture (saved); the captured one records shapes only.
        graph, _ = capture_graph(lambda: opforge.rmsnorm(x, w, eps=1e-5, out=y))
        x.copy_(rng.randn(8, H, dtype=torch.bfloat16, device="cuda"))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, opforge.rmsnorm(x, w, eps=1e-5))
    assert tracer.stats()[name]["kept"] == 2 and tracer.stats()[name]["dumped"] == 1
    saved = [t.workload for t in load(tmp_path / "ds").get_workloads(name)]
    assert [kinds(w_) for w_ in saved] == [{"hidden_states": "safetensors", "weight": "safetensors"},
                                          {"hidden_states": "random", "weight": "random"}]
