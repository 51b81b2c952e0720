"""The report tables in a terminal (rich). Every cell from the data is a rich Text, so a
solution named like "[bold]x" prints as written instead of as markup."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from . import fmt
from .best import BestRow
from .summary import SummaryRow

#: Width a table is measured in to find its natural width (wider than any real row).
_UNBOUNDED = 10_000


def _text(value, style: str = "") -> Text:
    return Text(str(value), style=style)


def _table(title: str, columns) -> Table:
    """Columns named with a leading "#" hold numbers (right-aligned). Every cell folds rather
    than being cut with an ellipsis: in a narrow terminal a long name or number wraps, but
    nothing is lost."""
    table = Table(title=title, title_justify="left", caption_justify="left")
    for name in columns:
        table.add_column(name.lstrip("#"), justify="right" if name.startswith("#") else "left", overflow="fold")
    return table


def _vs_baseline(row) -> Text:
    return _text(fmt.vs_baseline(row.speedup_vs_baseline, len(row.baseline_earlier), row.baseline_ratios))


def _caption(table: Table, rows, mean: bool) -> None:
    """Which way the speedup columns point, and the earlier-baseline footnote when one is marked."""
    runs = [run for r in rows for run in r.baseline_earlier]
    notes = [f"vs ref / vs baseline: {fmt.SPEEDUP_MEANING} ({fmt.SPEEDUP_DEFINITION})"]
    if runs:
        notes.append(fmt.earlier_note(runs, mean))
    table.caption = "\n".join(notes)


def print_tables(console: Optional[Console], tables: Sequence[Table]) -> None:
    """Print the tables that have rows, on ``console`` or on stdout at a width that keeps each
    row whole when stdout is not a terminal."""
    tables = [t for t in tables if t.row_count]
    if console is None:
        console = Console()
        if not console.is_terminal:
            # A pipe or a log file has no width to fit, and folding every cell into the 80
            # columns rich assumes there splits the numbers: print whole rows instead.
            wide = console.options.update_width(_UNBOUNDED)
            console.width = max([console.width] + [Measurement.get(console, wide, t).maximum for t in tables])
    for table in tables:
        console.print(table)


def _by_hardware(rows, hardware_of) -> dict[str, list]:
    """The rows of each hardware, in the order each first appears (one table per GPU model:
    numbers measured on different models are not compared in one table)."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(hardware_of(r), []).append(r)
    return groups


def _on(title: str, hardware: str) -> str:
    return f"{title} on {hardware}" if hardware else title


def print_summary(rows: Sequence[SummaryRow], console: Optional[Console] = None) -> None:
    tables = []
    for hardware, group in _by_hardware(rows, lambda r: ", ".join(r.hardware)).items():
        table = _table(_on("Summary (medians and geomeans over passed, non-suspect workloads)", hardware),
                       ("definition", "dtype", "solution", "lang", "#passed", "failures", "#not run", "#latency µs",
                        "#GB/s", "#% peak", "#vs ref", "#vs baseline", "#suspect"))
        for r in group:
            ok = "green" if r.workloads and r.passed == r.workloads else "red" if r.failed else "yellow"
            table.add_row(_text(r.definition), _text(r.dtype), _text(r.solution, "bold"), _text(r.language),
                          _text(f"{r.passed}/{r.workloads}", ok),
                          _text(fmt.failures(r.statuses), "red" if r.failed else ""),
                          _text(len(r.not_run) or "", "yellow"),
                          _text(fmt.us(r.median_latency_ms)), _text(fmt.gbps(r.median_gbps)),
                          _text(fmt.pct(r.median_percent_of_peak)), _text(fmt.times(r.speedup_vs_reference)),
                          _vs_baseline(r), _text(r.suspect or "", "yellow" if r.suspect else ""))
        _caption(table, group, mean=True)
        tables.append(table)
    print_tables(console, tables)


def print_best(rows: Sequence[BestRow], console: Optional[Console] = None) -> None:
    tables = []
    for hardware, group in _by_hardware(rows, lambda r: r.hardware).items():
        per_workload = _table(_on("Fastest passing solution per workload (suspect timings left out)", hardware),
                              ("definition", "workload", "best", "#latency µs", "#spread p90/p10", "#GB/s", "#% peak",
                               "#vs baseline", "#vs ref", "runner-up", "#margin", "note"))
        overall = _table(_on("Best overall (geomean of latency / fastest, among solutions passing every workload)",
                             hardware),
                         ("definition", "best", "#latency ratio", "#vs baseline", "#vs ref", "runner-up", "#margin",
                          "note"))
        for r in group:
            note = r.note
            if r.suspect and not r.overall:
                note = "; ".join(filter(None, [note, "suspect: " + ", ".join(r.suspect)]))
            if r.overall:
                overall.add_row(_text(r.definition), _text(r.solution or fmt.NONE, "bold green"),
                                _text(fmt.times(r.latency_ratio)), _vs_baseline(r),
                                _text(fmt.times(r.speedup_vs_reference)), _text(r.runner_up or fmt.NONE),
                                _text(fmt.margin(r.margin_pct)), _text(note, "yellow"))
            else:
                per_workload.add_row(_text(r.definition), _text(r.workload),
                                     _text(r.solution or fmt.NONE, "bold green"), _text(fmt.us(r.latency_ms)),
                                     _text(fmt.times(r.spread)), _text(fmt.gbps(r.gbps)),
                                     _text(fmt.pct(r.percent_of_peak)), _vs_baseline(r),
                                     _text(fmt.times(r.speedup_vs_reference)), _text(r.runner_up or fmt.NONE),
                                     _text(fmt.margin(r.margin_pct)), _text(note, "yellow"))
        _caption(per_workload, [r for r in group if not r.overall], mean=False)
        _caption(overall, [r for r in group if r.overall], mean=True)
        tables += [per_workload, overall]
    print_tables(console, tables)
