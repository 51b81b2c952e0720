"""Builtin solutions: opforge's own ops behind the Definition's names (the generated python
form, and the older "builtin" records, which build the same way)."""

from __future__ import annotations

import json

import pytest
import torch

import opforge
from opforge.registry import ENTRY_POINT_ERROR, SIGNATURE_ERROR, BuildError, build, builtin_solution
from opforge.trace import AxisConst, AxisVar, Definition, TensorSpec
from opforge.trace.own_op import AdapterError
from registry_helpers import solution


def legacy(definition, op, **adapter):
    """A record as older opforge wrote it: language builtin, the adapter in builtin.json."""
    return solution(f"{definition.name}_legacy", {"builtin.json": json.dumps(adapter)}, entry=f"builtin.json::{op}",
                    language="builtin", definition=definition.name, target=("cpu", "cuda"))


def refused(definition, op, match, kind, **adapter):
    """builtin_solution refuses the mapping, and building a legacy record of it fails alike."""
    with pytest.raises(AdapterError, match=match) as info:
        builtin_solution(definition, op, **adapter)
    assert info.value.entry == (kind == ENTRY_POINT_ERROR)
    with pytest.raises(BuildError, match=match) as info:
        build(legacy(definition, op, **adapter), definition, "cpu")
    assert info.value.kind == kind

ROWS = ["batch_size", "hidden_size"]


def norm_definition(name="rmsnorm_h64", fused=False, outputs=("output",), eps=1e-5) -> Definition:
    """Shaped like the public FlashInfer-Trace norm Definitions (eps fixed in the reference)."""
    inputs = {"hidden_states": TensorSpec(shape=ROWS, dtype="float32")}
    if fused:
        inputs["residual"] = TensorSpec(shape=ROWS, dtype="float32")
    inputs["weight"] = TensorSpec(shape=["hidden_size"], dtype="float32")
    if fused:
        reference = (f"import torch\ndef run(hidden_states, residual, weight):\n"
                     f"    s = hidden_states + residual\n"
                     f"    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + {eps}) * weight\n"
                     f"    return {{'output': out, 'residual_out': s}}\n")
    else:
        reference = (f"import torch\ndef run(hidden_states, weight):\n"
                     f"    x = hidden_states\n"
                     f"    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + {eps}) * weight\n")
    return Definition(name=name, op_type="rmsnorm", axes={"batch_size": AxisVar(), "hidden_size": AxisConst(value=64)},
                      inputs=inputs, outputs={o: TensorSpec(shape=ROWS, dtype="float32") for o in outputs},
                      reference=reference)


def test_rmsnorm_with_eps_constant():
    d = norm_definition()
    sol = builtin_solution(d, "rmsnorm", constants={"eps": 1e-5})
    assert sol.spec.entry_point == "main.py::run" and sol.spec.language == "python"
    assert sol.name == "rmsnorm_h64_builtin" and not sol.spec.destination_passing_style
    run = build(sol, d, "cpu")
    x, w = torch.randn(5, 64), torch.randn(64)
    torch.testing.assert_close(run(x, w), d.reference_fn()(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run(hidden_states=x, weight=w), run(x, w))


def test_fused_add_rmsnorm_two_outputs():
    d = norm_definition("fused_add_rmsnorm_h64", fused=True, outputs=("output", "residual_out"))
    run = build(builtin_solution(d, "fused_add_rmsnorm", constants={"eps": 1e-5}), d, "cpu")
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    out, res = run(x, r, w)
    ref = d.reference_fn()(x, r, w)
    torch.testing.assert_close(out, ref["output"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res, ref["residual_out"])


def test_outputs_in_the_op_order():
    # The Definition lists the residual first; the op returns (out, residual_out).
    d = norm_definition("fused_add_rmsnorm_rev_h64", fused=True, outputs=("residual_out", "output"))
    run = build(builtin_solution(d, "fused_add_rmsnorm", constants={"eps": 1e-5}, outputs=["output", "residual_out"]),
                d, "cpu")
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    res, out = run(x, r, w)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(out, opforge.fused_add_rmsnorm(x, r, w, 1e-5)[0])


def test_returned_value_dropped():
    # FlashInfer-Trace's fused_add_rmsnorm Definitions have one output; the op returns two.
    d = norm_definition("fused_add_rmsnorm_one_h64", fused=True, outputs=("output",))
    run = build(builtin_solution(d, "fused_add_rmsnorm", constants={"eps": 1e-5}, outputs=["output", None]), d, "cpu")
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    torch.testing.assert_close(run(x, r, w), d.reference_fn()(x, r, w)["output"], rtol=1e-5, atol=1e-5)
    wrong = build(builtin_solution(d, "fused_add_rmsnorm", name="wrong", constants={"eps": 1e-5}), d, "cpu")
    with pytest.raises(ValueError, match=r"returned 2 value\(s\); its adapter lists 1: \['output'\]"):
        wrong(x, r, w)


def test_explicit_input_mapping():
    d = Definition(name="scale_x", op_type="scale", axes={"n": AxisVar()},
                   inputs={"data": TensorSpec(shape=["n"], dtype="float32"), "k": TensorSpec(shape=None, dtype="float32")},
                   outputs={"out": TensorSpec(shape=["n"], dtype="float32")},
                   reference="def run(data, k):\n    return data * k\n")
    run = build(builtin_solution(d, "scale", inputs={"data": "x", "k": "factor"}), d, "cpu")
    x = torch.randn(10)
    torch.testing.assert_close(run(x, 0.5), x * 0.5)


@pytest.mark.parametrize("op, kwargs, kind, match", [
    ("nope", {}, ENTRY_POINT_ERROR, "opforge has no op 'nope' \\(ops: scale, rmsnorm"),
    ("_run", {}, ENTRY_POINT_ERROR, "opforge has no op '_run'"),
    ("rmsnorm", {"inputs": {"hidden_states": "x"}}, SIGNATURE_ERROR, r"parameter\(s\) hidden_states -> x not in opforge.rmsnorm"),
    ("rmsnorm", {"constants": {"epsilon": 1e-5}}, SIGNATURE_ERROR, "epsilon not in opforge.rmsnorm"),
    ("rmsnorm", {"inputs": {"bias": "weight"}}, SIGNATURE_ERROR, "adapter maps unknown input"),
    ("rmsnorm", {"outputs": ["out"]}, SIGNATURE_ERROR, "adapter outputs \\['out'\\] do not name each of the Definition's"),
    ("rmsnorm", {"outputs": ["output", "output"]}, SIGNATURE_ERROR, "do not name each"),
])
def test_adapter_errors(op, kwargs, kind, match):
    refused(norm_definition(), op, match, kind, **kwargs)


def test_op_parameter_left_unmapped():
    d = Definition(name="scale_n", op_type="scale", axes={"n": AxisVar()},
                   inputs={"x": TensorSpec(shape=["n"], dtype="float32")},
                   outputs={"out": TensorSpec(shape=["n"], dtype="float32")}, reference="def run(x):\n    return x\n")
    refused(d, "scale", 'opforge.scale needs factor, which no Definition input maps to', SIGNATURE_ERROR)


@pytest.mark.parametrize("content, match", [
    ("{not json", "builtin.json is not valid JSON"),
    ('{"input": {}}', r"builtin.json: unknown key\(s\) \['input'\]"),
    ("[1]", "builtin.json: unknown key\\(s\\) not an object"),
])
def test_malformed_adapter(content, match):
    sol = solution("bad_adapter", {"builtin.json": content}, entry="builtin.json::rmsnorm", language="builtin",
                   definition="rmsnorm_h64")
    with pytest.raises(BuildError, match=match) as info:
        build(sol, norm_definition(), "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


def test_destination_passing_refused():
    sol = solution("builtin_dps", {"builtin.json": "{}"}, entry="builtin.json::rmsnorm", language="builtin", dps=True,
                   definition="rmsnorm_h64")
    with pytest.raises(BuildError, match="builtin solutions are value-returning") as info:
        build(sol, norm_definition(), "cpu")
    assert info.value.kind == SIGNATURE_ERROR


@pytest.mark.gpu
def test_builtin_on_gpu():
    d = norm_definition()
    run = build(builtin_solution(d, "rmsnorm", constants={"eps": 1e-5}), d, "cuda")
    x, w = torch.randn(5, 64, device="cuda"), torch.randn(64, device="cuda")
    torch.testing.assert_close(run(x, w), d.reference_fn()(x, w), rtol=1e-5, atol=1e-5)


def _scale_with_extra_layout() -> Definition:
    """``x * factor``, with ``x_t`` (x transposed) as a second input the way NVFP4 Definitions
    carry both scale layouts: solutions read whichever suits them, opforge.scale neither."""
    return Definition(name="scale_layouts_n8", op_type="scale", axes={"rows": AxisVar(), "n": AxisConst(value=8)},
                      inputs={"x": TensorSpec(shape=["rows", "n"], dtype="float32"),
                              "x_t": TensorSpec(shape=["n", "rows"], dtype="float32"),
                              "factor": TensorSpec(shape=None, dtype="float32")},
                      outputs={"out": TensorSpec(shape=["rows", "n"], dtype="float32")},
                      reference="def run(x, x_t, factor):\n    return x * factor\n")


def test_null_input_is_left_out_of_the_call():
    d = _scale_with_extra_layout()
    sol = builtin_solution(d, "scale", inputs={"x_t": None})
    assert '"x_t": null' in sol.sources[0].content
    run = build(sol, d, "cpu")
    x, factor = torch.randn(5, 8), float(torch.randn(()))
    # opforge.scale takes no x_t: a call that passed it would raise, so this shows it is left out.
    torch.testing.assert_close(run(x, x.t().contiguous(), factor), x * factor)
    torch.testing.assert_close(run(x=x, x_t=torch.empty(8, 5), factor=factor), x * factor)
    assert build(builtin_solution(d, "scale", inputs={"x_t": None}), d, "cpu").calling == "positional"


@pytest.mark.parametrize("inputs, match", [
    ({}, r"x_t -> x_t not in opforge.scale\(x, factor, out, backend\); map each input .* or to null to leave it out"),
    ({"x_t": None, "x": None}, "opforge.scale needs x, which no Definition input maps to"),
    ({"x_t": "x"}, r"opforge.scale parameter\(s\) x would be given more than once"),
    ({"x_t": None, "nope": None}, r"adapter maps unknown input\(s\) nope"),
])
def test_null_and_duplicate_mappings_checked_before_any_call(inputs, match):
    refused(_scale_with_extra_layout(), "scale", match, SIGNATURE_ERROR, inputs=inputs)


def test_input_mapped_and_set_as_constant_refused():
    refused(_scale_with_extra_layout(), "scale", r"parameter\(s\) factor would be given more than once",
            SIGNATURE_ERROR, inputs={"x_t": None}, constants={"factor": 2.0})
