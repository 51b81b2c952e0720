"""Binding live op calls to their Definitions (opforge.trace.calls) and the op hook that carries
them to tracing and apply (opforge._hooks, opforge.intercept)."""

import pytest
import torch

import opforge
from opforge import _hooks, intercept
from opforge.registry import build, reference_solution
from opforge.trace.calls import bind_call, definition_named

H = 4096  # a public hidden size whose public Definitions fix eps at 1e-5


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("dtype,suffix", [(torch.bfloat16, ""), (torch.float16, "_f16"), (torch.float32, "_f32")])
@pytest.mark.parametrize("eps,name,inputs", [
    (1e-5, "rmsnorm_h4096", ["hidden_states", "weight"]),
    (1e-6, "rmsnorm_h4096_eps", ["hidden_states", "weight", "eps"]),
])
def test_norm_call_names_what_the_call_fixes(dtype, suffix, eps, name, inputs):
    x, w = _rand(3, 5, H, dtype=dtype), _rand(H, dtype=dtype)
    call = bind_call("rmsnorm", (x, w, eps), {})
    assert call.definition == name + suffix
    assert call.axes == {"batch_size": 15} and call.key == (name + suffix, 15)
    assert list(call.inputs) == inputs
    definition = definition_named(call.definition)
    assert definition.name == call.definition and list(definition.inputs) == inputs
    assert definition.inputs["hidden_states"].dtype.to_torch() == dtype
    assert call.inputs["hidden_states"].shape == (15, H)
    if "eps" in inputs:
        assert call.inputs["eps"] == eps


def test_non_public_size_takes_eps_as_input_and_declares_the_residual():
    x, r, w = _rand(2, 96), _rand(2, 96), _rand(96)
    call = bind_call("fused_add_rmsnorm", (), {"input": x, "residual": r, "weight": w, "eps": 1e-6})
    assert call.definition == "fused_add_rmsnorm_h96"
    definition = call.make_definition()
    assert list(definition.outputs) == ["output", "residual_out"]
    assert list(call.inputs) == list(definition.inputs) == ["hidden_states", "residual", "weight", "eps"]


@pytest.mark.parametrize("op,args,name,inputs", [
    ("silu_and_mul", lambda: (_rand(4, 2 * 96),), "silu_and_mul_d96", ["input"]),
    ("gelu_tanh_and_mul", lambda: (_rand(2, 3, 2 * 96, dtype=torch.float16),), "gelu_tanh_and_mul_d96_f16", ["input"]),
    ("scale", lambda: (_rand(4, 64), 0.5), "scale_h64", ["x", "factor"]),
    ("gemma_rmsnorm", lambda: (_rand(4, 2048), _rand(2048)), "gemma_rmsnorm_h2048", ["hidden_states", "weight"]),
])
def test_every_op_binds_to_a_definition_with_its_inputs(op, args, name, inputs):
    call = bind_call(op, args(), {})
    assert call.definition == name and list(call.inputs) == inputs
    assert list(call.make_definition().inputs) == inputs


@pytest.mark.parametrize("op,args", [
    ("rmsnorm", ("not a tensor", None)),
    ("rmsnorm", (torch.randn(()), torch.randn(()))),
    ("rmsnorm", (torch.zeros(4, 8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))),
    ("silu_and_mul", (torch.randn(4, 7),)),
    ("scale", (torch.randn(4, 8), True)),
    ("scale", (torch.randn(4, 8), "2")),
    ("not_an_op", (torch.randn(4, 8),)),
])
def test_calls_no_definition_describes_are_not_bound(op, args):
    assert bind_call(op, args, {}) is None


def _reference_outputs(call):
    run = build(reference_solution(call.make_definition()), call.make_definition())
    result = run(**call.inputs)
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("hidden,eps", [(H, 1e-5), (96, 1e-6)])
def test_finish_keeps_the_in_place_contract_of_fused_add(hidden, eps):
    """A solution's outputs delivered through finish() land where the op would put them: in
    place into input and residual, with the residual the rounded sum even where the public
    Definition has no residual_out output."""
    x, r, w = _rand(6, hidden), _rand(6, hidden), _rand(hidden)
    expect_out, expect_res = opforge.fused_add_rmsnorm(x.clone(), r.clone(), w, eps)
    call = bind_call("fused_add_rmsnorm", (x, r, w, eps), {"out": x, "residual_out": r})
    results = _reference_outputs(call)
    out, res = call.finish(results)
    assert out is x and res is r
    torch.testing.assert_close(res, expect_res, rtol=0, atol=0)
    torch.testing.assert_close(out.float(), expect_out.float(), rtol=2e-2, atol=2e-2)


def test_finish_returns_the_op_shapes_without_destinations():
    x = _rand(2, 3, 2 * 64)
    call = bind_call("silu_and_mul", (x,), {})
    out = call.finish(_reference_outputs(call))
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out.float(), opforge.silu_and_mul(x).float(), rtol=2e-2, atol=2e-2)


class _Recorder:
    def __init__(self):
        self.calls = []

    def record(self, call):
        # What the tracer sees must be the inputs before an in-place op writes them.
        self.calls.append((call.definition, {k: v.clone() if isinstance(v, torch.Tensor) else v
                                              for k, v in call.inputs.items()}))


@pytest.fixture
def recorder():
    rec = _Recorder()
    intercept.set_tracer(rec)
    try:
        yield rec
    finally:
        intercept.set_tracer(None)


def test_hook_is_off_unless_something_listens():
    assert not _hooks.active and _hooks.handler is None
    intercept.set_tracer(_Recorder())
    assert _hooks.active
    intercept.set_tracer(None)
    assert not _hooks.active and _hooks.handler is None


def test_hook_sees_inputs_before_the_op_overwrites_them(recorder):
    x, r, w = _rand(4, 96), _rand(4, 96), _rand(96)
    x0, r0 = x.clone(), r.clone()
    out, res = opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=x, residual_out=r, skip_check=True)
    assert out is x and res is r
    [(name, seen)] = recorder.calls
    assert name == "fused_add_rmsnorm_h96"
    assert torch.equal(seen["hidden_states"], x0) and torch.equal(seen["residual"], r0)
    assert not torch.equal(x, x0)


def test_hook_passes_bad_calls_to_the_op_and_its_errors(recorder):
    with pytest.raises(TypeError, match="opforge.rmsnorm"):
        opforge.rmsnorm("x", torch.randn(8))
    with pytest.raises(ValueError, match="opforge.silu_and_mul"):
        opforge.silu_and_mul(torch.randn(4, 7))
    assert recorder.calls == []


def test_hook_keeps_keyword_order_and_results(recorder):
    x, w = _rand(3, 64), _rand(64)
    y = opforge.rmsnorm(eps=1e-6, weight=w, input=x)
    torch.testing.assert_close(y, opforge.rmsnorm(x, w, 1e-6, backend="torch"), rtol=2e-2, atol=2e-2)
    assert [name for name, _ in recorder.calls] == ["rmsnorm_h64", "rmsnorm_h64"]


def test_nvfp4_calls_bind_with_derived_blocked_scales():
    from opforge.ops import nvfp4_format as fmt

    m, k, l = 130, 128, 3
    a = fmt.encode_fp4(torch.randint(16, (l, m, k)), dim=2).permute(1, 2, 0)
    b = fmt.encode_fp4(torch.randint(16, (l, 1, k)), dim=2).permute(1, 2, 0)
    scale_a = torch.exp2(torch.randint(-4, 3, (m, k // 16, l)).float()).to(torch.float8_e4m3fn)
    scale_b = torch.exp2(torch.randint(-4, 3, (1, k // 16, l)).float()).to(torch.float8_e4m3fn)
    out = torch.full((m, 1, l), float("nan"), dtype=torch.float16)
    call = bind_call("nvfp4_gemv", (a, b, scale_a, scale_b), {"out": out})
    assert call.definition == f"nvfp4_gemv_m{m}_k{k}" and call.key == (call.definition, l)
    definition = call.make_definition()
    assert list(call.inputs) == list(definition.inputs)
    assert torch.equal(call.inputs["scale_a_permuted"].float(), fmt.to_blocked(scale_a).float())
    result = call.finish(_reference_outputs(call))
    assert result is out
    torch.testing.assert_close(out, fmt.nvfp4_gemv_reference(a, b, scale_a, scale_b), rtol=1e-3, atol=1e-3)
    assert bind_call("nvfp4_gemv", (a[:, :24], b[:, :24], scale_a, scale_b), {}) is None  # K = 48
