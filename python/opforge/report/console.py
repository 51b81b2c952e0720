"""The report tables in a terminal (rich). Every cell from the data is a rich Text, so a
solution named like "[bold]x" prints as written instead of as markup."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import fmt
from .best import BestRow
from .summary import SummaryRow


def _text(value, style: str = "") -> Text:
    return Text(str(value), style=style)


def _table(title: str, columns) -> Table:
    """Columns named with a leading "#" hold numbers (right-aligned). Every cell folds rather
    than being cut with an ellipsis: in a narrow terminal a long name or number wraps, but
    nothing is lost."""
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name.lstrip("#"), justify="right" if name.startswith("#") else "left", overflow="fold")
    return table


def print_summary(rows: Sequence[SummaryRow], console: Optional[Console] = None) -> None:
    console = console or Console()
    hardware = sorted({h for r in rows for h in r.hardware})
    # One machine (the usual case) goes in the title rather than in a column of its own.
    per_row = len(hardware) > 1
    title = "Summary (medians and geomeans over passed, non-suspect workloads)"
    if len(hardware) == 1:
        title += f" on {hardware[0]}"
    table = _table(title, ("definition", "solution", "lang", "#passed", "failures", "#latency µs", "#GB/s", "#% peak",
                           "#vs ref", "#vs baseline", "#suspect") + (("hardware",) if per_row else ()))
    for r in rows:
        ok = "green" if r.workloads and r.passed == r.workloads else "red" if r.workloads else "dim"
        table.add_row(_text(r.definition), _text(r.solution, "bold"), _text(r.language),
                      _text(f"{r.passed}/{r.workloads}", ok),
                      _text(fmt.failures(r.statuses), "red" if r.failed else ""),
                      _text(fmt.us(r.median_latency_ms)), _text(fmt.gbps(r.median_gbps)),
                      _text(fmt.pct(r.median_percent_of_peak)), _text(fmt.times(r.speedup_vs_reference)),
                      _text(fmt.times(r.speedup_vs_baseline)), _text(r.suspect or "", "yellow" if r.suspect else ""),
                      *((_text(", ".join(r.hardware)),) if per_row else ()))
    console.print(table)


def print_best(rows: Sequence[BestRow], console: Optional[Console] = None) -> None:
    console = console or Console()
    per_workload = _table("Fastest passing solution per workload (suspect timings left out)",
                          ("definition", "workload", "best", "#latency µs", "#GB/s", "#% peak", "#vs baseline",
                           "#vs ref", "runner-up", "#margin", "note"))
    overall = _table("Best overall (geomean of latency / fastest, among solutions passing every workload)",
                     ("definition", "best", "#latency ratio", "#vs baseline", "#vs ref", "runner-up", "#margin",
                      "note"))
    for r in rows:
        note = r.note
        if r.suspect and not r.overall:
            note = "; ".join(filter(None, [note, "suspect: " + ", ".join(r.suspect)]))
        if r.overall:
            overall.add_row(_text(r.definition), _text(r.solution or fmt.NONE, "bold green"),
                            _text(fmt.times(r.latency_ratio)), _text(fmt.times(r.speedup_vs_baseline)),
                            _text(fmt.times(r.speedup_vs_reference)), _text(r.runner_up or fmt.NONE),
                            _text(fmt.margin(r.margin_pct)), _text(note, "yellow"))
        else:
            per_workload.add_row(_text(r.definition), _text(r.workload), _text(r.solution or fmt.NONE, "bold green"),
                                 _text(fmt.us(r.latency_ms)), _text(fmt.gbps(r.gbps)),
                                 _text(fmt.pct(r.percent_of_peak)),
                                 _text(fmt.times(r.speedup_vs_baseline)), _text(fmt.times(r.speedup_vs_reference)),
                                 _text(r.runner_up or fmt.NONE), _text(fmt.margin(r.margin_pct)), _text(note, "yellow"))
    if per_workload.row_count:
        console.print(per_workload)
    if overall.row_count:
        console.print(overall)
