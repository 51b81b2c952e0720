"""A fresh install has what the README's commands import: `opforge run` and `opforge report html`
run with every module outside the declared dependencies (and what those depend on) refused, in
this process's children and in the run's workers alike."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

# Installed into every Python process of the run (sitecustomize): a finder that refuses any
# top-level module that is neither in the standard library nor allowed.
BLOCKER = textwrap.dedent("""
    import importlib.abc, json, os, sys

    ALLOWED = set(json.loads(os.environ["OPFORGE_TEST_ALLOWED"])) | set(sys.stdlib_module_names) | {"opforge"}

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top not in ALLOWED and not top.startswith("_"):
                raise ModuleNotFoundError(f"No module named {name!r} (not a declared dependency)", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
""")


def _closure(requirements: list[str]) -> set[str]:
    """Distributions needed by ``requirements`` (no extras), recursively, as installed here."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in (md.requires(req.name) or [])]
        except md.PackageNotFoundError:
            pass
    return seen


def _allowed_modules() -> list[str]:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    dists = _closure(declared)
    modules = {top for top, owners in md.packages_distributions().items()
               if any(o.lower().replace("_", "-") in dists for o in owners)}
    return sorted(modules)


def test_the_readme_commands_need_only_the_declared_dependencies(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, OPFORGE_TEST_ALLOWED=json.dumps(_allowed_modules()),
               PYTHONPATH=os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # The blocker works: something outside the dependencies is refused.
    probe = subprocess.run([sys.executable, "-c", "import pytest"], env=env, capture_output=True, text=True)
    assert "not a declared dependency" in probe.stderr
    run = [sys.executable, "-m", "opforge.cli", "run", "--definitions", "scale_h2048", "--devices", "cpu",
           "--iterations", "3", "--warmup", "1", "--max-elements", "200000", "--seed", "1"]
    done = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 passed, 0 failed" in done.stdout
    done = subprocess.run([sys.executable, "-m", "opforge.cli", "report", "html"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    page = next(tmp_path.rglob("report.html")).read_text()
    assert "<svg" in page or "<img" in page  # the plots were drawn


def test_the_readme_installs_a_cpu_torch_and_ships_only_opforge():
    readme = (ROOT / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme  # not 3 GB of CUDA libraries
    assert 'CUDA_ARCH_LIST=none pip install .' in readme
    assert "pip wheel . --no-deps -w dist/" in readme and "pip wheel . -w dist/" not in readme
