"""What `opforge run` prints: every result once, in one table whose rows stay whole when piped,
the last lines of a worker that died (once, after the table), the totals, and the command
that reads the results next; while it runs, counts rather than results."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402

from test_runner import BATCHES, DEF, make_dataset  # noqa: E402

from opforge.bench import display  # noqa: E402
from opforge.bench.cli import BUILTIN_OUTPUT  # noqa: E402
from opforge.bench.runner import Skipped  # noqa: E402

QUICK = ["--devices", "cpu", "--iterations", "3", "--warmup", "1", "--seed", "5"]
RUN = "from opforge.cli import main; raise SystemExit(main(sys.argv[1:]))"


def test_piped_run_prints_each_result_once_in_one_table(tmp_path):
    make_dataset(tmp_path / "ds", names={"honest", "wrong_values", "exits"})
    out = tmp_path / "copy with space"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([sys.executable, "-c", f"import sys; {RUN}", "run", "--dataset", str(tmp_path / "ds"),
                           "--output", str(out), *QUICK], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr  # a solution failed
    lines = done.stdout.splitlines()
    assert sum(line.startswith("┃ definition ") for line in lines) == 1, done.stdout  # one table
    # Each (solution, workload) is one whole row, printed once.
    for name, status in (("honest", "PASSED"), ("wrong_values", "INCORRECT_NUMERICAL"), ("exits", "RUNTIME_ERROR")):
        for batch in BATCHES:
            rows = [line for line in lines if f"│ {DEF}_{name} " in line and f" batch={batch} " in line]
            assert len(rows) == 1 and f" {status} " in rows[0], (name, batch, done.stdout)
            # Nowhere else, except above the last lines of a worker that died.
            mentions = [line for line in lines if f"{DEF}_{name} " in line and f"batch={batch} " in line]
            assert len(mentions) == (2 if name == "exits" else 1), (name, batch, done.stdout)
    header = [c.strip() for c in next(line for line in lines if line.startswith("┃ definition ")).split("┃")]
    passed = [c.strip() for c in next(line for line in lines if f"│ {DEF}_honest " in line).split("│")]
    row = dict(zip(header, passed))
    assert row["latency"].endswith(" us") and row["spread"].endswith("×") and row["vs ref"].endswith("×"), row
    assert any("above 1× is faster" in line for line in lines)
    # The dead worker's last words, once each, after the table.
    tails = [i for i, line in enumerate(lines) if "| about to leave" in line]
    assert len(tails) == len(BATCHES) and min(tails) > max(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[-2].startswith("2 passed, 4 failed, 0 skipped") and f"traces in {out}" in lines[-2]
    assert lines[-1] == f"next: opforge report html --dataset '{out}'"


def test_the_next_command_needs_no_dataset_for_the_default_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert display.next_command(BUILTIN_OUTPUT, BUILTIN_OUTPUT) == "opforge report html"
    assert display.next_command(tmp_path / BUILTIN_OUTPUT, BUILTIN_OUTPUT) == "opforge report html"
    assert display.next_command("runs/x.json", BUILTIN_OUTPUT) == "opforge report html --dataset runs/x.json"


def test_without_a_terminal_progress_is_a_count_line_now_and_then():
    now = [0.0]
    out = io.StringIO()
    progress = display.RunProgress(Console(file=out, width=100), clock=lambda: now[0])
    assert not progress.live
    progress.start(3)
    skipped = [Skipped(DEF, f"{DEF}_honest", f"batch={b}", "too large") for b in (1, 2, 3)]
    progress.finished(skipped[0])
    now[0] = display.PIPE_INTERVAL_S - 1
    progress.finished(skipped[1])
    assert out.getvalue() == ""  # results themselves are not printed as they finish
    now[0] = display.PIPE_INTERVAL_S + 61
    progress.finished(skipped[2])
    assert out.getvalue() == "3/3 done after 1:31: 0 passed, 0 failed, 3 skipped\n"
    assert progress.items == skipped
    progress.stop()
