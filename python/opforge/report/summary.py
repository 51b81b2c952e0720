"""One summary row per (definition, solution) over the latest traces."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..trace import EvaluationStatus, TraceSet
from ..trace.own_op import language_label
from .fmt import dtype_label
from .select import DefinitionView, collect
from .stats import baseline_mean, believable, geomean, median, passed, speedup_vs_reference


@dataclass
class SummaryRow:
    """How one solution did on the traced workloads of its definition.

    The medians and geometric means are over the PASSED workloads whose timing is believable:
    a timing marked suspect (``suspect`` counts them) is left out, since one impossible number
    would skew a mean of a handful of workloads. ``baseline_ratios``: how many speedups
    ``speedup_vs_baseline`` averages; ``baseline_earlier``: for each of them whose baseline was
    timed in an earlier run, that run (see stats.earlier_baseline). ``workloads`` counts every
    workload of the definition in the dataset; ``not_run`` names those the solution has no
    counted trace for (skipped by the run or never run), so ``passed`` reads against all of
    them. ``dtype``: the definition's tensor dtypes, inputs -> outputs. ``hardware``: the GPU
    model the row is about (a dataset measured on several has a row per model)."""

    definition: str
    solution: str
    author: str
    language: str
    workloads: int
    passed: int
    dtype: str = ""
    not_run: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    suspect: int = 0
    median_latency_ms: Optional[float] = None
    median_gbps: Optional[float] = None
    median_percent_of_peak: Optional[float] = None
    speedup_vs_reference: Optional[float] = None
    speedup_vs_baseline: Optional[float] = None
    baseline: Optional[str] = None
    baseline_ratios: int = 0
    baseline_earlier: list[str] = field(default_factory=list)
    hardware: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return self.workloads - self.passed - len(self.not_run)


def summary_rows(view: DefinitionView) -> list[SummaryRow]:
    rows = []
    for solution in view.solutions:
        traces = view.traces_of(solution.name)
        counts = Counter(t.evaluation.status.value for t in traces)
        timed = [t for t in traces if believable(t)]
        perfs = [t.evaluation.performance for t in timed]
        baselines = sorted({p.baseline_solution for p in perfs if p.baseline_solution})
        vs_baseline = baseline_mean(timed)
        rows.append(SummaryRow(
            definition=view.name,
            solution=solution.name,
            author=solution.author,
            language=language_label(solution),  # "builtin" for opforge's own op
            workloads=len(view.workloads) + len(view.untraced),
            passed=sum(passed(t) for t in traces),
            dtype=dtype_label(view.definition),
            not_run=[w.label for w in view.not_run(solution.name)],
            statuses={s.value: counts[s.value] for s in EvaluationStatus if counts[s.value]},
            suspect=sum(passed(t) and t.evaluation.performance.suspect is not None for t in traces),
            median_latency_ms=median(p.latency_ms for p in perfs),
            median_gbps=median(p.achieved_gbps for p in perfs),
            median_percent_of_peak=median(p.percent_of_peak for p in perfs),
            speedup_vs_reference=geomean(speedup_vs_reference(t) for t in timed),
            speedup_vs_baseline=vs_baseline.value,
            baseline=", ".join(baselines) or None,
            baseline_ratios=vs_baseline.ratios,
            baseline_earlier=vs_baseline.earlier,
            hardware=[view.hardware] if view.hardware else sorted({t.evaluation.environment.hardware for t in traces}),
        ))
    return rows


def summarize(trace_set: TraceSet, definitions: Optional[Iterable[str]] = None,
              solutions: Optional[Iterable[str]] = None, hardware: Optional[str] = None) -> list[SummaryRow]:
    """One row per (definition, solution) of every definition with traces, in dataset order
    (each definition's reference and builtin first). The filters are those of ``collect``."""
    return [row for view in collect(trace_set, definitions, solutions, hardware) for row in summary_rows(view)]
