"""The numbers a report takes from a trace, and the averages it makes of them."""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Optional

from ..trace import EvaluationStatus, Trace


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(kept) if kept else None


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive finite values (the right mean for ratios: a 2x win and
    a 2x loss cancel out); None when there are none."""
    kept = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def passed(trace: Trace) -> bool:
    return trace.evaluation is not None and trace.evaluation.status == EvaluationStatus.PASSED


def believable(trace: Trace) -> bool:
    """PASSED with a timing that can be compared: not marked suspect, and not zero (a zero
    latency is a broken measurement even when nothing marked it)."""
    if not passed(trace):
        return False
    perf = trace.evaluation.performance
    return perf.suspect is None and perf.latency_ms > 0


def speedup_vs_reference(trace: Trace) -> Optional[float]:
    perf = trace.evaluation.performance
    if perf.speedup_factor > 0:
        return perf.speedup_factor
    # Writers that leave speedup_factor at its default still record both latencies.
    if perf.latency_ms > 0 and perf.reference_latency_ms > 0:
        return perf.reference_latency_ms / perf.latency_ms
    return None


def speedup_vs_baseline(trace: Trace) -> Optional[float]:
    perf = trace.evaluation.performance
    if perf.baseline_speedup_factor is not None and perf.baseline_speedup_factor > 0:
        return perf.baseline_speedup_factor
    if perf.baseline_latency_ms and perf.latency_ms > 0:
        return perf.baseline_latency_ms / perf.latency_ms
    return None


def first_line(text: Optional[str], limit: int = 120) -> str:
    """The first non-empty line of a log, cut to ``limit`` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""
