"""The HTML report: one self-contained file (inline CSS, inline SVG plots, no script).

Everything from the dataset (solution and author names, logs, hardware names) may come from
anyone who can submit a solution, so every such string goes through ``_e`` (html.escape), in
the tables and in the plots alike, and a Content-Security-Policy that allows no script at all
backs that up.

The page states what a reader would otherwise guess: the dtypes of each definition, the
workloads that were not run (the runner writes no trace for what it skips, so a count of
traces alone would read "4/4 passed" where 49 workloads never ran), and which way a speedup
points.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Optional, Union

from ..trace import EvaluationStatus, Trace, TraceSet
from . import fmt
from .best import BestRow, best_of
from .figures import plots
from .select import DefinitionView, collect, parse_timestamp, untraced_definitions
from .stats import (earlier_baseline, first_line, max_over_median, speedup_vs_baseline, speedup_vs_reference, spread,
                    timing_range)
from .style import CSS
from .summary import SummaryRow, summary_rows

_LOG_TITLE_CHARS = 2000
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _anchor(index: int, name: str) -> str:
    return f"def-{index}-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:60]


def _fmt_time(value: Optional[datetime]) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if value else fmt.NONE


# --- header --------------------------------------------------------------------------------


def _header(trace_set: TraceSet, views: list[DefinitionView], title: str, idle: list[str]) -> str:
    traces = [t for v in views for t in v.cells.values()]
    hardware = sorted({t.evaluation.environment.hardware for t in traces})
    devices = sorted({t.evaluation.device for t in traces if t.evaluation.device})
    libs: dict[str, set[str]] = {}
    for t in traces:
        for lib, version in t.evaluation.environment.libs.items():
            libs.setdefault(lib, set()).add(version)
    times = sorted(p for t in traces if (p := parse_timestamp(t.evaluation.timestamp)) is not None)
    solutions = {t.solution for t in traces}
    items = [
        ("hardware", ", ".join(hardware) or fmt.NONE),
        ("devices", ", ".join(devices) or fmt.NONE),
        ("libraries", ", ".join(f"{lib} {'/'.join(sorted(v))}" for lib, v in sorted(libs.items())) or fmt.NONE),
        ("runs", f"{_fmt_time(times[0])} – {_fmt_time(times[-1])}" if times else fmt.NONE),
        ("traces", f"{fmt.count(len(traces), 'latest trace')} of {fmt.count(len(solutions), 'solution')} on "
                   f"{fmt.count(len(views), 'definition')}"),
        ("not run", _not_run_summary(views, idle)),
    ]
    if trace_set.root is not None:
        items.append(("dataset", str(trace_set.root)))
    items.append(("generated", _fmt_time(datetime.now(timezone.utc))))
    meta = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items)
    several = len({v.hardware for v in views}) > 1  # then every definition is shown once per GPU model
    nav = " ".join(f'<a href="#{_e(_anchor(i, v.name))}">{_e(v.name)}{_e(f" ({v.hardware})" if several else "")}</a>'
                   for i, v in enumerate(views))
    return (f'<header><h1>{_e(title)}</h1><dl class="meta">{meta}</dl></header>'
            f'<nav><p class="muted">Definitions: {nav or fmt.NONE}</p></nav>')


def _not_run_summary(views: list[DefinitionView], idle: list[str]) -> str:
    pairs = sum(len(v.not_run(s.name)) for v in views for s in v.solutions)
    text = f"{fmt.count(pairs, 'solution-workload pair')} in the definitions shown"
    if idle:
        text += f"; {fmt.count(len(idle), 'definition')} with no trace at all: {', '.join(idle)}"
    return text


_READING_KEY = (
    '<section id="key"><h2>Reading this page</h2><ul class="key-list">'
    f"<li><b>Speedups</b> (vs reference, vs baseline): {_e(fmt.SPEEDUP_MEANING)} (speedup = "
    f"{_e(fmt.SPEEDUP_DEFINITION)}).</li>"
    "<li><b>Plots</b>: one line per solution, the reference dashed; bars span p10 to p90 of the timed runs; a "
    "red-edged ✕ is a suspect timing, kept off the line. An axis spanning more than 10× is logarithmic, "
    "any other starts at zero. Hover a point for its value.</li>"
    "<li><b>Spread</b>: p90/p10 of the timed runs (about 1.05× on a quiet machine; tens mean the median is luck)."
    "</li>"
    '<li><b>Status</b>: <span class="key"><span class="st-passed">passed</span>'
    '<span class="suspect">⚠ suspect timing</span><span class="st-incorrect_numerical">incorrect</span>'
    '<span class="st-runtime_error">runtime error</span><span class="st-compile_error">compile error</span>'
    '<span class="st-timeout">timeout</span><span class="st-none">not run</span></span> '
    '<span class="best-mark">★</span> fastest of several on that workload; hover a cell for its numbers or log.</li>'
    "<li><b>Not run</b> means no trace in the dataset: the run skipped it (larger than --max-elements allows, "
    "not supported by the solution, inputs missing) or never ran it.</li></ul></section>")


# --- cells shared by the tables ------------------------------------------------------------


def _earlier_runs(row: Union[SummaryRow, BestRow]) -> str:
    return (f"{len(row.baseline_earlier)} of {fmt.count(row.baseline_ratios, 'ratio')} against a baseline timed "
            f"in an earlier run: {'; '.join(sorted(set(row.baseline_earlier)))}")


def _vs_baseline_cell(row: Union[SummaryRow, BestRow]) -> str:
    """A speedup vs baseline, marked when baselines came from an earlier run (the title says which)."""
    title = [f"baseline: {row.baseline}"] if row.baseline else []
    if row.baseline_earlier:
        title.append(_earlier_runs(row))
    text = fmt.vs_baseline(row.speedup_vs_baseline, len(row.baseline_earlier), row.baseline_ratios)
    return f'<td class="n" title="{_e(chr(10).join(title))}">{_e(text)}</td>'


def _earlier_footnote(rows, mean: bool) -> str:
    runs = [run for r in rows for run in r.baseline_earlier]
    return f'<p class="footnote muted">{_e(fmt.earlier_note(runs, mean))}</p>' if runs else ""


def _spread_detail(spread_x: Optional[float], tail: Optional[float]) -> str:
    text = f"p90/p10 of the timed runs {fmt.times(spread_x)}"
    return text + (f"; slowest run {fmt.times(tail)} the median" if tail is not None else "")


# --- summary -------------------------------------------------------------------------------


def _summary_table(rows: list[SummaryRow], anchors: dict[tuple[str, str], str]) -> str:
    several = len({h for r in rows for h in r.hardware}) > 1  # one machine is in the header
    head = ("definition", "dtype", "solution", "author", "language", "passed", "failures", "not run",
            "median latency (µs)", "median GB/s", "median % of peak", "vs reference (geomean)",
            "vs baseline (geomean)", "suspect timings") + (("hardware",) if several else ())
    body = []
    for r in rows:
        suspect = (f'<td class="n suspect"><span class="flag">⚠ {r.suspect}</span></td>' if r.suspect
                   else '<td class="n">0</td>')
        not_run = (f'<td class="n not-run" title="{_e(", ".join(r.not_run))}">{len(r.not_run)}</td>'
                   if r.not_run else '<td class="n">0</td>')
        hardware = f"<td>{_e(', '.join(r.hardware))}</td>" if several else ""
        body.append(
            "<tr>"
            f'<td class="name"><a href="#{_e(anchors[(r.definition, ", ".join(r.hardware))])}">{_e(r.definition)}</a></td>'
            f'<td class="dtype">{_e(r.dtype)}</td>'
            f'<td class="name"><b>{_e(r.solution)}</b></td><td>{_e(r.author)}</td><td>{_e(r.language)}</td>'
            f'<td class="n">{r.passed}/{r.workloads}</td><td>{_e(fmt.failures(r.statuses))}</td>{not_run}'
            f'<td class="n">{_e(fmt.us(r.median_latency_ms))}</td><td class="n">{_e(fmt.gbps(r.median_gbps))}</td>'
            f'<td class="n">{_e(fmt.pct(r.median_percent_of_peak))}</td>'
            f'<td class="n">{_e(fmt.times(r.speedup_vs_reference))}</td>{_vs_baseline_cell(r)}'
            f"{suspect}{hardware}</tr>")
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (f'<section id="summary"><h2>Summary</h2><p class="muted">Medians and geometric means over the passed '
            f"workloads whose timing is not suspect; passed counts every workload of the definition, run or "
            f"not. {_e(fmt.SPEEDUP_NOTE)}.</p>"
            f'<div class="scroll"><table class="summary"><thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>{_earlier_footnote(rows, mean=True)}</section>")


# --- status matrix -------------------------------------------------------------------------


def _passed_cell(trace: Trace, winner: bool) -> str:
    perf = trace.evaluation.performance
    extra = [f"speedup vs reference {fmt.times(speedup_vs_reference(trace))}"]
    if perf.baseline_solution:
        earlier = earlier_baseline(trace)
        speedup = fmt.vs_baseline(speedup_vs_baseline(trace), int(earlier is not None))
        extra.append(f"vs {perf.baseline_solution} {speedup}"
                     + (f" (baseline timed in an earlier run: {earlier})" if earlier else ""))
    bounds = timing_range(trace)
    if bounds:
        extra.append(f"p10–p90 {fmt.us(bounds[0])}–{fmt.us(bounds[1])} µs, "
                     + _spread_detail(spread(trace), max_over_median(trace)))
    if perf.percent_of_peak is not None:
        extra.append(f"{fmt.pct(perf.percent_of_peak)} of peak")
    classes, flag = "st st-passed", ""
    if perf.suspect is not None:
        classes += " suspect"
        flag = '<br><span class="flag">⚠ suspect</span>'
        extra.insert(0, f"suspect timing: {perf.suspect}")
    mark = ' <span class="best-mark" title="fastest on this workload">★</span>' if winner else ""
    noise = f'<br><span class="spread">spread {_e(fmt.times(spread(trace)))}</span>' if bounds else ""
    return (f'<td class="{classes}" title="{_e(chr(10).join(extra))}"><span class="status">PASSED</span>{mark}<br>'
            f'<span class="num">{_e(fmt.us(perf.latency_ms))} µs</span>{noise}{flag}</td>')


def _failed_cell(trace: Trace) -> str:
    ev = trace.evaluation
    status = ev.status.value
    detail = ev.log[:_LOG_TITLE_CHARS]
    if ev.correctness is not None:
        detail = (f"max relative error {ev.correctness.max_relative_error:.3g}, max absolute error "
                  f"{ev.correctness.max_absolute_error:.3g}\n{detail}")
    line = first_line(ev.log)
    log = f'<div class="log">{_e(line)}</div>' if line else ""
    return (f'<td class="st st-{_e(status.lower())}" title="{_e(detail.strip())}">'
            f'<span class="status">{_e(status)}</span>{log}</td>')


def _status_matrix(view: DefinitionView, winners: dict[str, str]) -> str:
    header = "".join(f"<th>{_e(w.label)}</th>" for w in view.workloads)
    rows = []
    for s in view.solutions:
        cells = []
        for w in view.workloads:
            t = view.trace(s.name, w.uuid)
            if t is None:
                cells.append('<td class="st st-none"><span class="status">not run</span></td>')
            elif t.evaluation.status == EvaluationStatus.PASSED:
                cells.append(_passed_cell(t, winners.get(w.uuid) == s.name))
            else:
                cells.append(_failed_cell(t))
        rows.append(f'<tr><th class="name">{_e(s.name)}</th>{"".join(cells)}</tr>')
    untraced = ""
    if view.untraced:
        untraced = (f'<p class="not-run">Not run by any solution ({len(view.untraced)} of '
                    f"{fmt.count(len(view.all_workloads), 'workload')}): "
                    f"{_e(', '.join(w.label for w in view.untraced))}</p>")
    return (f'<h3>Status</h3><div class="scroll"><table class="status-matrix"><thead><tr>'
            f"<th>solution \\ workload</th>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"{untraced}")


# --- best ----------------------------------------------------------------------------------


def _best_table(rows: list[BestRow]) -> str:
    if not any(r.candidates > 1 for r in rows if not r.overall):
        # A ranking of one is the status matrix again; its numbers are in the cells and plots.
        return ('<p class="muted">No workload has two solutions with comparable timings: nothing to rank. '
                "Hover a status cell for its speedups, spread and % of peak.</p>")
    head = ("workload", "fastest", "latency (µs)", "spread (p90/p10)", "GB/s", "% of peak", "vs baseline",
            "vs reference", "runner-up", "margin", "note")
    body = []
    overall = ""
    for r in rows:
        if r.overall:
            overall = _overall(r)
            continue
        note = r.note
        if r.suspect:
            note = "; ".join(filter(None, [note, "suspect timing left out: " + ", ".join(r.suspect)]))
        note_cell = f'<td><span class="flag">⚠</span> {_e(note)}</td>' if r.suspect else f"<td>{_e(note)}</td>"
        body.append(
            f"<tr><td>{_e(r.workload)}</td><td><b>{_e(r.solution or fmt.NONE)}</b></td>"
            f'<td class="n">{_e(fmt.us(r.latency_ms))}</td>'
            f'<td class="n" title="{_e(_spread_detail(r.spread, r.max_over_median))}">{_e(fmt.times(r.spread))}</td>'
            f'<td class="n">{_e(fmt.gbps(r.gbps))}</td><td class="n">{_e(fmt.pct(r.percent_of_peak))}</td>'
            f'{_vs_baseline_cell(r)}<td class="n">{_e(fmt.times(r.speedup_vs_reference))}</td>'
            f"<td>{_e(r.runner_up or fmt.NONE)}</td>"
            f'<td class="n">{_e(fmt.margin(r.margin_pct))}</td>{note_cell}</tr>')
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (f"<h3>Best solution per workload</h3>{overall}"
            f'<div class="scroll"><table class="best"><thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>{_earlier_footnote([r for r in rows if not r.overall], mean=False)}")


def _overall(r: BestRow) -> str:
    if r.solution is None:
        return f'<p class="overall">Best overall: {fmt.NONE} ({_e(r.note)})</p>'
    text = (f"Best overall: <b>{_e(r.solution)}</b>, latency {_e(fmt.times(r.latency_ratio))} the fastest per "
            f"workload (geometric mean over {fmt.count(r.workloads_compared, 'workload')}, among "
            f"{fmt.count(r.candidates, 'solution')} that passed every workload)")
    if r.speedup_vs_baseline is not None:
        text += f"; {_e(fmt.times(r.speedup_vs_baseline))} vs {_e(r.baseline or 'baseline')}"
        if r.baseline_earlier:
            text += f" ({_e(_earlier_runs(r))})"
    if r.runner_up:
        text += f"; runner-up {_e(r.runner_up)} {_e(fmt.margin(r.margin_pct))}"
    if r.note:
        text += f'. <span class="flag">⚠</span> {_e(r.note)}'
    return f'<p class="overall">{text}</p>'


# --- page ----------------------------------------------------------------------------------


def _definition_section(view: DefinitionView, anchor: str, several: bool) -> str:
    d = view.definition
    consts = ", ".join(f"{k}={v}" for k, v in d.const_axes.items())
    rows = best_of(view)
    # A star among one candidate says nothing.
    winners = {r.uuid: r.solution for r in rows if not r.overall and r.solution and r.candidates > 1}
    about = f"op type {d.op_type}; dtype {fmt.dtype_label(d)}" + (f"; constant axes {consts}" if consts else "")
    on = f' <span class="muted">on {_e(view.hardware)}</span>' if several else ""
    return (f'<section class="definition" id="{_e(anchor)}"><h2>{_e(d.name)}{on}</h2>'
            f'<p class="muted" title="{_e(fmt.dtype_detail(d))}">{_e(about)}</p>'
            f"{plots(view)}{_status_matrix(view, winners)}{_best_table(rows)}</section>")


def render_html(trace_set: TraceSet, definitions: Optional[Iterable[str]] = None,
                solutions: Optional[Iterable[str]] = None, hardware: Optional[str] = None,
                title: str = "opforge benchmark report") -> str:
    """The report as HTML text (see write_html)."""
    views = collect(trace_set, definitions, solutions, hardware)
    idle = untraced_definitions(trace_set, views, definitions, solutions)
    anchors = {(v.name, v.hardware): _anchor(i, v.name) for i, v in enumerate(views)}
    summary = [row for v in views for row in summary_rows(v)]
    several = len({v.hardware for v in views}) > 1
    sections = "".join(_definition_section(v, anchors[(v.name, v.hardware)], several) for v in views)
    if not views:
        sections = '<p class="muted">No evaluated traces match.</p>'
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{_header(trace_set, views, title, idle)}{_READING_KEY}{_summary_table(summary, anchors)}"
            f"{sections}"
            f'<footer><p class="muted">Latest trace per definition, workload and solution. Generated by opforge.'
            f"</p></footer></main></body></html>\n")


def write_html(trace_set: TraceSet, path: Union[str, Path] = "report.html", definitions: Optional[Iterable[str]] = None,
               solutions: Optional[Iterable[str]] = None, hardware: Optional[str] = None,
               title: str = "opforge benchmark report") -> Path:
    """Write the report to ``path`` as one self-contained HTML file: a header (hardware,
    libraries, time range of the runs, what was not run), the summary table, and per definition
    its dtypes, the latency (with p10-p90 bars) and bandwidth plots, a status matrix (solutions
    x workloads, "not run" included) and the best solution per workload. Filters as in
    ``summarize``."""
    text = render_html(trace_set, definitions, solutions, hardware, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
