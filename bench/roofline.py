#!/usr/bin/env python3
"""opforge against its ceiling and its peers, in one run on one GPU.

    python3 bench/roofline.py --out results.json [--quick] [--markdown bench/results/X.md]
    python3 bench/roofline.py --dry-run        # every code path on tiny CPU tensors, in seconds

Measures, in this order, with the runner's timer (opforge.bench.timing, through timing.py):
  1. the ceiling: device-to-device copy bandwidth (calibrate_copy: up to 2 GiB,
     read + write counted), the same calibration `opforge run` makes;
  2. per op x shape x dtype: device time (time_cuda: CUDA events around each
     call, L2 flushed and a spin kernel queued ahead of it, inputs rotated past
     2x L2; median) of opforge, torch eager, torch.compile and Liger-Kernel,
     each first checked against an fp32 reference (a wrong result is reported
     as FAIL and not timed); GB/s and % of the copy ceiling from opspecs' byte
     formulas;
  3. at decode sizes (<= 256 rows, bf16): host-loop µs per call (the full
     public API, with and without out=) and CUDA-graph replay µs per call;
  4. host overhead of the public op on 16-element CPU tensors against
     torch.mul(a, 1.0, out=o).
Writes everything to --out (JSON) and prints the summary table last.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opspecs  # noqa: E402
import timing  # noqa: E402
from opspecs import SPEC  # noqa: E402

DECODE_MAX_ROWS = 256
MAX_SETS = 4096  # tiny cases: 4096 sets of a 1-row input still span 2x L2

# ---------------------------------------------------------------------------
# What to run: (op, rows, hidden, dtype). hidden = output width (d for act-and-mul).
# ---------------------------------------------------------------------------
H4K = [(r, 4096) for r in (1, 32, 256, 1024, 4096, 32768)]
WIDE = [(32768, 8192), (4096, 16384), (32768, 16384)]
ACT = [(r, d) for d in (11008, 14336) for r in (1, 32, 256, 1024, 4096, 16384)]

FULL_PLAN = [
    (("rmsnorm", "fused_add_rmsnorm"), H4K + WIDE, ("bf16",)),
    (("gemma_rmsnorm",), H4K + WIDE[:1], ("bf16",)),
    (("gemma_fused_add_rmsnorm",), [(1, 4096), (256, 4096), (32768, 4096)], ("bf16",)),
    (("silu_and_mul",), ACT, ("bf16",)),
    (("gelu_and_mul", "gelu_tanh_and_mul"), [(1, 14336), (256, 14336), (16384, 14336)], ("bf16",)),
    (("scale",), H4K + WIDE[:1], ("bf16",)),
    # other dtypes at one large size
    (("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "scale"), [(32768, 4096)], ("fp16", "fp32")),
    (("silu_and_mul",), [(4096, 14336)], ("fp16", "fp32")),
]
QUICK_PLAN = [
    (("rmsnorm", "fused_add_rmsnorm"), [(1, 4096), (256, 4096), (4096, 4096), (32768, 4096)], ("bf16",)),
    (("gemma_rmsnorm",), [(32768, 4096)], ("bf16",)),
    (("silu_and_mul",), [(1, 14336), (256, 14336), (16384, 14336)], ("bf16",)),
    (("gelu_tanh_and_mul",), [(16384, 14336)], ("bf16",)),
    (("scale",), [(1, 4096), (32768, 4096)], ("bf16",)),
    (("rmsnorm",), [(32768, 4096)], ("fp32",)),
]
DRY_PLAN = [(tuple(SPEC), [(1, 64), (4, 128)], ("fp32", "bf16"))]


def expand(plan, only=None):
    return [(op, r, h, dt) for ops, shapes, dts in plan for op in ops
            if not only or op in only for r, h in shapes for dt in dts]


# ---------------------------------------------------------------------------
# Setup: environment, peers
# ---------------------------------------------------------------------------

def git_commit():
    # OPFORGE_COMMIT first: a copy of the tree on a GPU machine may carry stale git metadata.
    if os.environ.get("OPFORGE_COMMIT"):
        return os.environ["OPFORGE_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=here,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:
        pass
    return "unknown"


def version_of(dist):
    try:
        return importlib.metadata.version(dist)
    except Exception:
        return None


def collect_meta(args, cuda, **extra):
    """What a results file records about its run (bench scripts share it; ``extra``: their own
    fields)."""
    meta = {"time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "dry_run": args.dry_run,
            "commit": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "triton": version_of("triton"), "host": platform.node(), **extra}
    try:
        import opforge
        meta["opforge_build_info"] = opforge.build_info()
    except Exception as e:
        meta["opforge_build_info"] = f"unavailable: {type(e).__name__}: {e}"
    if cuda:
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sm_count=p.multi_processor_count, l2_bytes=timing.l2_bytes(),
                    gpu_mem_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
    return meta


def configure_dynamo():
    """One compiled function per op recompiles once per shape and dtype; lift the
    per-function limits so later shapes are compiled instead of falling back to eager."""
    cfg = torch._dynamo.config
    for name, value in (("cache_size_limit", 512), ("recompile_limit", 512),
                        ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)


class Ctx:
    """Run-wide state: device, peers, ceiling."""

    def __init__(self, args, cuda):
        self.cuda, self.dry = cuda, args.dry_run
        self.device = "cuda" if cuda else "cpu"
        self.target_s = 0.02 if args.dry_run else (0.05 if args.quick else 0.1)
        self.host_loop_s = 0.001 if args.dry_run else 0.005  # per host loop (of 9); dry: at least 100 calls
        self.placements = 2 if args.dry_run else (3 if args.quick else 5)  # buffer placements per graph number
        self.l2 = timing.l2_bytes() if cuda else 60 << 20
        configure_dynamo()
        # Dry run: dynamo's tracing path without inductor's C++/Triton codegen, which takes minutes on CPU.
        backend = "eager" if args.dry_run else "inductor"
        self.compiled = {s.name: torch.compile(s.formula, dynamic=False, fullgraph=True, backend=backend)
                         for s in opspecs.SPECS}
        self.liger, self.liger_errors = opspecs.liger_peers()
        if not cuda:  # Triton kernels need a GPU: import checked above, calls skipped
            self.liger_errors.update({k: "needs CUDA" for k in self.liger})
            self.liger = {}
        self.copy_gbps = None

    def impls(self, spec):
        """label -> callable with the formula's signature."""
        fns = {"opforge": lambda *t: spec.opforge_call(t), "eager": spec.formula,
               "compile": self.compiled[spec.name]}
        if spec.liger in self.liger:
            label, fn = self.liger[spec.liger]
            fns[label] = fn
        return fns


# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------

def n_sets_for(nbytes, ctx):
    """Enough input sets that one pass over them moves more than 2x L2."""
    if ctx.dry:
        return 2
    return int(min(max(math.ceil(2 * ctx.l2 / nbytes) + 1, 2), MAX_SETS))


def gate(label, fn, spec, args, ref):
    """None if fn is right on args; else the reason. opforge is also checked
    through out= with NaN-poisoned outputs, so every element must be written."""
    problem = opspecs.check(spec, args, fn(*args), ref)
    if problem is None and label == "opforge":
        outs = opspecs.make_outputs(spec, args, fill=float("nan"))
        spec.opforge_call(args, outs)
        problem = opspecs.check(spec, args, outs, ref)
        problem = problem and f"out=: {problem}"
    return problem


def safe(f, *a, **kw):
    try:
        return f(*a, **kw)
    except Exception as e:
        return f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def measure(label, fn, spec, sets, ref, nbytes, ctx):
    try:
        problem = gate(label, fn, spec, sets[0], ref)
    except Exception as e:
        return {"status": "ERROR", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    if problem:
        return {"status": "FAIL", "error": problem}
    t = safe(timing.device_timing, fn, sets, ctx.cuda, ctx.target_s)
    if isinstance(t, str):
        return {"status": "ERROR", "error": t}
    us = 1e3 * t["median_ms"]
    gbps = nbytes / (us * 1e3)
    return {"status": "ok", "us": us, "gbps": gbps, "pct_copy": 100 * gbps / ctx.copy_gbps, "method": t["method"],
            "iterations": t["iterations"], "p10_us": 1e3 * t["p10_ms"], "p90_us": 1e3 * t["p90_ms"]}


def decode_metrics(spec, args, fns, ctx):
    """Host loop (full public API, with and without out=) and CUDA-graph replay.

    Every callable gets its arguments bound once (functools.partial), so the host loop times what
    ``opforge.rmsnorm(x, w, eps, out=o)`` written out in a loop costs, and nothing else. This loop
    used to call ``lambda *t: spec.opforge_call(t, outs)`` with ``*args``: per call it packed the
    arguments into a tuple and ran a second Python frame that executed ``import opforge``, looked
    the op up by name and rebuilt the out= keywords from a zip before the op's own frame, after
    only 3 warm-up calls. That adapter's work was reported as the op's: for rmsnorm(out=) on
    1×16 fp32 CPU tensors the old loop gave 2.4 µs per call where a plain loop of the same call
    gives 1.65 µs (+0.7 µs, over 40%). Both now run one loop (opforge.bench.timing.host_loop_ms):
    bound call, 20 warm-up calls, garbage collector paused, about 5 ms of back-to-back calls then
    one synchronize, median of 9.

    The graph replay is the median over ctx.placements placements of fresh copies of the inputs
    and outputs (a random spacer allocation before each): a one-block kernel's time can depend on
    where its buffers sit (by 0.17 µs for a one-row RMSNorm on an H200), and one placement per
    implementation made single numbers a draw (bench/decode_placement.py measures the spread)."""

    def bind(a):
        bound = {"opforge(out=)": spec.bound_call(a, opspecs.make_outputs(spec, a))}
        for label, fn in fns.items():
            bound[label] = spec.bound_call(a) if label == "opforge" else functools.partial(fn, *a)
        return bound

    bound = bind(args)
    host = {k: safe(timing.host_loop_us, f, (), ctx.cuda, target_s=ctx.host_loop_s) for k, f in bound.items()}
    rng = random.Random(0)
    samples = {k: [] for k in bound}
    for _ in range(ctx.placements):
        spacer, placed = opspecs.placed_copy(args, rng)
        for k, f in bind(placed).items():
            samples[k].append(safe(timing.replay_or_host_us, f, ctx.cuda, ctx.host_loop_s))
        del spacer, placed
    graph, spread = {}, {}
    for k, values in samples.items():
        s = spread_of(values)
        graph[k] = s["median"] if s else values[0]  # all failed: the first error
        if s:
            spread[k] = [s["min"], s["max"]]
    return {"host_loop_us": host, "graph_us": graph, "graph_spread_us": spread, "graph_placements": ctx.placements}


def spread_of(values) -> "dict | None":
    """min, median, max and count of the numbers among ``values`` (errors are strings); None if none."""
    ok = [v for v in values if isinstance(v, float)]
    return {"min": min(ok), "median": statistics.median(ok), "max": max(ok), "n": len(ok)} if ok else None


def run_case(op, rows, hidden, dt, ctx):
    spec, dtype = SPEC[op], opspecs.DTYPES[dt]
    nbytes = spec.bytes(rows, hidden, torch.finfo(dtype).bits // 8)
    sets = opspecs.make_input_sets(spec, rows, hidden, dtype, ctx.device, n_sets_for(nbytes, ctx))
    ref = opspecs.reference(spec, sets[0])
    fns = ctx.impls(spec)
    row = {"op": op, "rows": rows, "hidden": hidden, "dtype": dt, "bytes": nbytes,
           "bytes_formula": spec.bytes_formula, "n_sets": len(sets),
           "impls": {k: measure(k, f, spec, sets, ref, nbytes, ctx) for k, f in fns.items()}}
    if spec.liger and spec.liger not in ctx.liger:
        row["impls"]["liger"] = {"status": "n/a", "error": ctx.liger_errors.get(spec.liger, "")}
    if (rows <= DECODE_MAX_ROWS and dt == "bf16") or ctx.dry:
        ok = {k: f for k, f in fns.items() if row["impls"][k]["status"] == "ok"}
        row["decode"] = decode_metrics(spec, sets[0], ok, ctx) if "opforge" in ok else None
    del sets, ref
    if ctx.cuda:
        torch.cuda.empty_cache()
    return row


def tiny_torch_floor(ctx):
    """One tiny torch kernel (torch.mul(out=) on 1x4096 bf16) timed every way: the
    floor each decode number should be read against, measured in the same run."""
    a = torch.randn(1, 4096, device=ctx.device).to(torch.bfloat16)
    o = torch.empty_like(a)
    fn = functools.partial(torch.mul, a, 1.0, out=o)  # bound once, like the ops in decode_metrics
    res = {"event_us": safe(timing.device_time_us, fn, [()], ctx.cuda, ctx.target_s),
           "host_loop_us": safe(timing.host_loop_us, fn, (), ctx.cuda, target_s=ctx.host_loop_s)}
    if ctx.cuda:
        res["graph_us"] = safe(timing.graph_replay_us, fn, ())
    return res


def cpu16_overhead():
    """Host cost of the public op on 16-element CPU tensors (target: <= torch.mul(out=))."""
    import opforge

    a, o = torch.randn(16), torch.empty(16)
    x, w, x2 = torch.randn(1, 16), torch.randn(16), torch.randn(1, 32)
    o2 = torch.empty(1, 16)
    calls = {
        "torch.mul(a, 1.0, out=o)": lambda: torch.mul(a, 1.0, out=o),
        "torch.mul(a, 1.0)": lambda: torch.mul(a, 1.0),
        "opforge.scale(a, 1.0, out=o)": lambda: opforge.scale(a, 1.0, out=o),
        "opforge.scale(a, 1.0)": lambda: opforge.scale(a, 1.0),
        "opforge.scale(a, 1.0, out=o, skip_check=True)": lambda: opforge.scale(a, 1.0, out=o, skip_check=True),
        "opforge.rmsnorm(x, w, out=o)": lambda: opforge.rmsnorm(x, w, out=o2),
        "opforge.silu_and_mul(x, out=o)": lambda: opforge.silu_and_mul(x2, out=o2),
    }
    return {k: safe(timing.cpu_call_overhead_us, f) for k, f in calls.items()}


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------

def fmt(v, nd=1):
    return f"{v:.{nd}f}" if isinstance(v, (int, float)) else ("n/a" if v is None else "ERR")


def best_peer(impls):
    peers = [(r["us"], k) for k, r in impls.items() if k != "opforge" and r["status"] == "ok"]
    return min(peers) if peers else (None, None)


def summary_table(rows):
    out = ["| op | rows×hidden | dtype | opforge µs | % copy | best peer µs | peer | peer/opforge |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = r["impls"]["opforge"]
        peer_us, peer = best_peer(r["impls"])
        if o["status"] == "ok":
            mine, pct = fmt(o["us"]), fmt(o["pct_copy"], 0) + "%"
            ratio = fmt(peer_us / o["us"], 2) if peer_us else "n/a"
        else:
            mine, pct, ratio = o["status"], "", ""
        out.append(f"| {r['op']} | {r['rows']}×{r['hidden']} | {r['dtype']} | {mine} | {pct} | "
                   f"{fmt(peer_us)} | {peer or 'n/a'} | {ratio} |")
    return "\n".join(out)


def decode_table(rows):
    rows = [r for r in rows if r.get("decode")]
    if not rows:
        return ""
    cols = sorted({k for r in rows for k in r["decode"]["host_loop_us"]},
                  key=lambda k: (not k.startswith("opforge"), k))
    head = ["op", "rows×hidden", "dtype"] + [f"{c} host" for c in cols] + [f"{c} graph" for c in cols]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        d = r["decode"]
        cells = [fmt(d["host_loop_us"].get(c)) for c in cols] + [fmt(d["graph_us"].get(c), 2) for c in cols]
        out.append(f"| {r['op']} | {r['rows']}×{r['hidden']} | {r['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def cpu16_table(res):
    return "\n".join(["| call (16-element CPU tensors) | µs per call |", "|---|---|"] +
                     [f"| `{k}` | {fmt(v, 2) if not isinstance(v, str) else v} |" for k, v in res.items()])


def copy_size(results):
    """How much the copy ceiling moved (results from before the calibration was recorded: 2 GiB)."""
    nbytes = (results.get("copy_calibration") or {}).get("bytes")
    if not nbytes:
        return "2 GiB"
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


def render(results):
    m, f = results["meta"], results["tiny_torch_floor"]
    head = (f"# opforge roofline — {m.get('gpu', 'CPU (dry run)')}\n\n"
            f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}, "
            f"{'dry' if m['dry_run'] else 'quick' if m['quick'] else 'full'} run\n\ncopy ceiling: {fmt(results['copy_gbps'], 0)} GB/s "
            f"({copy_size(results)} device-to-device, read + write)\n\n"
            f"tiny torch kernel (torch.mul out=, 1×4096): {fmt(f.get('event_us'))} µs by events, "
            f"{fmt(f.get('host_loop_us'))} µs per call in a host loop, "
            f"{fmt(f.get('graph_us'), 2)} µs per call in a CUDA graph\n")
    parts = [head,
             "## Decode sizes: µs per call (host = N calls then one sync; graph = CUDA-graph replay, "
             "median over fresh buffer placements, min and max in the JSON)\n",
             decode_table(results["cases"]),
             "\n## Host overhead on CPU tensors\n", cpu16_table(results["cpu16_overhead_us"]),
             "\n## Device time (CUDA events, median; % of the copy ceiling from each op's byte formula; "
             "peer/opforge > 1: opforge faster)\n",
             summary_table(results["cases"])]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write full results as JSON here")
    p.add_argument("--markdown", help="write the tables as markdown here (for bench/results/)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter timings (< 1.5 min)")
    p.add_argument("--dry-run", action="store_true", help="run every path on tiny CPU tensors; times mean nothing")
    p.add_argument("--ops", help="comma-separated subset of ops")
    p.add_argument("--render", metavar="JSON", help="only re-render the tables of a saved results file")
    return p.parse_args(argv)


def write(results, out=None, markdown=None, render=None):
    """The results as JSON (``out``) and as markdown tables (``markdown``, made by ``render``:
    this script's tables unless a script of its own passes its renderer)."""
    render = render or globals()["render"]
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"wrote {out}")
    if markdown:
        os.makedirs(os.path.dirname(os.path.abspath(markdown)), exist_ok=True)
        with open(markdown, "w") as f:
            f.write(render(results))
        print(f"wrote {markdown}")


def add_output_args(p, dry_run_help: str):
    """The options every benchmark script here takes: --out, --markdown, --dry-run, --render."""
    p.add_argument("--out", help="write full results as JSON here")
    p.add_argument("--markdown", help="write the tables as markdown here (for bench/results/)")
    p.add_argument("--dry-run", action="store_true", help=dry_run_help)
    p.add_argument("--render", metavar="JSON", help="only re-render the tables of a saved results file")


def start(args, render, **meta) -> "bool | None":
    """What a kernel benchmark script does before measuring: --render re-renders a saved file,
    without CUDA (and without --dry-run) it says so and writes an empty result; a dry run uses
    Triton's interpreter. Returns None when the script is done, else whether CUDA is used."""
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        write(results, markdown=args.markdown, render=render)
        print(render(results))
        return None
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        note = "no CUDA device: nothing timed (use --dry-run to exercise the code paths on CPU)"
        print(note)
        if args.out:
            write({"meta": collect_meta(args, False, **meta), "note": note, "cases": []}, out=args.out, render=render)
        return None
    if args.dry_run and "triton" not in sys.modules:
        # Triton runs on CPU only in its interpreter, chosen when triton is first imported.
        os.environ["TRITON_INTERPRET"] = "1"
    return cuda


def progress(t0, row):
    o = row["impls"]["opforge"]
    got = f"{fmt(o['us'])} us" if o["status"] == "ok" else f"{o['status']} {o.get('error', '')}"
    print(f"[{time.time() - t0:6.1f}s] {row['op']} {row['rows']}x{row['hidden']} {row['dtype']}: opforge {got}",
          flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        write(results, markdown=args.markdown)
        print(render(results))
        return 0
    only = set(args.ops.split(",")) if args.ops else None
    if only and not only <= set(SPEC):
        sys.exit(f"unknown ops: {sorted(only - set(SPEC))}; known: {sorted(SPEC)}")
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        note = "no CUDA device: nothing timed (use --dry-run to exercise the code paths on CPU)"
        print(note)
        if args.out:
            write({"meta": collect_meta(args, False, quick=args.quick, liger_kernel=version_of("liger-kernel")), "note": note, "cases": []}, out=args.out)
        return 0
    t0 = time.time()
    meta = collect_meta(args, cuda, quick=args.quick, liger_kernel=version_of("liger-kernel"))
    ctx = Ctx(args, cuda)
    calibration = timing.copy_calibration(cuda)
    ctx.copy_gbps = calibration["gbps"]
    print(f"copy ceiling {ctx.copy_gbps:.0f} GB/s; liger: "
          f"{'ok' if ctx.liger else 'n/a'} {sorted(set(ctx.liger_errors.values()))[:1]}", flush=True)
    plan = DRY_PLAN if args.dry_run else (QUICK_PLAN if args.quick else FULL_PLAN)
    cases = []
    with torch.no_grad():
        for op, rows, hidden, dt in expand(plan, only):
            cases.append(run_case(op, rows, hidden, dt, ctx))
            progress(t0, cases[-1])
    results = {"meta": meta, "copy_gbps": ctx.copy_gbps, "copy_calibration": calibration,
               "liger_errors": ctx.liger_errors,
               "cases": cases, "tiny_torch_floor": tiny_torch_floor(ctx), "cpu16_overhead_us": cpu16_overhead(),
               "byte_formulas": {s.name: s.bytes_formula for s in opspecs.SPECS},
               "wall_s": round(time.time() - t0, 1)}
    write(results, args.out, args.markdown)
    print()
    print(render(results), flush=True)
    print(f"total {results['wall_s']} s")
    failed = [c for c in cases if c["impls"]["opforge"]["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
