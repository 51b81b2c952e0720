"""opforge's own ops as FlashInfer-Trace python solutions: every record opforge writes for them
is one FlashInfer-Bench reads and could run (with opforge installed); opforge recognises exactly
its generated file and nothing that imitates it; older "builtin" records still load, build, and
are saved in the new form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opforge
from fib_schema import FIB_LANGUAGES, fib_python_runnable, fib_solution_problems
from opforge.bench import generate_inputs
from opforge.registry import CACHE_DIR_VAR, ENTRY_POINT_ERROR, BuildError, build, builtin_solution
from opforge.trace import AxisConst, AxisVar, Definition, Solution, TensorSpec, TraceSet
from opforge.trace.builtin import builtin_dataset_path, builtin_solution_for, load_builtin_trace_set
from opforge.trace.own_op import ENTRY_POINT, LABEL, MARKER, OwnOp, language_label, own_op_source, read_own_op
from opforge.trace.templates import definition_for_name
from opforge.tracing import enable_tracing

#: One of each shape of call: a public eps constant, a dropped output, eps as an input with two
#: outputs, inputs the op does not take, a scalar input, a tuple of outputs.
RUN_HERE = ("rmsnorm_h4096", "fused_add_rmsnorm_h2048", "gemma_fused_add_rmsnorm_h4096", "nvfp4_gemv_m128_k7168",
            "scale_h2048", "silu_and_mul_d2048", "gqa_paged_decode_h32_kv8_d128_ps64")

#: rmsnorm_h4096's builtin record as opforge wrote it before the python form.
LEGACY_RMSNORM = {
    "name": "rmsnorm_h4096_builtin", "definition": "rmsnorm_h4096", "author": "opforge",
    "spec": {"language": "builtin", "target_hardware": ["cpu", "cuda"], "entry_point": "builtin.json::rmsnorm",
             "dependencies": [], "destination_passing_style": False, "binding": None},
    "sources": [{"path": "builtin.json", "content": '{\n  "constants": {\n    "eps": 1e-05\n  },\n  "inputs": {\n'
                 '    "hidden_states": "input"\n  },\n  "outputs": [\n    "output"\n  ]\n}\n'}],
    "description": "opforge.rmsnorm, compiled ahead of time into opforge's extension.",
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _shipped_records() -> list[tuple[str, dict]]:
    root = builtin_dataset_path() / "solutions"
    return [(str(p.relative_to(root)), json.loads(p.read_text(encoding="utf-8"))) for p in sorted(root.rglob("*.json"))]


def _with(solution: Solution, *, content=None, **spec) -> Solution:
    """``solution`` with its entry file's content and spec fields replaced."""
    data = solution.to_dict()
    data["spec"].update(spec)
    if content is not None:
        data["sources"][0]["content"] = content
    return Solution.from_dict(data)


# --- FlashInfer-Bench reads and runs what opforge writes ------------------------------------------


def test_every_solution_opforge_ships_is_a_flashinfer_bench_record():
    records = _shipped_records()
    assert len(records) >= 60
    problems = {path: p for path, record in records if (p := fib_solution_problems(record))}
    assert not problems, problems
    assert {r["spec"]["language"] for _, r in records} <= set(FIB_LANGUAGES)
    # The check itself: the older builtin record is one FlashInfer-Bench refuses.
    assert fib_solution_problems(LEGACY_RMSNORM) == [
        "spec.language 'builtin' is not one of ('python', 'triton', 'cpp', 'cuda', 'tilelang')"]


def test_flashinfer_bench_itself_validates_them():
    fib = pytest.importorskip("flashinfer_bench.data")  # optional: never a dependency of opforge
    for path, record in _shipped_records():
        fib.Solution.model_validate(record)
    with pytest.raises(ValueError):
        fib.Solution.model_validate(LEGACY_RMSNORM)


def test_each_definitions_builtin_solution_is_the_recognised_python_form():
    trace_set = load_builtin_trace_set()
    for name, definition in trace_set.definitions.items():
        own = trace_set.get_solution(f"{name}_builtin")
        assert own.content_hash() == builtin_solution_for(definition).content_hash()
        assert str(own.spec.language) == "python" and own.spec.entry_point == ENTRY_POINT
        assert own.spec.dependencies == ["opforge"] and not own.spec.destination_passing_style
        call = read_own_op(own)
        assert call is not None and call.returns == list(definition.outputs)
        assert list(call.inputs) == list(definition.inputs)
        assert language_label(own) == LABEL
        # The other solutions opforge ships (plain PyTorch, Triton) are solutions like any other.
        for other in trace_set.get_solutions(name):
            if other.name != own.name:
                assert read_own_op(other) is None and language_label(other) == str(other.spec.language)


@pytest.mark.parametrize("name", RUN_HERE)
def test_the_file_computes_what_opforge_runs_for_it(name, tmp_path, cache):
    """Loaded the way FlashInfer-Bench loads a python solution, the generated file returns exactly
    what opforge's direct call of the op returns (which imports nothing of the solution)."""
    trace_set = load_builtin_trace_set()
    definition = trace_set.get_definition(name)
    solution = trace_set.get_solution(f"{name}_builtin")
    workload = trace_set.get_workloads(name)[0].workload
    inputs = generate_inputs(definition, workload, seed=5)
    fn = fib_python_runnable(solution.to_dict(), definition, tmp_path / "fib")
    runnable = build(solution, definition, "cpu")
    assert runnable.fn.__name__ == f"builtin_{read_own_op(solution).op}" and runnable.build_dir is None
    assert not cache.exists()  # nothing written to the build cache, nothing imported
    got, ours = fn(*inputs), runnable(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    ours = ours if isinstance(ours, tuple) else (ours,)
    assert len(got) == len(ours) == len(definition.outputs)
    for a, b in zip(got, ours):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_the_file_and_the_direct_call_reach_the_same_function():
    """The file calls ``opforge.<op>``; opforge's direct call takes the op from opforge.ops."""
    assert all(getattr(opforge, name) is getattr(opforge.ops, name) for name in opforge.ops.__all__)


def test_outputs_come_back_in_the_definitions_order(tmp_path):
    rows = ["batch_size", "hidden_size"]
    d = Definition(name="add_norm_rev_h64", op_type="rmsnorm",
                   axes={"batch_size": AxisVar(), "hidden_size": AxisConst(value=64)},
                   inputs={"hidden_states": TensorSpec(shape=rows, dtype="float32"),
                           "residual": TensorSpec(shape=rows, dtype="float32"),
                           "weight": TensorSpec(shape=["hidden_size"], dtype="float32")},
                   outputs={"residual_out": TensorSpec(shape=rows, dtype="float32"),
                            "output": TensorSpec(shape=rows, dtype="float32")},
                   reference="def run(hidden_states, residual, weight):\n    return hidden_states, residual\n")
    solution = builtin_solution(d, "fused_add_rmsnorm", constants={"eps": 1e-5}, outputs=["output", "residual_out"])
    assert solution.sources[0].content.endswith("    return residual_out, output\n")
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    res, out = fib_python_runnable(solution.to_dict(), d, tmp_path)(x, r, w)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(out, opforge.fused_add_rmsnorm(x, r, w, 1e-5)[0], rtol=0, atol=0)


# --- recognition is exact ------------------------------------------------------------------------


def _rmsnorm_own() -> Solution:
    return builtin_solution_for(definition_for_name("rmsnorm_h4096"))


def _imitations() -> dict:
    own = _rmsnorm_own()
    text = own.sources[0].content
    marker, _, rest = text.partition("\n")
    call = json.loads(marker[len(MARKER):])

    def marked(**changes):
        return MARKER + json.dumps({**call, **changes}) + "\n" + rest

    def rendered_for(op):  # what the generator would write for another function of opforge
        return text.replace('"op": "rmsnorm"', f'"op": "{op}"').replace("opforge.rmsnorm", f"opforge.{op}")

    extra = own.to_dict()
    extra["sources"].append({"path": "opforge.py", "content": "def rmsnorm(**kw):\n    raise SystemExit\n"})
    return {
        "code appended": _with(own, content=text + "import os\nos.environ['PWNED'] = '1'\n"),
        "call changed": _with(own, content=text.replace("eps=1e-05)", "eps=1e-05) * 2")),
        "body of another op": _with(own, content=text.replace("opforge.rmsnorm(", "opforge.gemma_rmsnorm(")),
        "marker spelled differently": _with(own, content=text.replace('"eps": 1e-05', '"eps": 1e-5')),
        "marker key added": _with(own, content=marked(extra=1)),
        "marker keys reordered": _with(own, content=MARKER + json.dumps(dict(reversed(list(call.items()))))
                                       + "\n" + rest),
        "not an op: patch": _with(own, content=rendered_for("patch")),
        "not an op: enable_apply": _with(own, content=rendered_for("enable_apply")),
        "not an op: private": _with(own, content=rendered_for("_ext")),
        "name that injects code": _with(own, content=marked(inputs={"hidden_states": "input",
                                                                    "weight=__import__('os'), weight": "weight"})),
        "non-finite constant": _with(own, content=marked(constants={"eps": float("inf")})),
        "nested constant": _with(own, content=marked(constants={"eps": [1e-5]})),
        "deeply nested marker": _with(own, content=MARKER + "[" * 100000 + "]" * 100000 + "\n" + rest),
        "no marker": _with(own, content=rest),
        "windows line ends": _with(own, content=text.replace("\n", "\r\n")),
        "another source beside it": Solution.from_dict(extra),
        "another entry point": _with(own, content=text + "run2 = run\n", entry_point="main.py::run2"),
        "destination passing": _with(own, destination_passing_style=True),
        "a binding": _with(own, binding="torch"),
        "language pytorch": _with(own, language="pytorch"),
    }


@pytest.mark.parametrize("what", sorted(_imitations()))
def test_an_imitation_of_the_generated_file_is_not_an_own_op(what):
    solution = _imitations()[what]
    assert read_own_op(solution) is None
    assert language_label(solution) != LABEL


def test_an_imitation_is_imported_and_run_as_an_ordinary_solution(cache):
    """What is not exactly the generated file goes through the python builder: its own code runs
    (in the runner, in a worker process), never opforge's op in its place."""
    definition = definition_for_name("rmsnorm_h4096")
    own = _rmsnorm_own()
    imitation = _with(own, content=own.sources[0].content + "IMPORTED = True\n")
    runnable = build(imitation, definition, "cpu")
    assert runnable.fn.__globals__.get("IMPORTED") is True and runnable.build_dir is not None
    direct = build(own, definition, "cpu")
    assert "IMPORTED" not in direct.fn.__globals__ and direct.build_dir is None


def test_the_exact_form_with_another_mapping_only_ever_calls_the_op(tmp_path, cache):
    """A user may write the generated form for a mapping of their own (builtin_solution does):
    it is recognised and run by calling the op, and whatever its marker says, that is all it can
    do: names must be identifiers, the op one of opforge's, constants plain literals."""
    definition = definition_for_name("rmsnorm_h4096")
    own = _rmsnorm_own()
    x, w = torch.randn(2, 4096), torch.randn(4096)
    loose = builtin_solution(definition, "rmsnorm", constants={"eps": 0.5}, name="loose")
    assert read_own_op(loose) is not None and loose.content_hash() != own.content_hash()
    torch.testing.assert_close(build(loose, definition, "cpu")(x, w), opforge.rmsnorm(x, w, eps=0.5), rtol=0, atol=0)
    # A string constant is a literal in the file and an argument of the call: never evaluated.
    flag = tmp_path / "evaluated"
    payload = f"__import__('pathlib').Path({str(flag)!r}).touch()"
    sneaky = builtin_solution(definition, "rmsnorm", constants={"eps": payload}, name="sneaky")
    assert read_own_op(sneaky) is not None and f"eps={payload!r})" in sneaky.sources[0].content
    with pytest.raises((TypeError, ValueError)):
        build(sneaky, definition, "cpu")(x, w)
    with pytest.raises((TypeError, ValueError)):
        fib_python_runnable(sneaky.to_dict(), definition, tmp_path / "fib")(x, w)
    assert not flag.exists()


def test_the_generator_refuses_what_it_cannot_write_safely():
    with pytest.raises(ValueError, match="opforge has no op 'patch'"):
        own_op_source(OwnOp(op="patch", inputs={"x": "x"}, outputs=["y"], returns=["y"]))
    with pytest.raises(ValueError, match="reserved: opforge"):
        own_op_source(OwnOp(op="scale", inputs={"opforge": "x", "f": "factor"}, outputs=["y"], returns=["y"]))
    with pytest.raises(ValueError, match="cannot be Python parameters"):
        own_op_source(OwnOp(op="scale", inputs={"x": "x", "lambda": "factor"}, outputs=["y"], returns=["y"]))
    with pytest.raises(ValueError, match="only finite numbers"):
        own_op_source(OwnOp(op="scale", inputs={"x": "x"}, constants={"factor": float("nan")}, outputs=["y"],
                            returns=["y"]))


# --- older "builtin" records -----------------------------------------------------------------------


def _legacy_dataset(root: Path, record: dict, file_name: str = "rmsnorm_h4096_builtin.json") -> Path:
    ts = TraceSet(root)
    ts.add_definition(definition_for_name("rmsnorm_h4096"))
    ts.save_dataset(root)
    path = root / "solutions" / "opforge" / "rmsnorm" / "rmsnorm_h4096" / file_name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def test_legacy_records_load_in_the_python_form_and_are_saved_so(tmp_path, cache):
    path = _legacy_dataset(tmp_path / "ds", LEGACY_RMSNORM, file_name="named_otherwise.json")
    definition_file = next((tmp_path / "ds" / "definitions").rglob("*.json"))
    before = definition_file.read_bytes()
    ts = TraceSet.load(tmp_path / "ds", strict=True)
    (solution,) = ts.get_solutions("rmsnorm_h4096")
    definition = ts.get_definition("rmsnorm_h4096")
    assert str(solution.spec.language) == "python" and read_own_op(solution) is not None
    assert solution.content_hash() == builtin_solution_for(definition).content_hash()
    assert solution.description == LEGACY_RMSNORM["description"] and language_label(solution) == LABEL
    x, w = torch.randn(3, 4096), torch.randn(4096)
    torch.testing.assert_close(build(solution, definition, "cpu")(x, w), opforge.rmsnorm(x, w, 1e-5), rtol=0, atol=0)
    ts.save()
    written = json.loads(path.read_text(encoding="utf-8"))  # the same file, now in the new form
    assert written["spec"]["language"] == "python" and not fib_solution_problems(written)
    assert [p.name for p in path.parent.iterdir()] == ["named_otherwise.json"]
    assert definition_file.read_bytes() == before  # files nobody changed are left alone
    again = TraceSet.load(tmp_path / "ds", strict=True).get_solution("rmsnorm_h4096_builtin")
    assert again.content_hash() == solution.content_hash()


def test_legacy_records_in_a_single_json_file_and_made_in_python(tmp_path):
    definition = definition_for_name("rmsnorm_h4096")
    single = tmp_path / "set.json"
    single.write_text(json.dumps({"definitions": {definition.name: definition.to_dict()},
                                  "solutions": {definition.name: [LEGACY_RMSNORM]}}), encoding="utf-8")
    ts = TraceSet.load(single, strict=True)
    assert read_own_op(ts.get_solution("rmsnorm_h4096_builtin")) is not None
    ts.save()
    (saved,) = json.loads(single.read_text(encoding="utf-8"))["solutions"][definition.name]
    assert saved["spec"]["language"] == "python" and not fib_solution_problems(saved)
    added = TraceSet(definitions=[definition]).add_solution(Solution.from_dict(LEGACY_RMSNORM))
    assert added.content_hash() == builtin_solution_for(definition).content_hash()


def test_a_legacy_record_that_cannot_call_its_op_is_kept_and_fails_to_build(tmp_path):
    broken = json.loads(json.dumps(LEGACY_RMSNORM))
    broken["sources"][0]["content"] = '{"input": {}}'
    path = _legacy_dataset(tmp_path / "ds", broken)
    text = path.read_text(encoding="utf-8")
    ts = TraceSet.load(tmp_path / "ds", strict=True)
    solution = ts.get_solution("rmsnorm_h4096_builtin")
    assert str(solution.spec.language) == "builtin" and language_label(solution) == LABEL
    with pytest.raises(BuildError, match=r"builtin.json: unknown key\(s\) \['input'\]") as info:
        build(solution, ts.get_definition("rmsnorm_h4096"), "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR
    ts.save()
    assert path.read_text(encoding="utf-8") == text  # the user's record, as it was


# --- what tracing writes ---------------------------------------------------------------------------


def test_tracing_writes_the_python_form(tmp_path, rng):
    with enable_tracing(dataset_dir=tmp_path / "ds"):
        opforge.rmsnorm(rng.randn(2, 96), rng.randn(96))
    (path,) = (tmp_path / "ds" / "solutions").rglob("*.json")
    record = json.loads(path.read_text(encoding="utf-8"))
    assert path.name == "rmsnorm_h96_f32_builtin.json" and not fib_solution_problems(record)
    solution = Solution.from_dict(record)
    definition = TraceSet.load(tmp_path / "ds", strict=True).get_definition("rmsnorm_h96_f32")
    call = read_own_op(solution)
    assert call is not None and call.op == "rmsnorm" and list(call.inputs) == list(definition.inputs)
    assert solution.content_hash() == builtin_solution_for(definition).content_hash()



def test_a_live_function_registered_as_builtin_is_written_as_python():
    """Only the generated file is opforge's own op: a function registered with language
    "builtin" is a python solution (the label kept in its description)."""
    from opforge.registry import Registry

    sol = Registry().register("mine", lambda x, w: x, "my kernel", "builtin", definition="mul_h8")
    assert str(sol.spec.language) == "python" and sol.description == "my kernel (language: builtin)"
    assert not fib_solution_problems(sol.to_dict()) and language_label(sol) == "python"
