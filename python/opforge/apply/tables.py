"""Rankings of solutions from a dataset's traces, made once when apply is enabled.

For one Definition, traces count when they come from the chosen hardware, and only the latest
one of each (workload, solution) pair counts (a re-run replaces an earlier measurement).
A pair is *measured* when that trace PASSED with a believable timing (no ``suspect`` note, a
latency above zero), *failed* when it did not pass; a passing trace with an unbelievable
timing is neither (it says nothing about speed). Then, per Definition:

* exact: per workload axis values, the solutions measured there and failing on none of the
  workloads with those values, fastest first (latencies of workloads with equal axis values
  averaged);
* buckets: per bucket (ApplyConfig's key function of the axis values), the solutions ranked
  over the bucket's workloads: measured on the most of them first, then by the geometric mean
  of latency relative to each workload's fastest; a solution failing on any of them is left
  out;
* best: the same ranking over every workload of the Definition (the "overall best").

A call's choices are exact, then its bucket's (the nearest measured bucket if its own was never
measured), then the overall best, without repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Optional

from ..trace import Definition, TraceSet
from .config import ApplyConfig, BucketFn, bucket_distance


@dataclass
class TraceCounts:
    """What the traces of a dataset contributed (summed over Definitions)."""

    used: int = 0  #: latest traces measuring a solution on the chosen hardware
    failed: int = 0  #: latest traces that did not pass (their solution is not used there)
    suspect: int = 0  #: passing traces whose timing is not believable (suspect, or zero)
    superseded: int = 0  #: traces replaced by a later one of the same workload and solution
    other_hardware: int = 0  #: traces from hardware whose timings were not used
    unknown_solution: int = 0  #: traces naming a solution the dataset does not hold (skipped)


@dataclass
class Ranking:
    """The ranked solution names of one Definition (see the module doc)."""

    definition: Definition
    hardware: str
    bucket_fn: BucketFn
    exact: dict[tuple, tuple[str, ...]] = field(default_factory=dict)
    buckets: dict[Hashable, tuple[str, ...]] = field(default_factory=dict)
    best: tuple[str, ...] = ()

    def bucket_of(self, values: tuple) -> Optional[Hashable]:
        try:
            bucket = self.bucket_fn(dict(zip(self.definition.var_axes, values)))
            hash(bucket)
        except Exception:  # a key function failing on an unexpected size must not reach the model
            return None
        return bucket

    def choices(self, values: tuple, config: ApplyConfig) -> tuple[str, ...]:
        """Solution names for a call with these variable axis values, in the order to try."""
        names = list(self.exact.get(values, ()))
        bucket = self.bucket_of(values)
        if bucket is not None:
            ranked = self.buckets.get(bucket)
            if ranked is None and config.nearest_bucket:
                ranked = self.buckets.get(self._nearest(bucket))
            names.extend(ranked or ())
        if config.use_definition_best:
            names.extend(self.best)
        return tuple(dict.fromkeys(names))

    def _nearest(self, bucket) -> Optional[Hashable]:
        if not isinstance(bucket, tuple):
            return None
        found, found_rank = None, None
        for measured in self.buckets:
            if not isinstance(measured, tuple):
                continue
            distance = bucket_distance(bucket, measured)
            if distance is None:
                continue
            rank = (distance, -sum(measured))  # equally far: the larger bucket
            if found_rank is None or rank < found_rank:
                found, found_rank = measured, rank
        return found

    def solution_names(self) -> set[str]:
        names = set(self.best)
        for ranked in (*self.exact.values(), *self.buckets.values()):
            names.update(ranked)
        return names


def _believable(trace) -> bool:
    perf = trace.evaluation.performance
    return perf is not None and perf.suspect is None and perf.latency_ms > 0


def _usable_count(traces) -> int:
    return sum(1 for t in traces if t.is_successful() and _believable(t))


def _pick_hardware(by_hardware: dict, hardware: str, fallback: bool) -> Optional[str]:
    if _usable_count(by_hardware.get(hardware, ())):
        return hardware
    if not fallback:
        return None
    counts = {hw: _usable_count(traces) for hw, traces in by_hardware.items() if hw != hardware}
    counts = {hw: n for hw, n in counts.items() if n}
    # The most usable traces; equal counts: by name, so the choice does not depend on file order.
    return min(counts, key=lambda hw: (-counts[hw], hw)) if counts else None


def _rank_over(keys, measured: dict, failed: dict) -> tuple[str, ...]:
    """Solutions measured on the most of ``keys``, then by geometric-mean slowdown against each
    key's fastest; any failure among the keys leaves a solution out."""
    excluded = set().union(*(failed.get(k, ()) for k in keys))
    coverage: dict[str, int] = {}
    log_slowdown: dict[str, float] = {}
    for key in keys:
        latencies = {s: lat for s, lat in measured.get(key, {}).items() if s not in excluded}
        if not latencies:
            continue
        fastest = min(latencies.values())
        for solution, latency in latencies.items():
            coverage[solution] = coverage.get(solution, 0) + 1
            log_slowdown[solution] = log_slowdown.get(solution, 0.0) + math.log(latency / fastest)
    return tuple(sorted(coverage, key=lambda s: (-coverage[s], log_slowdown[s] / coverage[s], s)))


def rank_definition(definition: Definition, traces, hardware: str, config: ApplyConfig,
                    counts: TraceCounts) -> Optional[Ranking]:
    """The Ranking of one Definition from its evaluated traces (None: nothing usable)."""
    by_hardware: dict[str, list] = {}
    for trace in traces:
        if trace.evaluation is not None:
            by_hardware.setdefault(trace.evaluation.environment.hardware, []).append(trace)
    chosen = _pick_hardware(by_hardware, hardware, config.hardware_fallback)
    counts.other_hardware += sum(len(ts) for hw, ts in by_hardware.items() if hw != chosen)
    if chosen is None:
        return None
    latest: dict[tuple, object] = {}
    for trace in by_hardware[chosen]:  # in the order added: later lines are newer runs
        latest[(trace.workload.uuid, trace.solution)] = trace
    counts.superseded += len(by_hardware[chosen]) - len(latest)
    var_axes = definition.var_axes
    samples: dict[tuple, dict[str, list[float]]] = {}
    failed: dict[tuple, set[str]] = {}
    for trace in latest.values():
        values = tuple(trace.workload.axes[a] for a in var_axes)
        if not trace.is_successful():
            counts.failed += 1
            failed.setdefault(values, set()).add(trace.solution)
        elif not _believable(trace):
            counts.suspect += 1
        else:
            counts.used += 1
            samples.setdefault(values, {}).setdefault(trace.solution, []).append(
                trace.evaluation.performance.latency_ms)
    measured = {values: {s: sum(lat) / len(lat) for s, lat in by_solution.items()}
                for values, by_solution in samples.items()}
    ranking = Ranking(definition, chosen, config.bucket_fn(definition.name))
    for values, latencies in measured.items():
        bad = failed.get(values, set())
        ranked = sorted((s for s in latencies if s not in bad), key=lambda s: (latencies[s], s))
        if ranked:
            ranking.exact[values] = tuple(ranked)
    groups: dict[Hashable, list[tuple]] = {}
    every = list(dict.fromkeys([*measured, *failed]))  # a workload where all failed still excludes them
    for values in every:
        try:
            bucket = ranking.bucket_fn(dict(zip(var_axes, values)))
            hash(bucket)
        except Exception as exc:
            raise ValueError(f"ApplyConfig: the bucket function of {definition.name} fails on the measured axis "
                             f"values {dict(zip(var_axes, values))}: {type(exc).__name__}: {exc}") from exc
        if bucket is not None:
            groups.setdefault(bucket, []).append(values)
    for bucket, keys in groups.items():
        ranked = _rank_over(keys, measured, failed)
        if ranked:
            ranking.buckets[bucket] = ranked
    ranking.best = _rank_over(every, measured, failed)
    return ranking if ranking.exact or ranking.best else None


def unknown_solution_traces(trace_set: TraceSet) -> int:
    """Traces the loader skipped because the solution they name is not in the dataset."""
    return sum(1 for e in trace_set.load_errors
               if e.field and e.field.split(".")[-1] == "solution" and e.message.startswith("trace for "))


def rank_trace_set(trace_set: TraceSet, hardware: str, config: ApplyConfig) -> tuple[dict[str, Ranking], TraceCounts]:
    counts = TraceCounts(unknown_solution=unknown_solution_traces(trace_set))
    rankings = {}
    for name, definition in trace_set.definitions.items():
        ranking = rank_definition(definition, trace_set.traces.get(name, ()), hardware, config, counts)
        if ranking is not None:
            rankings[name] = ranking
    return rankings, counts
