#!/usr/bin/env python3
"""Decode-size device time against where the buffers sit in memory, opforge and Liger-Kernel alike.

    python3 bench/decode_placement.py --markdown bench/results/DATE_GPU_COMMIT_decode_placement/results.md
    python3 bench/decode_placement.py --trials 32 --ops rmsnorm
    python3 bench/decode_placement.py --cases scale:1x4096,silu_and_mul:32x14336
    python3 bench/decode_placement.py --dry-run     # every code path on tiny CPU tensors, in seconds

A one-row norm runs as one block on one SM, so its time is a chain of memory round trips, and a
round trip's latency depends on where the line lives (which L2 slice, near or far partition). The
same kernel on other buffers can then take a different time, by more than the differences between
implementations that single numbers (bench/roofline.py's) report. This script measures that: per
trial, a random-sized spacer allocation shifts where fresh inputs and outputs land, and each
implementation is timed on those same buffers (CUDA-graph replay, µs per call, as the roofline's
decode table): opforge, Liger-Kernel where it has the op, and torch.compile of the op's plain
PyTorch formula. It reports, per op and implementation, the spread over trials and how often
opforge was faster than the best peer on the same buffers.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opspecs  # noqa: E402
import timing  # noqa: E402
from opspecs import SPEC  # noqa: E402
from roofline import (add_output_args, collect_meta, configure_dynamo, fmt, safe, spread_of, start,  # noqa: E402
                      write as write_results)

#: (op, rows, hidden): the roofline's decode sizes where single-number comparisons were closest,
#: and the other hidden sizes whose launch shapes differ (1024-8192: one to four vectors per thread).
CASES = (("rmsnorm", 1, 4096), ("fused_add_rmsnorm", 1, 4096), ("rmsnorm", 256, 4096),
         ("fused_add_rmsnorm", 256, 4096), ("silu_and_mul", 1, 14336), ("rmsnorm", 1, 1024),
         ("rmsnorm", 32, 1024), ("rmsnorm", 1, 2048), ("rmsnorm", 32, 2048), ("rmsnorm", 1, 5120),
         ("rmsnorm", 1, 8192), ("gemma_rmsnorm", 32, 4096), ("scale", 1, 4096))
PEERS = ("liger", "compile")


def parse_cases(text: str) -> list:
    """"scale:1x4096,silu_and_mul:32x14336" -> [("scale", 1, 4096), ("silu_and_mul", 32, 14336)]."""
    cases = []
    for item in text.split(","):
        op, _, size = item.strip().partition(":")
        rows, _, hidden = size.partition("x")
        if op not in SPEC or not rows.isdigit() or not hidden.isdigit() or int(rows) < 1 or int(hidden) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: expected OP:ROWSxHIDDEN with OP one of "
                                             f"{', '.join(sorted(SPEC))}, e.g. silu_and_mul:1x14336")
        cases.append((op, int(rows), int(hidden)))
    return cases


def time_us(fn, cuda: bool) -> "float | str":
    return safe(timing.replay_or_host_us, fn, cuda)


def run_case(op: str, rows: int, hidden: int, trials: int, cuda: bool, liger: dict, compiled, rng: random.Random) -> dict:
    spec = SPEC[op]
    device = "cuda" if cuda else "cpu"
    times = {"opforge": [], "opforge_alloc": [], "liger": [], "compile": []}
    base = opspecs.make_input_sets(spec, rows, hidden, torch.bfloat16, device, 1)[0]
    spacers = []  # kept alive so every trial's buffers land somewhere new
    for _ in range(trials):
        spacer, inputs = opspecs.placed_copy(base, rng)
        spacers.append(spacer)
        outs = opspecs.make_outputs(spec, inputs, fill=float("nan"))
        call = spec.bound_call(inputs, outs)
        call()
        problem = opspecs.check(spec, inputs, outs)
        if problem:  # a wrong result is not timed
            raise SystemExit(f"{op} {rows}x{hidden}: opforge does not match the reference: {problem}")
        times["opforge"].append(time_us(call, cuda))
        # Without out=: the output allocated by the call (inside the graph, from its pool), as
        # the peers' outputs are.
        times["opforge_alloc"].append(time_us(spec.bound_call(inputs), cuda))
        if spec.liger in liger:
            peer = liger[spec.liger][1]
            times["liger"].append(time_us(lambda: peer(*inputs), cuda))
        times["compile"].append(time_us(lambda: compiled(*inputs), cuda))
    del spacers
    return {"op": op, "rows": rows, "hidden": hidden, "trials": trials, "us": times}


def summary(row: dict) -> dict:
    """Spread per implementation, and how often opforge beat the best peer of each trial."""
    us = row["us"]
    out = {impl: s for impl, values in us.items() if (s := spread_of(values))}
    wins = []
    for i, mine in enumerate(us["opforge"]):
        peers = [us[p][i] for p in PEERS if i < len(us[p]) and isinstance(us[p][i], float)]
        if isinstance(mine, float) and peers:
            wins.append(mine < min(peers))
    if wins:
        out["opforge_faster"] = sum(wins) / len(wins)
    return out


def render(results: dict) -> str:
    m = results["meta"]
    lines = [f"# Decode-size time against buffer placement — {m.get('gpu', 'CPU (dry run)')}\n",
             f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}; bf16; "
             f"{'CUDA-graph replay, µs per call' if m.get('gpu') else 'host loop (dry run: times mean nothing)'}; "
             "each trial: fresh buffers behind a random spacer, every implementation on the same buffers.\n",
             "opforge: out= buffers allocated beside the inputs; opforge, no out=: the call allocates its "
             "outputs, as Liger's calls do (inside a captured graph: from the graph's pool).\n",
             "Last column: the share of trials where opforge (out=) was faster than the best peer on "
             "the same buffers.\n",
             "| op | rows×hidden | trials | opforge min / median / max | opforge, no out= | Liger | "
             "torch.compile | opforge faster than both peers |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        s = r["summary"]

        def spread(impl):
            v = s.get(impl)
            return f"{fmt(v['min'], 2)} / {fmt(v['median'], 2)} / {fmt(v['max'], 2)}" if v else "n/a"

        won = s.get("opforge_faster")
        lines.append(f"| {r['op']} | {r['rows']}×{r['hidden']} | {r['trials']} | {spread('opforge')} | "
                     f"{spread('opforge_alloc')} | {spread('liger')} | {spread('compile')} | "
                     f"{'n/a' if won is None else f'{100 * won:.0f}%'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "every code path on tiny CPU tensors; times mean nothing")
    p.add_argument("--trials", type=int, default=24, help="placements per case (default: 24)")
    p.add_argument("--ops", help="comma-separated subset of " + ",".join(sorted({c[0] for c in CASES})))
    p.add_argument("--cases", type=parse_cases, help="comma-separated OP:ROWSxHIDDEN cases instead of the "
                   "default ones, e.g. scale:1x4096,silu_and_mul:32x14336")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    cuda = start(args, render)
    if cuda is None:
        return 0
    cases = [c for c in args.cases or CASES if not args.ops or c[0] in args.ops.split(",")]
    if args.dry_run:
        cases = list(dict.fromkeys((op, 2, 64) for op, _, _ in cases))
    trials = 2 if args.dry_run else args.trials
    liger, liger_errors = opspecs.liger_peers() if cuda else ({}, {})
    configure_dynamo()
    # Dry run: dynamo's tracing path without inductor's codegen, as the roofline's dry run.
    backend = "inductor" if cuda else "eager"
    compiled = {op: torch.compile(SPEC[op].formula, dynamic=False, fullgraph=True, backend=backend)
                for op in dict.fromkeys(c[0] for c in cases)}
    results = {"meta": collect_meta(args, cuda), "liger_errors": liger_errors, "rows": []}
    rng = random.Random(args.seed)
    with torch.no_grad():
        for op, rows, hidden in cases:
            row = run_case(op, rows, hidden, trials, cuda, liger, compiled[op], rng)
            row["summary"] = summary(row)
            results["rows"].append(row)
            print(f"{op} {rows}x{hidden}: {row['summary']}", flush=True)
    write_results(results, args.out, args.markdown, render=render)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
