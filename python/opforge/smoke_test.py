"""Smoke test: run each chosen solution on each matching workload against the Definition's
reference, say per workload whether it passed and how long it took, then summarize; exit
status 1 if any solution fails.

    python -m opforge.smoke_test [names...] [--dataset PATH] [--module M ...] [--device cpu]
    opforge smoke [names...]

Solutions come from the dataset (default: the built-in one shipped with opforge) and from the
registry (``opforge.registry.BACKENDS``), including modules named with ``--module`` that register
theirs on import. Each name selects:

* the solution of that name (``triton``, as a module registered it; ``rmsnorm_h4096_builtin``);
* every solution of the Definition of that name (``rmsnorm_h4096``);
* the solutions named ``<definition>_<name>`` (``builtin``: every Definition's builtin solution);
* ``reference``: the reference of each Definition selected by the other names (of every
  Definition when it is the only name), run as a solution of its own: a check of the
  workloads and the baseline row of the summary.

No names: every solution (without the references). Inputs are drawn from each workload's seed,
so a failure reproduces. The times are a quick indication (the median of a few calls after a
warm-up call, on the host clock around a synchronize); ``opforge run`` measures properly (cold
L2, CUDA events, many calls, isolated processes).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .bench.config import CPU_MAX_ELEMENTS  # on a CPU, larger workloads are skipped

#: ``reference`` as a name: the selected Definitions' references.
REFERENCE = "reference"
#: Calls timed per workload (after the checked call, which warms up: JIT, caches) and the time
#: budget that can cut them short; a smoke test is meant to take seconds.
TIMED_CALLS = 10
TIME_BUDGET_S = 0.2
#: The workload label of a solution's one result when it did not build.
NOT_BUILT = "-"
#: Longest note in the summary table (the per-workload lines above it have the whole line).
NOTE_CHARS = 80


@dataclass
class Result:
    solution: str
    language: str
    definition: str
    workload: str
    status: str  # PASS, FAIL, ERROR, SKIP
    detail: str = ""
    ms: Optional[float] = None
    reference_ms: Optional[float] = None

    @property
    def speedup(self) -> Optional[float]:
        return self.reference_ms / self.ms if self.ms and self.reference_ms else None


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _quick_ms(call: Callable, args: list, device: str) -> float:
    """Median milliseconds of up to TIMED_CALLS calls (at least one), host clock, synchronized."""
    samples: list[float] = []
    deadline = time.perf_counter() + TIME_BUDGET_S
    while len(samples) < TIMED_CALLS and (not samples or time.perf_counter() < deadline):
        _sync(device)
        start = time.perf_counter()
        call(*args)
        _sync(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _first_line(text: str, limit: Optional[int] = None) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if limit is None or len(line) <= limit else line[:limit - 3] + "..."


def _language(solution) -> str:
    from .trace.own_op import language_label

    return language_label(solution)  # "builtin" for opforge's own op (its record says python)


def _is_reference(solution, reference) -> bool:
    return solution.name == reference.name and solution.content_hash() == reference.content_hash()


class _Reference:
    """A Definition's reference, built once; its outputs and time per workload, run once."""

    def __init__(self, definition, device: str):
        from .registry import build, reference_solution

        self.definition = definition.name
        self.solution = reference_solution(definition)
        self.runnable = build(self.solution, definition, device)
        self.device = device
        self._runs: dict[str, tuple] = {}

    def run(self, workload_key: str, inputs: list) -> tuple:
        """(outputs, ms) on ``inputs``; computed on the first request for the workload."""
        if workload_key not in self._runs:
            # Its own copies: the solution is checked on ``inputs`` next, untouched by any call.
            inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            want = self.runnable(*inputs)
            self._runs[workload_key] = (want, _quick_ms(self.runnable, inputs, self.device))
        return self._runs[workload_key]


def _check_and_time(runnable, definition, inputs: list, want, device: str):
    """(Check, ms or None): the checked call first (it also warms up), then the timed ones."""
    from .bench import check_call
    from .trace import EvaluationStatus

    dps = runnable.destination_passing_style
    check = check_call(runnable.call_into if dps else runnable, definition, inputs, want, destination_passing=dps)
    if check.status == EvaluationStatus.RUNTIME_ERROR:
        return check, None
    if dps:
        call, args = runnable.call_into, inputs + runnable.allocate_outputs(*inputs)
    else:
        call, args = runnable, inputs
    return check, _quick_ms(call, args, device)


def _status_and_detail(check) -> tuple[str, str]:
    c = check.correctness
    errors = f"max abs {c.max_absolute_error:.2e}, max rel {c.max_relative_error:.2e}" if c else ""
    if check.passed:
        return "PASS", errors
    if check.status.value == "RUNTIME_ERROR":
        return "ERROR", _first_line(check.log)
    return "FAIL", "; ".join(filter(None, [_first_line(check.log), errors]))


def run_smoke(trace_set, solutions, device: str, max_elements: Optional[int],
              on_solution: Optional[Callable] = None, on_result: Optional[Callable] = None) -> list[Result]:
    """Run ``solutions``; ``on_solution(solution, labels)`` before each one's workloads and
    ``on_result(result)`` after each workload (the per-test report is printed as it goes)."""
    from .bench import generate_inputs
    from .registry import BACKENDS, UNSUPPORTED, BuildError, build

    reference: Optional[_Reference] = None  # the current Definition's (solutions come grouped)
    results = []

    def report(result: Result) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    for solution in solutions:
        definition = trace_set.get_definition(solution.definition)
        language = _language(solution)
        workloads = [t.workload for t in trace_set.get_workloads(definition.name)]
        labels = [",".join(f"{k}={v}" for k, v in w.axes.items()) or w.uuid for w in workloads]
        if on_solution is not None:
            on_solution(solution, labels)
        if reference is None or reference.definition != definition.name:
            reference = None  # its outputs are let go before the next Definition's are made
            try:
                reference = _Reference(definition, device)
            except BuildError as exc:
                report(Result(solution.name, language, definition.name, NOT_BUILT, "ERROR",
                              f"the reference: {exc.kind}: {exc.message}"))
                continue
        runnable = None  # the reference itself
        if not _is_reference(solution, reference.solution):
            try:
                fn = BACKENDS.function(solution.name) if solution.name in BACKENDS else None
                runnable = build(solution, definition, device, fn=fn)
            except BuildError as exc:
                # Like the runner: a solution that cannot run on this device is skipped, not failed.
                status = "SKIP" if exc.kind == UNSUPPORTED else "ERROR"
                report(Result(solution.name, language, definition.name, NOT_BUILT, status,
                              f"{exc.kind}: {exc.message}"))
                continue
        for workload, label in zip(workloads, labels):
            largest = max((torch.Size(s).numel() for s in definition.resolve_shapes(workload.axes).values() if s),
                          default=0)
            if max_elements is not None and largest > max_elements:
                report(Result(solution.name, language, definition.name, label, "SKIP",
                              f"{largest} elements > max elements {max_elements}"))
                continue
            try:
                inputs = generate_inputs(definition, workload, device=device, trace_set=trace_set)
                want, ref_ms = reference.run(workload.uuid, inputs)
            except Exception as exc:  # a bad workload or reference is reported, not fatal
                report(Result(solution.name, language, definition.name, label, "ERROR",
                              f"the reference: {type(exc).__name__}: {_first_line(exc)}"))
                continue
            if runnable is None:  # the reference itself: it is the baseline, 1.00x by definition
                report(Result(solution.name, language, definition.name, label, "PASS", "", ref_ms, ref_ms))
                continue
            try:
                check, ms = _check_and_time(runnable, definition, inputs, want, device)
            except Exception as exc:  # passed the check, then failed in a timed call
                report(Result(solution.name, language, definition.name, label, "ERROR",
                              f"timed call: {type(exc).__name__}: {_first_line(exc)}"))
                continue
            status, detail = _status_and_detail(check)
            report(Result(solution.name, language, definition.name, label, status, detail, ms, ref_ms))
    return results


# --- what is printed -------------------------------------------------------------------------


@dataclass
class SummaryRow:
    solution: str
    language: str
    definition: str
    passed: int
    checked: int  # workloads run (skipped ones left out)
    skipped: int
    speedup: Optional[float]  # geometric mean over the passed workloads
    not_built: Optional[Result] = None  # the solution did not build (ERROR) or cannot run here (SKIP)
    first_failure: str = ""

    @property
    def correctness(self) -> str:
        if self.not_built is not None:
            return "build failed" if self.not_built.status == "ERROR" else "not run"
        if not self.checked:
            return "–"
        return f"{100 * self.passed / self.checked:.1f}% ({self.passed}/{self.checked})"

    @property
    def failed(self) -> bool:
        return self.passed < self.checked or (self.not_built is not None and self.not_built.status == "ERROR")


def summarize(results: list[Result]) -> list[SummaryRow]:
    """One row per solution, in the order they ran."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.definition, r.solution), []).append(r)
    rows = []
    for (definition, solution), members in groups.items():
        ran = [r for r in members if r.status != "SKIP" and r.workload != NOT_BUILT]
        passed = [r for r in ran if r.status == "PASS"]
        ratios = [r.speedup for r in passed if r.speedup]
        failed = next((r for r in ran if r.status != "PASS"), None)
        # The row names the solution already; its errors' "solution 'x': " prefix goes.
        failure = f"{failed.workload}: {failed.status} {failed.detail.replace(f'solution {solution!r}: ', '')}" \
            if failed else ""
        rows.append(SummaryRow(
            solution, members[0].language, definition, len(passed), len(ran),
            sum(r.status == "SKIP" and r.workload != NOT_BUILT for r in members),
            math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
            not_built=next((r for r in members if r.workload == NOT_BUILT), None), first_failure=failure.strip()))
    return rows


def _console():
    from rich.console import Console

    # soft_wrap: a line longer than the terminal (or than the 80 columns rich assumes for a
    # pipe) is left whole for the terminal to wrap, never broken inside a word or number.
    return Console(soft_wrap=True, highlight=False)


_STYLE = {"PASS": "green", "FAIL": "red", "ERROR": "red", "SKIP": "yellow"}


class _Printer:
    """The per-test report: a header per solution, one aligned line per workload."""

    def __init__(self, console):
        self.console = console
        self.width = 0

    def solution(self, solution, labels: list[str]) -> None:
        from rich.text import Text

        head = Text.assemble((solution.name, "bold"), f" ({_language(solution)}) for {solution.definition}")
        if solution.description:
            head.append(f": {_first_line(solution.description)}")
        self.console.print()
        self.console.print(head)
        self.width = max([len(label) for label in labels] + [1])

    def result(self, r: Result) -> None:
        from rich.text import Text

        from .report import fmt

        timing = f"{r.ms:9.3f} ms" if r.ms is not None else " " * 12
        speedup = f"{fmt.times(r.speedup):>6} vs reference" if r.speedup else ""
        line = Text.assemble(f"  {r.workload:<{self.width}}  ", (f"{r.status:<5}", _STYLE[r.status]),
                             f" {timing}  {speedup:<19}  {_first_line(r.detail)}")
        line.rstrip()
        self.console.print(line)


def print_summary(rows: list[SummaryRow], device: str) -> None:
    if not rows:
        return
    from rich.table import Table
    from rich.text import Text

    from .report import fmt
    from .report.console import print_tables

    definitions = list(dict.fromkeys(r.definition for r in rows))
    # One Definition (the usual case) goes in the title rather than in a column of its own.
    title = f"Summary on {device}" + (f": {definitions[0]}" if len(definitions) == 1 else "")
    table = Table(title=title, title_justify="left")
    columns = (["definition"] if len(definitions) > 1 else []) + ["solution", "language", "correctness", "speedup",
                                                                   "notes"]
    for column in columns:
        table.add_column(column, justify="right" if column == "speedup" else "left", overflow="fold")
    for r in rows:
        ok = "red" if r.failed else "green" if r.checked else "yellow"
        notes = "; ".join(filter(None, [r.not_built.detail if r.not_built else "", r.first_failure,
                                        f"{r.skipped} skipped" if r.skipped else ""]))
        notes = _first_line(notes, NOTE_CHARS)
        cells = [Text(r.solution, "bold"), Text(r.language), Text(r.correctness, ok),
                 Text(fmt.times(r.speedup)), Text(notes)]
        table.add_row(*([Text(r.definition)] if len(definitions) > 1 else []), *cells)
    print_tables(None, [table])
    # A line of its own rather than the table's caption, which rich wraps to the table's width.
    _console().print("speedup: reference time / solution time, the geometric mean over the passed workloads")


def select(trace_set, names: list[str]):
    """Solutions of the dataset and the registry narrowed to ``names`` (see the module doc),
    grouped by Definition, a Definition's reference first."""
    from .registry import BACKENDS, reference_solution

    solutions = {s.name: s for group in trace_set.solutions.values() for s in group}
    elsewhere = {}
    for solution in BACKENDS:
        if solution.definition in trace_set.definitions:
            solutions.setdefault(solution.name, solution)
        else:
            elsewhere[solution.name] = solution.definition
    if not names:
        return _grouped(list(solutions.values()))
    chosen: dict[str, object] = {}
    definitions: dict[str, None] = {}  # in the order the names select them
    unknown, empty = [], []
    for name in names:
        hits = [s for s in solutions.values()
                if name in (s.name, s.definition) or s.name == f"{s.definition}_{name}"]
        for hit in hits:
            chosen.setdefault(hit.name, hit)
            definitions.setdefault(hit.definition)
        if name in trace_set.definitions:
            definitions.setdefault(name)
            if not hits and REFERENCE not in names:
                empty.append(name)
        elif not hits and name != REFERENCE:
            unknown.append(name)
    if empty:
        raise SystemExit(f"opforge smoke: no solution of {', '.join(empty)} is in the dataset or registered "
                         f"(add the name {REFERENCE} to run the reference)")
    if unknown:
        where = [f"{n} is registered for {elsewhere[n]}, which the dataset does not have" for n in unknown
                 if n in elsewhere]
        raise SystemExit(f"opforge smoke: no solution or definition named {', '.join(unknown)} "
                         f"({'; '.join(where) or 'solutions: ' + (', '.join(sorted(solutions)) or 'none')})")
    selected = list(chosen.values())
    if REFERENCE in names:
        wanted = list(definitions) or list(trace_set.definitions)
        selected = [reference_solution(trace_set.get_definition(d)) for d in wanted] + selected
    return _grouped(selected)


def _grouped(solutions: list) -> list:
    """Solutions grouped by Definition (in order of first appearance, otherwise in the given
    order): each Definition's reference is built and run once, and let go after its group."""
    order = {d: i for i, d in enumerate(dict.fromkeys(s.definition for s in solutions))}
    return sorted(solutions, key=lambda s: order[s.definition])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*",
                        help="solutions (full or short names), definitions, or 'reference' (default: every solution)")
    parser.add_argument("--dataset", help="dataset folder or .json file (default: the built-in dataset)")
    parser.add_argument("--module", action="append", default=[],
                        help="module or .py file that registers solutions on import (repeatable)")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--max-elements", type=int, default=None,
                        help=f"skip workloads with a larger tensor (default on CPU: {CPU_MAX_ELEMENTS})")


def run(args: argparse.Namespace) -> int:
    from .registry import load_solution_modules
    from .trace import TraceSet

    load_solution_modules(args.module)
    if args.dataset:
        trace_set = TraceSet.load(args.dataset)
    else:
        from .trace.builtin import load_builtin_trace_set

        trace_set = load_builtin_trace_set()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    max_elements = args.max_elements
    if max_elements is None and not device.startswith("cuda"):
        max_elements = CPU_MAX_ELEMENTS
    solutions = select(trace_set, args.names)
    console = _console()
    console.print(f"opforge smoke test: {len(solutions)} solution(s) on {device}. Times are a quick indication "
                  f"(median of up to {TIMED_CALLS} calls after a warm-up call, host clock); "
                  f"`opforge run` measures properly.")
    printer = _Printer(console)
    with torch.inference_mode():
        results = run_smoke(trace_set, solutions, device, max_elements, printer.solution, printer.result)
    console.print()
    print_summary(summarize(results), device)
    failed = [r for r in results if r.status in ("FAIL", "ERROR")]
    passed = sum(r.status == "PASS" for r in results)
    console.print(f"{passed} passed, {len(failed)} failed, {sum(r.status == 'SKIP' for r in results)} skipped")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.smoke_test", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
