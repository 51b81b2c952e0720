"""`opforge run` from the command line: the built-in dataset by default (written to a copy), a
dataset of one's own, settings from a file with options on top, resume, and the report of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_runner import DEF, make_dataset  # noqa: E402

from opforge.cli import main  # noqa: E402
from opforge.trace import TraceSet  # noqa: E402

QUICK = ["--devices", "cpu", "--iterations", "3", "--warmup", "1", "--seed", "7"]


def test_the_builtin_dataset_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--definitions", "scale_h2048", "--max-elements", "200000", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "scale_h2048_builtin" in out and "PASSED" in out and "SKIPPED" in out
    assert "3 passed, 0 failed, 2 skipped" in out and "seed 7" in out
    ts = TraceSet.load(tmp_path / "opforge-runs" / "builtin")
    traces = ts.get_traces("scale_h2048")
    assert len(traces) == 3 and all(t.is_successful() for t in traces)
    assert all(t.evaluation.performance.baseline_solution == "scale_h2048_builtin" for t in traces)
    # Again with --resume: nothing left to do; the report reads what the run wrote.
    assert main(["run", "--definitions", "scale_h2048", "--max-elements", "200000", "--resume", *QUICK]) == 0
    assert "0 passed, 0 failed, 2 skipped" in capsys.readouterr().out
    assert len(TraceSet.load(tmp_path / "opforge-runs" / "builtin").get_traces("scale_h2048")) == 3
    assert main(["report", "summary", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["solution"], r["passed"]) for r in rows] == [("scale_h2048_builtin", 3)]


def test_a_dataset_with_failures_exits_1_and_settings_come_from_the_file(tmp_path, capsys):
    make_dataset(tmp_path / "ds", names={"honest", "wrong_values"})
    config = tmp_path / "bench.toml"
    config.write_text(f'baseline = "{DEF}_honest"\n[definition.{DEF}]\niterations = 4\n')
    code = main(["run", "--dataset", str(tmp_path / "ds"), "--config", str(config), "--devices", "cpu",
                 "--seed", "3", "--output", str(tmp_path / "copy")])
    out = capsys.readouterr().out
    assert code == 1 and "INCORRECT_NUMERICAL" in out and "2 passed, 2 failed" in out
    assert not (tmp_path / "ds" / "traces").exists()  # --output: the dataset was copied, not changed
    traces = TraceSet.load(tmp_path / "copy").get_traces(DEF)
    assert {t.evaluation.performance.timing["iterations"] for t in traces if t.is_successful()} == {4}
    # Options beat the file.
    assert main(["run", "--dataset", str(tmp_path / "ds"), "--config", str(config), "--iterations", "2",
                 "--devices", "cpu", "--solutions", f"{DEF}_honest"]) == 0
    traces = TraceSet.load(tmp_path / "ds").get_traces(DEF)
    assert {t.evaluation.performance.timing["iterations"] for t in traces} == {2}


def test_bad_input_is_a_clear_message(tmp_path, capsys):
    make_dataset(tmp_path / "ds", names={"honest"})
    with pytest.raises(SystemExit, match="no definition named nope"):
        main(["run", "--dataset", str(tmp_path / "ds"), "--definitions", "nope", "--devices", "cpu"])
    with pytest.raises(SystemExit, match="no dataset at /nonexistent/ds"):
        main(["run", "--dataset", "/nonexistent/ds", "--devices", "cpu"])
    with pytest.raises(SystemExit, match="no solution named mine"):
        main(["run", "--dataset", str(tmp_path / "ds"), "--solutions", "mine", "--devices", "cpu"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--devices cuda: no GPU visible here"):
            main(["run", "--dataset", str(tmp_path / "ds"), "--devices", "cuda"])
    module = tmp_path / "kernels.py"
    module.write_text("import opforge_not_installed\n")
    with pytest.raises(SystemExit) as info:
        main(["run", "--dataset", str(tmp_path / "ds"), "--devices", "cpu", "--module", str(module)])
    first = str(info.value).splitlines()[0]
    assert "ModuleNotFoundError" in first and "opforge_not_installed" in first and "kernels.py:1" in first
    (tmp_path / "bad.toml").write_text("[defaults]\niterations = 0\n")
    with pytest.raises(SystemExit, match="iterations"):
        main(["run", "--dataset", str(tmp_path / "ds"), "--config", str(tmp_path / "bad.toml")])


def _public_dataset_without_solutions(root: Path) -> Path:
    """FlashInfer-Trace's public rmsnorm_h4096 and fused_add_rmsnorm_h7168 Definitions with a
    small workload each and no solution, as the public dataset ships some."""
    public = Path(__file__).resolve().parents[1] / "trace" / "fixtures" / "public" / "definitions" / "rmsnorm"
    ts = TraceSet(root)
    from opforge.trace import Definition, RandomInput, Workload

    for name in ("rmsnorm_h4096", "fused_add_rmsnorm_h7168"):
        definition = Definition.from_dict(json.loads((public / f"{name}.json").read_text()))
        ts.add_definition(definition)
        ts.add_workload(name, Workload(uuid=f"{name}-w", axes={"batch_size": 3},
                                       inputs={n: RandomInput() for n in definition.inputs}))
    ts.save_dataset(root)
    return root


def test_no_solutions_says_why_and_builtin_offers_opforges_own(tmp_path, capsys):
    root = _public_dataset_without_solutions(tmp_path / "public")
    assert main(["run", "--dataset", str(root), *QUICK]) == 1
    out = capsys.readouterr().out
    assert "nothing to run: none of the 2 selected definition(s) with workloads has a solution" in out
    assert "opforge has built-in solutions for 2 of them (fused_add_rmsnorm_h7168, rmsnorm_h4096)" in out
    assert "--builtin" in out
    assert main(["run", "--dataset", str(root), "--builtin", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "added opforge's built-in solutions: fused_add_rmsnorm_h7168_builtin, rmsnorm_h4096_builtin" in out
    ts = TraceSet.load(root)
    # Judged by the dataset's own references (eps baked in): both pass, and the solutions stay.
    for name in ("rmsnorm_h4096", "fused_add_rmsnorm_h7168"):
        (trace,) = ts.get_traces(name)
        assert trace.solution == f"{name}_builtin" and trace.is_successful(), trace.evaluation.log
    # Again: nothing more to add, and with --resume nothing left to run is not an error.
    assert main(["run", "--dataset", str(root), "--builtin", "--resume", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "already has its built-in solution" in out and "traced already" in out


def test_nothing_to_run_names_what_is_missing(tmp_path, capsys):
    make_dataset(tmp_path / "ds", names={"honest"})
    with pytest.raises(SystemExit, match="no definition named nope_h1"):
        main(["run", "--dataset", str(tmp_path / "ds"), "--definitions", "nope_h1", *QUICK])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--dataset", str(empty), *QUICK]) == 1
    assert "nothing to run: " in (out := capsys.readouterr().out) and "holds no definitions" in out, out
