"""The registry: Solutions and live functions, BACKENDS, the decorator, loading modules."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from opforge.registry import (BACKENDS, UNSUPPORTED, BuildError, Registry, build, load_solution_modules,
                              register_solution)
from opforge.trace import DuplicateError
from registry_helpers import cache, mul_definition, solution  # noqa: F401 (cache is a fixture)

X = torch.randn(2, 8)
W = torch.randn(8)
SRC = "def run(x, w):\n    return x * w\n"


@pytest.fixture
def backends():
    """BACKENDS, with whatever a test registers removed afterwards."""
    before = set(BACKENDS.names())
    yield BACKENDS
    for name in set(BACKENDS.names()) - before:
        BACKENDS.unregister(name)


def test_register_solution_object_and_look_up():
    reg = Registry()
    a = reg.register(solution("a", SRC))
    reg.register(solution("b", SRC, definition="other_h8"))
    assert reg.get("a") is a and "a" in reg and len(reg) == 2
    assert [s.name for s in reg.solutions_for("mul_h8")] == ["a"]
    assert reg.solutions_for("unknown") == []
    assert reg.names() == ["a", "b"] and [s.name for s in reg] == ["a", "b"]
    assert reg.function("a") is None
    with pytest.raises(KeyError, match=r"no solution named 'c' is registered \(registered: a, b\)"):
        reg.get("c")


def test_register_json_dict_and_file(tmp_path, cache):
    reg = Registry()
    reg.register(solution("from_dict", SRC).to_dict())
    path = tmp_path / "sol.json"
    path.write_text(solution("from_file", SRC).to_json())
    assert reg.register(path).name == "from_file"
    assert reg.register(str(path)).name == "from_file"  # same content again: accepted
    torch.testing.assert_close(reg.build("from_file", mul_definition(), "cpu")(X, W), X * W)


def test_register_bad_files(tmp_path):
    reg = Registry()
    with pytest.raises(ValueError, match="missing.json: cannot read the solution file"):
        reg.register(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**solution("x", SRC).to_dict(), "spec": {"language": "cobol", "entry_point": "k.py::run"}}))
    with pytest.raises(ValueError, match=r"bad.json: .*spec.language: 'cobol' is not one of"):
        reg.register(bad)
    with pytest.raises(TypeError, match="expected a Solution, its JSON dict or a path"):
        reg.register(42)


def test_duplicate_names_refused():
    reg = Registry()
    reg.register(solution("dup", SRC))
    reg.register(solution("dup", SRC))  # the same content (a module imported twice): fine
    with pytest.raises(DuplicateError, match="solution 'dup' is already registered"):
        reg.register(solution("dup", SRC.replace("x * w", "x + w")))
    reg.unregister("dup")
    reg.register(solution("dup", SRC.replace("x * w", "x + w")))


def test_register_function_seed_style(cache):
    reg = Registry(definition="mul_h8")  # one task's registry: the definition is its default
    scale = 3.0

    def kernel(x, w):  # a closure: the live function runs, not a copy of its source
        return x * w * scale

    sol = reg.register(name="closure", kernel_fn=kernel, description="times three", language="pytorch")
    assert sol.definition == "mul_h8" and sol.spec.language == "pytorch" and sol.description == "times three"
    # written as "python": FlashInfer-Bench's language list has no "pytorch" (the same build)
    assert sol.to_dict()["spec"]["language"] == "python"
    assert not sol.spec.destination_passing_style
    assert sol.spec.entry_point == "kernel.py::kernel" and "return x * w * scale" in sol.sources[0].content
    assert reg.function("closure") is kernel
    torch.testing.assert_close(reg.build("closure", mul_definition(), "cpu")(X, W), X * W * 3)


def test_register_function_positional_and_unknown_language():
    reg = Registry()
    sol = reg.register("cute", lambda x, w: x, "CuTe kernel", "cutlass", definition=mul_definition())
    assert sol.spec.language == "python" and sol.description == "CuTe kernel (language: cutlass)"
    assert sol.definition == "mul_h8"
    tri = reg.register("tri", lambda x, w: x, "Triton", "triton", "mul_h8")
    assert tri.spec.target_hardware == ["cuda"]  # the schema's default for GPU languages
    assert tri.spec.entry_point == "kernel.py::run" and "source is not available" in tri.sources[0].content


def test_register_function_errors():
    reg = Registry()
    with pytest.raises(ValueError, match="which Definition does it solve"):
        reg.register("nodef", lambda x, w: x)
    with pytest.raises(TypeError, match="kernel_fn must be callable"):
        reg.register("notfn", 3, definition="mul_h8")
    with pytest.raises(TypeError, match="to register a function, pass it as kernel_fn"):
        reg.register(solution("s", SRC), description="x")


def test_function_checks_still_apply(cache):
    reg = Registry(definition="mul_h8")
    reg.register("gpu_fn", lambda x, w: x * w, target_hardware=["sm_90"])
    with pytest.raises(BuildError, match="targets sm_90; this device is cpu") as info:
        reg.build("gpu_fn", mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED
    reg.register("long_fn", lambda x, w, y, z: x)
    with pytest.raises(BuildError, match="entry takes"):
        reg.build("long_fn", mul_definition(), "cpu")


def test_decorator(backends, cache):
    reg = Registry()

    @register_solution("mul_h8", registry=reg, language="pytorch", author="me")
    def mul_kernel(x, w):
        """Plain multiply.

        More words."""
        return x * w

    assert callable(mul_kernel) and reg.function("mul_kernel") is mul_kernel
    sol = reg.get("mul_kernel")
    assert sol.description == "Plain multiply." and sol.author == "me"
    assert sol.sources[0].content.startswith("def mul_kernel(x, w):")  # without the decorator

    @register_solution("mul_h8", name="mul_dps_registered", destination_passing_style=True)
    def mul_dps(x, w, y):
        torch.mul(x, w, out=y)

    assert backends.get("mul_dps_registered").spec.destination_passing_style
    torch.testing.assert_close(backends.build("mul_dps_registered", mul_definition(), "cpu")(X, W), X * W)


MODULE = """
    import torch
    from opforge.registry import BACKENDS


    def {fn}(x, w):
        return x * w + {offset}


    BACKENDS.register("{name}", {fn}, "registers itself on import", "pytorch", definition="mul_h8")
"""


def _module(path, name, offset=0):
    path.write_text(textwrap.dedent(MODULE.format(fn=f"{name}_fn", name=name, offset=offset)))
    return path


def test_load_modules_files_and_folders(backends, cache, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _module(tmp_path / "opforge_test_kernels_by_name.py", "by_name", 1)
    file = _module(tmp_path / "by_path.py", "by_path", 2)
    folder = tmp_path / "more"
    (folder / "sub").mkdir(parents=True)
    _module(folder / "sub" / "in_folder.py", "in_folder", 3)
    (folder / "sol.json").write_text(solution("from_json_file", SRC).to_json())

    new = load_solution_modules(["opforge_test_kernels_by_name", file, folder])
    assert sorted(new) == ["by_name", "by_path", "from_json_file", "in_folder"]
    assert load_solution_modules([file, folder]) == []  # nothing imported twice, nothing new
    mul = mul_definition()
    for name, offset in (("by_name", 1), ("by_path", 2), ("in_folder", 3)):
        torch.testing.assert_close(backends.build(name, mul, "cpu")(X, W), X * W + offset)
    torch.testing.assert_close(backends.build("from_json_file", mul, "cpu")(X, W), X * W)


def test_load_modules_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.py does not exist"):
        load_solution_modules([tmp_path / "missing.py"])
    with pytest.raises(ModuleNotFoundError, match="cannot import 'opforge_no_such_module_xyz'"):
        load_solution_modules(["opforge_no_such_module_xyz"])


def test_function_solution_rebuilds_from_its_sources(backends, cache, tmp_path):
    """The Solution recorded for a registered function carries its module's source, so once
    saved it builds and runs without the function object."""
    load_solution_modules([_module(tmp_path / "shareable.py", "shareable", 5)])
    saved = backends.get("shareable")
    assert saved.spec.entry_point == "shareable.py::shareable_fn"
    torch.testing.assert_close(build(saved, mul_definition(), "cpu")(X, W), X * W + 5)
