"""torch.library registration (torch.ops.opforge.*), torch.library.opcheck, and torch.compile of
functions that call the ops (fullgraph, so a graph break fails the test). The torch.compile tests
carry the ``compile`` marker: ``-m "not compile"`` deselects them."""

from __future__ import annotations

import pytest
import torch

import opforge
from conftest import DEVICES, assert_close, assert_same_bits, ref_act_and_mul, ref_rmsnorm

# --- registration and opcheck ----------------------------------------------------------------


@pytest.mark.parametrize("name, mutated", [("norm", ("out", "residual_out")), ("act_and_mul", ("out",)),
                                            ("scale", ("out",))])
def test_custom_ops_are_registered(name, mutated):
    packet = getattr(torch.ops.opforge, name)
    schema = packet.default._schema
    written = {arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    assert written == set(mutated)
    assert len(schema.returns) == 0


def _opcheck_samples():
    x, r = torch.randn(4, 64), torch.randn(4, 64)
    w = torch.randn(64)
    xb, wb = x.bfloat16(), w.bfloat16()
    strided = torch.randn(4, 96)[:, :64]
    e = torch.empty
    return [
        ("norm", (e(4, 64), x, None, None, w, 1e-6, False), "rmsnorm"),
        ("norm", (e(4, 64, dtype=torch.bfloat16), xb, None, None, wb, 1e-5, True), "gemma-bf16"),
        ("norm", (e(4, 64), strided, None, None, w, 1e-6, False), "rmsnorm-strided-input"),
        ("norm", (e(4, 64), x, r, e(4, 64), w, 1e-6, False), "fused-add"),
        ("norm", (x.clone(), x.clone(), None, None, w, 1e-6, False), "rmsnorm-in-place-shape"),
        ("norm", (e(2, 3, 64), torch.randn(2, 3, 64), torch.randn(2, 3, 64), e(2, 3, 64), w, 1e-6, True), "gemma-3d"),
        ("act_and_mul", (e(4, 32), x, "silu"), "silu"),
        ("act_and_mul", (e(4, 32, dtype=torch.bfloat16), xb, "gelu"), "gelu-bf16"),
        ("act_and_mul", (e(2, 3, 32), torch.randn(2, 3, 64), "gelu_tanh"), "gelu_tanh-3d"),
        ("scale", (e(4, 64), x, 0.5), "scale"),
        ("scale", (e(4, 64, dtype=torch.float16), x.half(), -3.0), "scale-fp16"),
    ]


@pytest.mark.parametrize("name, args", [pytest.param(n, a, id=i) for n, a, i in _opcheck_samples()])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.opforge, name).default, args)


def test_registered_ops_compute_the_ops():
    """The registered ops are the public ones underneath (what torch.compile puts in graphs)."""
    x, w = torch.randn(3, 16), torch.randn(16)
    out = torch.empty(3, 16)
    torch.ops.opforge.norm(out, x, None, None, w, 1e-6, False)
    assert torch.equal(out, opforge.rmsnorm(x, w))
    act = torch.empty(3, 8)
    torch.ops.opforge.act_and_mul(act, x, "gelu_tanh")
    assert torch.equal(act, opforge.gelu_tanh_and_mul(x))
    torch.ops.opforge.scale(out, x, 0.25)
    assert torch.equal(out, x * 0.25)


# --- torch.compile ---------------------------------------------------------------------------


def f_rmsnorm(x, r, w):
    return opforge.rmsnorm(x, w) * 2


def f_fused(x, r, w):
    out, res = opforge.fused_add_rmsnorm(x, r, w)
    return out + 1, res


def f_fused_in_place(x, r, w):
    opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
    return x, r


def f_silu(x, r, w):
    return opforge.silu_and_mul(torch.cat([x, r], dim=-1))


def f_scale(x, r, w):
    return opforge.scale(x + r, 0.5)


def f_chain(x, r, w):
    h, res = opforge.gemma_fused_add_rmsnorm(x, r, w)
    return opforge.gelu_and_mul(torch.cat([h, res], dim=-1)), res


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", [f_rmsnorm, f_fused, f_fused_in_place, f_silu, f_scale, f_chain],
                         ids=lambda f: f.__name__[2:])
def test_compiled_matches_eager(rng, fn, device):
    def inputs():
        return rng.randn(4, 64, device=device), rng.randn(4, 64, device=device), rng.randn(64, device=device)

    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    for _ in range(2):  # the second call runs the cached graph on new values
        args = inputs()
        eager_args = [a.clone() for a in args]
        expected = fn(*eager_args)
        got = compiled(*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected):
            assert_close(g, e.double())
        for a, e in zip(args, eager_args):  # in-place updates happen as in eager mode
            assert_same_bits(a, e)


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_results_match_reference(rng):
    x, r, w = rng.randn(8, 128), rng.randn(8, 128), rng.randn(128)

    @torch.compile(fullgraph=True, dynamic=False)
    def block(x, r, w):
        h, res = opforge.fused_add_rmsnorm(x, r, w)
        return opforge.silu_and_mul(torch.cat([h, h], dim=-1)), res

    got, res = block(x, r, w)
    h = ref_rmsnorm(x, w, residual=r)
    assert_close(got, ref_act_and_mul(torch.cat([h, h], dim=-1).float(), "silu"), rtol=1e-4, atol=1e-5)
    assert_same_bits(res, (x + r))


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_reports_shape_mismatch():
    compiled = torch.compile(f_rmsnorm, fullgraph=True, dynamic=False)
    with pytest.raises(Exception, match="do not match"):
        compiled(torch.randn(4, 64), None, torch.randn(63))


@pytest.mark.gpu
@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_with_cuda_graphs(rng):
    """mode="reduce-overhead" captures the ops into CUDA graphs and replays them."""
    compiled = torch.compile(f_chain, mode="reduce-overhead", fullgraph=True, dynamic=False)
    for _ in range(4):
        x, r, w = (rng.randn(16, 256, device="cuda", dtype=torch.bfloat16),
                   rng.randn(16, 256, device="cuda", dtype=torch.bfloat16),
                   rng.randn(256, device="cuda", dtype=torch.bfloat16))
        expected = f_chain(x.clone(), r.clone(), w)
        got = compiled(x, r, w)
        for g, e in zip(got, expected):
            assert_same_bits(g, e)


# --- autograd under torch.compile ------------------------------------------------------------

GRAD_CALLS = {
    "scale": lambda x, r, w: opforge.scale(x, 0.5),
    "rmsnorm": lambda x, r, w: opforge.rmsnorm(x, w),
    "gemma_rmsnorm": lambda x, r, w: opforge.gemma_rmsnorm(x, w),
    "fused_add_rmsnorm": lambda x, r, w: opforge.fused_add_rmsnorm(x, r, w)[0],
    "gemma_fused_add_rmsnorm": lambda x, r, w: opforge.gemma_fused_add_rmsnorm(x, r, w)[0],
    "silu_and_mul": lambda x, r, w: opforge.silu_and_mul(x),
    "gelu_and_mul": lambda x, r, w: opforge.gelu_and_mul(x),
    "gelu_tanh_and_mul": lambda x, r, w: opforge.gelu_tanh_and_mul(x),
}


def _grad_cases():
    cases = []
    for op in GRAD_CALLS:
        used = ["x"] + (["r"] if "fused" in op else []) + (["w"] if "rmsnorm" in op else [])
        cases += [pytest.param(op, name, id=f"{op}-{name}") for name in used]
    return cases


def _grad_args(needs_grad: str) -> dict:
    args = {"x": torch.randn(4, 64), "r": torch.randn(4, 64), "w": torch.randn(64)}
    args[needs_grad].requires_grad_()
    return args


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("op, needs_grad", _grad_cases())
def test_compiled_call_refuses_inputs_that_need_grad(op, needs_grad):
    """The ops have no backward: compiled, as in eager mode, an input that needs grad is refused
    (instead of a result whose gradient is silently dropped)."""
    compiled = torch.compile(GRAD_CALLS[op], fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as info:
        compiled(**_grad_args(needs_grad))
    assert "requires grad" in str(info.value) and f"opforge.{op}" in str(info.value)
    with torch.no_grad():
        compiled(**_grad_args(needs_grad))


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_call_without_fullgraph_refuses_inputs_that_need_grad():
    """Without fullgraph the refusal is the eager one, type included."""
    compiled = torch.compile(GRAD_CALLS["fused_add_rmsnorm"], dynamic=False)
    with pytest.raises(ValueError, match="^opforge.fused_add_rmsnorm: weight requires grad"):
        compiled(**_grad_args("w"))


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_write_into_a_saved_tensor_makes_the_backward_raise():
    a = torch.randn(4, 64, requires_grad=True)
    t = torch.randn(4, 64)
    loss = (a * t).sum()
    compiled = torch.compile(lambda x, out: opforge.scale(x, 2.0, out=out), fullgraph=True, dynamic=False)
    before = t._version
    compiled(torch.randn(4, 64), t)
    assert t._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_in_place_update_bumps_the_versions():
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    versions = x._version, r._version
    torch.compile(f_fused_in_place, fullgraph=True, dynamic=False)(x, r, w)
    assert x._version > versions[0] and r._version > versions[1]
