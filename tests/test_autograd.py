"""What the ops tell autograd. They have no backward, so inputs that need grad are refused while
grad mode is on (see test_errors.py and test_compile.py); and a write through ``out=`` (or an
in-place residual update) bumps the written tensors' version counters, as torch's own in-place ops
do, so a backward that saved one of them raises instead of computing a wrong gradient."""

from __future__ import annotations

import pytest
import torch

import opforge

MODIFIED = "modified by an inplace operation"
ROWS, H = 3, 8


def _outputs(name: str) -> tuple[str, ...]:
    return ("out", "residual_out") if "fused_add" in name else ("out",)


def _call(name: str, written: dict, dtype=torch.float32, **kw):
    """Calls op ``name`` on fresh inputs of ``dtype``, writing into the tensors in ``written`` (by
    argument name)."""
    x, r, w = (torch.randn(*shape).to(dtype) for shape in ((ROWS, H), (ROWS, H), (H,)))
    fn = getattr(opforge, name)
    if name == "scale":
        return fn(x, 0.5, out=written.get("out"), **kw)
    if name.endswith("_and_mul"):
        return fn(torch.randn(ROWS, 2 * H).to(dtype), out=written.get("out"), **kw)
    if "fused_add" in name:
        return fn(x, r, w, out=written.get("out"), residual_out=written.get("residual_out"), **kw)
    return fn(x, w, out=written.get("out"), **kw)


OPS = ["scale", "rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul",
       "gelu_and_mul", "gelu_tanh_and_mul"]
WRITTEN = [pytest.param(op, o, id=f"{op}-{o}") for op in OPS for o in _outputs(op)]


def _saved_by_a_backward() -> tuple[torch.Tensor, torch.Tensor]:
    """(t, loss): t needs no grad itself, but the backward of loss reads it (d loss / d a = t)."""
    a = torch.randn(ROWS, H, requires_grad=True)
    t = torch.randn(ROWS, H)
    return t, (a * t).sum()


def test_torch_in_place_write_makes_the_backward_raise():
    """The behaviour the ops must match: torch.mul(..., out=t) into a tensor a backward saved."""
    t, loss = _saved_by_a_backward()
    torch.mul(torch.randn(ROWS, H), 2.0, out=t)
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()


@pytest.mark.parametrize("skip_check", [False, True])
@pytest.mark.parametrize("backend", ["auto", "cpu", "torch"])
@pytest.mark.parametrize("op, written", WRITTEN)
def test_write_into_a_saved_tensor_makes_the_backward_raise(op, written, backend, skip_check):
    t, loss = _saved_by_a_backward()
    _call(op, {written: t}, backend=backend, skip_check=skip_check)
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()


@pytest.mark.parametrize("name", ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm"])
def test_in_place_residual_update_makes_the_backward_raise(name):
    """out=input, residual_out=residual (the serving engines' form) bumps both."""
    a = torch.randn(ROWS, H, requires_grad=True)
    x, residual, w = torch.randn(ROWS, H), torch.randn(ROWS, H), torch.randn(H)
    loss = (a * x).sum() + (a * residual).sum()
    versions = x._version, residual._version
    getattr(opforge, name)(x, residual, w, out=x, residual_out=residual)
    assert x._version > versions[0] and residual._version > versions[1]
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()


@pytest.mark.parametrize("op, written", WRITTEN)
def test_every_write_bumps_the_version(op, written):
    t = torch.empty(ROWS, H)
    before = t._version
    _call(op, {written: t})
    after = t._version
    assert after > before
    _call(op, {written: t}, skip_check=True)
    assert t._version > after


@pytest.mark.parametrize("op, written", WRITTEN)
def test_a_refused_call_bumps_nothing(op, written):
    t = torch.empty(ROWS, H)
    before = t._version
    with pytest.raises(TypeError, match="dtype"):
        _call(op, {written: t}, dtype=torch.float16, skip_check=True)
    assert t._version == before


@pytest.mark.parametrize("op, written", WRITTEN)
def test_writes_under_inference_mode(op, written):
    with torch.inference_mode():
        t = torch.empty(ROWS, H)
        result = _call(op, {written: t})
    assert (result[0] if isinstance(result, tuple) else result).shape == (ROWS, H)


def test_version_bump_on_torch_releases_that_take_one_tensor(monkeypatch):
    """torch 2.4's _increment_version takes one tensor, later ones an iterable of tensors."""
    from opforge import _ext

    real = torch._C._increment_version

    def one_tensor_only(t):
        if not isinstance(t, torch.Tensor):
            raise TypeError("increment_version expect a Tensor as input")
        real((t,))

    monkeypatch.setattr(torch._C, "_increment_version", one_tensor_only)
    a, b = torch.empty(2), torch.empty(2)
    _ext._version_bump()((a, b))
    assert a._version == 1 and b._version == 1
