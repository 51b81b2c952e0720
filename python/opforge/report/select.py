"""Which traces a report counts, and how workloads are named and ordered.

A dataset keeps every run, so a (definition, workload, solution) can have several traces; the
report counts only the latest on each hardware (by timestamp; on equal timestamps the one added
last): numbers measured on different GPU models are not one result, so a dataset measured on
several (a cluster run measures every pair on each of its models) is reported per model, the
views of one model together. Workloads
are labelled and ordered by their variable axes ("batch_size=64"). A workload of the dataset
that a solution has no counted trace for was not run for it: the runner writes no trace for
what it skips (too large for --max-elements, unsupported by the solution, inputs missing), and
a report must say so rather than count only what ran.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Optional

from ..trace import Definition, Solution, Trace, TraceSet

#: Axis value used to order workloads that lack a variable axis (older or hand-written files).
_MISSING_AXIS = -1


def parse_timestamp(text: Optional[str]) -> Optional[datetime]:
    """An ISO 8601 timestamp as an aware datetime (naive ones taken as UTC); None when unparsable."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _timestamp_key(trace: Trace) -> tuple:
    # Unparsable timestamps sort before every real one, so a trace with a readable time wins.
    parsed = parse_timestamp(trace.evaluation.timestamp)
    return (0, datetime.min.replace(tzinfo=timezone.utc)) if parsed is None else (1, parsed)


def _hardware_matches(trace: Trace, hardware: Optional[str]) -> bool:
    return hardware is None or hardware.lower() in trace.evaluation.environment.hardware.lower()


def latest_traces(trace_set: TraceSet, *, hardware: Optional[str] = None) -> list[Trace]:
    """The latest evaluated trace per (definition, workload uuid, solution, hardware), in the
    order each key first appears in ``trace_set.traces``. ``hardware`` keeps only traces whose
    environment.hardware contains it (case-insensitive)."""
    latest: dict[tuple, Trace] = {}
    for definition, traces in trace_set.traces.items():
        for trace in traces:
            if trace.evaluation is None or not _hardware_matches(trace, hardware):
                continue
            key = (definition, trace.workload.uuid, trace.solution, trace.evaluation.environment.hardware)
            kept = latest.get(key)
            # ">=" lets a later trace with the same timestamp replace an earlier one.
            if kept is None or _timestamp_key(trace) >= _timestamp_key(kept):
                latest[key] = trace
    return list(latest.values())


def workload_key(definition: Definition, axes: dict) -> tuple:
    """Sort key of a workload: its variable axis values in the Definition's axis order."""
    return tuple(axes.get(name, _MISSING_AXIS) for name in definition.var_axes)


def workload_label(definition: Definition, axes: dict) -> str:
    """``batch_size=64`` (several variable axes joined by ","); ``-`` without variable axes."""
    return definition.workload_label(axes)


def _pick(patterns: Optional[Iterable[str]], names: list[str], what: str) -> Optional[set[str]]:
    """The names matching any pattern (exact or fnmatch glob); ValueError for a pattern that
    matches nothing, so a typo is not silently an empty report."""
    if patterns is None:
        return None
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"no {what} matches {pattern!r}{hint}")
        chosen.update(hits)
    return chosen


@dataclass
class WorkloadInfo:
    uuid: str
    label: str
    axes: dict


@dataclass
class DefinitionView:
    """The counted traces of one Definition on one hardware, arranged as solutions x workloads.
    ``workloads`` have at least one counted trace; ``untraced`` are the Definition's other
    workloads in the dataset, which no selected solution has a counted trace for there."""

    definition: Definition
    workloads: list[WorkloadInfo]
    solutions: list[Solution]
    cells: dict[tuple[str, str], Trace] = field(default_factory=dict)  # (solution, uuid) -> trace
    untraced: list[WorkloadInfo] = field(default_factory=list)
    hardware: str = ""

    @property
    def name(self) -> str:
        return self.definition.name

    def trace(self, solution: str, uuid: str) -> Optional[Trace]:
        return self.cells.get((solution, uuid))

    def traces_of(self, solution: str) -> list[Trace]:
        """The solution's counted traces in workload order."""
        return [t for w in self.workloads if (t := self.cells.get((solution, w.uuid))) is not None]

    @property
    def all_workloads(self) -> list[WorkloadInfo]:
        """Traced and untraced workloads, in axis order."""
        return sorted(self.workloads + self.untraced, key=lambda w: (workload_key(self.definition, w.axes), w.uuid))

    def not_run(self, solution: str) -> list[WorkloadInfo]:
        """The workloads the solution has no counted trace for, in axis order."""
        return [w for w in self.all_workloads if (solution, w.uuid) not in self.cells]


def _solution_order(definition: str, solutions: list[Solution]) -> list[Solution]:
    # The reference and the builtin (the usual baseline) first: every other row is read against them.
    first = {f"{definition}_reference": 0, f"{definition}_builtin": 1}
    return sorted(solutions, key=lambda s: first.get(s.name, 2))


def _unique_labels(definition: Definition, workloads: list[WorkloadInfo]) -> None:
    # Two workloads with the same axes (different inputs or seeds) need telling apart.
    seen: dict[str, int] = {}
    for w in workloads:
        seen[w.label] = seen.get(w.label, 0) + 1
    for w in workloads:
        if seen[w.label] > 1:
            w.label = f"{w.label} ({w.uuid[:8]})"


def _wanted(trace_set: TraceSet, definitions, solutions) -> tuple[Optional[set[str]], Optional[set[str]]]:
    """The definition and solution names the filters select (None: all)."""
    definitions = [definitions] if isinstance(definitions, str) else definitions
    solutions = [solutions] if isinstance(solutions, str) else solutions
    all_solutions = [s.name for group in trace_set.solutions.values() for s in group]
    return (_pick(definitions, list(trace_set.definitions), "definition"),
            _pick(solutions, all_solutions, "solution"))


def collect(trace_set: TraceSet, definitions: Optional[Iterable[str]] = None,
            solutions: Optional[Iterable[str]] = None, hardware: Optional[str] = None) -> list[DefinitionView]:
    """The latest traces, filtered and arranged per hardware (in the order each first appears)
    and, within it, per Definition. Definitions without any counted trace on a hardware are
    left out there; solutions of a kept Definition are kept even untraced. ``definitions`` and
    ``solutions`` are names or glob patterns (ValueError when one matches nothing);
    ``hardware`` is a case-insensitive substring of the trace's hardware name."""
    wanted_defs, wanted_sols = _wanted(trace_set, definitions, solutions)
    by_hardware: dict[str, dict[str, list[Trace]]] = {}
    for trace in latest_traces(trace_set, hardware=hardware):
        if wanted_defs is not None and trace.definition not in wanted_defs:
            continue
        if wanted_sols is not None and trace.solution not in wanted_sols:
            continue
        group = by_hardware.setdefault(trace.evaluation.environment.hardware, {})
        group.setdefault(trace.definition, []).append(trace)
    return [view for machine, by_definition in by_hardware.items()
            for view in _views(trace_set, machine, by_definition, wanted_sols)]


def _views(trace_set: TraceSet, machine: str, by_definition: dict, wanted_sols) -> list[DefinitionView]:
    views = []
    for name, definition in trace_set.definitions.items():
        traces = by_definition.get(name)
        if not traces:
            continue
        workloads: dict[str, WorkloadInfo] = {}
        traced = {t.workload.uuid for t in traces}
        for w in [t.workload for t in traces] + [wt.workload for wt in trace_set.workloads.get(name, [])]:
            if w.uuid not in workloads:
                workloads[w.uuid] = WorkloadInfo(w.uuid, workload_label(definition, w.axes), dict(w.axes))
        ordered = sorted(workloads.values(), key=lambda w: (workload_key(definition, w.axes), w.uuid))
        _unique_labels(definition, ordered)
        sols = [s for s in trace_set.solutions.get(name, []) if wanted_sols is None or s.name in wanted_sols]
        view = DefinitionView(definition, [w for w in ordered if w.uuid in traced], _solution_order(name, sols),
                              untraced=[w for w in ordered if w.uuid not in traced], hardware=machine)
        for t in traces:
            view.cells[(t.solution, t.workload.uuid)] = t
        views.append(view)
    return views


def untraced_definitions(trace_set: TraceSet, views: list[DefinitionView], definitions: Optional[Iterable[str]] = None,
                         solutions: Optional[Iterable[str]] = None) -> list[str]:
    """The selected Definitions that have workloads and a selected solution but no counted
    trace (so no view): everything there was skipped or never run. Filters as in collect."""
    wanted_defs, wanted_sols = _wanted(trace_set, definitions, solutions)
    shown = {v.name for v in views}
    return [name for name in trace_set.definitions
            if name not in shown and (wanted_defs is None or name in wanted_defs) and trace_set.workloads.get(name)
            and any(wanted_sols is None or s.name in wanted_sols for s in trace_set.solutions.get(name, []))]
