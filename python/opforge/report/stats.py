"""The numbers a report takes from a trace, and the averages it makes of them."""

from __future__ import annotations

import math
import numbers
import statistics
from typing import Iterable, NamedTuple, Optional

from ..trace import EvaluationStatus, Trace


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(kept) if kept else None


def _positive(value) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value) and value > 0


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive finite values (the right mean for ratios: a 2x win and
    a 2x loss cancel out); None when there are none."""
    kept = [v for v in values if _positive(v)]
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


def _timing(trace: Trace, key: str) -> Optional[float]:
    # Older traces lack some of the keys, and the dict is free-form: only a positive number counts.
    value = (trace.evaluation.performance.timing or {}).get(key)
    return float(value) if _positive(value) else None


def timing_range(trace: Trace) -> Optional[tuple[float, float]]:
    """(p10, p90) of the trace's timed runs in ms: the range most of its samples fell in. None
    when the trace does not record both (older writers) or they are out of order."""
    p10, p90 = _timing(trace, "p10_ms"), _timing(trace, "p90_ms")
    return (p10, p90) if p10 is not None and p90 is not None and p10 <= p90 else None


def spread(trace: Trace) -> Optional[float]:
    """p90 / p10 of the timed runs: 1.05 is a quiet machine, tens mean the median is luck."""
    bounds = timing_range(trace)
    return bounds[1] / bounds[0] if bounds else None


def max_over_median(trace: Trace) -> Optional[float]:
    """The slowest timed run over the median: how far the worst outlier went."""
    worst = _timing(trace, "max_ms")
    middle = _timing(trace, "median_ms") or (trace.evaluation.performance.latency_ms or None)
    return worst / middle if worst is not None and middle else None


def earlier_baseline(trace: Trace) -> Optional[str]:
    """The earlier run whose baseline latency speedup_vs_baseline divides by ("<timestamp>",
    with ", seed N" when recorded); None when the baseline was timed in the same run. Such a
    ratio also measures whatever changed on the machine between the two runs."""
    earlier = (trace.evaluation.performance.timing or {}).get("baseline_earlier")
    if earlier is None:
        return None
    earlier = earlier if isinstance(earlier, dict) else {}
    label = str(earlier.get("timestamp") or "time not recorded")
    seed = earlier.get("seed")
    return f"{label}, seed {seed}" if isinstance(seed, int) else label


class BaselineMean(NamedTuple):
    """The geometric mean of some traces' speedups vs their baseline, and what it is made of."""

    value: Optional[float]
    ratios: int  # how many speedups the mean is of
    earlier: list[str]  # earlier_baseline of each of them whose baseline came from an earlier run


def baseline_mean(traces: Iterable[Trace]) -> BaselineMean:
    used = [t for t in traces if _positive(speedup_vs_baseline(t))]
    earlier = [run for t in used if (run := earlier_baseline(t)) is not None]
    return BaselineMean(geomean(speedup_vs_baseline(t) for t in used), len(used), earlier)


def first_line(text: Optional[str], limit: int = 120) -> str:
    """The first non-empty line of a log, cut to ``limit`` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""
