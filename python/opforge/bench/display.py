"""The runner's terminal output: a progress bar while it runs, then every result once, in one
table, the last lines of the workers that failed, and the command that reads the results.

Results are not printed as they finish, or each would be read twice: once scrolling by and
once in the table. In a terminal the progress bar counts passed, failed and skipped so far; in
a pipe or a log file (no live bar) a count line is printed now and then instead, so a long run
still shows it is alive.
"""

from __future__ import annotations

import shlex
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..report import fmt
from ..report.stats import spread
from ..trace import Trace
from .runner import WORKER_OUTPUT, Skipped

COLUMNS = ("definition", "solution", "workload", "status", "latency", "spread", "GB/s", "% peak", "vs ref",
           "vs baseline", "note")
_NUMBERS = {"latency", "spread", "GB/s", "% peak", "vs ref", "vs baseline"}
#: Lines of a failed worker's output shown after the table.
TAIL_LINES = 4
_STYLE = {"PASSED": "green", "SKIPPED": "yellow", "TIMEOUT": "magenta"}
#: Seconds between count lines when there is no live progress bar.
PIPE_INTERVAL_S = 30.0


def _us(ms) -> str:
    return "" if ms is None else (f"{ms * 1e3:.2f} us" if ms < 1 else f"{ms:.3f} ms")


def row(item) -> list[str]:
    """The cells of COLUMNS for a Trace or a Skipped, as rich markup."""
    # Names and logs are the dataset's and the solution's text: escaped, never read as markup.
    if isinstance(item, Skipped):
        return [escape(item.definition), escape(item.solution), escape(item.workload),
                "[yellow]SKIPPED[/]", "", "", "", "", "", "",
                escape(item.reason.splitlines()[0][:80]) if item.reason else ""]
    assert isinstance(item, Trace)
    ev = item.evaluation
    status = ev.status.value
    style = _STYLE.get(status, "red")
    label = ",".join(f"{k}={v}" for k, v in item.workload.axes.items()) or "-"
    cells = [escape(item.definition), escape(item.solution), escape(label),
             f"[{style}]{status}[/]"]
    p = ev.performance
    if p is None:
        first = next((line for line in ev.log.splitlines() if line.strip()), "")
        return cells + ["", "", "", "", "", "", escape(first[:100])]
    note = "[red]SUSPECT[/] " + "; ".join(r.split(":")[0] for r in p.suspect.splitlines()) if p.suspect else ""
    earlier = bool(p.timing and p.timing.get("baseline_earlier"))
    if earlier:
        note = (note + "; " if note else "") + "* baseline timed in an earlier run"
    if p.timing and p.timing.get("method") == "cuda_events+device_synchronize":
        note = (note + "; " if note else "") + "work after the end event counted"
    noise = spread(item)
    return cells + [
        _us(p.latency_ms),
        fmt.times(noise) if noise is not None else "",
        f"{p.achieved_gbps:.0f}" if p.achieved_gbps is not None else "",
        f"{p.percent_of_peak:.0f}%" if p.percent_of_peak is not None else "",
        fmt.times(p.speedup_factor) if p.speedup_factor else "",
        fmt.times(p.baseline_speedup_factor) + ("*" if earlier else "") if p.baseline_speedup_factor else "",
        note,
    ]


def results_table(items) -> Table:
    """Every result in one table: grouped by Definition (in the order they first appear, a rule
    between them), each solution's workloads together, in the order they ran."""
    definitions: dict[str, int] = {}
    solutions: dict[tuple[str, str], int] = {}
    for item in items:
        definitions.setdefault(item.definition, len(definitions))
        solutions.setdefault((item.definition, item.solution), len(solutions))
    ordered = sorted(items, key=lambda i: (definitions[i.definition], solutions[(i.definition, i.solution)]))
    table = Table(title="Results", title_justify="left", caption_justify="left",
                  caption=f"spread: p90/p10 of the timed runs; vs ref / vs baseline: {fmt.SPEEDUP_MEANING} "
                          f"({fmt.SPEEDUP_DEFINITION})")
    for c in COLUMNS:
        table.add_column(c, justify="right" if c in _NUMBERS else "left", overflow="fold",
                         max_width=48 if c == "note" else None)
    for i, item in enumerate(ordered):
        last = i + 1 == len(ordered) or ordered[i + 1].definition != item.definition
        table.add_row(*row(item), end_section=last)
    return table


def worker_output(item) -> str:
    """The last lines a failed solution's worker printed, under the result they belong to
    (the whole log is in the Trace and the worker's log); "" for any other result."""
    if not isinstance(item, Trace) or WORKER_OUTPUT not in item.evaluation.log:
        return ""
    output = [ln for ln in item.evaluation.log.split(WORKER_OUTPUT, 1)[1].splitlines() if ln.strip()]
    head = "  ".join(c for c in row(item)[:4] if c)
    return head + "".join(f"\n    | {escape(ln[:200])}" for ln in output[-TAIL_LINES:])


def next_command(where, default: Path) -> str:
    """The command that reads the run's results: the report's default dataset needs no option."""
    command = "opforge report html"
    if Path(where).resolve() != default.resolve():
        command += f" --dataset {shlex.quote(str(where))}"
    return command


class RunProgress:
    """Counts results as they finish: a live bar in a terminal, a count line every
    PIPE_INTERVAL_S seconds otherwise. ``start``, ``finished`` and ``stop`` are safe to call
    from the runner's device threads; ``clock`` is for tests."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic):
        self.console, self.clock = console, clock
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.items: list = []  # Traces and Skipped, in the order they finished
        self.total = None
        self._lock = threading.Lock()
        self.live = console.is_terminal
        self._started = self._last_line = clock()
        self._bar: Optional[Progress] = None
        if self.live:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[counts]}"), console=console,
                                 transient=True)
            self._task = self._bar.add_task("benchmarking", total=None, counts="")
            self._bar.start()

    def text(self) -> str:
        return ", ".join(f"{n} {what}" for what, n in self.counts.items())

    def start(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def finished(self, item) -> None:
        with self._lock:  # devices finish results on their own threads
            self.items.append(item)
            kind = "skipped" if isinstance(item, Skipped) else "passed" if item.is_successful() else "failed"
            self.counts[kind] += 1
            if self._bar is not None:
                self._bar.update(self._task, advance=1, description=escape(item.definition), counts=self.text())
            elif self.clock() - self._last_line >= PIPE_INTERVAL_S:
                self._last_line = self.clock()
                elapsed = int(self._last_line - self._started)
                self.console.print(f"{len(self.items)}/{self.total if self.total is not None else '?'} done after "
                                   f"{elapsed // 60}:{elapsed % 60:02d}: {self.text()}", highlight=False,
                                   soft_wrap=True)

    def stop(self) -> None:
        """Take the bar off the screen (again is harmless)."""
        if self._bar is not None:
            self._bar.stop()
