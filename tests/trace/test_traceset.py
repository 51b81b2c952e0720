"""TraceSet: adding and looking up, one-file and folder storage, lenient and strict loading of
bad datasets (every error naming file and field), and safetensors blobs."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from opforge.trace import (AxisConst, AxisVar, BlobError, BuildSpec, Correctness, Definition, DuplicateError,
                           Environment, Evaluation, LoadError, NotFoundError, Performance, RandomInput,
                           SafetensorsInput, ScalarInput, SchemaError, Solution, SourceFile, TensorSpec, Trace,
                           TraceSet, UnknownDefinitionError, UnknownSolutionError, Workload, WorkloadError,
                           check_safetensors_input, load_safetensors_input, save_safetensors_blob,
                           workload_blob_relpath)

PUBLIC = Path(__file__).parent / "fixtures" / "public"
BLOB = "blob/workloads/rmsnorm/rmsnorm_d128/rmsnorm_d128_a1b2c3d4-0002.safetensors"


def write_blob(root: Path, shape=(2, 128), dtype=None, keys=("input", "weight")) -> None:
    import torch
    from safetensors.torch import save_file

    dtype = dtype or torch.float16
    tensors = {"input": torch.randn(*shape).to(dtype), "weight": torch.randn(128).to(torch.float16)}
    path = root / BLOB
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: tensors[k] for k in keys}, str(path))


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A copy of the FlashInfer-Trace fixture folder with its safetensors blob written."""
    root = tmp_path / "dataset"
    shutil.copytree(PUBLIC, root)
    write_blob(root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def make_definition(name="rmsnorm_h2048") -> Definition:
    return Definition(name=name, op_type="rmsnorm",
                      axes={"batch_size": AxisVar(), "hidden_size": AxisConst(value=2048)},
                      inputs={"hidden_states": TensorSpec(shape=["batch_size", "hidden_size"], dtype="bfloat16"),
                              "weight": TensorSpec(shape=["hidden_size"], dtype="bfloat16")},
                      outputs={"output": TensorSpec(shape=["batch_size", "hidden_size"], dtype="bfloat16")},
                      reference="def run(hidden_states, weight):\n    return hidden_states\n",
                      constraints=["batch_size <= 4096"])


def make_solution(name="rmsnorm_h2048_triton", definition="rmsnorm_h2048", author="tutorial") -> Solution:
    return Solution(name=name, definition=definition, author=author,
                    spec=BuildSpec(language="triton", entry_point="kernel.py::run", destination_passing_style=False),
                    sources=[SourceFile(path="kernel.py", content="def run(hidden_states, weight):\n    return hidden_states\n")])


def make_workload(uuid="w-1", batch=8) -> Workload:
    return Workload(uuid=uuid, axes={"batch_size": batch}, inputs={"hidden_states": RandomInput(), "weight": RandomInput()},
                    seed=0)


def make_trace(solution="rmsnorm_h2048_triton", uuid="w-1") -> Trace:
    return Trace(definition="rmsnorm_h2048", workload=make_workload(uuid), solution=solution,
                 evaluation=Evaluation(status="PASSED", environment=Environment(hardware="cpu"),
                                       timestamp="2026-01-01T00:00:00Z", correctness=Correctness(),
                                       performance=Performance(latency_ms=0.5, reference_latency_ms=1.0,
                                                               speedup_factor=2.0)))


def populated() -> TraceSet:
    ts = TraceSet()
    ts.add_definition(make_definition())
    ts.add_solution(make_solution())
    ts.add_workload("rmsnorm_h2048", make_workload())
    ts.add_trace(make_trace())
    return ts


# --- in memory ----------------------------------------------------------------------------


def test_add_and_get():
    ts = populated()
    assert ts.get_definition("rmsnorm_h2048").name == "rmsnorm_h2048"
    assert ts.get_solution("rmsnorm_h2048_triton").author == "tutorial"
    assert [s.name for s in ts.get_solutions("rmsnorm_h2048")] == ["rmsnorm_h2048_triton"]
    assert [t.workload.uuid for t in ts.get_workloads("rmsnorm_h2048")] == ["w-1"]
    assert ts.get_traces("rmsnorm_h2048")[0].is_successful()
    assert ts.get_traces_for_solution("rmsnorm_h2048_triton") == ts.traces["rmsnorm_h2048"]
    assert "definitions=1" in repr(ts)
    with pytest.raises(NotFoundError, match="no definition 'rmsnorm_h248' \\(did you mean 'rmsnorm_h2048'\\?\\)"):
        ts.get_definition("rmsnorm_h248")
    with pytest.raises(NotFoundError, match="no solution 'x'"):
        ts.get_solution("x")
    with pytest.raises(KeyError):
        ts.get_workloads("nope")


def test_duplicates_and_unknown_references_are_refused():
    ts = populated()
    with pytest.raises(DuplicateError, match="definition 'rmsnorm_h2048' already exists"):
        ts.add_definition(make_definition())
    with pytest.raises(DuplicateError, match="solution 'rmsnorm_h2048_triton' already exists"):
        ts.add_solution(make_solution())
    with pytest.raises(DuplicateError, match="workload uuid 'w-1' already exists"):
        ts.add_workload("rmsnorm_h2048", make_workload())
    with pytest.raises(UnknownDefinitionError, match="solution 's' is for definition 'rmsnorm_h4096', which this "
                                                     "TraceSet does not hold"):
        ts.add_solution(make_solution(name="s", definition="rmsnorm_h4096"))
    with pytest.raises(UnknownDefinitionError, match="workload w-2 is for definition 'other'"):
        ts.add_workload("other", make_workload("w-2"))
    with pytest.raises(UnknownSolutionError, match="solution 'ghost' is unknown"):
        ts.add_trace(make_trace(solution="ghost"))
    with pytest.raises(WorkloadError, match="constraint 'batch_size <= 4096' does not hold for batch_size=5000"):
        ts.add_workload("rmsnorm_h2048", make_workload("w-3", batch=5000))
    with pytest.raises(TypeError):
        ts.add_definition({"name": "x"})


def test_workload_traces_go_through_add_trace_too():
    ts = populated()
    t = ts.add_trace(Trace(definition="rmsnorm_h2048", workload=make_workload("w-9")))
    assert t in ts.workloads["rmsnorm_h2048"] and t not in ts.traces["rmsnorm_h2048"]


def test_constructor_takes_collections():
    ts = populated()
    copy = TraceSet(definitions=ts.definitions, solutions=ts.solutions, workloads=ts.workloads, traces=ts.traces)
    assert copy.to_dict() == ts.to_dict()


# --- one JSON file ------------------------------------------------------------------------


def test_single_file_round_trip_is_byte_stable(tmp_path):
    ts = populated()
    first = ts.save(tmp_path / "custom_kernels.json")
    loaded = TraceSet.load(first)
    assert loaded.load_errors == []
    assert loaded.to_dict() == ts.to_dict()
    second = loaded.save(tmp_path / "again.json")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_text().endswith("}\n")
    assert list(json.loads(first.read_text())) == ["definitions", "solutions", "workloads", "traces"]


def test_single_file_in_flashinfer_bench_to_dict_form(tmp_path):
    ts = populated()
    data = ts.to_dict()
    data["workload"] = data.pop("workloads")  # FlashInfer-Bench's TraceSet.to_dict key
    path = tmp_path / "fib.json"
    path.write_text(json.dumps(data))
    assert TraceSet.load(path).to_dict() == ts.to_dict()


def test_from_path_and_load_follow_one_rule(tmp_path):
    """A .json file and a folder load through either name; a path that is neither is named."""
    ts = populated()
    path = tmp_path / "one.json"
    ts.save(path)
    folder = tmp_path / "folder"
    ts.save_dataset(folder)
    for load in (TraceSet.load, TraceSet.from_path):
        assert load(path).to_dict() == ts.to_dict()
        assert load(folder).to_dict() == ts.to_dict()
        with pytest.raises(FileNotFoundError, match="no dataset folder or TraceSet .json file at .*missing"):
            load(tmp_path / "missing")


def test_single_file_errors_name_the_entry(tmp_path):
    data = populated().to_dict()
    data["definitions"]["rmsnorm_h2048"]["inputs"]["weight"]["dtype"] = "float99"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    loaded = TraceSet.load(path)
    first = loaded.load_errors[0]
    assert first.field == "definitions.rmsnorm_h2048.inputs.weight.dtype" and "'float99' is not one of" in first.message
    assert any(e.field == "solutions.rmsnorm_h2048[0]" and "does not hold" in e.message for e in loaded.load_errors)
    with pytest.raises(LoadError, match="definitions.rmsnorm_h2048.inputs.weight.dtype"):
        TraceSet.load(path, strict=True)


# --- dataset folders ------------------------------------------------------------------------


def test_public_dataset_loads(dataset):
    ts = TraceSet.from_path(dataset)
    assert ts.load_errors == []
    assert set(ts.definitions) == {"rmsnorm_h4096", "fused_add_rmsnorm_h7168", "rmsnorm_d128"}
    assert [w.workload.uuid for w in ts.get_workloads("rmsnorm_d128")] == ["a1b2c3d4-0001", "a1b2c3d4-0002"]
    assert ts.get_workloads("rmsnorm_d128")[0].workload.inputs["eps"] == ScalarInput(value=1e-6)
    assert [t.evaluation.status.value for t in ts.get_traces("rmsnorm_h4096")] == ["PASSED", "INCORRECT_NUMERICAL",
                                                                                   "RUNTIME_ERROR"]
    assert ts.get_solution("rmsnorm_h4096_torch").spec.destination_passing_style is False
    w = ts.get_workloads("rmsnorm_d128")[1].workload
    x = ts.load_input_tensor("rmsnorm_d128", w, "input")
    assert tuple(x.shape) == (2, 128)


def test_saving_leaves_unchanged_files_alone(dataset, tmp_path):
    original = snapshot(dataset)
    ts = TraceSet.load(dataset)
    ts.save()
    assert snapshot(dataset) == original  # nothing changed, nothing rewritten (not even reformatted)
    copy = tmp_path / "copy"
    ts.save(copy)
    assert snapshot(copy) == original  # copied byte for byte, blobs included
    assert json.dumps(TraceSet.load(copy).to_dict()) == json.dumps(ts.to_dict())  # (NaN != NaN as dicts)


def test_saving_rewrites_what_changed_and_is_then_byte_stable(dataset):
    original = snapshot(dataset)
    ts = TraceSet.load(dataset)
    ts.get_definition("rmsnorm_h4096").tags.append("opforge:checked")
    ts.add_workload("fused_add_rmsnorm_h7168", Workload(uuid="new", axes={"batch_size": 3}, inputs={
        "hidden_states": RandomInput(), "residual": RandomInput(), "weight": RandomInput()}))
    ts.save()
    after = snapshot(dataset)
    changed = {k for k in after if original.get(k) != after[k]}
    assert changed == {"definitions/rmsnorm/rmsnorm_h4096.json", "workloads/rmsnorm/fused_add_rmsnorm_h7168.jsonl"}
    assert after["definitions/rmsnorm/rmsnorm_h4096.json"].endswith(b"}\n")
    again = TraceSet.load(dataset)
    again.get_definition("rmsnorm_h4096").tags.remove("opforge:checked")
    again.get_definition("rmsnorm_h4096").tags.append("opforge:checked")
    again.save()
    assert snapshot(dataset) == after  # opforge's own files re-save byte for byte
    assert "opforge:checked" in TraceSet.load(dataset).get_definition("rmsnorm_h4096").tags


def test_saving_does_not_clobber_files_it_did_not_load(dataset, tmp_path):
    ts = TraceSet(root=dataset)  # not loaded from it
    ts.add_definition(Definition.from_json((PUBLIC / DEF).read_text()))
    with pytest.raises(FileExistsError, match="definitions/rmsnorm/rmsnorm_h4096.json"):
        ts.save()
    ts.save(overwrite=True)
    out = tmp_path / "out"
    populated().save(out)
    populated().save(out, overwrite=True)
    fresh = populated()
    with pytest.raises(FileExistsError):
        fresh.save(out)
    fresh.save(out, overwrite=True)
    fresh.save(out)  # files it wrote itself may be replaced


def test_single_file_saves_back_to_itself(tmp_path):
    path = populated().save(tmp_path / "kernels.json")
    ts = TraceSet.load(path)
    ts.add_workload("rmsnorm_h2048", make_workload("w-2"))
    assert ts.save() == path
    assert len(TraceSet.load(path).get_workloads("rmsnorm_h2048")) == 2


def test_saved_dataset_keeps_every_public_field(dataset, tmp_path):
    out = tmp_path / "out"
    TraceSet.load(dataset).save_dataset(out)
    for relative in ("definitions/rmsnorm/rmsnorm_h4096.json", "definitions/rmsnorm/fused_add_rmsnorm_h7168.json",
                     "solutions/alice/rmsnorm/rmsnorm_h4096/rmsnorm_h4096_torch.json"):
        original, saved = json.loads((PUBLIC / relative).read_text()), json.loads((out / relative).read_text())
        for key, value in original.items():
            if key not in ("axes", "inputs", "outputs", "spec"):
                assert saved[key] == value, (relative, key)
    lines = (out / "traces/alice/rmsnorm/rmsnorm_h4096.jsonl").read_text().splitlines()
    assert lines[0] == (PUBLIC / "traces/alice/rmsnorm/rmsnorm_h4096.jsonl").read_text().splitlines()[0]


def test_new_objects_go_to_the_flashinfer_trace_layout(tmp_path):
    ts = populated()
    ts.save(tmp_path / "ds")
    files = set(snapshot(tmp_path / "ds"))
    assert files == {"definitions/rmsnorm/rmsnorm_h2048.json",
                     "solutions/tutorial/rmsnorm/rmsnorm_h2048/rmsnorm_h2048_triton.json",
                     "workloads/rmsnorm/rmsnorm_h2048.jsonl",
                     "traces/tutorial/rmsnorm/rmsnorm_h2048.jsonl"}
    assert ts.root == tmp_path / "ds"
    before = snapshot(tmp_path / "ds")
    ts.save()
    assert snapshot(tmp_path / "ds") == before


def test_persisted_traces_are_appended(tmp_path):
    ts = populated()
    ts.save(tmp_path / "ds")
    ts.add_workload("rmsnorm_h2048", make_workload("w-2"), persist=True)
    ts.add_trace(make_trace(uuid="w-2"), persist=True)
    reloaded = TraceSet.load(tmp_path / "ds")
    assert [t.workload.uuid for t in reloaded.get_workloads("rmsnorm_h2048")] == ["w-1", "w-2"]
    assert len(reloaded.get_traces("rmsnorm_h2048")) == 2
    with pytest.raises(ValueError, match="needs a TraceSet with a root folder"):
        populated().add_trace(make_trace(uuid="w-3"), persist=True)


# --- bad datasets -----------------------------------------------------------------------------


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


DEF = "definitions/rmsnorm/rmsnorm_h4096.json"
SOL = "solutions/alice/rmsnorm/rmsnorm_h4096/rmsnorm_h4096_torch.json"
WL = "workloads/rmsnorm/rmsnorm_d128.jsonl"


def _set(path, value):
    def change(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize("breakage, path, field, message", [
    (lambda root: (root / DEF).write_text('{"name": "rmsnorm_h4096",\n  "op_type": }'),
     DEF, None, "malformed JSON: Expecting value (line 2, column 14)"),
    (lambda root: edit_json(root / DEF, _set(["inputs", "weight", "dtype"], "float99")),
     DEF, "inputs.weight.dtype", "'float99' is not one of float32, float16, bfloat16"),
    (lambda root: edit_json(root / DEF, _set(["inputs", "weight", "shape"], ["hidden"])),
     DEF, "inputs.weight.shape[0]", "axis 'hidden' is not declared in axes"),
    (lambda root: edit_json(root / DEF, _set(["reference"], "import torch\n")),
     DEF, "reference", "defines no top-level function 'run'"),
    (lambda root: (root / DEF).write_text((root / DEF).read_text().replace('"op_type": "rmsnorm",',
                                                                            '"op_type": "rmsnorm", "op_type": "norm",')),
     DEF, "op_type", "appears twice in the same object"),
    (lambda root: shutil.copy(root / DEF, root / "definitions/rmsnorm/copy.json"),
     "definitions/rmsnorm/rmsnorm_h4096.json", "name",
     "definition 'rmsnorm_h4096' already exists (from definitions/rmsnorm/copy.json)"),
    (lambda root: edit_json(root / SOL, _set(["definition"], "rmsnorm_h9999")),
     SOL, "definition", "solution 'rmsnorm_h4096_torch' is for definition 'rmsnorm_h9999', which this TraceSet does not hold"),
    (lambda root: edit_json(root / SOL, _set(["spec", "entry_point"], "main.py::forward")),
     SOL, "spec.entry_point", "main.py defines no top-level 'forward'"),
    (lambda root: (root / WL).write_text((root / WL).read_text().replace('"batch_size": 4', '"batch_size": 99999')),
     WL, "workload.axes", "constraint 'batch_size <= 65536' does not hold for batch_size=99999"),
    (lambda root: (root / WL).write_text((root / WL).read_text().replace('"batch_size": 4', '"batch_size": 4, "seq": 2')),
     WL, "workload.axes.seq", "rmsnorm_d128 has no axis 'seq'"),
    (lambda root: write_blob(root, shape=(3, 128)),
     WL, "workload.inputs.input", f"{BLOB}['input'] has shape (3, 128), expected (2, 128)"),
    (lambda root: write_blob(root, dtype=__import__("torch").float32),
     WL, "workload.inputs.input", f"{BLOB}['input'] has dtype float32, expected float16"),
    (lambda root: write_blob(root, keys=("weight",)),
     WL, "workload.inputs.input", f"{BLOB} has no tensor 'input' (keys: weight)"),
    (lambda root: (root / BLOB).write_bytes(b"\x05\x00"),
     WL, "workload.inputs.input", "is not a readable safetensors file"),
])
def test_bad_files_are_reported_and_the_rest_loads(dataset, breakage, path, field, message, caplog):
    breakage(dataset)
    with caplog.at_level(logging.WARNING, logger="opforge.trace"):
        ts = TraceSet.from_path(dataset)
    errors = [e for e in ts.load_errors if e.path == path]
    assert errors, ts.load_errors
    assert any(e.field == field and message in e.message for e in errors), [str(e) for e in ts.load_errors]
    assert any(path in r.getMessage() for r in caplog.records)
    assert "fused_add_rmsnorm_h7168" in ts.definitions  # the rest loaded
    with pytest.raises(LoadError) as info:
        TraceSet.from_path(dataset, strict=True)
    assert str(info.value).startswith(info.value.path)


def test_error_text_names_file_line_and_field(dataset):
    edit_json(dataset / DEF, _set(["inputs", "weight", "dtype"], "float99"))
    (dataset / WL).write_text((dataset / WL).read_text() + "{not json\n")
    ts = TraceSet.from_path(dataset)
    texts = [str(e) for e in ts.load_errors]
    assert texts[0].startswith("definitions/rmsnorm/rmsnorm_h4096.json: inputs.weight.dtype: 'float99' is not one of "
                               "float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1, float4_e2m1fn_x2, int64, int32, "
                               "int16, int8, uint8, bool")
    malformed = [e for e in ts.load_errors if e.path == WL]
    assert [(e.line, e.field) for e in malformed] == [(3, None)]
    assert str(malformed[0]).startswith("workloads/rmsnorm/rmsnorm_d128.jsonl:3: malformed JSON: ")
    # the solution and traces of the definition that failed are reported, pointing at it
    assert any("'rmsnorm_h4096' failed to load from definitions/rmsnorm/rmsnorm_h4096.json" in t for t in texts)
    assert len(ts.get_workloads("rmsnorm_d128")) == 2


def test_lines_in_the_wrong_kind_of_file(dataset):
    traces = (dataset / "traces/alice/rmsnorm/rmsnorm_h4096.jsonl").read_text().splitlines()
    workloads = (dataset / "workloads/rmsnorm/rmsnorm_h4096.jsonl").read_text().splitlines()
    (dataset / "workloads/rmsnorm/rmsnorm_h4096.jsonl").write_text("\n".join(workloads + traces[:1]) + "\n")
    ts = TraceSet.from_path(dataset)
    assert [(e.line, e.field) for e in ts.load_errors] == [(3, "solution")]
    assert "workload traces only" in ts.load_errors[0].message


def test_workloads_with_missing_blobs_are_kept_counted_and_said_once(dataset, tmp_path, caplog):
    """A blob kept outside git (not fetched) loses no record: the workload stays, saving and
    copying keep it, one warning says how many and how to fetch them; a blob of the wrong shape
    is still an error."""
    (dataset / BLOB).unlink()
    with caplog.at_level("WARNING", logger="opforge.trace"):
        ts = TraceSet.from_path(dataset)
    assert len(ts.get_workloads("rmsnorm_d128")) == 2 and not ts.load_errors
    assert len(ts.missing_blobs) == 1
    definition, uuid, why = ts.missing_blobs[0]
    assert definition == "rmsnorm_d128" and "not found" in why
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "1 workload(s)" in warnings[0] and "git lfs pull" in warnings[0]
    ts.save_dataset(tmp_path / "copy")
    assert len(TraceSet.from_path(tmp_path / "copy").get_workloads("rmsnorm_d128")) == 2
    assert len(TraceSet.from_path(dataset, check_blobs=False).missing_blobs) == 0  # not looked at


def test_missing_dataset_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        TraceSet.from_path(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        TraceSet.load(tmp_path / "nope.json")


# --- blobs ------------------------------------------------------------------------------------


def test_blob_helpers(tmp_path):
    import torch

    relative = workload_blob_relpath("rmsnorm", "rmsnorm_d128", "u1")
    assert relative == "blob/workloads/rmsnorm/rmsnorm_d128/rmsnorm_d128_u1.safetensors"
    w = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    save_safetensors_blob(tmp_path, relative, {"w": w})
    spec = SafetensorsInput(path=relative, tensor_key="w")
    assert torch.equal(load_safetensors_input(tmp_path, spec, (2, 3), "int32"), w)
    check_safetensors_input(tmp_path, spec, [2, 3], "int32")
    with pytest.raises(SchemaError, match="path: path '/.*' must be relative, not absolute"):
        SafetensorsInput(path=str(tmp_path / relative), tensor_key="w")
    with pytest.raises(BlobError, match="already exists"):
        save_safetensors_blob(tmp_path, relative, {"w": w})
    with pytest.raises(BlobError, match="where: .* has shape \\(2, 3\\), expected \\(3, 2\\)"):
        load_safetensors_input(tmp_path, spec, (3, 2), where="where")
    with pytest.raises(BlobError, match="is relative, but the TraceSet has no root folder"):
        load_safetensors_input(None, spec)


def test_fp4_blobs_as_safetensors_writes_them(tmp_path):
    """safetensors writes an FP4 tensor as F4 counting 4-bit values (its header's last dimension
    is twice the torch tensor's); a blob is checked against the declared (torch) shape in either
    FP4 spelling of the Definition and loads back bit for bit."""
    import torch

    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    codes = torch.randint(0, 256, (3, 8, 2), dtype=torch.uint8)
    packed = codes.view(torch.float4_e2m1fn_x2)
    relative = workload_blob_relpath("gemv", "nvfp4_gemv_m3_k16", "u1")
    save_safetensors_blob(tmp_path, relative, {"a": packed})
    spec = SafetensorsInput(path=relative, tensor_key="a")
    for dtype, shape in (("float4_e2m1fn_x2", (3, 8, 2)), ("float4_e2m1", (3, 8, 2))):
        check_safetensors_input(tmp_path, spec, shape, dtype)
        got = load_safetensors_input(tmp_path, spec, shape, dtype)
        assert got.dtype == torch.float4_e2m1fn_x2 and tuple(got.shape) == (3, 8, 2)
        assert torch.equal(got.view(torch.uint8), codes)
    with pytest.raises(BlobError, match=r"has shape \(3, 8, 4\), expected \(3, 8, 8\)"):
        check_safetensors_input(tmp_path, spec, (3, 8, 4), "float4_e2m1fn_x2")
    with pytest.raises(BlobError, match="has dtype float4_e2m1, expected int8"):
        check_safetensors_input(tmp_path, spec, (3, 8, 2), "int8")


def test_bring_your_own_kernel_example_reads_naturally(tmp_path):
    """The public "custom kernel" walkthrough, with opforge.trace in place of the original
    import: define, add solutions, save to one JSON file, load it back."""
    from opforge.trace import AxisConst, AxisVar, DType, SupportedLanguages, TensorSpec

    fused = Definition(
        name="fused_add_rmsnorm_d4096", op_type="norm",
        axes={"batch": AxisVar(), "hidden": AxisConst(value=4096)},
        inputs={"input": TensorSpec(shape=["batch", "hidden"], dtype=DType.FLOAT16),
                "residual": TensorSpec(shape=["batch", "hidden"], dtype=DType.FLOAT16),
                "weight": TensorSpec(shape=["hidden"], dtype=DType.FLOAT16),
                "eps": TensorSpec(shape=None, dtype=DType.FLOAT32)},
        outputs={"out": TensorSpec(shape=["batch", "hidden"], dtype=DType.FLOAT16),
                 "residual_out": TensorSpec(shape=["batch", "hidden"], dtype=DType.FLOAT16)},
        reference="import torch\n\ndef run(input, residual, weight, eps):\n    h = input + residual\n"
                  "    v = h.pow(2).mean(-1, keepdim=True)\n    return h * torch.rsqrt(v + eps) * weight, h\n",
        tags=["stage:inference", "op:fused_norm", "memory:optimized"],
    )
    trace_set = TraceSet()
    trace_set.add_definition(fused)
    trace_set.add_solution(Solution(
        name="fused_add_rmsnorm_triton_v1", definition="fused_add_rmsnorm_d4096", author="tutorial",
        spec=BuildSpec(language=SupportedLanguages.TRITON, entry_point="kernel.py::run"),
        sources=[SourceFile(path="kernel.py", content="import triton\n\ndef run(input, residual, weight, eps):\n"
                                                      "    return input, residual\n")]))
    trace_set.add_solution(Solution(
        name="fused_add_rmsnorm_cuda_v1", definition="fused_add_rmsnorm_d4096", author="tutorial",
        spec=BuildSpec(language=SupportedLanguages.CUDA, entry_point="kernel.cu::run"),
        sources=[SourceFile(path="kernel.cu", content="__global__ void k() {}\n")]))
    trace_set.save(tmp_path / "custom_kernels.json")
    loaded = TraceSet.load(tmp_path / "custom_kernels.json")
    assert [s.name for s in loaded.get_solutions("fused_add_rmsnorm_d4096")] == ["fused_add_rmsnorm_triton_v1",
                                                                                 "fused_add_rmsnorm_cuda_v1"]
    assert loaded.get_definition("fused_add_rmsnorm_d4096") == fused


def test_each_traceset_tracks_its_own_files(dataset, tmp_path):
    ts = TraceSet.load(dataset)
    ts.get_definition("rmsnorm_h4096").tags.append("edited")
    other = TraceSet(definitions=ts.definitions, solutions=ts.solutions, workloads=ts.workloads, traces=ts.traces)
    other.save(tmp_path / "elsewhere")
    ts.save()
    assert "edited" in TraceSet.load(dataset).get_definition("rmsnorm_h4096").tags
