"""The build cache: hits, misses on changed content, unfinished builds, concurrent processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opforge.registry import cache_root, build
from opforge.registry.cache import MARKER
from registry_helpers import CACHE_VAR, cache, mul_definition, solution  # noqa: F401 (cache is a fixture)

SRC = "def run(x, w):\n    return x * w\n"


def test_cache_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv(CACHE_VAR)
    assert cache_root() == Path.home() / ".cache" / "opforge" / "builds"


def test_second_build_is_a_hit(cache):
    mul = mul_definition()
    first = build(solution("c1", SRC), mul, "cpu")
    second = build(solution("c1", SRC), mul, "cpu")
    assert first.cache_hit is False and second.cache_hit is True
    assert first.build_dir == second.build_dir and first.build_dir.parent.parent == cache
    info = json.loads((first.build_dir / MARKER).read_text())
    assert info["entry"] == "kernel.py" and len(info["key"]) == 64


def test_changed_source_is_a_miss(cache):
    mul = mul_definition()
    first = build(solution("c2", SRC), mul, "cpu")
    changed = build(solution("c2", SRC.replace("x * w", "x * w + 1")), mul, "cpu")
    assert changed.cache_hit is False and changed.build_dir != first.build_dir
    torch.testing.assert_close(changed(torch.zeros(1, 8), torch.zeros(8)), torch.ones(1, 8))


def test_changed_spec_is_a_miss(cache):
    mul = mul_definition()
    first = build(solution("c3", SRC), mul, "cpu")
    other = build(solution("c3", SRC, target=("cpu", "cuda")), mul, "cpu")
    assert other.cache_hit is False and other.build_dir != first.build_dir


def test_unfinished_build_is_redone(cache):
    mul = mul_definition()
    first = build(solution("c4", SRC), mul, "cpu")
    (first.build_dir / MARKER).unlink()  # as if the process had died mid-build
    (first.build_dir / "kernel.py").write_text("garbage(")
    again = build(solution("c4", SRC), mul, "cpu")
    assert again.cache_hit is False
    assert (again.build_dir / "kernel.py").read_text() == SRC


_CHILD = textwrap.dedent("""
    import sys, json
    sys.path.insert(0, {helpers!r})
    from registry_helpers import mul_definition, solution
    from opforge.registry import build
    import torch
    run = build(solution("conc", {src!r}), mul_definition(), "cpu")
    out = run(torch.ones(2, 8), torch.full((8,), 3.0))
    print(json.dumps({{"hit": run.cache_hit, "ok": bool((out == 3).all())}}))
""")


def test_two_processes_build_once(cache):
    # Started together; whichever takes the lock first builds, the other finds the build.
    # (Contention during a slow build is exercised by the C++ tests' shared build.)
    code = _CHILD.format(helpers=str(Path(__file__).parent), src=SRC)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert sorted(r["hit"] for r in results) == [False, True]
    folders = [p for p in (cache / "python").iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / MARKER).exists()


def test_source_paths_cannot_leave_the_folder(cache):
    from opforge.registry.cache import write_sources

    class Source:
        path, content = "../escape.py", ""

    with pytest.raises(ValueError, match="leaves the solution's folder"):
        write_sources(cache, [Source()])
