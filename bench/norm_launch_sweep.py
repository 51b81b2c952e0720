#!/usr/bin/env python3
"""The norms' launch shapes against Liger-Kernel and a plain copy of the same bytes, per size.

    python3 bench/norm_launch_sweep.py --markdown bench/results/DATE_GPU_COMMIT_norm_sweep/results.md
    python3 bench/norm_launch_sweep.py --rows 512,4096 --hidden 4096 --ops rmsnorm
    python3 bench/norm_launch_sweep.py --dry-run     # every code path on tiny CPU tensors, in seconds

For each op (rmsnorm, fused_add_rmsnorm; bf16 unless --dtype says otherwise), hidden size and
row count: device time (the runner's timer: CUDA events, L2 flushed, inputs rotated past 2x L2;
median) of opforge's shipped launch choice and of every forced one (_C.norm's vectors per thread:
1, 2, 4, 8, 0 = the streaming kernel; "--" where it does not fit), of Liger-Kernel when installed, and of
``dst.copy_(src)`` moving the same bytes (half read, half written): what this size allows a
kernel that only streams, ramp-up and tail included. % of the copy ceiling (calibrated once, on
large copies) for each. Where the shipped choice loses to a forced one or to the peer, the launch
heuristic (cuda/launch_shape.h) is what to revisit; where the copy of the same bytes is itself far
below the ceiling, the size is launch- and tail-bound for any kernel.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opspecs  # noqa: E402
import timing  # noqa: E402
from opspecs import SPEC  # noqa: E402
from roofline import add_output_args, collect_meta, fmt, n_sets_for, safe, start, write as write_results  # noqa: E402

OPS = ("rmsnorm", "fused_add_rmsnorm")
HIDDEN = (4096, 8192)
ROWS = (256, 512, 1024, 2048, 4096, 8192, 16384)
VPTS = (-1, 1, 2, 4, 8, 0)  # -1: the shipped choice; 0: the streaming kernel
EPS = 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class _Ctx:
    def __init__(self, cuda: bool, dry: bool):
        self.cuda, self.dry = cuda, dry
        self.device = "cuda" if cuda else "cpu"
        self.l2 = timing.l2_bytes() if cuda else 60 << 20
        self.target_s = 0.01 if dry else 0.08


def _rotating(call, outs):
    """``call(outs[i], *inputs)`` for the i-th input set in turn (each set its own outputs)."""
    state = {"i": -1}

    def fn(*inputs):
        state["i"] = (state["i"] + 1) % len(outs)
        call(outs[state["i"]], *inputs)

    return fn


def _forced(op: str, vpt: int, ctx: _Ctx):
    """opforge's kernel with ``vpt`` vectors per thread (-1: its own choice), through the binding."""
    from opforge import _C
    from opforge._ext import cuda_stream

    stream = cuda_stream(0) if ctx.cuda else 0
    if op == "fused_add_rmsnorm":
        return lambda o, x, r, w: _C.norm(o[0], x, r, o[1], w, EPS, False, stream, True, vpt, False)
    return lambda o, x, w: _C.norm(o[0], x, None, None, w, EPS, False, stream, True, vpt, False)


def _time(fn, sets, ctx) -> "float | str":
    return safe(timing.device_time_us, fn, sets, ctx.cuda, ctx.target_s)  # an error: its one-line text


def measure(op: str, rows: int, hidden: int, ctx: _Ctx, liger: dict, copy_gbps: float,
            dtype: torch.dtype = torch.bfloat16) -> dict:
    spec = SPEC[op]
    elem = dtype.itemsize
    nbytes = spec.bytes(rows, hidden, elem)
    sets = opspecs.make_input_sets(spec, rows, hidden, dtype, ctx.device, n_sets_for(nbytes, ctx))
    outs = [opspecs.make_outputs(spec, s) for s in sets]
    ref = opspecs.reference(spec, sets[0])
    row = {"op": op, "rows": rows, "hidden": hidden, "bytes": nbytes, "us": {}, "check": {}}
    for vpt in VPTS:
        fn = _rotating(_forced(op, vpt, ctx), outs)
        try:
            fn(*sets[0])
        except Exception as e:  # noqa: BLE001 - a forced shape that does not fit this row
            row["us"][f"vpt{vpt}"] = f"{type(e).__name__}"
            continue
        problem = opspecs.check(spec, sets[0], outs[0], ref)
        row["check"][f"vpt{vpt}"] = problem or "pass"
        row["us"][f"vpt{vpt}"] = _time(fn, sets, ctx) if problem is None else "FAIL"
    if spec.liger in liger:
        row["us"]["liger"] = _time(liger[spec.liger][1], sets, ctx)
    # The same bytes through a plain copy: half of them read, half written.
    elems = nbytes // 2 // elem
    srcs = [torch.randn(elems, device=ctx.device).to(dtype) for _ in range(len(sets))]
    dsts = [torch.empty_like(s) for s in srcs]
    row["us"]["copy"] = _time(_rotating(lambda d, s: d[0].copy_(s), [(d,) for d in dsts]), [(s,) for s in srcs], ctx)
    row["pct_copy"] = {k: 100 * nbytes / (v * 1e3) / copy_gbps for k, v in row["us"].items()
                       if isinstance(v, float)}
    del sets, outs, srcs, dsts
    if ctx.cuda:
        torch.cuda.empty_cache()
    return row


def render(results: dict) -> str:
    m = results["meta"]
    labels = [f"vpt{v}" for v in VPTS] + ["liger", "copy"]
    names = {"vpt-1": "shipped", "vpt0": "streaming"}
    lines = [f"# Norm launch shapes at each size — {m.get('gpu', 'CPU (dry run)')}\n",
             f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}; {results.get('dtype', 'bf16')}; copy ceiling "
             f"{fmt(results['copy_gbps'], 0)} GB/s. µs (% of the ceiling); vptN: N vectors per thread forced; "
             "copy: dst.copy_(src) of the same bytes.\n",
             "| op | rows × hidden | MB | " + " | ".join(names.get(k, k) for k in labels) + " |",
             "|" + "---|" * (len(labels) + 3)]
    for r in results["rows"]:
        cells = []
        for k in labels:
            v = r["us"].get(k)
            cells.append(f"{fmt(v, 2)} ({fmt(r['pct_copy'][k], 0)}%)" if isinstance(v, float)
                         else "--" if v is not None else "")
        lines.append(f"| {r['op']} | {r['rows']}×{r['hidden']} | {fmt(r['bytes'] / 1e6, 1)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ints(text: "str | None", default):
    return tuple(int(x) for x in text.split(",")) if text else default


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "every code path on tiny CPU tensors; times mean nothing")
    p.add_argument("--ops", help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--rows", help="comma-separated row counts (default: %s)" % ",".join(map(str, ROWS)))
    p.add_argument("--hidden", help="comma-separated hidden sizes (default: %s)" % ",".join(map(str, HIDDEN)))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type (default: bf16)")
    args = p.parse_args(argv)
    cuda = start(args, render)
    if cuda is None:
        return 0
    ops = tuple(args.ops.split(",")) if args.ops else OPS
    unknown = set(ops) - set(OPS)
    if unknown:
        sys.exit(f"unknown ops: {sorted(unknown)}; known: {list(OPS)}")
    ctx = _Ctx(cuda, args.dry_run)
    rows, hidden = _ints(args.rows, (4, 64) if args.dry_run else ROWS), _ints(args.hidden, (256,) if args.dry_run else HIDDEN)
    calibration = timing.copy_calibration(cuda)
    liger, liger_errors = opspecs.liger_peers() if cuda else ({}, {})
    results = {"meta": collect_meta(args, cuda), "copy_gbps": calibration["gbps"], "copy_calibration": calibration,
               "liger_errors": liger_errors, "dtype": args.dtype, "rows": []}
    with torch.no_grad():
        for op in ops:
            for h in hidden:
                for r in rows:
                    results["rows"].append(measure(op, r, h, ctx, liger, calibration["gbps"], DTYPES[args.dtype]))
                    got = {k: fmt(v, 2) for k, v in results["rows"][-1]["us"].items()}
                    print(f"{op} {r}x{h}: {got}", flush=True)
    write_results(results, args.out, args.markdown, render=render)
    print(render(results))
    failed = [r for r in results["rows"] if any(v != "pass" for v in r["check"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
