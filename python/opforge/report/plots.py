"""Line plots of the HTML report, written as SVG text.

Written by hand rather than drawn with matplotlib: a report has two plots per definition, and a
matplotlib figure costs 0.1-0.3 s and 15-50 KB of SVG, which made the report of the built-in
dataset (over 100 plots) take tens of seconds and several MB. These cost well under a
millisecond and a few KB each, and a point's exact value is in its tooltip.

A plot has one y quantity in one unit on one axis (no second axis): logarithmic when its
values, p10-p90 bars included, span more than 10x, else linear from zero so that heights
compare honestly. The legend is not drawn here: the page shows one legend per definition for
its plots, with the colors given in each Series. Every string from the data is escaped.

Fonts and the strokes every plot shares are styled once by the page's stylesheet (style.py) rather
than repeated on every element.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

#: Line colors, assigned per solution by the page (matplotlib's tab10, easy to tell apart).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
REFERENCE_COLOR = "#555555"
SUSPECT_EDGE = "#d00000"

_WIDTH, _HEIGHT = 560, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 14, 24, 42
#: Characters of a workload label under a category x axis (the full label is in the tables).
_TICK_CHARS = 26
#: Width of a character of the 11 px tick labels, on average (digits and underscores).
_CHAR_PX = 6.8
#: Most labelled ticks on the x axis; more would overlap.
_MAX_XTICKS = 10


class Point(NamedTuple):
    x: float
    y: float
    suspect: bool = False
    low: Optional[float] = None  # the range y's samples mostly fell in (p10, p90), when known
    high: Optional[float] = None
    note: str = ""  # the point's tooltip


@dataclass
class Series:
    """One line of a plot: the points of one solution (or the reference, ``dashed``)."""

    name: str
    points: list[Point] = field(default_factory=list)
    color: str = PALETTE[0]
    dashed: bool = False


def escape(value) -> str:
    return html.escape(str(value), quote=True)


def _log_worthy(values: Sequence[float]) -> bool:
    return len(values) > 1 and min(values) > 0 and max(values) / min(values) > 10


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def tick_label(value: float) -> str:
    """``0.5``, ``20``, ``1,000``, ``20k``: short, and never in exponent notation."""
    if value >= 1e4:
        return f"{value / 1e3:,.0f}k"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class _Axis:
    """Maps data values to pixels between ``start`` and ``end`` (end < start for y)."""

    def __init__(self, lo: float, hi: float, log: bool, start: float, end: float):
        self.log, self.start, self.end = log, start, end
        self.lo, self.hi = (math.log10(lo), math.log10(hi)) if log else (lo, hi)

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        return self.start + (v - self.lo) / (self.hi - self.lo) * (self.end - self.start)


def _y_axis(values: list[float]) -> tuple[_Axis, list[float]]:
    top, bottom = _TOP, _HEIGHT - _BOTTOM
    if _log_worthy(values):
        lo, hi = min(values) / 1.25, max(values) * 1.25
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        # Three decades or fewer get 2x and 5x ticks too, so the axis has enough labels to read.
        steps = (1, 2, 5) if len(decades) <= 4 else (1,)
        ticks = [m * 10.0 ** d for d in decades for m in steps if lo <= m * 10.0 ** d <= hi]
        return _Axis(lo, hi, True, bottom, top), ticks
    high = max(values) if max(values) > 0 else 1.0
    step = _nice_step(high)
    hi = math.ceil(high / step) * step
    return _Axis(0.0, hi, False, bottom, top), [i * step for i in range(int(round(hi / step)) + 1)]


def _x_axis(xs: list[float], categories: bool, left: float, right: float) -> _Axis:
    lo, hi = min(xs), max(xs)
    if categories:
        return _Axis(lo - 0.5, hi + 0.5, False, left, right)
    if _log_worthy(xs):
        return _Axis(lo / 1.4, hi * 1.4, True, left, right)
    pad = (hi - lo) * 0.06 or max(abs(lo) * 0.5, 0.5)
    return _Axis(lo - pad, hi + pad, False, left, right)


def _thin(ticks: list[tuple[float, str]]) -> list[tuple[float, str]]:
    every = math.ceil(len(ticks) / _MAX_XTICKS)
    return ticks[::every]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _marker(x: float, y: float, color: str, note: str, suspect: bool) -> str:
    title = f"<title>{escape(note)}</title>" if note else ""
    if suspect:
        d = f"M{x - 4:.1f} {y - 4:.1f}L{x + 4:.1f} {y + 4:.1f}M{x - 4:.1f} {y + 4:.1f}L{x + 4:.1f} {y - 4:.1f}"
        return (f'<g class="suspect-point">{title}<path d="{d}" stroke="{SUSPECT_EDGE}" stroke-width="4"/>'
                f'<path d="{d}" stroke="{color}" stroke-width="2"/></g>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">{title}</circle>'


def line_plot(series: Sequence[Series], *, xlabel: str, ylabel: str, title: str,
              xticks: Optional[Sequence[tuple[float, str]]] = None) -> Optional[str]:
    """An SVG line plot: one line per series through its believable points; suspect points are
    red-edged crosses off the line. A point with a low-high range gets a bar over it (suspect or
    not: a noisy point is what the bar is there to show); the bars of the i-th series with
    points are the group of class ``p10-p90`` with ``data-series="<i>"``. ``xticks`` places labelled ticks (workloads
    without one numeric axis, drawn as categories); otherwise an x axis spanning more than 10x
    is logarithmic with a tick at each value. None when no series has a point."""
    series = [s for s in series if s.points]
    if not series:
        return None
    xs = [p.x for s in series for p in s.points]
    ys = [v for s in series for p in s.points for v in (p.y, p.low, p.high) if v is not None and v > 0]
    categories = xticks is not None
    left, right = _LEFT, _WIDTH - _RIGHT
    bottom_extra = 0
    if categories:
        labels = [_cut(label, _TICK_CHARS) for _, label in xticks]
        # Labels slanted at 30 degrees need room below the axis (sin 30 = 0.5 of their length)
        # and, for the first one, to the left of its tick (cos 30 = 0.87).
        longest = max(len(t) for t in labels) * _CHAR_PX
        bottom_extra = max(0, int(longest * 0.5) - 14)
        first_tick = (right - left) / (2 * max(len(xticks), 1))
        left = max(left, int(longest * 0.87 - first_tick) + 8)
    height = _HEIGHT + bottom_extra
    xa = _x_axis(xs + ([x for x, _ in xticks] if categories else []), categories, left, right)
    ya, yticks = _y_axis(ys)
    plot_bottom = _HEIGHT - _BOTTOM

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {height}" role="img" '
           f'aria-label="{escape(title)}" class="plot">',
           f'<rect x="{left}" y="{_TOP}" width="{right - left}" height="{plot_bottom - _TOP}" class="frame"/>',
           f'<text x="{(left + right) / 2:.0f}" y="15" class="mid title">{escape(title)}</text>']
    for v in yticks:
        y = ya(v)
        out.append(f'<path d="M{left} {y:.1f}H{right}" class="grid"/>'
                   f'<text x="{left - 5}" y="{y + 4:.1f}" class="end">{tick_label(v)}</text>')
    if categories:
        shown = _thin([(x, label) for (x, _), label in zip(xticks, labels)])
    else:
        # The workloads' own axis values, written as they are ("4096", not "4,096").
        shown = _thin([(v, str(int(v)) if float(v).is_integer() else f"{v:g}") for v in sorted(set(xs))])
    for v, label in shown:
        x = xa(v)
        out.append(f'<path d="M{x:.1f} {_TOP}V{plot_bottom}" class="grid"/>')
        if categories:
            out.append(f'<text transform="translate({x + 3:.1f},{plot_bottom + 12}) rotate(-30)" '
                       f'class="end">{escape(label)}</text>')
        else:
            out.append(f'<text x="{x:.1f}" y="{plot_bottom + 15}" class="mid">{escape(label)}</text>')
    out.append(f'<text x="{(left + right) / 2:.0f}" y="{height - 6}" class="mid">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14,{(_TOP + plot_bottom) / 2:.0f}) rotate(-90)" '
               f'class="mid">{escape(ylabel)}</text>')

    for i, s in enumerate(series):
        points = sorted(s.points, key=lambda p: p.x)
        good = [p for p in points if not p.suspect and p.y > 0]
        if len(good) > 1:
            coords = " ".join(f"{xa(p.x):.1f},{ya(p.y):.1f}" for p in good)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            out.append(f'<polyline points="{coords}" class="line" fill="none" stroke="{s.color}"{dash}/>')
        bars = []
        for p in points:
            if p.low is None or p.high is None or p.low <= 0:
                continue
            x, y0, y1 = xa(p.x), ya(p.low), ya(max(p.high, p.low))
            bars.append(f'<path d="M{x:.1f} {y0:.1f}V{y1:.1f}M{x - 3:.1f} {y0:.1f}h6M{x - 3:.1f} {y1:.1f}h6"/>')
        if bars:
            out.append(f'<g class="p10-p90" data-series="{i}" fill="none" stroke="{s.color}">'
                       + "".join(bars) + "</g>")
        out.extend(_marker(xa(p.x), ya(p.y), s.color, p.note, p.suspect) for p in points if p.y > 0)
    out.append("</svg>")
    return "".join(out)


def finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
