"""The fastest solution per workload, and per definition overall.

Only PASSED traces with a believable timing compete (see stats.believable): a suspect number
is exactly the kind that would otherwise win.

Overall, a definition's best solution is the one with the smallest geometric mean, over the
workloads, of its latency divided by the fastest latency on that workload. Only solutions that
passed every traced workload of the definition compete (a solution that fails somewhere is not
a drop-in choice), and workloads where one of them has a suspect timing are left out of the
mean, so every competitor is averaged over the same workloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..trace import Trace, TraceSet
from .select import DefinitionView, WorkloadInfo, collect
from .stats import (baseline_mean, believable, geomean, max_over_median, passed, speedup_vs_reference,
                    spread)

OVERALL = "(overall)"


@dataclass
class BestRow:
    """The winner of one workload (``overall`` False) or of a whole definition (True).

    ``margin_pct``: how much slower the runner-up is, in percent of the winner's latency (for
    an overall row, of its mean latency ratio). ``spread`` and ``max_over_median``: how noisy
    the winner's timing was (see stats.spread; per workload only). ``baseline_ratios`` and
    ``baseline_earlier``: as in SummaryRow. ``suspect``: solutions left out because their
    timing was suspect. ``note``: why there is no winner, or what the overall mean left out.
    ``hardware``: where the compared traces were measured (one GPU model per row)."""

    definition: str
    workload: str
    overall: bool = False
    hardware: str = ""
    uuid: Optional[str] = None
    axes: dict = field(default_factory=dict)
    solution: Optional[str] = None
    latency_ms: Optional[float] = None
    spread: Optional[float] = None
    max_over_median: Optional[float] = None
    gbps: Optional[float] = None
    percent_of_peak: Optional[float] = None
    speedup_vs_baseline: Optional[float] = None
    baseline: Optional[str] = None
    baseline_ratios: int = 0
    baseline_earlier: list[str] = field(default_factory=list)
    speedup_vs_reference: Optional[float] = None
    runner_up: Optional[str] = None
    runner_up_latency_ms: Optional[float] = None
    margin_pct: Optional[float] = None
    candidates: int = 0
    latency_ratio: Optional[float] = None
    runner_up_latency_ratio: Optional[float] = None
    workloads_compared: Optional[int] = None
    suspect: list[str] = field(default_factory=list)
    note: str = ""


def _margin(best: float, runner_up: float) -> Optional[float]:
    return (runner_up / best - 1.0) * 100.0 if best > 0 else None


def _set_baseline(row: BestRow, traces: list[Trace]) -> None:
    mean = baseline_mean(traces)
    row.speedup_vs_baseline, row.baseline_ratios, row.baseline_earlier = mean.value, mean.ratios, mean.earlier
    row.baseline = ", ".join(sorted({p for t in traces if (p := t.evaluation.performance.baseline_solution)})) or None


def _workload_row(view: DefinitionView, workload: WorkloadInfo) -> BestRow:
    traces = [t for s in view.solutions if (t := view.trace(s.name, workload.uuid)) is not None]
    suspect = [t.solution for t in traces if passed(t) and not believable(t)]
    # sorted() is stable, so equal latencies keep the report's solution order.
    ranked = sorted((t for t in traces if believable(t)), key=lambda t: t.evaluation.performance.latency_ms)
    row = BestRow(view.name, workload.label, uuid=workload.uuid, axes=dict(workload.axes), suspect=suspect,
                  candidates=len(ranked), hardware=view.hardware)
    if not ranked:
        row.note = ("only suspect timings" if suspect else "no solution passed")
        return row
    winner = ranked[0]
    perf = winner.evaluation.performance
    row.solution = winner.solution
    row.latency_ms = perf.latency_ms
    row.spread = spread(winner)
    row.max_over_median = max_over_median(winner)
    row.gbps = perf.achieved_gbps
    row.percent_of_peak = perf.percent_of_peak
    _set_baseline(row, [winner])
    row.speedup_vs_reference = speedup_vs_reference(winner)
    if len(ranked) > 1:
        row.runner_up = ranked[1].solution
        row.runner_up_latency_ms = ranked[1].evaluation.performance.latency_ms
        row.margin_pct = _margin(perf.latency_ms, row.runner_up_latency_ms)
    return row


def _overall_row(view: DefinitionView) -> BestRow:
    row = BestRow(view.name, OVERALL, overall=True, hardware=view.hardware)
    uuids = [w.uuid for w in view.workloads]
    eligible = [s.name for s in view.solutions
                if all((t := view.trace(s.name, u)) is not None and passed(t) for u in uuids)]
    if not eligible:
        row.note = "no solution passed every workload"
        return row
    compared, skipped = [], []
    for w in view.workloads:
        traces = [view.trace(s, w.uuid) for s in eligible]
        (compared if all(believable(t) for t in traces) else skipped).append(w)
        for t in traces:
            if not believable(t) and t.solution not in row.suspect:
                row.suspect.append(t.solution)
    row.candidates = len(eligible)
    row.workloads_compared = len(compared)
    if skipped:
        row.note = f"left out for suspect timings: {', '.join(w.label for w in skipped)}"
    if not compared:
        row.note = "every workload has a suspect timing"
        return row

    def fastest(w: WorkloadInfo) -> float:
        return min(view.trace(s, w.uuid).evaluation.performance.latency_ms for s in eligible)

    floor = {w.uuid: fastest(w) for w in compared}
    ratios = {s: geomean(view.trace(s, w.uuid).evaluation.performance.latency_ms / floor[w.uuid] for w in compared)
              for s in eligible}
    ranked = sorted(eligible, key=lambda s: ratios[s])
    winner = ranked[0]
    mine: list[Trace] = [view.trace(winner, w.uuid) for w in compared]
    row.solution = winner
    row.latency_ratio = ratios[winner]
    row.speedup_vs_reference = geomean(speedup_vs_reference(t) for t in mine)
    _set_baseline(row, mine)
    if len(ranked) > 1:
        row.runner_up = ranked[1]
        row.runner_up_latency_ratio = ratios[ranked[1]]
        row.margin_pct = _margin(row.latency_ratio, row.runner_up_latency_ratio)
    return row


def best_of(view: DefinitionView) -> list[BestRow]:
    """The definition's per-workload rows in workload order, then its overall row."""
    return [_workload_row(view, w) for w in view.workloads] + [_overall_row(view)]


def best(trace_set: TraceSet, definitions: Optional[Iterable[str]] = None,
         solutions: Optional[Iterable[str]] = None, hardware: Optional[str] = None) -> list[BestRow]:
    """For every definition with traces: one row per workload, then one overall row
    (``overall=True``). The filters are those of ``collect``; the winners are picked among the
    selected solutions only."""
    return [row for view in collect(trace_set, definitions, solutions, hardware) for row in best_of(view)]
