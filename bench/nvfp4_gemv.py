#!/usr/bin/env python3
"""NVFP4 GEMV against its ceiling and its peers, in one run on one GPU.

    python3 bench/nvfp4_gemv.py --out results.json --markdown bench/results/DATE_GPU_COMMIT_nvfp4.md
    python3 bench/nvfp4_gemv.py --dry-run          # every code path on tiny CPU tensors, numbers meaningless
    python3 bench/nvfp4_gemv.py --render results.json   # re-render the tables of a saved run

Target: opforge.nvfp4_gemv (CUDA) at >= 80% of the copy bandwidth measured in the same run at
the three speed shapes (M, K, L) = (7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4). Also
measured: small M (128 and 256 rows, K = 7168), where launch and latency dominate.

c[m, 0, l] = sum_k A[m, k, l] * B[0, k, l] with A, B FP4 E2M1 and one FP8 E4M3 scale per 16
values along K; c in fp16. Inputs are what opforge's runner draws for the built-in Definitions
(opforge.bench.generate_inputs: every FP4 code, scales spread over the E4M3 binades up to the
fp16 bound, blocked scales derived from the plain ones), laid out as the task hands them over
(``--layout task``: K contiguous, the batch L outermost; ``contiguous``: the Definition's shape
contiguous, L innermost, as the runner's workers receive them).

Implementations, each first checked against the Definition's fp64 reference with its tolerance
(|got - ref| <= 1e-3 + 1e-3 |ref|), then timed whatever the check said (the table shows both):

* ``reference``: the Definition's reference (decode to fp64, einsum, round once);
* ``triton``: the Triton solution opforge ships (opforge/solutions/nvfp4_gemv_triton.py, its
  one-tuple entry, plain scales);
* ``opforge``: ``opforge.nvfp4_gemv(a, b, scale_a, scale_b, out=c)``;
* ``bf16 matmul``: ``torch.matmul`` of the dequantised A [L, M, K] and B [L, K, 1] in bf16
  (dequantised before timing: exact in bf16, as FP4 x E4M3 has at most 6 significant bits); its
  output is bf16, so it is not expected to meet 1e-3. It moves 2 bytes per weight, not 0.5625.
* ``read only``: the speed of light at this size, not a GEMV: a Triton kernel that reads as many
  bytes as A and its scales (one flat buffer per input set, 16 bytes per load, XOR-reduced) and
  writes almost nothing. What a launch of this many bytes can reach on this GPU, ramp and tail
  included; no check.

Timing (bench/timing.py, as roofline.py): CUDA events around each call, median of many, input
sets rotated so that one pass moves more than 2x L2 (so A comes from HBM), spin kernels queued
ahead so launches are not timed. Also "back to back": one CUDA graph that calls the
implementation once per input set in turn (as a model's layers follow each other), replayed; time
per call. Each launch then overlaps the previous one's tail, which a lone launch cannot. Bytes = A + A's scales, M * K * L * (1/2 + 1/16): what a GEMV
must read. B, its scales and c (K * L * 0.5625 + 2 * M * L bytes) are below 0.1% at every shape
here and left out. GB/s = bytes / time; % copy = of the device-to-device copy bandwidth (2 GiB,
read + write) measured at the start of the run. The bf16 peer's GB/s counts the same NVFP4
bytes (a speed comparison); its own traffic is in the JSON (``own_gbps``).

Without a GPU (and without --dry-run) it prints a note and exits 0. It exits 1 when opforge's op
or the Triton solution fails its check at any shape.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from roofline import add_output_args, collect_meta, fmt, safe, start, write as write_results  # noqa: E402

SPEED_SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)]
SMALL_SHAPES = [(128, 7168, 1), (256, 7168, 1), (256, 7168, 8)]
DRY_SHAPES = [(64, 128, 2), (130, 256, 1)]
TARGET_PCT = 80.0
MAX_SETS = 512
IMPLS = ("reference", "triton", "opforge", "bf16 matmul", "read only")
#: Implementations whose failed check fails the run.
GATED = ("triton", "opforge")


def nvfp4_bytes(m: int, k: int, l: int) -> int:
    """A (half a byte per value) and its scales (one byte per 16 values)."""
    return m * k * l // 2 + m * k * l // 16


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

def definition_for(m: int, k: int):
    from opforge.trace.templates import TEMPLATES

    return TEMPLATES["nvfp4_gemv"].definition(M=m, K=k)


def make_sets(definition, l: int, n: int, device: str, layout: str) -> list[dict]:
    from opforge.bench import generate_inputs
    from opforge.ops.nvfp4_format import dequantize
    from opforge.trace import RandomInput, Workload

    m = definition.const_axes["M"]
    workload = Workload(uuid="bench", axes={"L": l}, inputs={name: RandomInput() for name in definition.inputs})
    sets = []
    for seed in range(n):
        inputs = generate_inputs(definition, workload, seed=seed)
        if layout == "contiguous":  # generated in the task's layout (the Definition's storage_orders)
            inputs = [t.contiguous() for t in inputs[:4]] + inputs[4:]
        inputs = [t.to(device) for t in inputs]
        a, b, scale_a, scale_b = inputs[:4]
        sets.append({
            "inputs": inputs,
            "c": torch.empty(m, 1, l, dtype=torch.float16, device=device),
            # Dequantised once, outside the timing: [L, M, K] and [L, K, 1].
            "a_bf16": dequantize(a, scale_a).permute(2, 0, 1).contiguous().to(torch.bfloat16),
            "b_bf16": dequantize(b, scale_b).permute(2, 1, 0).contiguous().to(torch.bfloat16),
            # As many bytes as A and its scales, for the read-only speed of light.
            "flat": torch.randint(-2**31, 2**31 - 1, (nvfp4_bytes(m, a.shape[1] * 2, l) // 4,),
                                  dtype=torch.int32, device=device),
            "sink": torch.zeros(1, dtype=torch.int32, device=device),
        })
    return sets


def n_sets_for(nbytes: int, ctx) -> int:
    """Enough input sets that one pass over them moves more than 2x L2."""
    if ctx.dry:
        return 2
    return int(min(max(math.ceil(2 * ctx.l2 / nbytes) + 1, 2), MAX_SETS))


# ---------------------------------------------------------------------------
# The read-only speed of light
# ---------------------------------------------------------------------------

READ_BLOCK = 4096  # int32 words per program: 16 KiB


def read_only_fn():
    """fn(set) -> None that reads set["flat"] once (Triton), or raise when Triton is missing."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_kernel(x_ptr, n, sink_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
        acc = tl.xor_sum(x, 0)
        # Never true for random data: the store exists so the loads cannot be dropped.
        tl.store(sink_ptr, acc, mask=acc == 0x5A5A5A5A)

    def run(s):
        flat = s["flat"]
        read_kernel[(triton.cdiv(flat.numel(), READ_BLOCK),)](flat, flat.numel(), s["sink"], BLOCK=READ_BLOCK)

    return run


# ---------------------------------------------------------------------------
# Implementations: each takes one input set and returns c as [M, 1, L]
# ---------------------------------------------------------------------------

def implementations(definition) -> tuple[dict, dict]:
    """label -> fn(set) -> c, and label -> why it is unavailable."""
    fns, missing = {}, {}
    reference = definition.reference_fn()
    fns["reference"] = lambda s: reference(*s["inputs"])
    try:
        from opforge.solutions import nvfp4_gemv_triton

        fns["triton"] = lambda s: nvfp4_gemv_triton.triton_kernel((*s["inputs"], s["c"]))
    except Exception as e:  # triton missing or broken: the other columns still run
        missing["triton"] = f"{type(e).__name__}: {e}"
    try:
        import opforge

        op = opforge.nvfp4_gemv
        fns["opforge"] = lambda s: op(*s["inputs"][:4], out=s["c"])
    except Exception as e:
        missing["opforge"] = f"{type(e).__name__}: {e}"
    fns["bf16 matmul"] = lambda s: torch.matmul(s["a_bf16"], s["b_bf16"])
    try:
        fns["read only"] = read_only_fn()
    except Exception as e:
        missing["read only"] = f"{type(e).__name__}: {e}"
    return fns, missing


def as_c(label: str, out: torch.Tensor) -> torch.Tensor:
    # The bf16 peer returns [L, M, 1] bf16; the others c itself.
    return out.permute(1, 2, 0).to(torch.float16) if label == "bf16 matmul" else out


# ---------------------------------------------------------------------------
# One shape
# ---------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, cuda: bool):
        self.cuda, self.dry, self.layout = cuda, args.dry_run, args.layout
        self.device = "cuda" if cuda else "cpu"
        self.target_s = 0.02 if args.dry_run else 0.1
        self.l2 = timing.l2_bytes() if cuda else 60 << 20
        self.copy_gbps = None


def check(definition, label: str, fn, s, want) -> dict:
    from opforge.bench import compare_outputs

    got = as_c(label, fn(s))
    verdict = compare_outputs(definition, got, want)
    c = verdict.correctness
    return {"passed": verdict.passed, "log": verdict.log or "",
            "max_abs": c.max_absolute_error if c else None, "max_rel": c.max_relative_error if c else None}


def back_to_back_us(fn, sets) -> float:
    """Device µs per call when one CUDA graph calls fn on every set in turn (replayed)."""
    return 1e3 * timing.opforge_timing.graph_ms_per_call(lambda: [fn(s) for s in sets], [], calls=1, replays=3) / len(sets)


def measure(definition, label, fn, sets, want, nbytes, own_bytes, ctx) -> dict:
    try:
        row = {"status": "ok", "check": None if label == "read only" else check(definition, label, fn, sets[0], want)}
    except Exception as e:
        return {"status": "ERROR", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    us = safe(timing.device_time_us, fn, [(s,) for s in sets], ctx.cuda, ctx.target_s)
    if isinstance(us, str):
        return {**row, "status": "ERROR", "error": us}
    gbps = nbytes / (us * 1e3)
    row.update(us=us, gbps=gbps, pct_copy=100 * gbps / ctx.copy_gbps)
    if ctx.cuda and label != "reference":  # the reference takes milliseconds: nothing to overlap
        b2b = safe(back_to_back_us, fn, sets)
        if isinstance(b2b, str):
            row["b2b_error"] = b2b
        else:
            row.update(b2b_us=b2b, b2b_pct_copy=100 * nbytes / (b2b * 1e3) / ctx.copy_gbps)
    if own_bytes is not None:
        row["own_gbps"] = own_bytes / (us * 1e3)
    return row


def run_shape(m: int, k: int, l: int, ctx) -> dict:
    definition = definition_for(m, k)
    nbytes = nvfp4_bytes(m, k, l)
    sets = make_sets(definition, l, n_sets_for(nbytes, ctx), ctx.device, ctx.layout)
    want = definition.reference_fn()(*sets[0]["inputs"])
    fns, missing = implementations(definition)
    bf16_bytes = 2 * m * k * l + 2 * k * l + 2 * m * l
    row = {"M": m, "K": k, "L": l, "bytes": nbytes, "n_sets": len(sets), "layout": ctx.layout, "impls": {}}
    for label in IMPLS:
        if label in missing:
            row["impls"][label] = {"status": "n/a", "error": missing[label]}
            continue
        own = bf16_bytes if label == "bf16 matmul" else None
        row["impls"][label] = measure(definition, label, fns[label], sets, want, nbytes, own, ctx)
    del sets, want
    if ctx.cuda:
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------

def cell(r: dict) -> tuple[str, str, str, str]:
    """(µs, GB/s, % copy, check) of one implementation's result."""
    if r["status"] != "ok":
        return r["status"], "", "", ""
    c = r["check"]
    verdict = "—" if c is None else "pass" if c["passed"] else f"FAIL (max abs {fmt(c['max_abs'], 4)})"
    return fmt(r["us"]), fmt(r["gbps"], 0), fmt(r["pct_copy"], 0) + "%", verdict


def progress(row: dict) -> str:
    parts = []
    for impl, r in row["impls"].items():
        us, _, pct, verdict = cell(r)
        parts.append(f"{impl} {us} µs {pct} {verdict}" if r["status"] == "ok"
                     else f"{impl} {r['status']} ({r.get('error', '')[:120]})")
    return "; ".join(parts)


def table(rows: list) -> str:
    head = ["M×K×L", "MB"] + [f"{impl} {what}" for impl in IMPLS for what in ("µs", "% copy", "check")]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['M']}×{r['K']}×{r['L']}", fmt(r["bytes"] / 1e6, 1)]
        for impl in IMPLS:
            us, _, pct, verdict = cell(r["impls"][impl])
            cells += [us, pct, verdict]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def b2b_table(rows: list) -> str:
    impls = [i for i in IMPLS if i != "reference"]
    head = ["M×K×L"] + [f"{impl} {what}" for impl in impls for what in ("µs", "% copy")]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['M']}×{r['K']}×{r['L']}"]
        for impl in impls:
            x = r["impls"][impl]
            cells += ([fmt(x["b2b_us"]), fmt(x["b2b_pct_copy"], 0) + "%"] if "b2b_us" in x
                      else [x.get("b2b_error", x["status"])[:40], ""])
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def target_lines(rows: list) -> list[str]:
    lines = []
    for r in rows:
        if (r["M"], r["K"], r["L"]) not in SPEED_SHAPES:
            continue
        o, sol = r["impls"]["opforge"], r["impls"].get("read only", {})
        if o["status"] == "ok":
            met = o["pct_copy"] >= TARGET_PCT and o["check"]["passed"]
            line = (f"- {r['M']}×{r['K']}×{r['L']}: opforge {fmt(o['pct_copy'], 0)}% of copy "
                    f"({'met' if met else 'NOT met'})")
            if "b2b_pct_copy" in o:
                line += f"; back to back {fmt(o['b2b_pct_copy'], 0)}%"
            if sol.get("status") == "ok":
                line += (f"; a pure read of the same bytes: {fmt(sol['pct_copy'], 0)}%"
                         + (f", back to back {fmt(sol['b2b_pct_copy'], 0)}%" if "b2b_pct_copy" in sol else ""))
            lines.append(line)
        else:
            lines.append(f"- {r['M']}×{r['K']}×{r['L']}: opforge {o['status']} {o.get('error', '')}")
    return lines


def render(results: dict) -> str:
    m = results["meta"]
    parts = [
        f"# NVFP4 GEMV — {m.get('gpu', 'CPU (dry run)')}\n",
        f"torch {m['torch']}, triton {m['triton']}, commit {m['commit']}, {m['time_utc']}, "
        f"{'dry' if m['dry_run'] else 'full'} run, layout {m['layout']}\n",
        f"copy ceiling: {fmt(results['copy_gbps'], 0)} GB/s (2 GiB device-to-device, read + write)\n",
        "Bytes: A + its scales (M·K·L·(1/2 + 1/16)); B, its scales and c are below 0.1% and left out. "
        "Device time by CUDA events, median, inputs rotated past 2× L2. Check: against the fp64 "
        "reference, |got − ref| ≤ 1e-3 + 1e-3·|ref|. The bf16 matmul reads 2 bytes per weight "
        "(3.6× the NVFP4 bytes) and rounds c to bf16.\n",
        f"## Target: opforge ≥ {TARGET_PCT:.0f}% of copy at the speed shapes\n",
        "\n".join(target_lines(results["cases"])) or "(no speed shape in this run)",
        "\n## Device time, % of copy, check\n",
        table(results["cases"]),
    ]
    if any("b2b_us" in x for c in results["cases"] for x in c["impls"].values()):
        parts += ["\n## Back to back (one CUDA graph over the input sets), µs per call\n", b2b_table(results["cases"])]
    return "\n".join(parts) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "tiny shapes on CPU (Triton in its interpreter); times mean nothing")
    p.add_argument("--layout", choices=("task", "contiguous"), default="task",
                   help="task: K contiguous, L outermost (default); contiguous: [M, K/2, L] contiguous")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = start(args, render, layout=args.layout, triton_interpret=os.environ.get("TRITON_INTERPRET"))
    if cuda is None:
        return 0
    t0 = time.time()
    meta = collect_meta(args, cuda, layout=args.layout, triton_interpret=os.environ.get("TRITON_INTERPRET"))
    ctx = Ctx(args, cuda)
    ctx.copy_gbps = timing.copy_bandwidth_gbps(cuda)
    print(f"copy ceiling {ctx.copy_gbps:.0f} GB/s", flush=True)
    cases = []
    with torch.no_grad():
        for m, k, l in DRY_SHAPES if args.dry_run else SPEED_SHAPES + SMALL_SHAPES:
            cases.append(run_shape(m, k, l, ctx))
            print(f"[{time.time() - t0:6.1f}s] {m}x{k}x{l}: {progress(cases[-1])}", flush=True)
    results = {"meta": meta, "copy_gbps": ctx.copy_gbps, "target_pct_copy": TARGET_PCT, "cases": cases,
               "wall_s": round(time.time() - t0, 1)}
    write_results(results, args.out, args.markdown, render=render)
    print()
    print(render(results), flush=True)
    failed = [(c["M"], c["K"], c["L"], impl) for c in cases for impl in GATED
              if c["impls"][impl]["status"] != "ok" or not c["impls"][impl]["check"]["passed"]]
    if failed:
        print(f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
