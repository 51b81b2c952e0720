"""NVFP4 GEMV Definitions: what the template declares (the task's tuple of tensors, packed FP4
shapes, blocked scale shapes, tolerance, bytes), names both ways, the reference against
opforge's NVFP4 format module, the fp16 bound on the scales, the new value-domain kinds, and
the Solutions the built-in dataset ships for them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

import opforge.solutions
from opforge.bench import generate_inputs
from opforge.ops import nvfp4_format
from opforge.trace import Definition, DType, RandomInput, SchemaError, Workload, builtin
from opforge.trace.own_op import read_own_op
from opforge.trace.templates import TEMPLATES, definition_for_name
from opforge.trace.templates.nvfp4 import E4M3_SMALLEST, scale_bound

TEMPLATE = TEMPLATES["nvfp4_gemv"]
INPUTS = ["a", "b", "scale_a", "scale_b", "scale_a_permuted", "scale_b_permuted"]


def small(m: int = 37, k: int = 192) -> Definition:
    return TEMPLATE.definition(M=m, K=k)


def workload(definition: Definition, l: int, seed: int = 0) -> Workload:
    return Workload(uuid=f"L{l}", axes={"L": l}, inputs={n: RandomInput() for n in definition.inputs}, seed=seed)


@pytest.mark.parametrize("m, k", builtin.NVFP4_GEMV_SHAPES)
def test_builtin_definitions_declare_the_task_tuple(m, k):
    d = definition_for_name(f"nvfp4_gemv_m{m}_k{k}")
    assert d is not None and d.op_type == "gemv"
    assert list(d.inputs) == INPUTS and list(d.outputs) == ["c"]
    assert d.const_axes["M"] == m and d.const_axes["K"] == k and d.var_axes == ["L"]
    l = 3
    shapes = d.resolve_shapes({"L": l})
    assert shapes["a"] == (m, k // 2, l) and shapes["b"] == (1, k // 2, l)
    assert shapes["scale_a"] == (m, k // 16, l) and shapes["scale_b"] == (1, k // 16, l)
    assert shapes["scale_a_permuted"] == nvfp4_format.blocked_shape(m, k, l)
    assert shapes["scale_b_permuted"] == nvfp4_format.blocked_shape(1, k, l)
    assert shapes["c"] == (m, 1, l)
    dtypes = {name: spec.dtype for name, spec in {**d.inputs, **d.outputs}.items()}
    # FlashInfer-Bench's FP4 spelling, so its own reader takes the Definition
    assert dtypes == {"a": DType.FLOAT4_E2M1, "b": DType.FLOAT4_E2M1, "scale_a": DType.FLOAT8_E4M3FN,
                      "scale_b": DType.FLOAT8_E4M3FN, "scale_a_permuted": DType.FLOAT8_E4M3FN,
                      "scale_b_permuted": DType.FLOAT8_E4M3FN, "c": DType.FLOAT16}
    # The declared shape of a packed tensor is the torch tensor's: the runner allocates it as is.
    assert d.inputs["a"].dtype.to_torch() is torch.float4_e2m1fn_x2
    assert d.tolerance("c").atol == d.tolerance("c").rtol == 1e-3
    # Bytes: A and B (a byte per two values), one copy of the scales, c in fp16.
    assert d.bytes_moved({"L": l}) == (m + 1) * (k // 2) * l + (m + 1) * (k // 16) * l + 2 * m * l
    assert d.flop_count({"L": l}) == 2 * m * k * l
    d.check_constraints({"L": l})
    assert Definition.from_json(d.to_json()) == d  # the new domain kinds survive a file


def test_names_round_trip_and_refuse_what_no_call_makes():
    d = TEMPLATE.definition(M=2880, K=4096)
    assert d.name == "nvfp4_gemv_m2880_k4096"
    assert definition_for_name(d.name) == d
    assert builtin.template_of(d) is TEMPLATE
    # Every tensor has a fixed dtype: no dtype suffix, whatever dtype is asked for.
    assert TEMPLATE.definition(dtype="float16", M=2880, K=4096).name == d.name
    assert definition_for_name("nvfp4_gemv_m2880_k4096_f16") is None
    assert definition_for_name("nvfp4_gemv_m128_k100") is None  # K must be a multiple of 64
    with pytest.raises(ValueError, match="multiple of 64"):
        TEMPLATE.definition(M=128, K=100)


def test_live_call_is_described_by_its_definition():
    m, k, l = 40, 128, 3
    a = torch.zeros(m, k // 2, l, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    b = torch.zeros(1, k // 2, l, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sa = torch.ones(m, k // 16, l).to(torch.float8_e4m3fn)
    sb = torch.ones(1, k // 16, l).to(torch.float8_e4m3fn)
    d = TEMPLATE.definition_for_call(a, b, sa, sb)
    assert d.name == f"nvfp4_gemv_m{m}_k{k}"
    values = TEMPLATE.axis_values(a, b, sa, sb)
    assert values["L"] == l and values["K"] == k and values["M_tiles"] == 1
    d.check_workload(TEMPLATE.workload_for_call(a, b, sa, sb))


def test_reference_imports_only_torch():
    tree = ast.parse(small().reference)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert imported == {"torch"}


@pytest.mark.parametrize("m, k, l", [(37, 192, 3), (128, 64, 1), (130, 256, 2)])
def test_reference_matches_the_format_module(m, k, l):
    d = small(m, k)
    inputs = generate_inputs(d, workload(d, l), seed=m + k)
    got = d.reference_fn()(*inputs)
    want = nvfp4_format.nvfp4_gemv_reference(*inputs[:4])
    assert got.shape == (m, 1, l) and got.dtype == torch.float16
    assert torch.equal(got, want)
    # The layout of the task's data (K contiguous, L outermost) means the same.
    relaid = [t.permute(2, 0, 1).contiguous().permute(1, 2, 0) for t in inputs[:4]] + inputs[4:]
    assert relaid[0].stride(1) == 1 and torch.equal(d.reference_fn()(*relaid), want)


@pytest.mark.parametrize("k", sorted({k for _, k in builtin.NVFP4_GEMV_SHAPES}))
def test_scale_bound_keeps_the_worst_case_finite_in_fp16(k):
    d = small(4, k)
    high = d.resolve_value_domain("scale_a", {"L": 1})["high"]
    assert high == pytest.approx(scale_bound(k))
    # Every code at +6 and every scale at the largest E4M3 value the domain allows.
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    top = float(values[(values > 0) & (values <= high)].max())
    a = torch.full((4, k // 2, 1), 0x77, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    b = torch.full((1, k // 2, 1), 0x77, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    sa = torch.full((4, k // 16, 1), top).to(torch.float8_e4m3fn)
    sb = torch.full((1, k // 16, 1), top).to(torch.float8_e4m3fn)
    c = d.reference_fn()(a, b, sa, sb, None, None)
    assert torch.isfinite(c).all() and float(c.max()) == pytest.approx(36 * k * top * top, rel=1e-3)
    assert E4M3_SMALLEST == float(values[values > 0].min())  # low is the smallest subnormal


def _definition_with(**domains) -> dict:
    data = small().to_dict()
    data["value_domains"] = {**data["value_domains"], **domains}
    return data


@pytest.mark.parametrize("domains, message", [
    ({"scale_a_permuted": {"kind": "derived", "source": "nope", "transform": "blocked_128x4"}},
     "'nope' is not another input"),
    ({"scale_a_permuted": {"kind": "derived", "source": "scale_a_permuted", "transform": "blocked_128x4"}},
     "is not another input"),
    ({"scale_a_permuted": {"kind": "derived", "source": "scale_b_permuted", "transform": "blocked_128x4"}},
     "is derived itself"),
    ({"scale_a_permuted": {"kind": "derived", "source": "a", "transform": "blocked_128x4"}}, "keeps the dtype"),
    ({"scale_a": {"kind": "derived", "source": "scale_b", "transform": "blocked_128x4"}}, "makes a 6-D tensor"),
    ({"scale_a_permuted": {"kind": "derived", "source": "scale_a", "transform": "swizzle"}}, "blocked_128x4"),
    ({"scale_a": {"kind": "log_uniform", "low": 0, "high": 1}}, "needs low > 0"),
    ({"scale_a": {"kind": "log_uniform", "low": 1, "high": 0.5}}, "must be below high"),
    ({"scale_a": {"kind": "log_uniform", "low": 1, "high": "K * Q"}}, "unknown name Q"),
    ({"a": {"kind": "log_uniform", "low": 1, "high": 2}}, "needs a tensor of float16"),
])
def test_new_value_domain_kinds_are_validated(domains, message):
    with pytest.raises(SchemaError, match="value_domains") as info:
        Definition.from_dict(_definition_with(**domains))
    assert any(message in m for _, m in info.value.errors), info.value.errors


@pytest.mark.parametrize("orders, message", [
    ({"c": [2, 0, 1]}, "'c' is not a tensor input"),
    ({"nope": [0]}, "'nope' is not a tensor input"),
    ({"a": [2, 0]}, "expected the 3 dimensions of 'a'"),
    ({"a": [2, 2, 1]}, "each once"),
    ({"a": [0, 1, 3]}, "each once"),
])
def test_storage_orders_are_validated(orders, message):
    data = small().to_dict()
    data["storage_orders"] = {**data.get("storage_orders", {}), **orders}
    with pytest.raises(SchemaError, match="storage_orders") as info:
        Definition.from_dict(data)
    assert any(message in m for _, m in info.value.errors), info.value.errors


def test_storage_orders_round_trip_and_count_in_the_content_hash():
    d = small()
    assert d.storage_orders == {name: [2, 0, 1] for name in ("a", "b", "scale_a", "scale_b")}
    assert Definition.from_dict(d.to_dict()) == d
    data = d.to_dict()
    del data["storage_orders"]
    plain = Definition.from_dict(data)
    assert plain.storage_orders == {} and "storage_orders" not in plain.to_dict()
    assert plain.content_hash() != d.content_hash()


def test_builtin_solution_leaves_the_blocked_scales_out_of_the_op_call():
    d = definition_for_name("nvfp4_gemv_m4096_k7168")
    solution = builtin.builtin_solution_for(d)
    own = read_own_op(solution)
    assert solution.spec.entry_point == "main.py::run" and own is not None and own.op == "nvfp4_gemv"
    assert own.inputs == {"a": "a", "b": "b", "scale_a": "scale_a", "scale_b": "scale_b",
                          "scale_a_permuted": None, "scale_b_permuted": None}
    assert "opforge.nvfp4_gemv(a=a, b=b, scale_a=scale_a, scale_b=scale_b)\n" in solution.sources[0].content


def test_shipped_triton_solutions_are_the_package_file():
    trace_set = builtin.load_builtin_trace_set()
    text = (Path(opforge.solutions.__file__).parent / "nvfp4_gemv_triton.py").read_text(encoding="utf-8")
    for m, k in builtin.NVFP4_GEMV_SHAPES:
        name = f"nvfp4_gemv_m{m}_k{k}"
        (solution,) = [s for s in trace_set.solutions[name] if s.name == f"{name}_triton"]
        assert solution.author == "opforge"
        assert str(solution.spec.language) == "triton" and solution.spec.destination_passing_style
        assert solution.spec.entry_point == "nvfp4_gemv_triton.py::triton_kernel"
        assert [s.path for s in solution.sources] == ["nvfp4_gemv_triton.py"]
        assert solution.sources[0].content == text, "regenerate: python -m opforge.trace.builtin --write ..."
    # Self-contained: it runs wherever the Solution is built, without opforge.
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(text))
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert imported - set(sys.stdlib_module_names) == {"torch", "triton"}
