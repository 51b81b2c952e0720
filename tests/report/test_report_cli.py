"""``opforge report summary|best|html`` and ``python -m opforge.report``: output, JSON, exit
codes, the default dataset and the messages when there is nothing to read."""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys

import pytest

from opforge.report import cli
from opforge.trace import TraceSet
from report_data import dataset_json  # noqa: F401 (a fixture)
from report_data import BROKEN, DEF, EVIL, FAST, FLAKY, STEADY, build_trace_set, mul_definition


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    # rich wraps to COLUMNS when the output is not a terminal; wide enough for whole rows.
    monkeypatch.setenv("COLUMNS", "300")


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_table(dataset_json, capsys):
    code, out, err = _run(capsys, "summary", "--dataset", str(dataset_json))
    assert code == 0, err
    assert "Summary" in out and EVIL in out
    fast_line = next(line for line in out.splitlines() if f" {FAST} " in line)
    assert "4/5" in fast_line and "20.00" in fast_line and "3.76×" in fast_line
    assert "float32 → float32" in fast_line
    assert "1 wrong values, 1 runtime error" in out
    assert "vs ref / vs baseline: above 1× is faster" in out


def test_summary_json(dataset_json, capsys):
    code, out, _ = _run(capsys, "summary", "--dataset", str(dataset_json), "--json")
    assert code == 0
    rows = {r["solution"]: r for r in json.loads(out)}
    assert len(rows) == 9
    assert rows[FAST]["median_latency_ms"] == pytest.approx(0.02) and rows[FAST]["suspect"] == 1
    assert rows[BROKEN]["statuses"] == {"COMPILE_ERROR": 4} and rows[BROKEN]["median_latency_ms"] is None
    assert (rows[FAST]["workloads"], rows[FAST]["passed"], rows[FAST]["not_run"]) == (5, 4, ["batch=65536"])
    assert rows[FAST]["dtype"] == "float32 → float32"


def test_best_table_and_json(dataset_json, capsys):
    code, out, _ = _run(capsys, "best", "--dataset", str(dataset_json))
    assert code == 0
    assert "batch=4096" in out and "+12.0%" in out and f"suspect: {FAST}" in out and "+20.5%" in out
    code, out, _ = _run(capsys, "best", "--dataset", str(dataset_json), "--json")
    rows = json.loads(out)
    assert [(r["workload"], r["solution"]) for r in rows] == [
        ("batch=1", FLAKY), ("batch=16", FAST), ("batch=256", FAST), ("batch=4096", FAST), ("(overall)", FAST)]
    assert rows[-1]["runner_up"] == STEADY


def test_filters(dataset_json, capsys):
    code, out, _ = _run(capsys, "best", "--dataset", str(dataset_json), "--definitions", "mul_*",
                        "--solutions", FAST, STEADY, "--hardware", "H200", "--json")
    assert code == 0
    assert json.loads(out)[0]["solution"] == STEADY  # FAST's batch=1 timing is suspect
    code, out, err = _run(capsys, "summary", "--dataset", str(dataset_json), "--definitions", "mul_h9")
    assert code == 2 and out == ""
    assert "no definition matches 'mul_h9' (did you mean 'mul_h8'?)" in err
    code, _, err = _run(capsys, "summary", "--dataset", str(dataset_json), "--hardware", "MI300")
    assert code == 1 and "no evaluated traces in" in err and "match the filters" in err


def test_html(dataset_json, tmp_path, capsys):
    out_path = tmp_path / "pages" / "r.html"
    code, out, err = _run(capsys, "html", "--dataset", str(dataset_json), "-o", str(out_path), "--title", "nightly")
    assert code == 0, err
    assert out.strip() == f"wrote {out_path} (1 definition, 30 traces)"
    text = out_path.read_text(encoding="utf-8")
    assert "<title>nightly</title>" in text and "status-matrix" in text


def test_html_default_output_needs_no_matplotlib(dataset_json, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    code, out, err = _run(capsys, "html", "--dataset", str(dataset_json))
    assert code == 0, err
    assert out.startswith("wrote report.html") and "<svg" in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_without_a_dataset_the_message_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "summary")
    assert code == 2 and out == ""
    assert "opforge-runs/builtin" in err and "--dataset PATH" in err


def test_the_default_dataset_is_opforge_runs_builtin(tmp_path, monkeypatch, capsys):
    build_trace_set().save(tmp_path / "opforge-runs" / "builtin")  # a dataset folder, as `opforge run` writes
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "best", "--json")
    assert code == 0, err
    assert json.loads(out)[-1]["solution"] == FAST
    assert _run(capsys, "html")[0] == 0
    assert EVIL not in (tmp_path / "report.html").read_text(encoding="utf-8")  # escaped


def test_unreadable_or_empty_datasets(tmp_path, capsys):
    code, _, err = _run(capsys, "summary", "--dataset", str(tmp_path / "missing"))
    assert code == 2 and "cannot read" in err and "missing" in err
    empty = TraceSet(definitions=[mul_definition(DEF)]).save(tmp_path / "empty.json")
    code, _, err = _run(capsys, "summary", "--dataset", str(empty))
    assert code == 1 and f"no evaluated traces in {empty}" in err


def test_wired_into_a_parent_command(dataset_json, capsys):
    # How `opforge report` plugs it in (python/opforge/cli.py).
    parser = argparse.ArgumentParser(prog="opforge")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report")
    cli.add_arguments(report)
    report.set_defaults(run=cli.run)
    args = parser.parse_args(["report", "summary", "--dataset", str(dataset_json), "--json"])
    assert args.run(args) == 0
    assert len(json.loads(capsys.readouterr().out)) == 9
    with pytest.raises(SystemExit):
        parser.parse_args(["report"])  # a report kind is required


def test_opforge_report_command(dataset_json, capsys):
    import opforge.cli

    if '"report"' not in inspect.getsource(opforge.cli):
        pytest.skip("`opforge report` is not in opforge.cli yet")
    assert opforge.cli.main(["report", "best", "--dataset", str(dataset_json), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[-1]["solution"] == FAST


def test_python_dash_m(dataset_json):
    done = subprocess.run([sys.executable, "-m", "opforge.report", "summary", "--dataset", str(dataset_json), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert {r["solution"] for r in json.loads(done.stdout)} >= {FAST, STEADY, EVIL}
    done = subprocess.run([sys.executable, "-m", "opforge.report", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "summary" in done.stdout and "opforge-runs/builtin" in done.stdout
