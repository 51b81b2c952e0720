"""What FlashInfer-Bench (0.1.2, the release on PyPI) accepts as a Solution, written out by hand
so that the tests need no flashinfer-bench install (it pulls flashinfer and CUDA libraries):
its pydantic models' fields, enum values and validators (flashinfer_bench/data/solution.py),
and what its python builder does with a python solution (compile/builders/python_builder.py:
sources written under a package folder, the entry module imported, the entry symbol called
with the Definition's inputs in order; value-returning solutions must take exactly that many
parameters and return the outputs in the Definition's order)."""

from __future__ import annotations

import importlib
import inspect
import sys
import uuid
from pathlib import Path, PurePosixPath

#: FlashInfer-Bench's DType values (flashinfer_bench/data/definition.py): FP4 only as
#: "float4_e2m1", whose declared shape its input generator uses as the torch shape.
FIB_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1", "int64", "int32",
              "int16", "int8", "bool")
#: FlashInfer-Bench's SupportedLanguages and SupportedBindings.
FIB_LANGUAGES = ("python", "triton", "cpp", "cuda", "tilelang")
FIB_BINDINGS = ("tvm-ffi", "torch")

_SOLUTION_KEYS = {"name", "definition", "author", "spec", "sources", "description"}
_SPEC_KEYS = {"language", "target_hardware", "entry_point", "dependencies", "destination_passing_style", "binding"}


def _nonempty(value) -> bool:
    return isinstance(value, str) and len(value) >= 1


def fib_solution_problems(record: dict) -> list[str]:
    """Why FlashInfer-Bench's ``Solution.model_validate(record)`` would fail (empty: it would
    not). Keys it does not know are reported too, though pydantic would ignore them: opforge
    writes none."""
    problems = []
    if not isinstance(record, dict):
        return ["not an object"]
    problems += [f"unknown key {k!r}" for k in sorted(set(record) - _SOLUTION_KEYS)]
    for key in ("name", "definition", "author"):
        if not _nonempty(record.get(key)):
            problems.append(f"{key}: a non-empty string is required")
    if record.get("description") is not None and not isinstance(record["description"], str):
        problems.append("description: a string or null")
    spec = record.get("spec")
    if not isinstance(spec, dict):
        return problems + ["spec: an object is required"]
    problems += [f"spec: unknown key {k!r}" for k in sorted(set(spec) - _SPEC_KEYS)]
    if spec.get("language") not in FIB_LANGUAGES:
        problems.append(f"spec.language {spec.get('language')!r} is not one of {FIB_LANGUAGES}")
    hardware = spec.get("target_hardware")
    if not isinstance(hardware, list) or not hardware or not all(isinstance(h, str) for h in hardware):
        problems.append("spec.target_hardware: a non-empty list of strings is required")
    entry = spec.get("entry_point")
    if not _nonempty(entry) or entry.count("::") != 1:
        problems.append(f"spec.entry_point {entry!r} is not '<file_path>::<function_name>'")
    deps = spec.get("dependencies", [])
    if not isinstance(deps, list) or not all(_nonempty(d) for d in deps):
        problems.append("spec.dependencies: a list of non-empty strings")
    if not isinstance(spec.get("destination_passing_style", True), bool):
        problems.append("spec.destination_passing_style: a bool")
    if spec.get("binding") is not None and spec["binding"] not in FIB_BINDINGS:
        problems.append(f"spec.binding {spec['binding']!r} is not one of {FIB_BINDINGS}")
    sources = record.get("sources")
    if not isinstance(sources, list) or not sources:
        return problems + ["sources: a non-empty list is required"]
    paths = []
    for i, source in enumerate(sources):
        if not isinstance(source, dict) or set(source) != {"path", "content"}:
            problems.append(f"sources[{i}]: an object with path and content is required")
            continue
        path, content = source["path"], source["content"]
        if not _nonempty(path) or not _nonempty(content):
            problems.append(f"sources[{i}]: path and content must be non-empty strings")
            continue
        if PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
            problems.append(f"sources[{i}].path {path!r}: absolute or '..'")
        if path in paths:
            problems.append(f"duplicate source path {path!r}")
        paths.append(path)
    if _nonempty(entry) and entry.split("::")[0] not in paths:
        problems.append(f"entry file {entry.split('::')[0]!r} is not among the sources")
    return problems


def fib_python_runnable(record: dict, definition, folder: Path):
    """The entry callable of a python solution loaded the way FlashInfer-Bench's python builder
    loads it (sources under ``folder/<package>/``, ``<package>.<module>`` imported), after its
    signature check. Only for code the test trusts: it runs in this process."""
    spec = record["spec"]
    assert spec["language"] == "python"
    entry_file, symbol = spec["entry_point"].split("::")
    assert entry_file.endswith(".py"), entry_file
    package = f"fib_sol_{uuid.uuid4().hex}"
    for source in record["sources"]:
        target = folder / package / source["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source["content"], encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(f"{package}.{entry_file[:-3].replace('/', '.')}")
    finally:
        sys.path.remove(str(folder))
    fn = getattr(module, symbol)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    expected = len(definition.inputs) + (len(definition.outputs) if spec.get("destination_passing_style", True) else 0)
    assert len(params) == expected, f"{record['name']}: run takes {len(params)} parameters; FIB passes {expected}"
    return fn
