#!/usr/bin/env python3
"""Programmatic dependent launch (enable_pdl) on back-to-back decode-size calls.

    python3 bench/pdl_chain.py --markdown bench/results/DATE_GPU_COMMIT_pdl/results.md
    python3 bench/pdl_chain.py --dry-run        # the code paths on CPU (PDL off), numbers meaningless

A decoder layer's norm -> activation pair without its GEMMs, LAYERS times in a row:
fused_add_rmsnorm(x, r, w, out=h, residual_out=r) then silu_and_mul(h, out=a), each reading what
the previous call wrote. The chain is captured in one CUDA graph and replayed (the way serving
engines run decode steps); the table gives device µs per layer (two kernels) with enable_pdl
off and on, at hidden 4096 (bf16) and 1 to 256 rows. With PDL a kernel's blocks may be scheduled
while the previous kernel finishes and wait on the device until its writes are visible, so the
launch gap between the two kernels of a pair, and between pairs, is what changes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from roofline import add_output_args, collect_meta, fmt, start, write as write_results  # noqa: E402

HIDDEN = 4096
ROWS = (1, 8, 32, 128, 256)
LAYERS = 16


def chain(x, r, w, h, a, pdl: bool):
    import opforge

    for _ in range(LAYERS):
        opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=h, residual_out=r, enable_pdl=pdl)
        opforge.silu_and_mul(h, out=a, enable_pdl=pdl)
        x = h  # the next norm reads this layer's norm output (its activation has read it too)
    return a


def measure(rows: int, cuda: bool) -> dict:
    device = "cuda" if cuda else "cpu"
    x = torch.randn(rows, HIDDEN, device=device).bfloat16()
    r = torch.randn(rows, HIDDEN, device=device).bfloat16()
    w = torch.randn(HIDDEN, device=device).bfloat16()
    h = torch.empty_like(x)
    a = torch.empty(rows, HIDDEN // 2, device=device, dtype=torch.bfloat16)
    row = {"rows": rows}
    for pdl in (False, True):
        if pdl and not cuda:
            continue
        if cuda:
            ms = timing.opforge_timing.graph_ms_per_call(lambda: chain(x, r, w, h, a, pdl), [], calls=1, replays=20)
        else:
            t0 = time.perf_counter()
            chain(x, r, w, h, a, pdl)
            ms = (time.perf_counter() - t0) * 1e3
        row["pdl" if pdl else "plain"] = 1e3 * ms / LAYERS
    return row


def render(results: dict) -> str:
    m = results["meta"]
    lines = [f"# enable_pdl on back-to-back norm -> activation — {m.get('gpu', 'CPU (dry run)')}\n",
             f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}; hidden {HIDDEN}, bf16, "
             f"{LAYERS} layers per CUDA graph, µs per layer (fused_add_rmsnorm + silu_and_mul); "
             f"enable_pdl=True launches with PDL: {m.get('launches_with_pdl')}\n",
             "| rows | plain µs | enable_pdl µs | saved |", "|---|---|---|---|"]
    for r in results["rows"]:
        saved = (fmt(r["plain"] - r["pdl"], 2) + " µs") if "pdl" in r else ""
        lines.append(f"| {r['rows']} | {fmt(r['plain'], 2)} | {fmt(r.get('pdl'), 2)} | {saved} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "run the chain once on CPU tensors (PDL off); times mean nothing")
    args = p.parse_args(argv)
    cuda = start(args, render)
    if cuda is None:
        return 0
    if cuda and torch.cuda.get_device_capability() < (9, 0):
        print("programmatic dependent launch needs compute capability 9.0+: nothing to compare here")
        return 0
    # Whether enable_pdl=True launches really use PDL on this GPU with this build (code generated
    # for an older arch is launched plainly): a table of "pdl" times means nothing otherwise.
    from opforge import _C

    launches_with_pdl = _C.launches_with_pdl(torch.cuda.current_device()) if cuda else None
    results = {"meta": collect_meta(args, cuda, launches_with_pdl=launches_with_pdl), "rows": []}
    with torch.no_grad():
        for rows in ROWS[:2] if args.dry_run else ROWS:
            results["rows"].append(measure(rows, cuda))
            print(results["rows"][-1], flush=True)
    write_results(results, args.out, args.markdown, render=render)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
