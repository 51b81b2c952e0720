"""Import-based builds (python): calling conventions, sibling modules, entry points, errors."""

from __future__ import annotations

import sys

import pytest
import torch

from opforge.registry import (ENTRY_POINT_ERROR, IMPORT_ERROR, SIGNATURE_ERROR, BuildError, build,
                              reference_solution)
from registry_helpers import cache, mul_definition, solution  # noqa: F401 (cache is a fixture)

X = torch.arange(24, dtype=torch.float32).reshape(3, 8)
W = torch.linspace(-1, 1, 8)


@pytest.fixture
def mul():
    return mul_definition()


@pytest.mark.parametrize("body", ["return x * w", "return (x * w,)", "return {'y': x * w}", "return [x * w]"])
def test_value_returning_forms(cache, mul, body):
    run = build(solution("v", f"def run(x, w):\n    {body}\n"), mul, "cpu")
    assert not run.destination_passing_style and run.by_name
    torch.testing.assert_close(run(X, W), X * W)
    torch.testing.assert_close(run(x=X, w=W), X * W)
    torch.testing.assert_close(run(X, w=W), X * W)


def test_names_may_differ_positional_call(cache, mul):
    run = build(solution("pos", "def run(a, b):\n    return a * b\n"), mul, "cpu")
    assert not run.by_name
    torch.testing.assert_close(run(X, W), X * W)


def test_keyword_call_when_names_match(cache, mul):
    # Parameters in another order than the Definition's: only a keyword call gets this right.
    run = build(solution("kw", "def run(w, x):\n    return x * w + x\n"), mul, "cpu")
    torch.testing.assert_close(run(X, W), X * W + X)


def test_destination_passing_allocates_outputs(cache):
    two = mul_definition("mul2_h8", outputs=("y", "z"))
    src = "def run(x, w, y, z):\n    y.copy_(x * w)\n    z.copy_(x + w)\n"
    run = build(solution("dps", src, dps=True, definition="mul2_h8"), two, "cpu")
    y, z = run(X, W)
    torch.testing.assert_close(y, X * W)
    torch.testing.assert_close(z, X + W)
    assert y.shape == (3, 8) and y.dtype == torch.float32
    y2, z2 = torch.empty(3, 8), torch.empty(3, 8)
    assert run.call_into(X, W, y2, z2) is None
    torch.testing.assert_close(y2, X * W)


def test_destination_passing_checks_input_shapes(cache, mul):
    run = build(solution("dps_shape", "def run(x, w, y):\n    y.copy_(x * w)\n", dps=True), mul, "cpu")
    with pytest.raises(ValueError, match="hidden=4; expected hidden=8"):
        run(torch.ones(2, 4), torch.ones(4))


def test_runnable_argument_errors(cache, mul):
    run = build(solution("args", "def run(x, w):\n    return x * w\n"), mul, "cpu")
    with pytest.raises(TypeError, match="missing input 'w'"):
        run(X)
    with pytest.raises(TypeError, match="takes 2 inputs"):
        run(X, W, W)
    with pytest.raises(TypeError, match="unexpected argument"):
        run(X, W, scale=2)


@pytest.mark.parametrize("body, match", [
    ("return None", "returned None; .*destination_passing_style"),
    ("return x, w", "returned 2 value"),
    ("return {'z': x}", "without output"),
])
def test_value_returning_result_errors(cache, mul, body, match):
    run = build(solution("bad_result", f"def run(x, w):\n    {body}\n"), mul, "cpu")
    with pytest.raises(ValueError, match=match):
        run(X, W)


def test_sibling_modules_relative_and_bare(cache, mul):
    sources = {
        "kernel.py": "from .ops import times\nimport helpers\n\ndef run(x, w):\n    return helpers.twice(times(x, w))\n",
        "ops.py": "def times(a, b):\n    return a * b\n",
        "helpers.py": "def twice(t):\n    return 2 * t\n",
    }
    run = build(solution("siblings", sources), mul, "cpu")
    torch.testing.assert_close(run(X, W), 2 * X * W)
    assert "helpers" not in sys.modules  # bare-name siblings do not leak into the global namespace
    assert str(run.build_dir) not in sys.path


def test_same_helper_name_in_two_solutions(cache, mul):
    a = build(solution("a", {"kernel.py": "import helpers\ndef run(x, w):\n    return helpers.f(x, w)\n",
                             "helpers.py": "def f(x, w):\n    return x * w\n"}), mul, "cpu")
    b = build(solution("b", {"kernel.py": "import helpers\ndef run(x, w):\n    return helpers.f(x, w)\n",
                             "helpers.py": "def f(x, w):\n    return x + w\n"}), mul, "cpu")
    torch.testing.assert_close(a(X, W), X * W)
    torch.testing.assert_close(b(X, W), X + W)


def test_entry_in_subfolder(cache, mul):
    sources = {"pkg/kernel.py": "from .util import f\ndef run(x, w):\n    return f(x, w)\n",
               "pkg/util.py": "def f(x, w):\n    return x * w\n"}
    run = build(solution("sub", sources, entry="pkg/kernel.py::run"), mul, "cpu")
    torch.testing.assert_close(run(X, W), X * W)


def test_entry_symbol_missing(cache, mul):
    # The schema checks top-level definitions; a conditional one is left to the builder.
    src = "if True:\n    def other(x, w):\n        return x\n"
    sol = solution("nosym", src.replace("other", "run"))
    sol.sources[0].content = src
    with pytest.raises(BuildError, match=r"defines no 'run' \(callables there: other\)") as info:
        build(sol, mul, "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


def test_entry_symbol_not_callable(cache, mul):
    with pytest.raises(BuildError, match="is not callable") as info:
        build(solution("notcall", "run = 3\n"), mul, "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


def test_entry_file_missing(cache, mul):
    sol = solution("nofile", "def run(x, w):\n    return x\n")
    sol = sol.model_copy(update={"sources": [sol.sources[0].model_copy(update={"path": "other.py"})]})
    with pytest.raises(BuildError, match=r"entry point file 'kernel.py' is not among the sources \(sources: other.py\)") as info:
        build(sol, mul, "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


def test_import_error_shows_solution_frames_only(cache, mul):
    src = "import torch\n\ndef helper():\n    raise RuntimeError('broken at import')\n\nhelper()\n\ndef run(x, w):\n    return x\n"
    with pytest.raises(BuildError) as info:
        build(solution("boom", src), mul, "cpu")
    err = info.value
    assert err.kind == IMPORT_ERROR
    assert "RuntimeError: broken at import" in str(err)
    assert 'File "kernel.py", line 4, in helper' in str(err)
    assert "importlib" not in str(err) and "opforge/registry" not in str(err)


def test_missing_module_is_import_error(cache, mul):
    with pytest.raises(BuildError, match="No module named 'not_a_real_module_xyz'") as info:
        build(solution("nomod", "import not_a_real_module_xyz\ndef run(x, w):\n    return x\n"), mul, "cpu")
    assert info.value.kind == IMPORT_ERROR


@pytest.mark.parametrize("src, dps, match", [
    ("def run(x, w, y, z):\n    return x\n", False,
     r"entry takes \(x, w, y, z\); the Definition's value-returning call passes 2: \(x, w\), as separate arguments "
     "or as one tuple"),
    ("def run(x, w, y):\n    y.copy_(x)\n", False, "looks destination-passing: set destination_passing_style"),
    ("def run(x, w):\n    return x\n", True, "looks value-returning: unset destination_passing_style"),
    ("def run(x, w, *, scale):\n    return x\n", False, "required keyword-only parameter\\(s\\) scale"),
])
def test_signature_mismatch(cache, mul, src, dps, match):
    with pytest.raises(BuildError, match=match) as info:
        build(solution("sig", src, dps=dps), mul, "cpu")
    assert info.value.kind == SIGNATURE_ERROR


@pytest.mark.parametrize("src", ["def run(*args):\n    return args[0] * args[1]\n",
                                 "def run(x, w, scale=1.0):\n    return x * w * scale\n"])
def test_signature_that_fits(cache, mul, src):
    torch.testing.assert_close(build(solution("fits", src), mul, "cpu")(X, W), X * W)


def test_solution_for_another_definition(cache, mul):
    with pytest.raises(ValueError, match="solves 'other_h8', not 'mul_h8'"):
        build(solution("other", "def run(x, w):\n    return x\n", definition="other_h8"), mul, "cpu")


def test_reference_solution_runs_like_a_solution(cache, mul):
    ref = reference_solution(mul)
    assert ref.spec.entry_point == "reference.py::run" and ref.spec.language == "python"
    assert not ref.spec.destination_passing_style
    run = build(ref, mul, "cpu")
    torch.testing.assert_close(run(X, W), mul.reference_fn()(X, W))
