"""Checks before anything runs: target hardware and dependencies."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from opforge.registry import UNSUPPORTED, BuildError, DeviceInfo, build, device_info, hardware_matches
from opforge.registry.checks import dependency_problem
from registry_helpers import cache, mul_definition, solution  # noqa: F401 (cache is a fixture)

CPU = DeviceInfo("cpu")
H100 = DeviceInfo("cuda", 0, 90, "NVIDIA H100 80GB HBM3")
A100 = DeviceInfo("cuda", 1, 80, "NVIDIA A100-SXM4-40GB")
SRC = "def run(x, w):\n    return x * w\n"


@pytest.mark.parametrize("entry, device, expected", [
    ("cpu", CPU, True), ("CPU", CPU, True), ("cpu", H100, False),
    ("cuda", H100, True), ("gpu", A100, True), ("cuda", CPU, False),
    ("any", CPU, True), ("LOCAL", H100, True), ("*", A100, True),
    ("sm_90", H100, True), ("sm90", H100, True), ("sm_90a", H100, True), ("sm_90", A100, False),
    ("sm_80+", H100, True), ("sm_80+", A100, True), ("sm_90+", A100, False), ("sm_90", CPU, False),
    ("H100", H100, True), ("NVIDIA_H100", H100, True), ("nvidia h100", H100, True), ("h100", A100, False),
    ("A100", A100, True), ("B200", H100, False), ("H10", H100, False), ("H100", CPU, False),
])
def test_hardware_matcher(entry, device, expected):
    assert hardware_matches(entry, device) is expected


def test_device_info_cpu():
    assert device_info("cpu") == CPU
    assert str(H100) == "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)"
    if not torch.cuda.is_available():
        assert device_info() == CPU
    with pytest.raises(ValueError, match="accepted: cpu, cuda"):
        device_info("meta")


@pytest.mark.parametrize("language, entry, binding", [("python", "kernel.py::run", None),
                                                       ("cuda", "kernel.cu::run", None),
                                                       ("cuda", "kernel.cu::run", "torch")])
def test_a_cuda_device_this_process_cannot_use_is_a_build_error(cache, monkeypatch, language, entry, binding):
    """Building for cuda where torch has no CUDA (or no GPU is visible) names why, as a BuildError
    the runner reports (not torch's bare AssertionError), before any of the solution runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    src = "raise SystemExit('must not be imported')\ndef run(x, w):\n    return x\n"
    with pytest.raises(BuildError) as info:
        build(solution(f"on_cuda_{language}_{binding}", src, entry=entry, language=language, binding=binding,
                       target=("cuda",)), mul_definition(), "cuda")
    assert info.value.kind == UNSUPPORTED
    assert "device cuda: " in str(info.value)
    assert ("built without CUDA" if torch.version.cuda is None else "no CUDA device is visible") in str(info.value)
    with pytest.raises(ValueError, match="device cuda:0: "):
        device_info("cuda:0")


def test_target_hardware_refused_before_anything_runs(cache):
    src = "raise SystemExit('must not be imported')\ndef run(x, w):\n    return x\n"
    with pytest.raises(BuildError) as info:
        build(solution("gpu_only", src, target=("sm_90", "H100")), mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED
    assert str(info.value) == "solution 'gpu_only': targets sm_90, H100; this device is cpu"
    assert not cache.exists()


def test_triton_on_cpu_hints_at_the_interpreter(cache, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(BuildError, match="set TRITON_INTERPRET=1 to run triton solutions on CPU") as info:
        build(solution("tri", SRC, language="triton", target=("cuda",)), mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED


@pytest.mark.parametrize("entry", ["torch", "torch>=2.4", "torch >= 2.0, <100", "packaging", "CUDA",
                                   "filelock>=3", "pytest", "some_pkg; python_version < '3'"])
def test_dependencies_met(entry):
    if entry == "CUDA" and torch.version.cuda is None:
        pytest.skip("torch without CUDA")
    assert dependency_problem(entry) is None


def test_dependency_problems():
    # The installed distribution's version (torch.__version__ may add a local part, e.g. +cu130).
    installed = importlib.metadata.version("torch")
    assert dependency_problem("torch>=999") == f"needs torch>=999; installed: torch {installed}"
    assert dependency_problem("not_a_real_package_xyz") == "needs not_a_real_package_xyz; it is not installed"
    assert "not a requirement string" in dependency_problem("torch >>> 2")
    if torch.version.cuda is None:
        assert dependency_problem("CUDA >= 12.0") == "needs CUDA >= 12.0; this torch build has no CUDA"
    else:
        assert dependency_problem("CUDA >= 999") == f"needs CUDA >= 999; installed: CUDA {torch.version.cuda}"


def test_dependencies_refused_before_anything_runs(cache):
    sol = solution("deps", SRC, deps=("torch>=2.0", "not_a_real_package_xyz>=1", "torch<1"))
    with pytest.raises(BuildError) as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED
    message = str(info.value)
    assert "needs not_a_real_package_xyz>=1; it is not installed" in message
    assert f"needs torch<1; installed: torch {importlib.metadata.version('torch')}" in message
    assert "torch>=2.0" not in message
    assert not cache.exists()


def test_met_dependencies_build(cache):
    run = build(solution("deps_ok", SRC, deps=("torch>=2.0", "packaging")), mul_definition(), "cpu")
    torch.testing.assert_close(run(torch.ones(1, 8), torch.ones(8)), torch.ones(1, 8))
