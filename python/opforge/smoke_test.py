"""Smoke test: run each chosen solution once on each matching workload against the
Definition's reference and print a table; exit status 1 if any solution fails.

    python -m opforge.smoke_test [names...] [--dataset PATH] [--module M ...] [--device cpu]
    opforge smoke [names...]

Solutions come from the dataset (default: the built-in one shipped with opforge) and from the
registry (``opforge.registry.BACKENDS``), including modules named with ``--module`` that register
theirs on import. ``names`` selects solutions (or every solution of a Definition) by name.
Inputs are drawn from each workload's seed, so a failure reproduces.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from .bench.config import CPU_MAX_ELEMENTS  # on a CPU, larger workloads are skipped


@dataclass
class Result:
    solution: str
    language: str
    definition: str
    workload: str
    status: str  # PASS, FAIL, ERROR, SKIP
    detail: str = ""
    ms: float | None = None
    reference_ms: float | None = None


def _timed(fn, *args):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - start) * 1e3


def run_smoke(trace_set, solutions, device: str, max_elements: int | None) -> list[Result]:
    from .bench import check_call, generate_inputs
    from .registry import BACKENDS, BuildError, build, reference_solution

    results = []
    for solution in solutions:
        definition = trace_set.get_definition(solution.definition)
        language = str(getattr(solution.spec.language, "value", solution.spec.language))
        try:
            fn = BACKENDS.function(solution.name) if solution.name in BACKENDS else None
            runnable = build(solution, definition, device, fn=fn)
            reference = build(reference_solution(definition), definition, device)
        except BuildError as exc:
            results.append(Result(solution.name, language, definition.name, "-", "ERROR", f"{exc.kind}: {exc}"))
            continue
        for trace in trace_set.get_workloads(definition.name):
            workload = trace.workload
            label = ",".join(f"{k}={v}" for k, v in workload.axes.items())
            largest = max((torch.Size(s).numel() for s in definition.resolve_shapes(workload.axes).values() if s),
                          default=0)
            if max_elements is not None and largest > max_elements:
                results.append(Result(solution.name, language, definition.name, label, "SKIP",
                                      f"{largest} elements > --max-elements {max_elements}"))
                continue
            try:
                inputs = generate_inputs(definition, workload, device=device, trace_set=trace_set)
                want, ref_ms = _timed(reference, *inputs)
            except Exception as exc:  # a bad workload or reference is reported, not fatal
                results.append(Result(solution.name, language, definition.name, label, "ERROR",
                                      f"reference: {type(exc).__name__}: {exc}"))
                continue
            elapsed = []

            def timed_call(*args, _fn=runnable.call_into if runnable.destination_passing_style else runnable):
                out, ms = _timed(_fn, *args)
                elapsed.append(ms)
                return out

            check = check_call(timed_call, definition, inputs, want,
                               destination_passing=runnable.destination_passing_style)
            c = check.correctness
            detail = check.log.splitlines()[0] if check.log else (
                f"max abs {c.max_absolute_error:.2e}, max rel {c.max_relative_error:.2e}" if c else "")
            status = "PASS" if check.passed else ("ERROR" if check.status.value == "RUNTIME_ERROR" else "FAIL")
            results.append(Result(solution.name, language, definition.name, label, status, detail,
                                  elapsed[0] if elapsed else None, ref_ms))
    return results


def print_table(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="opforge smoke test")
    for column in ("solution", "language", "workload", "status", "errors / reason", "ms", "speedup"):
        table.add_column(column, justify="right" if column in ("ms", "speedup") else "left")
    style = {"PASS": "green", "FAIL": "red", "ERROR": "red", "SKIP": "yellow"}
    for r in results:
        speedup = f"{r.reference_ms / r.ms:.2f}x" if r.ms and r.reference_ms else ""
        table.add_row(r.solution, r.language, r.workload, f"[{style[r.status]}]{r.status}[/]", r.detail,
                      f"{r.ms:.3f}" if r.ms is not None else "", speedup)
    Console().print(table)


def select(trace_set, names: list[str]):
    """Every solution of the dataset and the registry, narrowed to ``names`` (solution or
    definition names)."""
    from .registry import BACKENDS

    solutions = {s.name: s for group in trace_set.solutions.values() for s in group}
    for solution in BACKENDS:
        if solution.definition in trace_set.definitions:
            solutions.setdefault(solution.name, solution)
    if not names:
        return list(solutions.values())
    chosen, unknown = [], []
    for name in names:
        hits = [s for s in solutions.values() if s.name == name or s.definition == name]
        chosen.extend(h for h in hits if h not in chosen)
        if not hits:
            unknown.append(name)
    if unknown:
        raise SystemExit(f"opforge smoke: no solution or definition named {', '.join(unknown)} "
                         f"(solutions: {', '.join(sorted(solutions)) or 'none'})")
    return chosen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="solutions or definitions to test (default: all)")
    parser.add_argument("--dataset", help="dataset folder or .json file (default: the built-in dataset)")
    parser.add_argument("--module", action="append", default=[],
                        help="module or .py file that registers solutions on import (repeatable)")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--max-elements", type=int, default=None,
                        help=f"skip workloads with a larger tensor (default on CPU: {CPU_MAX_ELEMENTS})")


def run(args: argparse.Namespace) -> int:
    from .registry import load_solution_modules
    from .trace import TraceSet
    from .trace.builtin import load_builtin_trace_set

    load_solution_modules(args.module)
    trace_set = TraceSet.load(args.dataset) if args.dataset else load_builtin_trace_set()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    max_elements = args.max_elements
    if max_elements is None and not device.startswith("cuda"):
        max_elements = CPU_MAX_ELEMENTS
    with torch.inference_mode():
        results = run_smoke(trace_set, select(trace_set, args.names), device, max_elements)
    print_table(results)
    failed = [r for r in results if r.status in ("FAIL", "ERROR")]
    passed = sum(r.status == "PASS" for r in results)
    print(f"{passed} passed, {len(failed)} failed, {sum(r.status == 'SKIP' for r in results)} skipped")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.smoke_test", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
