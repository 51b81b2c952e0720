"""The runner's terminal output: one line per evaluation as it finishes, and a table at the end."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..trace import Trace
from .runner import WORKER_OUTPUT, Skipped

COLUMNS = ("definition", "solution", "workload", "status", "latency", "GB/s", "% peak", "vs ref", "vs baseline",
           "note")
#: Lines of a failed worker's output shown under its line.
TAIL_LINES = 4
_STYLE = {"PASSED": "green", "SKIPPED": "yellow", "TIMEOUT": "magenta"}


def _us(ms) -> str:
    return "" if ms is None else (f"{ms * 1e3:.2f} us" if ms < 1 else f"{ms:.3f} ms")


def row(item) -> list[str]:
    """The cells of COLUMNS for a Trace or a Skipped."""
    # Names and logs are the dataset's and the solution's text: escaped, never read as markup.
    if isinstance(item, Skipped):
        return [escape(item.definition), escape(item.solution), escape(item.workload), "[yellow]SKIPPED[/]", "", "",
                "", "", "", escape(item.reason.splitlines()[0][:80]) if item.reason else ""]
    assert isinstance(item, Trace)
    ev = item.evaluation
    status = ev.status.value
    style = _STYLE.get(status, "red")
    label = ",".join(f"{k}={v}" for k, v in item.workload.axes.items()) or "-"
    cells = [escape(item.definition), escape(item.solution), escape(label), f"[{style}]{status}[/]"]
    p = ev.performance
    if p is None:
        first = next((line for line in ev.log.splitlines() if line.strip()), "")
        return cells + ["", "", "", "", "", escape(first[:100])]
    note = "[red]SUSPECT[/] " + "; ".join(r.split(":")[0] for r in p.suspect.splitlines()) if p.suspect else ""
    earlier = bool(p.timing and p.timing.get("baseline_earlier"))
    if earlier:
        note = (note + "; " if note else "") + "* baseline timed in an earlier run"
    if p.timing and p.timing.get("method") == "cuda_events+device_synchronize":
        note = (note + "; " if note else "") + "work after the end event counted"
    return cells + [
        _us(p.latency_ms),
        f"{p.achieved_gbps:.0f}" if p.achieved_gbps is not None else "",
        f"{p.percent_of_peak:.0f}%" if p.percent_of_peak is not None else "",
        f"{p.speedup_factor:.2f}x" if p.speedup_factor else "",
        f"{p.baseline_speedup_factor:.2f}x{'*' if earlier else ''}" if p.baseline_speedup_factor else "",
        note,
    ]


def results_tables(items) -> list[Table]:
    """One table per Definition, in the order the Definitions first appear."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(item.definition, []).append(item)
    tables = []
    for definition, members in groups.items():
        table = Table(title=definition, title_justify="left")
        for c in COLUMNS[1:]:
            table.add_column(c, justify="right" if c in ("latency", "GB/s", "% peak", "vs ref", "vs baseline")
                             else "left", overflow="fold", max_width=48 if c == "note" else None)
        for item in members:
            table.add_row(*row(item)[1:])
        tables.append(table)
    return tables


def line(item) -> str:
    """One finished evaluation as a console line; a solution whose worker failed gets the last
    lines its worker printed under it (the whole log is in the Trace and the worker's log)."""
    text = "  ".join(c for c in row(item) if c)
    if isinstance(item, Trace) and WORKER_OUTPUT in item.evaluation.log:
        output = [ln for ln in item.evaluation.log.split(WORKER_OUTPUT, 1)[1].splitlines() if ln.strip()]
        text += "".join(f"\n    | {escape(ln[:200])}" for ln in output[-TAIL_LINES:])
    return text
