"""The smoke test (`opforge smoke`, `python -m opforge.smoke_test`): every built-in solution
passes on CPU, a wrong solution fails the run, and the command reports what it ran."""

from __future__ import annotations

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


def test_unknown_names_are_refused():
    with pytest.raises(SystemExit, match="no solution or definition named nope"):
        cli.main(["smoke", "nope", "--device", "cpu"])


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "opforge.smoke_test", "scale_h2048", "--device", "cpu",
                           "--max-elements", "100000"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout
