"""The plots of one definition in the HTML report: latency per workload (p10-p90 bars, the
reference as a dashed line) and bandwidth per workload, under one legend. A solution keeps its
color in both plots, so one legend serves them."""

from __future__ import annotations

import statistics
from typing import Callable, Optional

from ..trace import Trace
from .plots import PALETTE, REFERENCE_COLOR, SUSPECT_EDGE, Point, Series, finite, line_plot
from .plots import escape as _e
from .select import DefinitionView
from .stats import believable, passed, timing_range


def x_axis(view: DefinitionView):
    """(x value per traced workload uuid, x label, labelled ticks or None): the variable axis
    when there is one, else the workloads as categories, each labelled with its axis values
    ("8, 321") under an axis label that names them once ("batch_size, num_pages")."""
    var = view.definition.var_axes
    if len(var) == 1 and all(var[0] in w.axes for w in view.workloads):
        return {w.uuid: float(w.axes[var[0]]) for w in view.workloads}, var[0], None
    xs = {w.uuid: float(i) for i, w in enumerate(view.workloads)}
    if not var or any(set(var) - set(w.axes) for w in view.workloads):
        return xs, "workload", [(xs[w.uuid], w.label) for w in view.workloads]
    return xs, ", ".join(var), [(xs[w.uuid], ", ".join(str(w.axes[a]) for a in var)) for w in view.workloads]


def colors(view: DefinitionView) -> dict[str, str]:
    return {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(view.solutions)}


def _value(value: float, unit: str) -> str:
    """``7 µs``, ``19,182 µs``, ``2.5%``: four significant digits, never an exponent."""
    number = f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"
    return f"{number}%" if unit == "%" else f"{number} {unit}"


def _series(view: DefinitionView, metric: Callable[[Trace], Optional[float]], unit: str,
            bounds: Callable[[Trace], Optional[tuple]] = lambda t: None) -> list[Series]:
    """One series per solution of ``metric(trace)`` over its passed traces; ``bounds(trace)``
    gives the (low, high) range of the value when there is one."""
    xs, _, _ = x_axis(view)
    labels = {w.uuid: w.label for w in view.workloads}
    palette = colors(view)
    out = []
    for s in view.solutions:
        points = []
        for t in view.traces_of(s.name):
            value = metric(t) if passed(t) else None
            if not (finite(value) and value > 0):
                continue
            low_high = bounds(t) or (None, None)
            note = f"{s.name}, {labels[t.workload.uuid]}: {_value(value, unit)}"
            if low_high[0] is not None:
                note += f" (p10–p90 {_value(low_high[0], unit)} – {_value(low_high[1], unit)})"
            if not believable(t):
                note += "; suspect timing: " + (t.evaluation.performance.suspect or "zero latency")
            points.append(Point(xs[t.workload.uuid], value, not believable(t), *low_high, note))
        out.append(Series(s.name, points, palette[s.name]))
    return out


def _latency_bounds_us(trace: Trace) -> Optional[tuple[float, float]]:
    bounds = timing_range(trace)
    return (bounds[0] * 1e3, bounds[1] * 1e3) if bounds else None


def reference_series(view: DefinitionView) -> Series:
    """The reference's latency per workload in µs, as the passed traces recorded it (median
    when runs differ): the line every solution should be far below."""
    xs, _, _ = x_axis(view)
    labels = {w.uuid: w.label for w in view.workloads}
    by_workload: dict[str, list[float]] = {}
    for s in view.solutions:
        for t in view.traces_of(s.name):
            ref = t.evaluation.performance.reference_latency_ms if passed(t) else None
            if finite(ref) and ref > 0:
                by_workload.setdefault(t.workload.uuid, []).append(ref * 1e3)
    name = f"{view.name}_reference"
    points = [Point(xs[uuid], (y := statistics.median(v)), note=f"{name}, {labels[uuid]}: {_value(y, 'µs')}")
              for uuid, v in by_workload.items()]
    return Series(name, points, REFERENCE_COLOR, dashed=True)


def _figure(svg: Optional[str], caption: str) -> str:
    if svg is None:
        return f'<figure><p class="muted">{_e(caption)}: no passed timings to plot.</p></figure>'
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _legend(series: list[Series], suspect: bool) -> str:
    items = []
    for s in series:
        swatch = "swatch dashed" if s.dashed else "swatch"
        items.append(f'<li><span class="{swatch}" style="border-color:{s.color}"></span>{_e(s.name)}</li>')
    if suspect:
        items.append(f'<li><span class="x-key" style="color:{SUSPECT_EDGE}">✕</span>suspect timing (off the line)</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'


def plots(view: DefinitionView) -> str:
    """The plots of the view with their legend, as HTML."""
    _, xlabel, xticks = x_axis(view)
    solutions = _series(view, lambda t: t.evaluation.performance.latency_ms * 1e3, "µs", _latency_bounds_us)
    reference = reference_series(view)
    if any(s.name == reference.name and s.points for s in solutions):
        reference.points = []  # the reference is benchmarked as a solution: its own line says it
    latency = line_plot(solutions + [reference], xlabel=xlabel, ylabel="latency (µs)",
                        title=f"{view.name}: latency", xticks=xticks)
    perfs = [t.evaluation.performance for t in view.cells.values() if passed(t)]
    # One quantity per plot: % of peak when the traces have it, else GB/s, never both.
    if any(p.percent_of_peak is not None for p in perfs):
        bandwidth = _series(view, lambda t: t.evaluation.performance.percent_of_peak, "%")
        label = "% of peak bandwidth"
    else:
        bandwidth = _series(view, lambda t: t.evaluation.performance.achieved_gbps, "GB/s")
        label = "achieved GB/s"
    bandwidth_svg = line_plot(bandwidth, xlabel=xlabel, ylabel=label, title=f"{view.name}: {label}", xticks=xticks)
    drawn = [s for s in solutions + bandwidth if s.points]
    shown = list({s.name: s for s in drawn}.values()) + ([reference] if reference.points else [])
    points = [p for s in drawn for p in s.points]
    legend = _legend(shown, any(p.suspect for p in points))
    return (legend + '<div class="plots">'
            + _figure(latency, "Latency per workload, lower is better; bars span p10 to p90 of the timed runs")
            + _figure(bandwidth_svg, f"{label[0].upper()}{label[1:]} per workload, higher is better")
            + "</div>")

