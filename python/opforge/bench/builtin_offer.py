"""opforge's own ops as solutions of Definitions in a user's dataset (``opforge run --builtin``),
and why a run had nothing to run.

A FlashInfer-Trace dataset (the public one, or one captured elsewhere) names Definitions whose
meaning opforge already knows (``rmsnorm_h4096``, ``fused_add_rmsnorm_h7168``,
``gqa_paged_decode_h32_kv8_d128_ps1``): the op templates parse those names back. For each such
Definition with no solution of opforge's own op yet, ``--builtin`` adds the builtin Solution
(the python record the built-in dataset ships, which FlashInfer-Bench reads too) to the
dataset, so ``opforge run --dataset X --builtin`` benchmarks opforge against the dataset's other
solutions without JSON copied by hand.
The Definition's own reference still judges it: a Definition that shares a name but not a
meaning fails its correctness check, visibly.
"""

from __future__ import annotations

from typing import Optional


def builtin_solutions_for(trace_set, definitions: Optional[list] = None) -> list:
    """The builtin Solutions opforge could add to ``trace_set`` (those of ``definitions`` only
    when given): one per Definition it knows that has none with the same content yet."""
    from ..trace.builtin import builtin_solution_for

    offered = []
    for name, definition in trace_set.definitions.items():
        if definitions is not None and name not in definitions:
            continue
        try:
            solution = builtin_solution_for(definition)
        except (KeyError, ValueError):  # a known name with another layout: no adapter fits
            solution = None
        if solution is None:
            continue
        have = {s.content_hash() for s in trace_set.solutions.get(name, ())}
        taken = {s.name for s in trace_set.solutions.get(name, ())}
        if solution.content_hash() not in have and solution.name not in taken:
            offered.append(solution)
    return offered


def add_builtin_solutions(trace_set, definitions: Optional[list] = None) -> list[str]:
    """Add (and save into the dataset) opforge's builtin Solutions for the Definitions it knows;
    returns their names."""
    added = builtin_solutions_for(trace_set, definitions)
    for solution in added:
        trace_set.add_solution(solution)
    if added:
        trace_set.save()
    return [s.name for s in added]


def nothing_to_run(trace_set, definitions: Optional[list], solutions: Optional[list], modules: list,
                   resume: bool) -> tuple[str, bool]:
    """Why a run evaluated nothing, and what to do about it, in a few lines; and whether that is
    the user's mistake (False: a resumed run that had nothing left)."""
    text = _why_nothing(trace_set, definitions, solutions, modules)
    if text is None:
        return ("every selected solution/workload pair was traced already" if resume
                else "no solution matched the selected definitions"), not resume
    return text, True


def _why_nothing(trace_set, definitions, solutions, modules) -> Optional[str]:
    where = trace_set.single_file or trace_set.root
    selected = [n for n in trace_set.definitions if definitions is None or n in definitions]
    if definitions:
        unknown = [n for n in definitions if n not in trace_set.definitions]
        if unknown:
            return f"no definition named {', '.join(unknown)} in {where}"
    if not selected:
        return f"{where} holds no definitions"
    with_workloads = [n for n in selected if trace_set.workloads.get(n)]
    if not with_workloads:
        return f"none of the {len(selected)} selected definition(s) has a workload in {where}"
    with_solutions = [n for n in with_workloads if trace_set.solutions.get(n)]
    if not with_solutions and not modules:
        lines = [f"none of the {len(with_workloads)} selected definition(s) with workloads has a solution in {where}"]
        offer = builtin_solutions_for(trace_set, with_workloads)
        if offer:
            names = sorted({s.definition for s in offer})
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            lines.append(f"opforge has built-in solutions for {len(names)} of them ({shown}): "
                         "add --builtin to benchmark them")
        else:
            lines.append("add solutions to the dataset, or register them with --module my_solutions.py")
        return "\n".join(lines)
    if solutions:
        names = {s.name for n in with_workloads for s in trace_set.solutions.get(n, ())}
        missing = [n for n in solutions if n not in names]
        if missing and not modules:
            return f"no solution named {', '.join(missing)} for the selected definitions in {where}"
    return None
