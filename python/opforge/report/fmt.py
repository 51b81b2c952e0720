"""How report numbers read in tables (the JSON output keeps the raw values).

Latencies show in microseconds: the fused ops take a few microseconds to a few milliseconds,
and one unit per column keeps rows comparable at a glance.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..trace import EvaluationStatus

NONE = "–"

#: Marks a speedup whose baseline was timed in an earlier run (see stats.earlier_baseline).
EARLIER = "*"

#: Short names of the failing statuses, for the tables' failure column.
SHORT_STATUS = {
    EvaluationStatus.PASSED.value: "passed",
    EvaluationStatus.INCORRECT_SHAPE.value: "wrong shape",
    EvaluationStatus.INCORRECT_NUMERICAL.value: "wrong values",
    EvaluationStatus.INCORRECT_DTYPE.value: "wrong dtype",
    EvaluationStatus.RUNTIME_ERROR.value: "runtime error",
    EvaluationStatus.COMPILE_ERROR.value: "compile error",
    EvaluationStatus.TIMEOUT.value: "timeout",
}


def us(ms: Optional[float]) -> str:
    if ms is None:
        return NONE
    value = ms * 1e3
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}" if value < 1 else f"{value:.2f}"


def times(x: Optional[float]) -> str:
    return NONE if x is None else f"{x:.2f}×"


def vs_baseline(x: Optional[float], earlier: int = 0, ratios: int = 1) -> str:
    """``1.20×``, marked ``1.20×*`` when its baseline was timed in an earlier run; a mean of
    several ratios says how many of them were: ``1.20×* (2/4)``."""
    if x is None or not earlier:
        return times(x)
    return times(x) + EARLIER + (f" ({earlier}/{ratios})" if ratios > 1 else "")


def earlier_note(runs: Iterable[str], mean: bool) -> str:
    """The footnote of a table with ``vs_baseline`` marks, naming the earlier runs."""
    note = f"{EARLIER} baseline timed in an earlier run ({'; '.join(sorted(set(runs)))})"
    return note + ("; (n/m): n of the m averaged ratios" if mean else "")


def pct(x: Optional[float]) -> str:
    return NONE if x is None else f"{x:.1f}%"


def gbps(x: Optional[float]) -> str:
    return NONE if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def margin(x: Optional[float]) -> str:
    return NONE if x is None else f"+{x:.1f}%"


def count(n: int, noun: str) -> str:
    """``1 trace``, ``2 traces``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def dtype_label(definition) -> str:
    """The distinct dtypes of a Definition's tensors, inputs then outputs: ``bfloat16 → bfloat16``,
    ``float16, int32 → float16, float32`` (scalar inputs left out: they rarely decide speed)."""

    def distinct(specs) -> str:
        return ", ".join(dict.fromkeys(str(s.dtype.value) for s in specs.values() if s.shape is not None)) or NONE

    return f"{distinct(definition.inputs)} → {distinct(definition.outputs)}"


def dtype_detail(definition) -> str:
    """Every tensor's dtype: ``inputs: x bfloat16, w bfloat16; outputs: y bfloat16``."""

    def each(specs) -> str:
        return ", ".join(f"{n} {s.dtype.value}" + ("" if s.shape is not None else " (scalar)")
                         for n, s in specs.items())

    return f"inputs: {each(definition.inputs)}; outputs: {each(definition.outputs)}"


#: What every table with speedups says once: which way is better, and why.
SPEEDUP_MEANING = "above 1× is faster, below 1× slower"
SPEEDUP_DEFINITION = "the other's latency ÷ this one's"
SPEEDUP_NOTE = f"Speedup = {SPEEDUP_DEFINITION}: {SPEEDUP_MEANING}"


def failures(statuses: dict[str, int]) -> str:
    """``1 wrong values, 2 timeout`` from status counts (PASSED left out)."""
    parts = [f"{n} {SHORT_STATUS.get(s, s)}" for s, n in statuses.items() if s != EvaluationStatus.PASSED.value and n]
    return ", ".join(parts) or NONE
