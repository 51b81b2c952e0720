"""`opforge run` on opforge's own ops, whose records are python solutions of a generated form:
the worker recognises that exact file and calls the op (nothing of the solution is written out
or imported), the report labels them builtin, and an imitation of the file runs as its own code."""

from __future__ import annotations

import json

from opforge.cli import main
from opforge.registry import CACHE_DIR_VAR
from opforge.trace import TraceSet
from opforge.trace.builtin import builtin_solution_for, builtin_workloads
from opforge.trace.own_op import MARKER
from opforge.trace.templates import definition_for_name

QUICK = ["--devices", "cpu", "--iterations", "3", "--warmup", "1", "--seed", "7"]


def _files_with_the_marker(folder) -> list:
    return [p for p in folder.rglob("*.py") if MARKER in p.read_text(encoding="utf-8")] if folder.exists() else []


def test_run_builtin_on_the_shipped_dataset_benchmarks_opforges_ops(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "cache"))
    assert main(["run", "--builtin", "--definitions", "scale_h2048", "--max-elements", "200000", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "already has its built-in solution" in out and "3 passed, 0 failed, 2 skipped" in out
    traces = TraceSet.load(tmp_path / "opforge-runs" / "builtin").get_traces("scale_h2048")
    assert {t.solution for t in traces} == {"scale_h2048_builtin"} and all(t.is_successful() for t in traces)
    assert _files_with_the_marker(tmp_path / "cache") == []  # the op was called, the file never imported
    assert main(["report", "summary", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["solution"], r["language"]) for r in rows] == [("scale_h2048_builtin", "builtin")]


def test_an_imitation_in_a_dataset_runs_as_its_own_code(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_DIR_VAR, str(tmp_path / "cache"))
    definition = definition_for_name("scale_h2048")
    own = builtin_solution_for(definition)
    text = own.sources[0].content
    assert text.endswith("    return opforge.scale(x=x, factor=factor)\n")
    data = own.to_dict()
    data["name"] = "scale_h2048_imitation"
    data["sources"][0]["content"] = text[: -len("\n")] + " * 2\n"  # looks like opforge's op, computes 2x
    ts = TraceSet(tmp_path / "ds")
    ts.add_definition(definition)
    ts.add_workload(definition.name, builtin_workloads(definition)[1])  # batch_size=8
    ts.add_solution(own)
    ts.add_solution(type(own).from_dict(data))
    ts.save()
    assert main(["run", "--dataset", str(tmp_path / "ds"), *QUICK]) == 1
    capsys.readouterr()
    status = {t.solution: t.evaluation.status.value
              for t in TraceSet.load(tmp_path / "ds").get_traces(definition.name)}
    assert status == {"scale_h2048_builtin": "PASSED", "scale_h2048_imitation": "INCORRECT_NUMERICAL"}
    # The imitation went through the python builder (its file is in the build cache); the own op did not.
    (cached,) = _files_with_the_marker(tmp_path / "cache")
    assert cached.read_text(encoding="utf-8").endswith(" * 2\n")
