"""Op templates: consistency with the ops' signatures, generated Definitions (names and meaning
of the public FlashInfer-Trace ones), and Definitions / Workloads read off live calls."""

from __future__ import annotations

import inspect

import pytest
import torch

from opforge.trace import expr
from opforge.trace.template import Scalar, Tensor, Var
from opforge.trace.templates import TEMPLATES

SCALARS = {"eps": 1e-6, "factor": 0.37}


def _example_call(template, rows=5, size=256):
    """Arguments of a real call of the template's op on small CPU tensors."""
    g = torch.Generator().manual_seed(0)
    params = inspect.signature(template.op).parameters
    const = template.const_axes[0]
    width = 2 * size if const == "intermediate_size" else size
    kwargs = {}
    for key, spec in template.inputs.items():
        name = spec.param or key
        if isinstance(spec, Scalar):
            kwargs[name] = SCALARS[name]
        elif spec.shape == ["hidden_size"]:
            kwargs[name] = torch.randn(size, generator=g).to(torch.bfloat16)
        else:
            kwargs[name] = torch.randn(rows, width, generator=g).to(torch.bfloat16)
    assert set(kwargs) <= set(params)
    return kwargs


#: Templates over rows of a hidden size (one variable axis batch_size, bf16 example calls).
ROW_TEMPLATES = sorted(name for name, t in TEMPLATES.items()
                       if [axis for axis, kind in t.axes.items() if isinstance(kind, Var)] == ["batch_size"])


def _example_definition(template):
    """A Definition of the template at the built-in dataset's first size."""
    from opforge.trace.builtin import builtin_sizes

    return template.definition(**builtin_sizes(template)[0][0])


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_parameters_exist_in_the_op_signature(name):
    template = TEMPLATES[name]
    params = inspect.signature(template.op).parameters
    # An input the op does not take must be another layout of one it does (a derived domain),
    # so that the op's builtin solution computes what the Definition means.
    derived = {key for key, domain in _example_definition(template).value_domains.items()
               if domain.kind == "derived" and template.param_of(domain.source) in params}
    for key, spec in {**template.inputs, **template.outputs}.items():
        assert (spec.param or key) in params or key in derived, \
            f"{name}: {key} -> parameter {spec.param or key!r} not in {list(params)}"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_constant_axis_is_used_by_a_tensor(name):
    template = TEMPLATES[name]
    used = {axis for spec in {**template.inputs, **template.outputs}.values()
            if isinstance(spec, Tensor) and spec.shape for axis in spec.shape}
    # An axis the name spells (nvfp4_gemv's K) may reach the tensors through a constraint.
    constrained = {axis for constraint in _example_definition(template).constraints
                   if set(expr.names(constraint)) & used for axis in expr.names(constraint)}
    for axis in template.axes:
        assert axis in used | constrained, f"{name}: axis {axis} appears in no tensor"


@pytest.mark.parametrize("name", ROW_TEMPLATES)
def test_definition_of_a_live_call_runs_its_reference_like_the_op(name):
    template = TEMPLATES[name]
    kwargs = _example_call(template)
    definition = template.definition_for_call(**kwargs)
    assert definition.name.startswith(name + "_")
    values = template.axis_values(**kwargs)
    assert values["batch_size"] == 5
    definition.check_constraints(values)
    run = definition.reference_fn()
    args = [kwargs[template.param_of(key)] if key in kwargs or template.param_of(key) in kwargs else SCALARS[key]
            for key in definition.inputs]
    expected = run(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = template.op(**kwargs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(expected) <= len(got)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o.float(), e.float(), rtol=2e-2, atol=2e-2)
    workload = template.workload_for_call(**kwargs)
    definition.check_workload(workload)
    for key, spec in definition.inputs.items():
        if spec.shape is None:
            assert workload.inputs[key].value == pytest.approx(SCALARS[key])


def test_leading_dimensions_fold_into_the_batch_axis():
    t = TEMPLATES["rmsnorm"]
    x = torch.randn(2, 3, 4096)
    assert t.axis_values(x, torch.randn(4096)) == {"batch_size": 6, "hidden_size": 4096}


def test_mismatched_axes_are_reported():
    t = TEMPLATES["fused_add_rmsnorm"]
    with pytest.raises(ValueError, match="hidden_size"):
        t.axis_values(torch.randn(2, 64), torch.randn(2, 64), torch.randn(32))


@pytest.mark.parametrize(
    "prefix, hidden, eps",
    [("rmsnorm", 4096, 1e-5), ("rmsnorm", 7168, 1e-6), ("fused_add_rmsnorm", 4096, 1e-5),
     ("fused_add_rmsnorm", 8192, 1e-6), ("gemma_rmsnorm", 2048, 1e-6), ("gemma_fused_add_rmsnorm", 2048, 1e-6)],
)
def test_public_names_mean_what_the_public_dataset_means(prefix, hidden, eps):
    d = TEMPLATES[prefix].definition(dtype="bfloat16", hidden_size=hidden)
    assert d.name == f"{prefix}_h{hidden}" and d.op_type == "rmsnorm"
    add = "fused_add" in prefix
    assert list(d.inputs) == (["hidden_states", "residual", "weight"] if add else ["hidden_states", "weight"])
    assert list(d.outputs) == ["output"]
    assert d.inputs["weight"].shape == ["hidden_size"] and d.inputs["hidden_states"].dtype.value == "bfloat16"
    # The published formula, written out here: fp32 math, eps inside the reference.
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(3, hidden, generator=g).to(torch.bfloat16) for _ in range(2))
    w = torch.randn(hidden, generator=g).to(torch.bfloat16)
    s = x.float() + (r.float() if add else 0)
    scale = 1.0 + w.float() if prefix.startswith("gemma") else w.float()
    want = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * scale).to(torch.bfloat16)
    got = d.reference_fn()(*((x, r, w) if add else (x, w)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_new_names_make_eps_explicit_and_declare_the_residual():
    d = TEMPLATES["gemma_fused_add_rmsnorm"].definition(dtype="float16", hidden_size=4096)
    assert d.name == "gemma_fused_add_rmsnorm_h4096_f16"
    assert d.inputs["eps"].shape is None and d.inputs["eps"].dtype.value == "float32"
    assert list(d.outputs) == ["output", "residual_out"]
    assert d.aliases == {"output": "hidden_states", "residual_out": "residual"}


def test_activation_names_and_constraint():
    d = TEMPLATES["silu_and_mul"].definition(intermediate_size=11008)
    assert d.name == "silu_and_mul_d11008"
    assert d.axes["gated_size"].value == 22016
    with pytest.raises(Exception, match="gated_size"):
        d.check_constraints({"batch_size": 1, "intermediate_size": 11008, "gated_size": 100})


def test_unknown_constant_axis_is_refused():
    with pytest.raises(ValueError, match="not constant axes"):
        TEMPLATES["scale"].definition(hidden_size=4096, batch_size=3)
