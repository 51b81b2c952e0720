"""Damaged build-cache entries: a loaded file (the compiled library, or a Python solution's
source) truncated, emptied, replaced by another build's library or deleted, or a source deleted,
while the marker stays. The next build finds it, says so, discards the entry and rebuilds.

The damaging happens to a copy of a cache built once per module; the next build runs in a child
process, since loading a truncated library can kill the process that loads it (SIGBUS).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opforge.registry import build
from opforge.registry.cache import MARKER
from registry_helpers import (  # noqa: F401 (cache is a fixture)
    CACHE_VAR, TVM_FFI_CPP_MUL, c_api_source, cache, mul_definition, solution)

TVM_FFI_CPP_ADD = TVM_FFI_CPP_MUL.replace("] * wp[c]", "] + wp[c]")

#: The solutions whose cached builds get damaged, by a short name the child process uses too.
SOLUTIONS = {
    "python": lambda: solution("dmg_py", "def run(x, w):\n    return x * w\n"),
    "cpp": lambda: solution("dmg_cpp", c_api_source(), entry="kernel.cpp::run", language="cpp"),
    "tvm": lambda: solution("dmg_tvm", TVM_FFI_CPP_MUL, entry="kernel.cpp::run", language="cpp", dps=True,
                            binding="tvm-ffi"),
    "tvm_add": lambda: solution("dmg_tvm_add", TVM_FFI_CPP_ADD, entry="kernel.cpp::run", language="cpp",
                                dps=True, binding="tvm-ffi"),
}

_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {helpers!r})
    import torch
    from opforge.registry import build
    from registry_helpers import mul_definition
    from test_cache_damage import SOLUTIONS
    x, w = torch.randn(3, 8), torch.randn(8)
    runs = [build(SOLUTIONS[{name!r}](), mul_definition(), "cpu") for _ in range(2)]
    print(json.dumps([{{"hit": r.cache_hit, "ok": bool(torch.equal(r(x, w), x * w))}} for r in runs]))
""")


@pytest.fixture(scope="module")
def pristine_cache(tmp_path_factory):
    """A cache holding a finished build of each of SOLUTIONS."""
    path = tmp_path_factory.mktemp("pristine-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_VAR, str(path))
        names = ["python", "cpp"]
        try:
            import tvm_ffi  # noqa: F401
            names += ["tvm", "tvm_add"]
        except ImportError:
            pass
        builds = {name: build(SOLUTIONS[name](), mul_definition(), "cpu").build_dir for name in names}
    return path, builds


def _loaded_file(folder: Path) -> Path:
    info = json.loads((folder / MARKER).read_text())
    return folder / info.get("artifact", info.get("entry", ""))


def _truncate(folder, builds):
    artifact = _loaded_file(folder)
    with open(artifact, "r+b") as f:  # in place, as a full disk or an interrupted copy leaves it
        f.truncate(artifact.stat().st_size // 2)


def _empty(folder, builds):
    _loaded_file(folder).write_bytes(b"")


def _delete_artifact(folder, builds):
    _loaded_file(folder).unlink()


def _delete_source(folder, builds):
    (folder / "kernel.cpp" if (folder / "kernel.cpp").exists() else folder / "kernel.py").unlink()


def _replace_with_other_build(folder, builds):
    # A valid library exporting the same symbol, computing x + w instead.
    shutil.copyfile(_loaded_file(builds["tvm_add"]), _loaded_file(folder))


@pytest.mark.parametrize("name, damage, says", [
    ("cpp", _truncate, "size"),
    ("cpp", _empty, "size 0"),
    ("cpp", _delete_artifact, "missing"),
    ("cpp", _delete_source, "kernel.cpp: missing"),
    ("python", _delete_source, "kernel.py: missing"),
    ("python", _truncate, "size"),
    ("tvm", _truncate, "size"),
    ("tvm", _replace_with_other_build, "sha256|size"),
], ids=lambda v: getattr(v, "__name__", "").strip("_") if callable(v) else None)
def test_damaged_entry_is_rebuilt(pristine_cache, tmp_path, name, damage, says):
    pristine, builds = pristine_cache
    if name not in builds:
        pytest.skip("apache-tvm-ffi is not installed")
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    folder = cache / builds[name].relative_to(pristine)
    damage(folder, {n: cache / p.relative_to(pristine) for n, p in builds.items()})
    code = _CHILD.format(helpers=str(Path(__file__).parent), name=name)
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ, CACHE_VAR: str(cache)},
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, f"exit status {child.returncode}\n{child.stderr[-3000:]}"
    rebuilt, after = json.loads(child.stdout.strip().splitlines()[-1])
    assert rebuilt == {"hit": False, "ok": True} and after == {"hit": True, "ok": True}
    found = rf"build cache entry {re.escape(str(folder))} is damaged \(.*({says})"
    assert re.search(found, child.stderr), child.stderr
    assert "discarding it and rebuilding" in child.stderr


def test_deleted_library_is_rebuilt_in_the_same_process(cache, caplog):
    # torch skips compiling a name it already compiled in this process; the rebuild must compile.
    sol, mul = SOLUTIONS["cpp"](), mul_definition()
    first = build(sol, mul, "cpu")
    first.artifact.unlink()  # unlinked, not truncated: this process keeps its mapping of it
    again = build(sol, mul, "cpu")
    assert again.cache_hit is False and again.artifact.is_file()
    assert f"{first.artifact.name}: missing" in caplog.text
    x, w = torch.randn(2, 8), torch.randn(8)
    torch.testing.assert_close(again(x, w), x * w)


def test_marker_without_file_records_is_rebuilt(cache, caplog):
    sol, mul = SOLUTIONS["python"](), mul_definition()
    marker = build(sol, mul, "cpu").build_dir / MARKER
    info = json.loads(marker.read_text())
    del info["files"]  # as a marker written before files were recorded
    marker.write_text(json.dumps(info))
    assert build(sol, mul, "cpu").cache_hit is False
    assert "the marker records no file hashes" in caplog.text
    assert build(sol, mul, "cpu").cache_hit is True
