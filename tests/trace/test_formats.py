"""The JSON forms: exact shapes of each object, FlashInfer-Trace files read as written, lossless
and byte-stable round trips, and the package importing without torch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import opforge.trace as trace_pkg
from opforge.trace import (AxisConst, AxisVar, BuildSpec, Correctness, Definition, DType, Environment, Evaluation,
                           Performance, RandomInput, SafetensorsInput, ScalarInput, SchemaError, Solution,
                           SourceFile, TensorSpec, Trace, Workload)

PUBLIC = Path(__file__).parent / "fixtures" / "public"


def public_json(relative: str) -> dict:
    return json.loads((PUBLIC / relative).read_text())


def public_lines(relative: str) -> list[dict]:
    return [json.loads(line) for line in (PUBLIC / relative).read_text().splitlines() if line.strip()]


def assert_preserved(original, saved, where="") -> None:
    """Every field of the original is in the saved form with the same value (the saved form may
    add fields the original left at their defaults)."""
    if isinstance(original, dict):
        assert isinstance(saved, dict), where
        for key, value in original.items():
            assert key in saved, f"{where}.{key} lost"
            assert_preserved(value, saved[key], f"{where}.{key}")
    elif isinstance(original, float) and math.isnan(original):
        assert isinstance(saved, float) and math.isnan(saved), where
    else:
        assert original == saved, f"{where}: {original!r} != {saved!r}"


# --- exact JSON of each object ---------------------------------------------------------------


def test_json_shapes_of_small_objects():
    assert AxisConst(value=4096).to_dict() == {"type": "const", "value": 4096, "description": None}
    assert AxisVar().to_dict() == {"type": "var", "description": None}
    assert TensorSpec(shape=None, dtype="float32").to_dict() == {"shape": None, "dtype": "float32", "description": None}
    assert RandomInput().to_dict() == {"type": "random"}
    assert ScalarInput(value=1e-6).to_dict() == {"type": "scalar", "value": 1e-6}
    assert SafetensorsInput(path="blob/a.safetensors", tensor_key="x").to_dict() == {
        "type": "safetensors", "path": "blob/a.safetensors", "tensor_key": "x"}
    w = Workload(uuid="u1", axes={"batch_size": 3}, inputs={"x": RandomInput()})
    assert list(w.to_dict()) == ["axes", "inputs", "uuid"]
    assert Workload(uuid="u1", axes={}, inputs={}, seed=7).to_dict()["seed"] == 7
    spec = BuildSpec(language="triton", target_hardware=["NVIDIA_H100"], entry_point="main.py::run")
    assert spec.to_dict() == {"language": "triton", "target_hardware": ["NVIDIA_H100"], "entry_point": "main.py::run",
                              "dependencies": [], "destination_passing_style": True, "binding": None}


def test_json_shapes_of_definition_solution_trace():
    d = Definition(name="gemm_n4096_k4096", op_type="gemm",
                   axes={"M": AxisVar(), "N": AxisConst(value=4096), "K": AxisConst(value=4096)},
                   inputs={"A": TensorSpec(shape=["M", "K"], dtype="float16"),
                           "B": TensorSpec(shape=["N", "K"], dtype="float16")},
                   outputs={"C": TensorSpec(shape=["M", "N"], dtype="float16")},
                   reference="def run(A, B):\n    return A @ B.T\n")
    assert list(d.to_dict()) == ["name", "op_type", "axes", "inputs", "outputs", "reference", "tags",
                                 "description", "constraints"]
    extended = Definition(**{**d.model_dump(), "tolerances": {"C": {"atol": 0.01, "rtol": 0.01}},
                             "flops": "2*M*N*K"})
    assert list(extended.to_dict())[-2:] == ["tolerances", "flops"]
    s = Solution(name="gemm_torch", definition=d.name, author="bob",
                 spec=BuildSpec(language="python", entry_point="main.py::run", destination_passing_style=False),
                 sources=[SourceFile(path="main.py", content="def run(A, B):\n    return A @ B.T\n")])
    assert list(s.to_dict()) == ["name", "definition", "author", "spec", "sources", "description"]
    t = Trace(definition=d.name, workload=Workload(uuid="u", axes={"M": 8}, inputs={"A": RandomInput(), "B": RandomInput()}),
              solution="gemm_torch",
              evaluation=Evaluation(status="PASSED", environment=Environment(hardware="NVIDIA_H100"), timestamp="t",
                                    correctness=Correctness(), performance=Performance(latency_ms=1.0, achieved_gbps=10.0),
                                    definition_hash=d.content_hash()))
    data = t.to_dict()
    assert list(data) == ["definition", "workload", "solution", "evaluation"]
    assert list(data["evaluation"]) == ["status", "environment", "timestamp", "log", "correctness", "performance",
                                        "definition_hash"]
    assert data["evaluation"]["correctness"] == {"max_relative_error": 0.0, "max_absolute_error": 0.0, "extra": None}
    assert data["evaluation"]["performance"] == {"latency_ms": 1.0, "reference_latency_ms": 0.0, "speedup_factor": 0.0,
                                                 "achieved_gbps": 10.0}
    assert Trace(definition="x", workload=Workload(uuid="u", axes={}, inputs={})).to_dict() == {
        "definition": "x", "workload": {"axes": {}, "inputs": {}, "uuid": "u"}, "solution": None, "evaluation": None}


def test_text_forms():
    w = Workload(uuid="u", axes={"b": 2}, inputs={"eps": ScalarInput(value=1e-05)})
    assert w.to_json(indent=None) == '{"axes":{"b":2},"inputs":{"eps":{"type":"scalar","value":1e-05}},"uuid":"u"}'
    assert w.to_json() == json.dumps(w.to_dict(), indent=2) + "\n"
    assert Workload.from_json(w.to_json()) == w
    snowman = Definition.from_json(public_text("definitions/rmsnorm/rmsnorm_h4096.json")).model_copy(
        update={"description": "Schnee \u2603"})
    assert "\u2603" in snowman.to_json()  # UTF-8, not \\u escapes


def public_text(relative: str) -> str:
    return (PUBLIC / relative).read_text()


def test_non_finite_floats_round_trip_as_strings():
    c = Correctness(max_relative_error=math.nan, max_absolute_error=math.inf)
    assert c.to_json(indent=None) == '{"max_relative_error":"NaN","max_absolute_error":"Infinity","extra":null}'
    back = Correctness.from_json(c.to_json())
    assert math.isnan(back.max_relative_error) and back.max_absolute_error == math.inf
    assert Correctness.from_json('{"max_relative_error": NaN, "max_absolute_error": 1.0}').to_json(indent=None).startswith(
        '{"max_relative_error":"NaN"')


# --- FlashInfer-Trace files ------------------------------------------------------------------


def test_public_definitions_read():
    d = Definition.from_json(public_text("definitions/rmsnorm/rmsnorm_h4096.json"))
    assert d.name == "rmsnorm_h4096" and d.op_type == "rmsnorm"
    assert list(d.inputs) == ["hidden_states", "weight"] and list(d.outputs) == ["output"]
    assert d.const_axes == {"hidden_size": 4096} and d.var_axes == ["batch_size"]
    assert "EPS = 1e-5" in d.reference
    fused = Definition.from_json(public_text("definitions/rmsnorm/fused_add_rmsnorm_h7168.json"))
    assert list(fused.inputs) == ["hidden_states", "residual", "weight"]
    assert fused.inputs["residual"].dtype is DType.BFLOAT16 and "EPS = 1e-6" in fused.reference
    scalar = Definition.from_json(public_text("definitions/rmsnorm/rmsnorm_d128.json"))
    assert scalar.inputs["eps"].shape is None and scalar.axes["batch_size"].description == "Rows."


def test_public_definition_runs_its_reference():
    import torch

    d = Definition.from_json(public_text("definitions/rmsnorm/rmsnorm_h4096.json"))
    x = torch.randn(3, 4096, dtype=torch.bfloat16)
    w = torch.randn(4096, dtype=torch.bfloat16)
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    torch.testing.assert_close(d.reference_fn()(x, w), ref.to(torch.bfloat16))


@pytest.mark.parametrize("relative, model", [
    ("definitions/rmsnorm/rmsnorm_h4096.json", Definition),
    ("definitions/rmsnorm/fused_add_rmsnorm_h7168.json", Definition),
    ("definitions/rmsnorm/rmsnorm_d128.json", Definition),
    ("solutions/alice/rmsnorm/rmsnorm_h4096/rmsnorm_h4096_torch.json", Solution),
])
def test_public_objects_lose_nothing(relative, model):
    original = public_json(relative)
    obj = model.from_dict(original)
    assert_preserved(original, obj.to_dict())
    assert model.from_dict(obj.to_dict()) == obj
    text = obj.to_json()
    assert model.from_json(text).to_json() == text  # byte-stable once written


@pytest.mark.parametrize("relative", ["workloads/rmsnorm/rmsnorm_h4096.jsonl", "workloads/rmsnorm/rmsnorm_d128.jsonl",
                                      "traces/alice/rmsnorm/rmsnorm_h4096.jsonl"])
def test_public_lines_lose_nothing(relative):
    lines = (PUBLIC / relative).read_text().splitlines()
    for raw, original in zip(lines, public_lines(relative)):
        t = Trace.from_json(raw)
        assert_preserved(_nan_aware(original), t.to_dict())
        line = t.to_json(indent=None)
        assert Trace.from_json(line).to_json(indent=None) == line


def test_lines_written_by_flashinfer_bench_resave_identically():
    for raw in public_text("traces/alice/rmsnorm/rmsnorm_h4096.jsonl").splitlines()[:1]:
        assert Trace.from_json(raw).to_json(indent=None) == raw


def _nan_aware(value):
    if isinstance(value, dict):
        return {k: _nan_aware(v) for k, v in value.items()}
    if value == "NaN":
        return math.nan
    if value == "Infinity":
        return math.inf
    return value


def test_unknown_fields_are_kept():
    data = public_json("definitions/rmsnorm/rmsnorm_h4096.json")
    data["custom_inputs_entrypoint"] = None
    data["axes"]["batch_size"]["parent"] = "tokens"
    d = Definition.from_dict(data)
    out = d.to_dict()
    assert "custom_inputs_entrypoint" in out and out["axes"]["batch_size"]["parent"] == "tokens"
    line = json.loads(public_text("traces/alice/rmsnorm/rmsnorm_h4096.jsonl").splitlines()[0])
    line["evaluation"]["performance"]["profile"] = [{"name": "k", "duration_ns": 5}]
    assert Trace.from_dict(line).to_dict()["evaluation"]["performance"]["profile"] == [{"name": "k", "duration_ns": 5}]


def test_early_spellings_are_read():
    data = public_json("definitions/rmsnorm/fused_add_rmsnorm_h7168.json")
    data["type"] = data.pop("op_type")
    data["inputs"]["weight"]["dtype"] = "float8_e4m3"
    data["tags"] = None
    d = Definition.from_dict(data)
    assert d.op_type == "rmsnorm" and d.inputs["weight"].dtype is DType.FLOAT8_E4M3FN and d.tags == []
    out = d.to_dict()
    assert out["op_type"] == "rmsnorm" and "type" not in out and out["inputs"]["weight"]["dtype"] == "float8_e4m3fn"


def test_duplicate_keys_are_refused():
    from opforge.trace._base import DuplicateKeyError

    text = '{"name": "a", "name": "b"}'
    with pytest.raises(DuplicateKeyError, match="'name' appears twice"):
        Definition.from_json(text)


def test_models_are_compared_by_content():
    a = Definition.from_json(public_text("definitions/rmsnorm/rmsnorm_h4096.json"))
    b = Definition.from_json(a.to_json())
    assert a == b and a is not b


def test_schema_error_is_a_value_error():
    with pytest.raises(ValueError):
        TensorSpec(shape=["a"], dtype="float99")
    with pytest.raises(SchemaError, match=r"invalid TensorSpec: dtype: 'float99' is not one of"):
        TensorSpec(shape=["a"], dtype="float99")


def test_import_needs_no_torch():
    """The trace package imports without torch (checked with a stand-in parent package, since
    importing opforge itself loads the compiled extension)."""
    package_dir = Path(trace_pkg.__file__).parent.parent
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('opforge'); pkg.__path__ = [{str(package_dir)!r}]; sys.modules['opforge'] = pkg\n"
        "import opforge.trace as t\n"
        "d = t.Definition.from_json(open(sys.argv[1]).read())\n"
        "t.TraceSet(definitions=[d]).to_dict()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'opforge._C' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(PUBLIC / "definitions/rmsnorm/rmsnorm_h4096.json")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_files_that_leave_optional_fields_out_are_copied_as_they_are(tmp_path):
    """A FlashInfer-Trace dataset whose definition and solution leave out description, tags,
    constraints and per-tensor descriptions: a copy through opforge (TraceSet.save_dataset, what
    `opforge run --output` does) writes the same bytes, and content hashes do not depend on it."""
    import json

    from opforge.trace import Definition, Solution, TraceSet

    definition = {"name": "mul_h8", "op_type": "mul",
                  "axes": {"batch": {"type": "var"}, "hidden": {"type": "const", "value": 8}},
                  "inputs": {"x": {"shape": ["batch", "hidden"], "dtype": "float32"}},
                  "outputs": {"y": {"shape": ["batch", "hidden"], "dtype": "float32"}},
                  "reference": "def run(x):\n    return x * 2\n"}
    solution = {"name": "mul_h8_py", "definition": "mul_h8", "author": "someone",
                "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run",
                         "destination_passing_style": False},
                "sources": [{"path": "main.py", "content": "def run(x):\n    return x * 2\n"}]}
    src = tmp_path / "src"
    (src / "definitions" / "mul").mkdir(parents=True)
    (src / "solutions" / "someone" / "mul" / "mul_h8").mkdir(parents=True)
    files = {src / "definitions" / "mul" / "mul_h8.json": definition,
             src / "solutions" / "someone" / "mul" / "mul_h8" / "mul_h8_py.json": solution}
    for path, data in files.items():
        path.write_text(json.dumps(data, indent=2) + "\n")
    ts = TraceSet.load(src)
    assert not ts.load_errors
    ts.save_dataset(tmp_path / "copy")
    for path in files:
        copy = tmp_path / "copy" / path.relative_to(src)
        assert json.loads(copy.read_text()) == json.loads(path.read_text()), copy
    # The same objects built in Python (every field set) hash the same.
    assert Definition(**definition).content_hash() == ts.definitions["mul_h8"].content_hash()
    assert Solution(**solution).content_hash() == ts.get_solution("mul_h8_py").content_hash()
