"""From a worker's timing to a Trace's Performance, and when not to believe it.

A timing comes from the solution's own worker process, where the solution could have changed
anything, so the runner checks it before using it:
- its shape (``checked_timing``): the statistics a real timer reports, finite, in order, for no
  more calls than were asked; anything else is the solution's failure;
- against the runner's own clock (``clock_problem``): a timed batch of n calls with a median of
  m takes at least n/2 · m (half the calls took at least the median), plus the spin lead queued
  ahead of every timed and every paired empty call on a GPU, plus the graph replays; a worker
  that answers sooner did not run what it reported. Fewer calls than asked are only right when
  the time budget ran out. This bounds what a patched timer can claim without doing the work;
  it cannot see a timer that runs the calls and then reports a smaller number;
- its spread (``spread_problem``): a p90/p10 ratio beyond ``suspect_spread`` (over at least
  SPREAD_MIN_CALLS calls) means the machine was busy with something else, and the median is not
  a number to compare;
- the physical floor: faster than the copy bandwidth allows.
Each finding makes the timing suspect (the reason is recorded); suspect timings never win in
reports and never serve as a baseline.
"""

from __future__ import annotations

import math
from typing import Optional

from ..trace import Performance
from .config import Settings
from .timing import BARE_ITERATIONS, GRAPH_CALLS, GRAPH_REPEATS, MIN_LEAD_US

#: The fewest timed calls whose spread is judged.
SPREAD_MIN_CALLS = 20
_STATS = ("median_ms", "p10_ms", "p90_ms", "min_ms", "max_ms", "stdev_ms")
#: Keys of a timing other than _STATS and "iterations", with the types they may have.
_EXTRA = {"method": str, "flush_l2": bool, "spin_lead_us": float, "sync_excess_ms": float, "host_ms": float,
          "graph_ms": float, "graph_error": str}


def checked_timing(timing, settings: Settings) -> dict:
    """The timing a worker sent, if it is one a real timer makes (ValueError otherwise); keys
    nobody asked for are dropped."""
    if not isinstance(timing, dict):
        raise ValueError(f"the timing is a {type(timing).__name__}, not a dict")
    clean = {}
    for key in _STATS:
        value = timing.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"timing {key} = {str(value)[:40]!r}: not a finite time")
        clean[key] = float(value)
    n = timing.get("iterations")
    if isinstance(n, bool) or not isinstance(n, int) or not min(10, settings.iterations) <= n <= settings.iterations:
        raise ValueError(f"timing iterations = {str(n)[:40]!r}: {settings.iterations} calls were asked")
    clean["iterations"] = n
    # (With a handful of calls p90 may fall below the median: nearest-rank quantiles.)
    if not (clean["min_ms"] <= clean["p10_ms"] <= clean["p90_ms"] <= clean["max_ms"]
            and clean["min_ms"] <= clean["median_ms"] <= clean["max_ms"]):
        raise ValueError("timing statistics out of order (min <= p10 <= p90 <= max, min <= median <= max)")
    for key, kind in _EXTRA.items():
        value = timing.get(key)
        if value is None:
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is float and not math.isfinite(value)):
            raise ValueError(f"timing {key} = {str(value)[:40]!r}: not a {kind.__name__}")
        clean[key] = value[:500] if kind is str else value
    return clean


def clock_problem(timing: dict, wall_s: float, settings: Settings, cuda: bool) -> Optional[str]:
    """Why the timing cannot be what the worker did in ``wall_s`` of the runner's clock (see the
    module doc), or None."""
    n, median, wall_ms = timing["iterations"], timing["median_ms"], wall_s * 1e3
    # The statistics of a loop without the spin lead (timing.py) come from fewer calls and a
    # quarter of the budget.
    bare = "no lead" in timing.get("method", "")
    asked = min(settings.iterations, BARE_ITERATIONS) if bare else settings.iterations
    budget_s = settings.max_time_s / 4 if bare else settings.max_time_s
    if n < asked and wall_s < budget_s:
        return (f"timing does not fit the runner's clock: {n} of {asked} calls reported after "
                f"{wall_ms:.1f} ms, before the {budget_s:g} s budget ran out")
    floor_ms = n / 2 * median
    if cuda and not bare:
        floor_ms += n * 2 * max(timing.get("spin_lead_us") or 0.0, MIN_LEAD_US) / 1e3
        floor_ms += GRAPH_CALLS * GRAPH_REPEATS * (timing.get("graph_ms") or 0.0)
    if wall_ms < floor_ms:
        return (f"timing does not fit the runner's clock: {n} calls with a median of {median * 1e3:.2f} us take at "
                f"least {floor_ms:.2f} ms, but the worker answered in {wall_ms:.2f} ms")
    return None


def spread_problem(timing: dict, settings: Settings) -> Optional[str]:
    p10, p90, median = timing["p10_ms"], timing["p90_ms"], timing["median_ms"]
    # Fewer calls say little about the spread (p10 is then the fastest call).
    if timing["iterations"] < SPREAD_MIN_CALLS or p10 <= 0 or p90 / p10 <= settings.suspect_spread:
        return None
    tail = f", max/median {timing['max_ms'] / median:.0f}x" if median > 0 else ""
    return (f"high spread: p90/p10 {p90 / p10:.1f}x{tail} over {timing['iterations']} calls (limit "
            f"{settings.suspect_spread:g}x); the machine was busy, the median is not comparable")


def performance(definition, axes: dict, timing: dict, calibration: dict, settings: Settings, *,
                reference_ms: float, baseline: Optional[str], baseline_ms: Optional[float],
                clock: Optional[str] = None) -> Performance:
    """The Performance of a PASSED trace: throughput against the calibrated copy bandwidth,
    speedups, and every reason to doubt the number (see the module doc)."""
    latency = timing["median_ms"]
    nbytes = definition.bytes_moved(axes)
    flops = definition.flop_count(axes)
    gbps = nbytes / (latency * 1e6) if latency > 0 else None
    calibrated = calibration["gbps"]
    percent = 100.0 * gbps / calibrated if gbps is not None else None
    reasons = [clock, spread_problem(timing, settings)]
    if latency <= 0:
        reasons.insert(0, "no measurable time: the timer did not see the solution's work")
    elif percent is not None and percent > settings.suspect_percent_of_peak:
        floor_ms = nbytes / (calibrated * 1e6)
        reasons.insert(0, f"faster than the physical floor: {latency * 1e3:.2f} us for {nbytes / 1e6:.3g} MB is "
                          f"{percent:.0f}% of the {calibrated:.0f} GB/s copy bandwidth (floor {floor_ms * 1e3:.2f} us); "
                          "work the events did not see (another stream?) or outputs not computed")
    suspect = "\n".join(r for r in reasons if r) or None  # one reason per line
    timing = dict(timing, bytes=nbytes, floor_ms=nbytes / (calibrated * 1e6))
    return Performance(
        latency_ms=latency,
        reference_latency_ms=reference_ms,
        speedup_factor=reference_ms / latency if reference_ms and latency > 0 else 0.0,
        achieved_gbps=gbps,
        achieved_tflops=flops / (latency * 1e9) if flops is not None and latency > 0 else None,
        percent_of_peak=percent,
        calibrated_gbps=calibrated,
        baseline_solution=baseline if baseline_ms else None,
        baseline_latency_ms=baseline_ms,
        baseline_speedup_factor=baseline_ms / latency if baseline_ms and latency > 0 else None,
        suspect=suspect,
        timing=timing,
    )
