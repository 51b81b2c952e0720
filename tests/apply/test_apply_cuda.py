"""apply on a GPU: routing inside CUDA-graph capture (nothing built or synchronized there) and
traces named after this GPU."""

import pytest
import torch

import opforge
from apply_helpers import builtin, calls_of, counting_reference, dataset, isolated, measured  # noqa: F401
from apply_helpers import template_definition
from conftest import assert_close, capture_graph, ref_rmsnorm
from opforge.apply import ApplyConfig, enable_apply, hardware_name
from opforge.registry import device_info

pytestmark = pytest.mark.gpu

NORM = template_definition("rmsnorm", dtype="bfloat16", hidden_size=64)  # rmsnorm_h64: eps is an input


def gpu_dataset():
    hw = hardware_name(device_info("cuda"))
    return dataset([NORM], [counting_reference("S", NORM), builtin(NORM)],
                   [measured(NORM, "S", {"batch_size": 8}, 1.0, hardware=hw),
                    measured(NORM, builtin(NORM).name, {"batch_size": 8}, 2.0, hardware=hw)])


def capture(fn) -> torch.cuda.CUDAGraph:
    return capture_graph(fn)[0]


def inputs(rng):
    x = rng.randn(8, 64, dtype=torch.bfloat16, device="cuda")
    return x, rng.randn(64, dtype=torch.bfloat16, device="cuda"), torch.empty_like(x)


def test_a_solution_built_ahead_of_time_is_captured_and_replayed(rng):
    handle = enable_apply(gpu_dataset(), ApplyConfig(device="cuda", ahead_of_time=True))
    x, w, out = inputs(rng)
    graph = capture(lambda: opforge.rmsnorm(x, w, 1e-6, out=out))
    served = calls_of(handle, NORM.name, "S")
    assert served == 2  # warm-up and capture; replays run no Python
    for _ in range(2):
        x.copy_(rng.randn(8, 64, dtype=torch.bfloat16, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, ref_rmsnorm(x, w, 1e-6))
    assert calls_of(handle, NORM.name, "S") == served


def test_during_capture_a_solution_not_built_yet_is_passed_over(rng, monkeypatch):
    handle = enable_apply(gpu_dataset(), ApplyConfig(device="cuda"))
    x, w, out = inputs(rng)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opforge.rmsnorm(x, w, 1e-6, out=out)  # opforge's own kernel is captured
    assert handle.runnable(NORM.name, "S") is None
    x.copy_(rng.randn(8, 64, dtype=torch.bfloat16, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, ref_rmsnorm(x, w, 1e-6))
    opforge.rmsnorm(x, w, 1e-6, out=out)  # outside capture: built now, and it serves
    assert calls_of(handle, NORM.name, "S") == 1
