#!/usr/bin/env python3
"""Paged GQA decode attention against its ceiling and its peers, in one run on one GPU.

    python3 bench/paged_decode_attention.py --out results.json --markdown bench/results/DATE_GPU_COMMIT_paged_decode.md
    python3 bench/paged_decode_attention.py --splits 1,2,4,8,16,32,r   # also time forced cuts (plan tuning; r: page ranges)
    python3 bench/paged_decode_attention.py --cases 32x2048,128x512,32xtail --impls opforge,sdpa   # a quick subset
    python3 bench/paged_decode_attention.py --batches 2,4,64 --contexts 2048,32768 --impls opforge,sdpa  # another grid
    python3 bench/paged_decode_attention.py --dry-run     # every code path on tiny CPU tensors, numbers meaningless
    python3 bench/paged_decode_attention.py --render results.json      # re-render the tables of a saved run

Targets (PERFORMANCE.md): opforge.paged_decode_attention at >= 75% of the copy bandwidth measured
in the same run at batch >= 32 and context >= 2048, >= 50% at batch >= 32 and context 512, and
faster than torch's scaled_dot_product_attention on the gathered KV everywhere.

Cases: Llama-3.1-8B's attention (32 query heads, 8 KV heads, head_dim 128; ``--heads``,
``--head-dim``), bf16, pages of 16 tokens (``--page-size``) in random order out of the cache, over
batch {1, 8, 32, 128} x context {512, 2048, 8192, 32768} (every request that long), plus
batches of mixed lengths: uniform in [1, 2 x context] and a long tail (one long request among
short ones).

Implementations, each first checked against the Definition's reference on the first requests
of the batch (|got - ref| <= 1.6e-2 (1 + |ref|) for the output, lse within 1e-3), then timed
whatever the check said (the table shows both):

* ``opforge``: ``opforge.paged_decode_attention(..., out=, lse=, skip_check=True)``: the serving
  loop's call (the layout's values are not re-checked, which would synchronise);
* ``triton``: the Triton solution opforge ships (opforge/solutions/gqa_paged_decode_triton.py);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (enable_gqa) on K and V gathered
  beforehand into [batch, kv heads, longest, head_dim] (padded, masked where lengths differ):
  the gather is not timed, so this is the peer's best case;
* ``flashinfer``: ``BatchDecodeWithPagedKVCacheWrapper.run`` (plan() outside the timing), when
  flashinfer is importable.

Timing (bench/timing.py): CUDA events around each call, median of many, input sets rotated so
that one pass moves more than 2x L2, spin kernels queued ahead so launches are not timed. Bytes
= the KV rows actually read (every request's tokens x kv heads x head_dim, K and V) + q + out +
lse + kv_indptr and kv_indices; GB/s = bytes / time; % copy = of the device-to-device copy
bandwidth (2 GiB, read + write) measured at the start of the run. The peers' GB/s count the same
bytes (a speed comparison; SDPA reads padding too).

Without a GPU (and without --dry-run) it prints a note and exits 0. It exits 1 when opforge's op
fails its check at any case.
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

BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192, 32768)
#: (label, batch, context): "uniform" lengths in [1, 2 x context]; "tail": one request of 16
#: x context tokens among batch - 1 of context / 4. Also on request (--cases 32xskew3): "skewR",
#: one request of R x SKEW_CONTEXT tokens among batch - 1 of SKEW_CONTEXT.
MIXES = (("uniform", 8, 8192), ("uniform", 32, 2048), ("uniform", 128, 2048), ("tail", 32, 2048))
SKEW_CONTEXT = 2048
DRY_GRID = ((1, 40), (3, 100))
DRY_MIXES = (("uniform", 3, 64), ("tail", 4, 32))
TARGETS = {"long": 75.0, "short": 50.0}  # % of copy at batch >= 32: context >= 2048 / context 512
MAX_SETS = 64
CHECKED_REQUESTS = 8
IMPLS = ("opforge", "triton", "sdpa", "flashinfer")


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

def lengths_for(kind: str, batch: int, context: int, gen: torch.Generator) -> list[int]:
    if kind == "same":
        return [context] * batch
    if kind == "uniform":
        return torch.randint(1, 2 * context + 1, (batch,), generator=gen).tolist()
    if kind == "tail":
        return [16 * context] + [max(context // 4, 1)] * (batch - 1)
    if kind.startswith("skew"):
        return [round(float(kind[4:]) * context)] + [context] * (batch - 1)
    raise AssertionError(kind)


class Case:
    """One shape: the lengths, the head configuration, and `n` input sets on `device`."""

    def __init__(self, label: str, lengths: list[int], args, device: str, n_sets: int, seed: int = 0):
        self.label, self.lengths = label, lengths
        self.heads, self.kv_heads = args.heads, args.kv_heads
        self.head_dim, self.page_size = args.head_dim, args.page_size
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
        gen = torch.Generator().manual_seed(seed)
        pages = [-(-n // self.page_size) for n in lengths]
        total = sum(pages)
        self.num_pages = total + 8
        offsets = [0]
        for p in pages:
            offsets.append(offsets[-1] + p)
        self.indptr = torch.tensor(offsets, dtype=torch.int32, device=device)
        self.indices = torch.randperm(self.num_pages, generator=gen)[:total].int().to(device)
        self.last = torch.tensor([n - (p - 1) * self.page_size if p else 1 for n, p in zip(lengths, pages)],
                                 dtype=torch.int32, device=device)
        self.sm_scale = 1 / math.sqrt(self.head_dim)
        # --max-kv-len: opforge is told the longest request, as a serving loop that knows its batch can.
        self.max_kv_len = max(lengths) if getattr(args, "max_kv_len", False) else None
        batch = len(lengths)
        cache = (self.num_pages, self.page_size, self.kv_heads, self.head_dim)
        g = torch.Generator(device=device).manual_seed(seed)
        self.sets = []
        for _ in range(n_sets):
            self.sets.append({
                "q": torch.randn(batch, self.heads, self.head_dim, device=device, generator=g).to(self.dtype),
                "k": torch.randn(cache, device=device, generator=g).to(self.dtype),
                "v": torch.randn(cache, device=device, generator=g).to(self.dtype),
                "out": torch.empty(batch, self.heads, self.head_dim, device=device, dtype=self.dtype),
                "lse": torch.empty(batch, self.heads, device=device),
            })

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def bytes(self) -> int:
        """KV rows read + q + out + lse + the page table."""
        item = torch.finfo(self.dtype).bits // 8
        kv = 2 * sum(self.lengths) * self.kv_heads * self.head_dim * item
        io = self.batch * self.heads * (2 * self.head_dim * item + 4)
        return kv + io + 4 * (self.indptr.numel() + self.indices.numel())

    def definition(self):
        from opforge.trace.templates import TEMPLATES

        return TEMPLATES["gqa_paged_decode"].definition(
            dtype={torch.bfloat16: "bfloat16", torch.float16: "float16"}[self.dtype], num_qo_heads=self.heads,
            num_kv_heads=self.kv_heads, head_dim=self.head_dim, page_size=self.page_size)

    def reference(self, s: dict) -> tuple:
        """The Definition's reference on the first CHECKED_REQUESTS requests of set s."""
        n = min(self.batch, CHECKED_REQUESTS)
        used = int(self.indptr[n])
        args = [s["q"][:n], s["k"], s["v"], self.indptr[: n + 1], self.indices[:used]]
        if self.page_size > 1:
            args.append(self.last[:n])
        return self.definition().reference_fn()(*args, self.sm_scale)

    def gathered(self, s: dict) -> dict:
        """K and V as [batch, kv heads, longest, head_dim] and the padding mask (for SDPA)."""
        longest = max(self.lengths)
        t = torch.arange(longest, device=self.indptr.device)
        lengths = torch.tensor(self.lengths, device=self.indptr.device)
        valid = t[None, :] < lengths[:, None]
        entry = self.indptr[:-1, None].long() + torch.div(t, self.page_size, rounding_mode="floor")[None, :]
        entry = torch.where(valid, entry, torch.zeros_like(entry)).clamp(max=max(self.indices.numel() - 1, 0))
        page = torch.where(valid, self.indices.long()[entry], torch.zeros_like(entry))
        slot = (t % self.page_size)[None, :].expand_as(page)
        k = s["k"][page, slot].permute(0, 2, 1, 3).contiguous()
        v = s["v"][page, slot].permute(0, 2, 1, 3).contiguous()
        same = min(self.lengths) == longest
        return {"q": s["q"].unsqueeze(2), "k": k, "v": v, "mask": None if same else valid[:, None, None, :]}


def n_sets_for(nbytes: int, ctx) -> int:
    """Enough input sets that one pass over them moves more than 2x L2 (one when a set does)."""
    if ctx.dry:
        return 2
    return 1 if nbytes >= 2 * ctx.l2 else min(math.ceil(2 * ctx.l2 / nbytes) + 1, MAX_SETS)


# ---------------------------------------------------------------------------
# Implementations: each takes one input set and returns (out, lse or None)
# ---------------------------------------------------------------------------

def implementations(case: Case) -> tuple[dict, dict]:
    """label -> fn(set) -> (out, lse), and label -> why it is unavailable."""
    fns, missing = {}, {}
    import opforge

    op = opforge.paged_decode_attention
    last = case.last if case.page_size > 1 else None

    def opforge_fn(s):
        return op(s["q"], s["k"], s["v"], case.indptr, case.indices, case.sm_scale, last, out=s["out"], lse=s["lse"],
                  max_kv_len=case.max_kv_len, skip_check=True)

    fns["opforge"] = opforge_fn
    try:
        from opforge.solutions import gqa_paged_decode_triton

        fns["triton"] = lambda s: gqa_paged_decode_triton.run(s["q"], s["k"], s["v"], case.indptr, case.indices, last,
                                                              case.sm_scale)
    except Exception as e:  # triton missing or broken: the other columns still run
        missing["triton"] = f"{type(e).__name__}: {e}"
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa_fn(s):
        g = s["gathered"]
        out = sdpa(g["q"], g["k"], g["v"], attn_mask=g["mask"], scale=case.sm_scale, enable_gqa=True)
        return out.squeeze(2), None

    fns["sdpa"] = sdpa_fn
    try:
        if case.indptr.device.type != "cuda":
            raise RuntimeError("flashinfer runs on CUDA only")
        import flashinfer

        workspace = torch.empty(256 << 20, dtype=torch.uint8, device=case.indptr.device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(case.indptr, case.indices, case.last, case.heads, case.kv_heads, case.head_dim,
                     case.page_size, q_data_type=case.dtype, kv_data_type=case.dtype)  # its default scale is ours
        fns["flashinfer"] = lambda s: wrapper.run(s["q"], (s["k"], s["v"]), return_lse=True)
    except Exception as e:  # not installed, or no kernel for this configuration: the others still run
        missing["flashinfer"] = f"{type(e).__name__}: {str(e)[:200]}"
    return fns, missing


def forced_split_fn(case: Case, splits: int, token_warps: int = 1, even_splits: int = -1):
    """opforge's kernel with a forced split count and token warps per CTA, or page ranges and
    their even_splits (the binding directly, workspace preallocated)."""
    from opforge import _C
    from opforge._ext import cuda_stream

    last = case.last if case.page_size > 1 else None
    s0 = case.sets[0]
    stream = cuda_stream(case.indptr.get_device()) if case.indptr.is_cuda else 0
    plan = dict(splits=splits, token_warps=token_warps) | (dict(even_splits=even_splits) if splits == 0 else {})
    need = _C.paged_decode_attention(s0["out"], s0["lse"], s0["q"], s0["k"], s0["v"], case.indptr, case.indices, last,
                                     None, case.sm_scale, stream, True, **plan)
    workspace = torch.empty(max(need, 1), dtype=torch.float32, device=case.indptr.device) if need else None

    def fn(s):
        _C.paged_decode_attention(s["out"], s["lse"], s["q"], s["k"], s["v"], case.indptr, case.indices, last,
                                  workspace, case.sm_scale, stream, True, **plan)
        return s["out"], s["lse"]

    return fn


# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, cuda: bool):
        self.cuda, self.dry = cuda, args.dry_run
        self.device = "cuda" if cuda else "cpu"
        self.target_s = 0.02 if args.dry_run else 0.1
        self.l2 = timing.l2_bytes() if cuda else 60 << 20
        self.copy_gbps = None
        self.splits = [parse_plan_name(x) for x in args.splits.split(",")] if args.splits else []
        self.sdpa_max_gib = args.sdpa_max_gib


def check(case: Case, got: tuple, want: tuple) -> dict:
    n = want[0].shape[0]
    out, lse = got
    ref_out, ref_lse = (w.double() for w in want)
    err = (out[:n].double() - ref_out).abs()
    out_ok = bool((err <= 1.6e-2 * (1 + ref_out.abs())).all())
    lse_err = None
    lse_ok = True
    if lse is not None:
        lse = lse[:n].double()
        same_inf = torch.isinf(ref_lse) & (lse == ref_lse)
        diff = torch.where(same_inf, torch.zeros_like(lse), (lse - ref_lse).abs())
        lse_err = float(diff.max()) if diff.numel() else 0.0
        lse_ok = bool((diff <= 1e-3 + 1e-4 * ref_lse.abs().nan_to_num(posinf=0, neginf=0)).all())
    return {"passed": out_ok and lse_ok, "max_abs": float(err.max()) if err.numel() else 0.0, "lse_err": lse_err}


def measure(case: Case, fn, want, nbytes: int, ctx) -> dict:
    try:
        row = {"status": "ok", "check": check(case, fn(case.sets[0]), want)}
    except Exception as e:
        return {"status": "ERROR", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    us = safe(timing.device_time_us, fn, [(s,) for s in case.sets], ctx.cuda, ctx.target_s)
    if isinstance(us, str):
        return {**row, "status": "ERROR", "error": us}
    gbps = nbytes / (us * 1e3)
    return {**row, "us": us, "gbps": gbps, "pct_copy": 100 * gbps / ctx.copy_gbps}


def run_case(label: str, lengths: list[int], args, ctx) -> dict:
    from opforge import _C

    probe = Case(label, lengths, args, ctx.device, 0)
    nbytes = probe.bytes()
    case = Case(label, lengths, args, ctx.device, n_sets_for(nbytes, ctx))
    want = case.reference(case.sets[0])
    fns, missing = implementations(case)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if ctx.cuda else 132
    plan = _C.paged_decode_attention_plan(case.batch, case.heads, case.kv_heads, case.head_dim,
                                          case.indices.numel() * case.page_size, case.page_size, sms,
                                          max_tokens=case.max_kv_len or 0)
    row = {"label": label, "batch": case.batch, "tokens": sum(lengths), "longest": max(lengths), "bytes": nbytes,
           "n_sets": len(case.sets), "plan": plan, "impls": {}}
    selected = set(args.impls.split(",")) | {"opforge"} if args.impls else set(IMPLS)
    for impl in IMPLS:
        if impl not in selected:
            row["impls"][impl] = {"status": "n/a", "error": "not selected (--impls)"}
            continue
        if impl in missing:
            row["impls"][impl] = {"status": "n/a", "error": missing[impl]}
            continue
        if impl == "sdpa":
            gathered_gib = 2 * case.batch * case.kv_heads * max(lengths) * case.head_dim * 2 / 2**30
            if gathered_gib * len(case.sets) > ctx.sdpa_max_gib:
                row["impls"][impl] = {"status": "n/a", "error": f"gathered KV {gathered_gib:.1f} GiB per set"}
                continue
            for s in case.sets:
                s["gathered"] = case.gathered(s)
        row["impls"][impl] = measure(case, fns[impl], want, nbytes, ctx)
        if impl == "sdpa":
            for s in case.sets:
                s.pop("gathered", None)
    if ctx.splits:
        row["forced_splits"] = {}
        for forced in ctx.splits:
            if forced[0] <= 128:
                fn = forced_split_fn(case, *forced)
                row["forced_splits"][plan_name(*forced)] = measure(case, fn, want, nbytes, ctx)
    del case, want
    if ctx.cuda:
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------

def cell(r: dict) -> tuple[str, str, str]:
    """(µs, % copy, check) of one implementation's result."""
    if r["status"] != "ok":
        return r["status"], "", ""
    c = r["check"]
    return fmt(r["us"]), fmt(r["pct_copy"], 0) + "%", "pass" if c["passed"] else f"FAIL ({fmt(c['max_abs'], 4)})"


def case_name(r: dict) -> str:
    if r["label"] == "same":
        return f"{r['batch']}×{r['longest']}"
    return f"{r['batch']}×{r['label']}({r['tokens'] // r['batch']} avg, {r['longest']} max)"


def progress(row: dict) -> str:
    parts = []
    for impl, r in row["impls"].items():
        us, pct, verdict = cell(r)
        parts.append(f"{impl} {us} µs {pct} {verdict}" if r["status"] == "ok"
                     else f"{impl} {r['status']} ({r.get('error', '')[:100]})")
    return f"plan {row_plan(row)}; " + "; ".join(parts)


def speedup(r: dict, peer: str) -> str:
    o, p = r["impls"]["opforge"], r["impls"].get(peer, {"status": "n/a"})
    return fmt(p["us"] / o["us"], 2) + "×" if o["status"] == "ok" and p["status"] == "ok" else ""


def table(rows: list) -> str:
    head = ["batch × context", "MB", "plan"] + [f"{i} {w}" for i in IMPLS for w in ("µs", "% copy", "check")] + \
        ["triton/opforge", "sdpa/opforge", "flashinfer/opforge"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [case_name(r), fmt(r["bytes"] / 1e6, 1), row_plan(r)]
        for impl in IMPLS:
            cells += list(cell(r["impls"][impl]))
        cells += [speedup(r, "triton"), speedup(r, "sdpa"), speedup(r, "flashinfer")]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plan_name(splits: int, token_warps: int = 1, even_splits: int = -1) -> str:
    """A plan's cut as the tables name it: splits, and "wT" for T token warps per CTA; page ranges
    (splits 0) as "rN" for N per KV head, "r" for a wave's, and "eK" for K runs per request of
    a batch the GPU finds balanced (none: the plan's)."""
    if splits == 0:
        return ("r" if token_warps == -1 else f"r{token_warps}") + ("" if even_splits == -1 else f"e{even_splits}")
    return f"{splits}" if token_warps == 1 else f"{splits}w{token_warps}"


def row_plan(row: dict) -> str:
    """The plan a case ran with (results saved before token warps have none: 1)."""
    if row["plan"].get("ranges"):
        return plan_name(0, row["plan"]["ranges"], row["plan"].get("even_splits", 0))
    return plan_name(row["plan"]["splits"], row["plan"].get("token_warps", 1))


def parse_plan_name(name: str) -> tuple[int, int, int]:
    """(splits, token_warps, even_splits) of a name plan_name gives (even_splits -1: the plan's)."""
    if name.startswith("r"):
        ranges, _, even = name[1:].partition("e")
        return 0, int(ranges or -1), int(even or -1)
    splits, _, warps = name.partition("w")
    return int(splits), int(warps or 1), -1


def splits_table(rows: list) -> str:
    forced = sorted({s for r in rows for s in r.get("forced_splits", {})}, key=parse_plan_name)
    if not forced:
        return ""
    out = ["Columns: forced splits, \"wT\": T warps of a CTA sharing its slice; \"rN\": N page ranges per KV "
           "head (\"r\": a wave's), \"eK\": K runs per request where the GPU finds the batch balanced "
           "(\"e0\": never; none: the plan's).\n",
           "| batch × context | plan | " + " | ".join(f"{s} µs" for s in forced) + " | best |",
           "|" + "---|" * (len(forced) + 3)]
    for r in rows:
        times = {s: v["us"] for s, v in r.get("forced_splits", {}).items() if v["status"] == "ok"}
        best = min(times, key=times.get) if times else None
        plan = row_plan(r)
        out.append(f"| {case_name(r)} | {plan} | " + " | ".join(fmt(times.get(s)) for s in forced) + f" | {best} |")
    return "\n".join(out)


def target_lines(rows: list) -> list[str]:
    lines = []
    for r in rows:
        o = r["impls"]["opforge"]
        if r["label"] != "same" or r["batch"] < 32 or o["status"] != "ok":
            continue
        kind = "long" if r["longest"] >= 2048 else "short" if r["longest"] <= 512 else None
        if kind is None:
            continue
        met = o["pct_copy"] >= TARGETS[kind] and o["check"]["passed"]
        lines.append(f"- {case_name(r)}: opforge {fmt(o['pct_copy'], 0)}% of copy (target {TARGETS[kind]:.0f}%: "
                     f"{'met' if met else 'NOT met'})")
    slower = [case_name(r) for r in rows
              if r["impls"]["sdpa"]["status"] == "ok" and r["impls"]["opforge"]["status"] == "ok"
              and r["impls"]["opforge"]["us"] >= r["impls"]["sdpa"]["us"]]
    lines.append(f"- faster than SDPA on gathered KV: {'everywhere' if not slower else 'NOT at ' + ', '.join(slower)}")
    return lines


def render(results: dict) -> str:
    m = results["meta"]
    parts = [
        f"# Paged GQA decode — {m.get('gpu', 'CPU (dry run)')}\n",
        f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}, {'dry' if m['dry_run'] else 'full'} run; "
        f"h{m['heads']}_kv{m['kv_heads']}_d{m['head_dim']}, page size {m['page_size']}, {m['dtype']}\n",
        f"copy ceiling: {fmt(results['copy_gbps'], 0)} GB/s (2 GiB device-to-device, read + write)\n",
        "Bytes: KV rows read + q + out + lse + page table. Device time by CUDA events, median, inputs rotated "
        "past 2× L2. Check: the Definition's reference on the first 8 requests. opforge: public call with "
        f"skip_check=True{', told the longest request (max_kv_len)' if m.get('max_kv_len_hint') else ''}; sdpa: on "
        "KV gathered beforehand (not timed).\n",
        "## Targets\n",
        "\n".join(target_lines(results["cases"])),
        "\n## Device time, % of copy, check\n",
        table(results["cases"]),
    ]
    forced = splits_table(results["cases"])
    if forced:
        parts += ["\n## Forced split counts (opforge's kernel, µs)\n", forced]
    return "\n".join(parts) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "tiny shapes on CPU; times mean nothing")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--splits", help="comma-separated split counts to force and time besides the plan's; SwT: S "
                                    "splits with T warps of a CTA sharing each slice (2w4); rN: N page ranges "
                                    "per KV head (r: a wave's), rNeK: with K runs per request for a batch "
                                    "the GPU finds balanced (re0: never)")
    p.add_argument("--max-kv-len", action="store_true",
                   help="pass each case's longest request to opforge as max_kv_len (the plan's hint)")
    p.add_argument("--sdpa-max-gib", type=float, default=24.0, help="skip SDPA where its gathered KV exceeds this")
    p.add_argument("--batches", type=_int_list, default=BATCHES,
                   help=f"comma-separated batch sizes of the grid of uniform cases (default {_csv(BATCHES)}; a dry "
                        "run keeps its tiny grid)")
    p.add_argument("--contexts", type=_int_list, default=CONTEXTS,
                   help=f"comma-separated context lengths of that grid (default {_csv(CONTEXTS)})")
    p.add_argument("--cases", help="comma-separated cases to run, BATCHxCONTEXT or BATCHxMIX (32x2048, 8xuniform), "
                                   f"or BATCHxskewR: one request of R x {SKEW_CONTEXT} tokens among BATCH - 1 of "
                                   f"{SKEW_CONTEXT} (32xskew3); default: all")
    p.add_argument("--impls", help=f"comma-separated implementations to time, of {', '.join(IMPLS)}; default: all "
                                   "(opforge always runs: the targets are its)")
    args = p.parse_args(argv)
    if args.impls:
        unknown = set(args.impls.split(",")) - set(IMPLS)
        if unknown:
            p.error(f"--impls: unknown {', '.join(sorted(unknown))} (known: {', '.join(IMPLS)})")
    return args


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def _int_list(text: str) -> tuple[int, ...]:
    """argparse type of --batches / --contexts: positive integers, comma-separated."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers, e.g. 1,2,4,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one or more numbers >= 1")
    return values


def case_key(label: str, batch: int, context: int) -> str:
    """The name --cases selects a case by: 32x2048, or 8xuniform for a mix."""
    return f"{batch}x{context}" if label == "same" else f"{batch}x{label}"


def main(argv=None) -> int:
    args = parse_args(argv)
    shape_meta = dict(heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, page_size=args.page_size,
                      dtype=args.dtype, max_kv_len_hint=args.max_kv_len)
    cuda = start(args, render, **shape_meta)
    if cuda is None:
        return 0
    t0 = time.time()
    meta = collect_meta(args, cuda, **shape_meta)
    ctx = Ctx(args, cuda)
    ctx.copy_gbps = timing.copy_bandwidth_gbps(cuda)
    print(f"copy ceiling {ctx.copy_gbps:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    grid = DRY_GRID if args.dry_run else [(b, c) for b in args.batches for c in args.contexts]
    specs = [("same", b, c) for b, c in grid] + list(DRY_MIXES if args.dry_run else MIXES)
    # Lengths are drawn for every case in order, selected or not, so a subset draws what the full
    # run draws.
    cases = [(kind, lengths_for(kind, b, c, gen), case_key(kind, b, c)) for kind, b, c in specs]
    if args.cases:
        wanted = {name.strip().replace("×", "x") for name in args.cases.split(",") if name.strip()}
        for name in sorted(wanted):
            batch, _, kind = name.partition("x")
            if kind.startswith("skew") and batch.isdigit() and kind[4:].replace(".", "", 1).isdigit():
                cases.append((kind, lengths_for(kind, int(batch), SKEW_CONTEXT, gen), name))
        unknown = wanted - {key for _, _, key in cases}
        if unknown:
            print(f"--cases: no case named {', '.join(sorted(unknown))} (known: "
                  f"{', '.join(key for _, _, key in cases)})", file=sys.stderr)
            return 2
        cases = [c for c in cases if c[2] in wanted]
    rows = []
    with torch.no_grad():
        for label, lengths, _ in cases:
            rows.append(run_case(label, lengths, args, ctx))
            print(f"[{time.time() - t0:6.1f}s] {case_name(rows[-1])}: {progress(rows[-1])}", flush=True)
    results = {"meta": meta, "copy_gbps": ctx.copy_gbps, "targets_pct_copy": TARGETS, "cases": rows,
               "wall_s": round(time.time() - t0, 1)}
    write_results(results, args.out, args.markdown, render=render)
    print()
    print(render(results), flush=True)
    failed = [case_name(r) for r in rows
              if r["impls"]["opforge"]["status"] != "ok" or not r["impls"]["opforge"]["check"]["passed"]]
    if failed:
        print(f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
