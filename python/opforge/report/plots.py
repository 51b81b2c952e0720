"""Plots of the HTML report, drawn with matplotlib into SVG text.

matplotlib (a dependency of opforge) is imported only when a plot is drawn, so the rest of the
report and the runner start without it. Figures are made with matplotlib.figure.Figure directly rather than pyplot, so
no GUI backend is picked and no global figure state is touched.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

INSTALL_HINT = "pip install matplotlib"

#: Longest solution name shown in a legend; the tables next to the plot have the full names.
_LEGEND_CHARS = 40
_SUSPECT_EDGE = "#d00000"


class Point(NamedTuple):
    x: float
    y: float
    suspect: bool = False
    low: Optional[float] = None  # the range y's samples mostly fell in (p10, p90), when known
    high: Optional[float] = None


@dataclass
class Series:
    """One line of a plot: the points of one solution."""

    name: str
    points: list[Point] = field(default_factory=list)


def require_matplotlib():
    """matplotlib's Figure class; ImportError saying what to install in an environment that
    lost it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the HTML report draws its plots with matplotlib, which is not installed: "
                          f"{INSTALL_HINT}") from exc
    return Figure


def _plain(text: str, limit: Optional[int] = None) -> str:
    # "$" starts matplotlib mathtext; a name from the data must print as written.
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("$", r"\$")


def _log_worthy(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and len(values) > 1 and max(values) / min(values) > 10


def line_plot(series: Sequence[Series], *, xlabel: str, ylabel: str, title: str,
              xticks: Optional[Sequence[tuple[float, str]]] = None) -> Optional[str]:
    """An SVG line plot with one line per series through its believable points; suspect
    points are drawn as red-edged crosses outside the line. A point with a low-high range gets
    an error bar over it (suspect or not: a noisy point is what the bar is there to show); the
    bars of series i are the SVG group with id ``p10-p90-<i>``. Axes spanning more than 10x are
    logarithmic. ``xticks`` places labelled ticks (for workloads without one numeric axis).
    None when no series has a point."""
    series = [s for s in series if s.points]
    if not series:
        return None
    Figure = require_matplotlib()
    from matplotlib import colormaps, rc_context
    from matplotlib.lines import Line2D

    colors = colormaps["tab10" if len(series) <= 10 else "tab20"].colors
    fig = Figure(figsize=(7.2, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    handles, labels = [], []
    any_suspect = False
    for i, s in enumerate(series):
        color = colors[i % len(colors)]
        points = sorted(s.points, key=lambda p: p.x)
        good = [(p.x, p.y) for p in points if not p.suspect]
        bad = [(p.x, p.y) for p in points if p.suspect]
        (line,) = ax.plot([x for x, _ in good], [y for _, y in good], marker="o", markersize=4, color=color)
        if bad:
            any_suspect = True
            ax.plot([x for x, _ in bad], [y for _, y in bad], linestyle="none", marker="X", markersize=9,
                    color=color, markeredgecolor=_SUSPECT_EDGE, markeredgewidth=1.2)
        ranged = [p for p in points if p.low is not None and p.high is not None]
        if ranged:
            # Clipped at zero: matplotlib refuses a negative bar length, which a median outside
            # its own p10-p90 (from a hand-edited or inconsistent trace) would give.
            below = [max(p.y - p.low, 0.0) for p in ranged]
            above = [max(p.high - p.y, 0.0) for p in ranged]
            bars = ax.errorbar([p.x for p in ranged], [p.y for p in ranged], yerr=[below, above], fmt="none",
                               ecolor=color, elinewidth=1.2, capsize=3, alpha=0.7)
            bars.lines[2][0].set_gid(f"p10-p90-{i}")  # lines: (data line, caps, bar collections)
        handles.append(line)
        labels.append(_plain(s.name, _LEGEND_CHARS))
    if any_suspect:
        handles.append(Line2D([], [], linestyle="none", marker="X", markersize=9, color="white",
                              markeredgecolor=_SUSPECT_EDGE, markeredgewidth=1.2))
        labels.append("suspect timing")

    xs = [p.x for s in series for p in s.points]
    # The bars count toward the y extent: a 36x spread on a linear axis would flatten every line.
    ys = [v for s in series for p in s.points for v in (p.y, p.low, p.high) if v is not None]
    if xticks is None and _log_worthy(xs):
        ax.set_xscale("log")
    if _log_worthy(ys):
        ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks([x for x, _ in xticks], [_plain(label) for _, label in xticks],
                      rotation=30 if len(xticks) > 4 else 0, ha="right" if len(xticks) > 4 else "center")
    elif ax.get_xscale() == "log":
        # Label the workloads' own values rather than powers of ten.
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
        ax.minorticks_off()
    ax.set_xlabel(_plain(xlabel))
    ax.set_ylabel(_plain(ylabel))
    ax.set_title(_plain(title), fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    # Explicit handles and labels: legend() would otherwise drop names starting with "_".
    ax.legend(handles, labels, fontsize=8, loc="best")
    out = io.StringIO()
    # A fixed hash salt and no date make the same data give the same SVG.
    with rc_context({"svg.hashsalt": "opforge-report", "svg.fonttype": "path"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
