"""The schema models: validation at construction, axis maths, constraints, expressions,
workload checks, solutions and evaluations."""

from __future__ import annotations

import json
import math

import pytest

from opforge.trace import (AxisConst, AxisVar, BuildSpec, ConstraintError, Correctness, Definition, DType,
                           Environment, Evaluation, EvaluationStatus, ExpressionError, IndptrDomain,
                           Performance, RandomInput, RangeDomain, SafetensorsInput, ScalarInput, SchemaError,
                           Solution, SourceFile, SupportedLanguages, TensorSpec, Tolerance, Trace, Workload,
                           WorkloadError)
from opforge.trace import expr

RMSNORM_REF = "import torch\n\ndef run(hidden_states, weight):\n    return hidden_states\n"


def rmsnorm(**overrides) -> Definition:
    fields = dict(
        name="rmsnorm_h4096", op_type="rmsnorm",
        axes={"batch_size": AxisVar(), "hidden_size": AxisConst(value=4096)},
        inputs={"hidden_states": TensorSpec(shape=["batch_size", "hidden_size"], dtype=DType.BFLOAT16),
                "weight": TensorSpec(shape=["hidden_size"], dtype="bfloat16")},
        outputs={"output": TensorSpec(shape=["batch_size", "hidden_size"], dtype="bfloat16")},
        reference=RMSNORM_REF,
    )
    fields.update(overrides)
    return Definition(**fields)


def paged() -> Definition:
    return Definition(
        name="gqa_paged_decode_h32_kv8_d128_ps1", op_type="gqa_paged",
        axes={"batch_size": AxisVar(), "num_pages": AxisVar(), "len_indptr": AxisVar(),
              "num_kv_indices": AxisVar(), "head_dim": AxisConst(value=128)},
        inputs={"q": TensorSpec(shape=["batch_size", "head_dim"], dtype="bfloat16"),
                "kv_indptr": TensorSpec(shape=["len_indptr"], dtype="int32"),
                "kv_indices": TensorSpec(shape=["num_kv_indices"], dtype="int32"),
                "sm_scale": TensorSpec(shape=None, dtype="float32")},
        outputs={"out": TensorSpec(shape=["batch_size", "head_dim"], dtype="bfloat16")},
        reference="def run(q, kv_indptr, kv_indices, sm_scale):\n    return q\n",
        constraints=["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1]"],
        value_domains={"kv_indptr": {"kind": "indptr", "total": "num_kv_indices"},
                       "kv_indices": {"low": 0, "high": "num_pages"}},
    )


def field_errors(exc_info) -> list[tuple[str, str]]:
    return exc_info.value.errors


# --- DType ----------------------------------------------------------------------------------


def test_dtype_values_itemsize_and_torch():
    import torch

    assert [d.value for d in DType] == ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                        "float4_e2m1", "float4_e2m1fn_x2", "int64", "int32", "int16", "int8", "uint8",
                                        "bool"]
    assert DType.INT64.itemsize == 8 and DType.BOOL.itemsize == 1
    # Raw bytes (packed FP4 pairs, E8M0 scales) as some public MoE Definitions declare them.
    assert DType.UINT8.is_int and DType.UINT8.itemsize == 1 and DType.UINT8.to_torch() is torch.uint8
    # Both FP4 spellings: a declared element is one byte of two values (FlashInfer-Bench's meaning)
    assert DType.FLOAT4_E2M1.itemsize == DType.FLOAT4_E2M1FN_X2.itemsize == 1
    assert DType.FLOAT4_E2M1.is_fp4 and DType.FLOAT4_E2M1FN_X2.is_fp4 and not DType.FLOAT8_E4M3FN.is_fp4
    for d in DType:
        if d in (DType.FLOAT4_E2M1, DType.FLOAT4_E2M1FN_X2) and not hasattr(torch, "float4_e2m1fn_x2"):
            continue
        # Both FP4 spellings are float4_e2m1fn_x2 tensors, whose shape counts bytes.
        want = DType.FLOAT4_E2M1FN_X2 if d is DType.FLOAT4_E2M1 else d
        assert DType.from_torch(d.to_torch()) is want
    assert DType.BFLOAT16.to_torch() is torch.bfloat16
    assert DType("float8_e4m3") is DType.FLOAT8_E4M3FN  # early FlashInfer-Trace spelling
    with pytest.raises(ValueError, match="float64 has no trace dtype"):
        DType.from_torch(torch.float64)
    assert str(DType.INT8) == "int8"


# --- Definition validation ----------------------------------------------------------------------


def test_definition_basics():
    d = rmsnorm()
    assert d.const_axes == {"hidden_size": 4096}
    assert d.var_axes == ["batch_size"]
    assert d.resolve_shapes({"batch_size": 3}) == {"hidden_states": (3, 4096), "weight": (4096,), "output": (3, 4096)}
    assert d.input_shapes({"batch_size": 0})["hidden_states"] == (0, 4096)
    assert d.output_shapes({"batch_size": 2, "hidden_size": 4096}) == {"output": (2, 4096)}
    assert d.io_bytes({"batch_size": 2}) == (2 * 4096 * 2) * 2 + 4096 * 2
    assert d.bytes_moved({"batch_size": 2}) == d.io_bytes({"batch_size": 2})
    assert d.flop_count({"batch_size": 2}) is None


@pytest.mark.parametrize("values, message", [
    ({}, "no value for variable axis 'batch_size'"),
    ({"batch_size": 1, "hidden_size": 8}, "axis 'hidden_size' is constant 4096, not 8"),
    ({"batch_size": 1, "seq": 3}, "unknown axis 'seq'"),
])
def test_resolve_shapes_errors_name_the_definition(values, message):
    with pytest.raises(ValueError, match=message) as info:
        rmsnorm().resolve_shapes(values)
    assert str(info.value).startswith("rmsnorm_h4096: ")


@pytest.mark.parametrize("overrides, field, message", [
    (dict(inputs={"hidden_states": TensorSpec(shape=["batch_size", "hidden"], dtype="bfloat16")}),
     "inputs.hidden_states.shape[1]", "axis 'hidden' is not declared in axes (declared: batch_size, hidden_size)"),
    (dict(outputs={"output": TensorSpec(shape=["rows"], dtype="bfloat16")}),
     "outputs.output.shape[0]", "axis 'rows' is not declared"),
    (dict(outputs={"weight": TensorSpec(shape=["hidden_size"], dtype="bfloat16")}),
     "outputs.weight", "'weight' is also the name of an input"),
    (dict(reference="import torch\n\ndef forward(x):\n    return x\n"), "reference", "defines no top-level function 'run'"),
    (dict(reference="def run(x:\n    return x\n"), "reference", "invalid Python"),
    (dict(reference="class K:\n    def run(self):\n        pass\n"), "reference", "no top-level function 'run'"),
    (dict(name=""), "name", "non-empty"),
    (dict(name="rms/norm"), "name", "cannot be used as a file name"),
    (dict(name=".."), "name", "cannot be used as a file name"),
    (dict(op_type="a\\b"), "op_type", "cannot be used as a file name"),
    (dict(axes={"batch_size": AxisVar(), "hidden_size": {"type": "const", "value": 0}}),
     "axes.hidden_size.value", "greater than 0"),
    (dict(axes={"batch_size": AxisVar(), "hidden_size": {"type": "const", "value": 4096.5}}),
     "axes.hidden_size.value", "integer"),
    (dict(axes={"batch_size": {"type": "variable"}, "hidden_size": AxisConst(value=4)}),
     "axes.batch_size", "type 'variable' is not one of const, var"),
    (dict(inputs={"weight": {"shape": ["hidden_size"], "dtype": "float99"}}),
     "inputs.weight.dtype", "'float99' is not one of float32, float16, bfloat16, float8_e4m3fn"),
    (dict(constraints=["batch_size >"]), "constraints[0]", "malformed expression"),
    (dict(constraints=["__import__('os').system('true')"]), "constraints[0]", "not allowed"),
    (dict(constraints=["batch_size < max_batch"]), "constraints[0]", "unknown name max_batch"),
    (dict(tolerances={"out": Tolerance(atol=1e-2, rtol=1e-2)}), "tolerances.out", "'out' is not an output"),
    (dict(tolerances={"output": {"atol": -1, "rtol": 0}}), "tolerances.output.atol", "greater than or equal to 0"),
    (dict(aliases={"output": "weight"}), "aliases.output", "shapes and dtypes differ"),
    (dict(aliases={"output": "x"}), "aliases.output", "'x' is not an input"),
    (dict(value_domains={"weight": {"kind": "indptr", "total": 4}}), "value_domains.weight", "1-D integer input"),
    (dict(value_domains={"weight": {"low": 1, "high": 1}}), "value_domains.weight", "low (1) must be below high (1)"),
    (dict(value_domains={"weight": {"kind": "zipf"}}), "value_domains.weight", "kind must be 'range', 'indptr', 'log_uniform' or 'derived'"),
    (dict(value_domains={"nope": {"low": 0, "high": 1}}), "value_domains.nope", "'nope' is not an input"),
    (dict(bytes="batch_size * hidden_size * dtype_size + warp"), "bytes", "unknown name warp"),
    (dict(flops="open('x')"), "flops", "calling 'open' is not allowed"),
])
def test_definition_rejects(overrides, field, message):
    with pytest.raises(SchemaError) as info:
        rmsnorm(**overrides)
    fields = field_errors(info)
    assert any(f == field and message in m for f, m in fields), fields
    assert str(info.value).startswith("invalid Definition: ")


def test_schema_error_lists_every_problem():
    with pytest.raises(SchemaError) as info:
        Definition.from_dict({"name": "x", "axes": {}, "inputs": {"a": {"shape": None, "dtype": "f"}},
                              "outputs": {}, "reference": "def run(a): pass"})
    fields = [f for f, _ in info.value.errors]
    assert "op_type" in fields and "inputs.a.dtype" in fields
    assert "2 problems" in str(info.value)


def test_extensions():
    d = rmsnorm(tolerances={"output": Tolerance(atol=1e-2, rtol=2e-2)}, aliases={"output": "hidden_states"},
                value_domains={"weight": {"low": -1.0, "high": 1.0}},
                bytes="2*batch_size*hidden_size*dtype_size + hidden_size*weight_itemsize",
                flops="4*batch_size*hidden_size")
    assert d.tolerance("output") == Tolerance(atol=1e-2, rtol=2e-2)
    assert d.tolerance("nope") is None
    assert d.bytes_moved({"batch_size": 8}) == 2 * 8 * 4096 * 2 + 4096 * 2
    assert d.flop_count({"batch_size": 8}) == 4 * 8 * 4096
    assert d.eval_expr("bfloat16 + float4_e2m1 + cdiv(hidden_size, 1000)", {}) == 2 + 1 + 5  # itemsizes
    assert isinstance(d.value_domains["weight"], RangeDomain)
    assert d.resolve_value_domain("weight", {"batch_size": 1}) == {"kind": "range", "low": -1.0, "high": 1.0,
                                                                    "unique": False}
    assert d.resolve_value_domain("hidden_states", {"batch_size": 1}) is None


def test_value_domains_resolve_expressions():
    d = paged()
    assert isinstance(d.value_domains["kv_indptr"], IndptrDomain)
    axes = {"batch_size": 3, "num_pages": 50, "len_indptr": 4, "num_kv_indices": 20}
    assert d.resolve_value_domain("kv_indptr", axes) == {"kind": "indptr", "total": 20, "within": None,
                                                         "page_size": None}
    assert d.resolve_value_domain("kv_indices", axes)["high"] == 50


def _with_query_offsets(**domain) -> dict:
    data = paged().to_dict()
    data["inputs"]["qo_indptr"] = {"shape": ["len_indptr"], "dtype": "int32"}
    data["reference"] = "def run(q, kv_indptr, kv_indices, sm_scale, qo_indptr):\n    return q\n"
    data["value_domains"]["qo_indptr"] = {"kind": "indptr", "total": "batch_size", **domain}
    return data


def test_an_indptr_within_another_resolves_and_round_trips():
    d = Definition.from_dict(_with_query_offsets(within="kv_indptr", page_size="head_dim // 64"))
    axes = {"batch_size": 3, "num_pages": 50, "len_indptr": 4, "num_kv_indices": 20}
    assert d.resolve_value_domain("qo_indptr", axes) == {"kind": "indptr", "total": 3, "within": "kv_indptr",
                                                         "page_size": 2}
    assert Definition.from_dict(d.to_dict()) == d
    # Without the pairing the file keeps its old form: no within / page_size keys written.
    assert set(paged().to_dict()["value_domains"]["kv_indptr"]) == {"kind", "total"}


@pytest.mark.parametrize("domain,field,message", [
    ({"within": "nope"}, "value_domains.qo_indptr.within", "'nope' is not another input"),
    ({"within": "qo_indptr"}, "value_domains.qo_indptr.within", "is not another input"),
    ({"within": "q"}, "value_domains.qo_indptr.within", "is not an integer input of 'qo_indptr'"),
    ({"within": "kv_indices"}, "value_domains.qo_indptr.within", "is not an integer input of 'qo_indptr'"),
    ({"page_size": 4}, "value_domains.qo_indptr.page_size", "page_size needs within"),
    ({"within": "kv_indptr", "page_size": "no_such_axis"}, "value_domains.qo_indptr.page_size", "no_such_axis"),
])
def test_bad_within_pairings_are_schema_errors(domain, field, message):
    with pytest.raises(SchemaError) as info:
        Definition.from_dict(_with_query_offsets(**domain))
    assert any(f == field and message in m for f, m in field_errors(info)), field_errors(info)


def test_an_indptr_cannot_be_within_one_that_is_within_another_or_not_an_indptr():
    data = _with_query_offsets(within="kv_indptr")
    data["value_domains"]["kv_indptr"] = {"kind": "indptr", "total": "num_kv_indices", "within": "qo_indptr"}
    with pytest.raises(SchemaError, match="must be an indptr drawn on its own"):
        Definition.from_dict(data)
    data = _with_query_offsets(within="kv_indptr")
    data["value_domains"]["kv_indptr"] = {"low": 0, "high": 4}
    with pytest.raises(SchemaError, match="must be an indptr drawn on its own"):
        Definition.from_dict(data)


# --- constraints and expressions ----------------------------------------------------------------


def test_constraints_true_false_and_data_dependent():
    import torch

    d = paged()
    d.check_constraints({"batch_size": 3, "num_pages": 9, "len_indptr": 4, "num_kv_indices": 7})
    with pytest.raises(ConstraintError) as info:
        d.check_constraints({"batch_size": 3, "num_pages": 9, "len_indptr": 5, "num_kv_indices": 7})
    assert info.value.definition == d.name and info.value.constraint == "len_indptr == batch_size + 1"
    assert "does not hold for batch_size=3, len_indptr=5" in str(info.value)
    axes = {"batch_size": 2, "num_pages": 9, "len_indptr": 3, "num_kv_indices": 7}
    d.check_constraints(axes, tensors={"kv_indptr": torch.tensor([0, 3, 7])})
    with pytest.raises(ConstraintError, match=r"num_kv_indices == kv_indptr\[-1\]"):
        d.check_constraints(axes, tensors={"kv_indptr": torch.tensor([0, 3, 6])})


@pytest.mark.parametrize("text", [
    "__import__('os')", "().__class__", "x.__class__", "open('f')", "lambda: 1", "[i for i in (1, 2)]",
    "'abc' == 'abc'", "min(1, key=2)", "x.real", "getattr(x, 'y')",
])
def test_unsafe_expressions_are_refused(text):
    with pytest.raises(ExpressionError):
        expr.evaluate(text, {"x": 1})


@pytest.mark.parametrize("text, value", [
    ("a + b * 2", 7), ("a < b <= 3", True), ("a if a > b else b", 3), ("not a", False),
    ("cdiv(b, 2) + max(a, b) + ceil(0.5)", 6), ("b ** 2 % 5", 4), ("-a // 2", -1), ("a and b", 3),
])
def test_expressions_evaluate(text, value):
    assert expr.evaluate(text, {"a": 1, "b": 3}) == value


def test_expression_errors():
    with pytest.raises(ExpressionError, match="malformed"):
        expr.evaluate("a +", {"a": 1})
    with pytest.raises(ExpressionError, match="no value for 'z'"):
        expr.evaluate("z + 1", {})
    with pytest.raises(ExpressionError, match="too large"):
        expr.evaluate("2 ** 10 ** 9", {})
    with pytest.raises(ExpressionError, match="ZeroDivisionError"):
        expr.evaluate("1 // a", {"a": 0})
    assert expr.names("cdiv(a, b) + pi + c.shape[0]") == {"a", "b", "c"}


def test_constraint_that_cannot_be_evaluated():
    d = rmsnorm(constraints=["hidden_size % batch_size == 0"])
    d.check_constraints({"batch_size": 4})
    with pytest.raises(ConstraintError, match="cannot be evaluated: .*ZeroDivisionError"):
        d.check_constraints({"batch_size": 0})


# --- reference and hashes -------------------------------------------------------------------


def test_reference_fn_runs_the_reference():
    import torch

    d = rmsnorm(reference="import torch\n\ndef run(hidden_states, weight):\n    return hidden_states * 2\n")
    assert torch.equal(d.reference_fn()(torch.ones(2), None), torch.full((2,), 2.0))
    broken = rmsnorm(reference="import not_a_module_anywhere\n\ndef run(x):\n    return x\n")
    with pytest.raises(RuntimeError, match="rmsnorm_h4096: reference failed to load: ModuleNotFoundError"):
        broken.reference_fn()


def test_content_hash_tracks_meaning_not_prose():
    base = rmsnorm()
    assert base.content_hash() == rmsnorm(description="words", tags=["a:b"]).content_hash()
    assert base.content_hash() == Definition.from_json(base.to_json()).content_hash()
    assert base.content_hash() != rmsnorm(reference=RMSNORM_REF + "# changed\n").content_hash()
    assert base.content_hash() != rmsnorm(axes={"batch_size": AxisVar(), "hidden_size": AxisConst(value=2048)}).content_hash()
    assert len(base.content_hash()) == 64


# --- workloads ------------------------------------------------------------------------------


def test_check_workload_accepts_fitting_workloads():
    d = paged()
    w = Workload(uuid="w1", axes={"batch_size": 2, "num_pages": 9, "len_indptr": 3, "num_kv_indices": 7},
                 inputs={"q": RandomInput(), "kv_indptr": RandomInput(),
                         "kv_indices": SafetensorsInput(path="blob/x.safetensors", tensor_key="kv_indices"),
                         "sm_scale": ScalarInput(value=0.088)}, seed=3)
    d.check_workload(w)
    rmsnorm().check_workload(Workload(uuid="w2", axes={"batch_size": 5, "hidden_size": 4096},
                                      inputs={"hidden_states": RandomInput(), "weight": RandomInput()}))


@pytest.mark.parametrize("axes, inputs, field, message", [
    ({}, None, "axes", "no value for variable axis 'batch_size'"),
    ({"batch_size": 1, "seq_len": 2}, None, "axes.seq_len", "has no axis 'seq_len'"),
    ({"batch_size": 1, "hidden_size": 8}, None, "axes.hidden_size", "constant 4096"),
    ({"batch_size": 1}, {"weight": None}, "inputs", "no data source for input 'weight'"),
    ({"batch_size": 1}, {"bias": {"type": "random"}}, "inputs.bias", "has no input 'bias'"),
    ({"batch_size": 1}, {"hidden_states": {"type": "scalar", "value": 1.0}}, "inputs.hidden_states", "a scalar value"),
    ({"batch_size": 70000}, None, "axes", "constraint 'batch_size <= 65536' does not hold for batch_size=70000"),
])
def test_check_workload_rejects(axes, inputs, field, message):
    d = rmsnorm(constraints=["batch_size <= 65536"])
    full_inputs = {"hidden_states": {"type": "random"}, "weight": {"type": "random"}}
    full_inputs.update(inputs or {})
    full_inputs = {k: v for k, v in full_inputs.items() if v is not None}
    w = Workload.from_dict({"uuid": "w-bad", "axes": axes, "inputs": full_inputs})
    with pytest.raises(WorkloadError) as info:
        d.check_workload(w)
    assert info.value.field == field and message in info.value.message, str(info.value)
    assert str(info.value).startswith("rmsnorm_h4096: workload w-bad: ")


def test_scalar_inputs_must_match_their_dtype():
    d = paged()
    base = {"q": RandomInput(), "kv_indptr": RandomInput(), "kv_indices": RandomInput()}
    axes = {"batch_size": 2, "num_pages": 9, "len_indptr": 3, "num_kv_indices": 7}
    with pytest.raises(WorkloadError, match="needs .*scalar"):
        d.check_workload(Workload(uuid="a", axes=axes, inputs={**base, "sm_scale": RandomInput()}))
    with pytest.raises(WorkloadError, match="is not a number"):
        d.check_workload(Workload(uuid="a", axes=axes, inputs={**base, "sm_scale": ScalarInput(value=True)}))
    d.check_workload(Workload(uuid="a", axes=axes, inputs={**base, "sm_scale": ScalarInput(value=1)}))


@pytest.mark.parametrize("data, field", [
    ({"uuid": "", "axes": {}, "inputs": {}}, "uuid"),
    ({"uuid": "u", "axes": {"b": -1}, "inputs": {}}, "axes.b"),
    ({"uuid": "u", "axes": {"b": True}, "inputs": {}}, "axes.b"),
    ({"uuid": "u", "axes": {}, "inputs": {"x": {"type": "file"}}}, "inputs.x"),
    ({"uuid": "u", "axes": {}, "inputs": {"x": {"type": "safetensors", "path": "a"}}}, "inputs.x.tensor_key"),
    ({"uuid": "u", "axes": {}, "inputs": {"x": {"type": "scalar"}}}, "inputs.x.value"),
])
def test_workload_rejects(data, field):
    with pytest.raises(SchemaError) as info:
        Workload.from_dict(data)
    assert field in [f for f, _ in info.value.errors], info.value.errors


# --- solutions ------------------------------------------------------------------------------


def solution(**overrides) -> Solution:
    fields = dict(name="rmsnorm_triton_v1", definition="rmsnorm_h4096", author="alice",
                  spec=BuildSpec(language=SupportedLanguages.TRITON, entry_point="kernel.py::run",
                                 destination_passing_style=False),
                  sources=[SourceFile(path="kernel.py", content="import torch\n\ndef run(hidden_states, weight):\n    pass\n")])
    fields.update(overrides)
    return Solution(**fields)


def test_solution_defaults_and_helpers():
    s = solution()
    assert s.spec.target_hardware == ["cuda"]
    assert BuildSpec(language="python", entry_point="m.py::run").target_hardware == ["cpu", "cuda"]
    assert BuildSpec(language="cuda", entry_point="k.cu::run").destination_passing_style is True
    assert s.get_entry_source().path == "kernel.py"
    assert s.spec.entry_symbol == "run" and s.spec.entry_path == "kernel.py"
    assert s.content_hash() == solution(name="other", author="bob", description="x").content_hash()
    changed = solution(sources=[SourceFile(path="kernel.py", content="def run(a, b):\n    return a\n")])
    assert changed.content_hash() != s.content_hash()
    assert [lang.value for lang in SupportedLanguages] == ["python", "pytorch", "triton", "tilelang", "cutedsl",
                                                          "cuda", "cpp", "builtin"]


def test_pytorch_is_written_as_python(tmp_path):
    """A "pytorch" solution (seed 003 registers them so) keeps its label in memory, for tables, and
    is written as "python", which FlashInfer-Bench reads; its content hash is the python record's,
    and the written file reads back as python."""
    torch_solution = solution(spec={"language": "pytorch", "entry_point": "kernel.py::run"})
    python_solution = solution(spec={"language": "python", "entry_point": "kernel.py::run"})
    assert torch_solution.spec.language == "pytorch" and torch_solution.spec.target_hardware == ["cpu", "cuda"]
    assert torch_solution.to_dict()["spec"]["language"] == "python"
    assert json.loads(torch_solution.to_json())["spec"]["language"] == "python"
    assert torch_solution.content_hash() == python_solution.content_hash()
    assert Solution.from_dict(torch_solution.to_dict()).spec.language == "python"


@pytest.mark.parametrize("make, field, message", [
    (lambda: SourceFile(path="../x.py", content=""), "path", "must not contain '..'"),
    (lambda: SourceFile(path="/abs/x.py", content=""), "path", "must be relative"),
    (lambda: BuildSpec(language="triton", entry_point="kernel.py"), "entry_point", "'file::symbol'"),
    (lambda: BuildSpec(language="triton", entry_point="kernel.py::run::x"), "entry_point", "'file::symbol'"),
    (lambda: BuildSpec(language="triton", entry_point="kernel.py::1run"), "entry_point", "not a valid symbol"),
    (lambda: BuildSpec(language="fortran", entry_point="k.f::run"), "language", "'fortran' is not one of python"),
    (lambda: BuildSpec(language="cuda", entry_point="k.cu::run", target_hardware=[]), "target_hardware", "at least 1"),
    (lambda: BuildSpec(language="cuda", entry_point="k.cu::run", binding="pybind"), "binding", "not one of tvm-ffi, torch"),
    (lambda: solution(spec=BuildSpec(language="triton", entry_point="main.py::run")), "spec.entry_point",
     "entry file 'main.py' is not among the sources"),
    (lambda: solution(spec=BuildSpec(language="triton", entry_point="kernel.py::forward")), "spec.entry_point",
     "kernel.py defines no top-level 'forward'"),
    (lambda: solution(sources=[SourceFile(path="kernel.py", content="def run(:\n")]), "sources[0].content",
     "invalid Python"),
    (lambda: solution(sources=[SourceFile(path="kernel.py", content="def run(): pass"),
                               SourceFile(path="kernel.py", content="")]), "sources[1].path", "appears twice"),
    (lambda: solution(sources=[]), "sources", "at least 1"),
    (lambda: solution(author="a/b"), "author", "cannot be used as a file name"),
])
def test_solution_rejects(make, field, message):
    with pytest.raises(SchemaError) as info:
        make()
    assert any(f == field and message in m for f, m in info.value.errors), info.value.errors


def test_entry_symbol_found_through_imports_and_assignments():
    for content in ("from .impl import run\n", "run = compiled\n", "import run\n", "from x import *\n",
                    "try:\n    from a import run\nexcept ImportError:\n    pass\n"):
        solution(sources=[SourceFile(path="kernel.py", content=content)])
    cuda = solution(spec=BuildSpec(language="cuda", entry_point="k.cu::launch", binding="torch"),
                    sources=[SourceFile(path="k.cu", content="// no python check for CUDA\n")])
    assert cuda.spec.binding == "torch"


# --- evaluations and traces -----------------------------------------------------------------


ENV = Environment(hardware="NVIDIA_H100", libs={"torch": "2.6.0"})


def test_evaluation_metrics_follow_status():
    ok = Evaluation(status=EvaluationStatus.PASSED, environment=ENV, timestamp="2025-06-27T12:45:00Z",
                    correctness=Correctness(max_relative_error=1e-5, max_absolute_error=1e-5),
                    performance=Performance(latency_ms=0.008, reference_latency_ms=0.019, speedup_factor=2.375))
    assert ok.status == "PASSED"
    Evaluation(status="INCORRECT_NUMERICAL", environment=ENV, timestamp="t",
               correctness=Correctness(max_relative_error=math.nan, max_absolute_error=math.inf))
    Evaluation(status="COMPILE_ERROR", environment=ENV, timestamp="t", log="nvcc: error")
    cases = [
        (dict(status="PASSED"), "correctness", "required when status is PASSED"),
        (dict(status="PASSED", correctness=Correctness()), "performance", "required when status is PASSED"),
        (dict(status="TIMEOUT", correctness=Correctness()), "correctness", "must be null when status is TIMEOUT"),
        (dict(status="INCORRECT_NUMERICAL", correctness=Correctness(), performance=Performance()), "performance",
         "must be null"),
        (dict(status="SLOW"), "status", "'SLOW' is not one of PASSED, INCORRECT_SHAPE"),
        (dict(status="PASSED", correctness={"max_relative_error": -1.0}), "correctness.max_relative_error",
         "non-negative"),
    ]
    for kwargs, field, message in cases:
        with pytest.raises(SchemaError) as info:
            Evaluation(environment=ENV, timestamp="t", **kwargs)
        assert any(f == field and message in m for f, m in info.value.errors), (kwargs, info.value.errors)
    assert [s.value for s in EvaluationStatus] == ["PASSED", "INCORRECT_SHAPE", "INCORRECT_NUMERICAL",
                                                    "INCORRECT_DTYPE", "RUNTIME_ERROR", "COMPILE_ERROR", "TIMEOUT"]


def test_trace_kinds():
    w = Workload(uuid="u", axes={"batch_size": 1}, inputs={})
    assert Trace(definition="d", workload=w).is_workload_trace()
    failed = Trace(definition="d", workload=w, solution="s",
                   evaluation=Evaluation(status="RUNTIME_ERROR", environment=ENV, timestamp="t"))
    assert not failed.is_workload_trace() and not failed.is_successful()
    with pytest.raises(SchemaError, match="solution: an evaluation needs the name"):
        Trace(definition="d", workload=w, evaluation=failed.evaluation)


def test_errors_survive_pickling():
    import pickle

    from opforge.trace import LoadError

    with pytest.raises(SchemaError) as schema_info:
        rmsnorm(name="")
    with pytest.raises(WorkloadError) as workload_info:
        rmsnorm().check_workload(Workload(uuid="u", axes={}, inputs={}))
    with pytest.raises(ConstraintError) as constraint_info:
        paged().check_constraints({"batch_size": 1, "num_pages": 1, "len_indptr": 1, "num_kv_indices": 1})
    for exc in (schema_info.value, workload_info.value, constraint_info.value, LoadError("a.json", "name", "bad", 3)):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
    assert pickle.loads(pickle.dumps(rmsnorm())) == rmsnorm()
