"""The smoke test (`opforge smoke`, `python -m opforge.smoke_test`): every built-in solution
passes on CPU, a wrong solution fails the run, and the command reports what it ran: a line per
workload, then a summary row per solution, each whole when the output goes to a pipe."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from opforge import cli


def _run(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["smoke", "--max-elements", "300000", *argv])
    return code, capsys.readouterr().out


def test_builtin_solutions_pass_on_cpu(capsys):
    code, out = _run(capsys, "rmsnorm_h2048", "fused_add_rmsnorm_h4096", "gemma_fused_add_rmsnorm_h4096",
                     "silu_and_mul_d2048", "scale_h5120", "--device", "cpu")
    assert code == 0, out
    assert "PASS" in out and "FAIL" not in out and "ERROR" not in out
    assert " 0 failed" in out


def test_every_builtin_definition_has_a_passing_builtin_solution(capsys):
    code, out = _run(capsys, "--device", "cpu", "--max-elements", "20000")
    assert code == 0, out
    assert "0 failed" in out


def test_a_wrong_solution_fails_the_run(tmp_path):
    module = tmp_path / "wrong_solutions.py"
    module.write_text(textwrap.dedent('''
        from opforge.registry import BACKENDS

        def rmsnorm_forgets_weight(hidden_states, weight):
            import torch
            x = hidden_states.float()
            return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(hidden_states.dtype)

        BACKENDS.register("rmsnorm_forgets_weight", rmsnorm_forgets_weight, "ignores the weight", "pytorch",
                          definition="rmsnorm_h2048")
    '''))
    # In its own process: the module registers into the process-wide registry.
    proc = subprocess.run([sys.executable, "-m", "opforge.cli", "smoke", "rmsnorm_forgets_weight", "--module",
                           str(module), "--device", "cpu", "--max-elements", "300000"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout
    # Each workload fails with its errors on its line; the summary says 0 of them passed.
    assert re.search(r"^  batch_size=1\s+FAIL\s+\d+\.\d{3} ms .*output: \d+ of \d+ elements outside", proc.stdout, re.M)
    assert re.search(r"rmsnorm_forgets_weight\W+pytorch\W+0\.0% \(0/3\)\W+–\W+batch_size=1: FAIL output:",
                     proc.stdout), proc.stdout


def test_unknown_names_are_refused():
    with pytest.raises(SystemExit, match="no solution or definition named nope"):
        cli.main(["smoke", "nope", "--device", "cpu"])


def test_module_entry_point_piped_output_stays_whole():
    """A pipe has no width; rich assumes 80 columns (here told 40). No line may be cut there:
    not the header, not a workload's line, not a row of the summary."""
    proc = subprocess.run([sys.executable, "-m", "opforge.smoke_test", "scale_h2048", "reference", "--device", "cpu",
                           "--max-elements", "100000"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "40"})
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.search(r"^opforge smoke test: 2 solution\(s\) on cpu\. Times are a quick indication .*"
                     r"`opforge run` measures properly\.$", out, re.M), out
    assert re.search(r"^scale_h2048_builtin \(builtin\) for scale_h2048: opforge\.scale, compiled ahead of time "
                     r"into opforge's extension\.$", out, re.M), out
    assert re.search(r"^  batch_size=512\s+SKIP\s+1048576 elements > max elements 100000$", out, re.M), out
    assert re.search(r"^[│|]\W+scale_h2048_reference\W+python\W+100\.0% \(2/2\)\W+1\.00×\W+3 skipped\W+$", out, re.M)
    assert re.search(r"^[│|]\W+scale_h2048_builtin\W+builtin\W+100\.0% \(2/2\)\W+\d+\.\d\d×\W+3 skipped\W+$", out,
                     re.M)
    assert out.rstrip().endswith("4 passed, 0 failed, 6 skipped")


def test_summary_by_short_name(capsys):
    """``builtin`` selects <definition>_builtin of every Definition; ``reference`` adds each
    selected Definition's reference, first in its group, as the 1.00× row."""
    code, out = _run(capsys, "builtin", "--device", "cpu", "--max-elements", "20000")
    assert code == 0, out
    # Many Definitions: each row starts with its Definition's name; a Definition whose every
    # workload is too large for --max-elements has no correctness to show.
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    from opforge.trace.builtin import load_builtin_trace_set

    dataset = load_builtin_trace_set()
    assert sorted(r[0] for r in rows) == sorted(dataset.definitions), out
    for definition, solution, language, correctness, speedup, notes in rows:
        assert solution == f"{definition}_builtin" and language == "builtin"
        checked = re.fullmatch(r"100\.0% \((\d+)/\1\)|–", correctness)
        skipped = re.fullmatch(r"(\d+) skipped|", notes)
        assert checked and skipped, (definition, correctness, notes)
        assert int(checked.group(1) or 0) + int(skipped.group(1) or 0) == len(dataset.get_workloads(definition))
    assert any(r[3] != "–" for r in rows)
    code, out = _run(capsys, "silu_and_mul_d2048", "scale_h2048", "reference", "--device", "cpu",
                     "--max-elements", "20000")
    assert code == 0, out
    names = re.findall(r"^[│|]\W+(?:\w+\W+)?((?:silu_and_mul_d2048|scale_h2048)_(?:reference|builtin))\W", out, re.M)
    assert names == ["silu_and_mul_d2048_reference", "silu_and_mul_d2048_builtin", "scale_h2048_reference",
                     "scale_h2048_builtin"], out
    assert "definition" in out  # two Definitions: a column of their own
