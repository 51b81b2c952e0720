#!/usr/bin/env python3
"""End-to-end decode throughput of a Llama-3-8B-shaped model: plain transformers, opforge.patch
and Liger-Kernel, each eager and compiled.

    python3 bench/e2e_decode.py --out bench/results/DATE_GPU_COMMIT_e2e     # one GPU, a few minutes
    python3 bench/e2e_decode.py --dry-run                                  # tiny CPU model, seconds
    python3 bench/e2e_decode.py --variants plain,opforge --batches 1 --steps 64

Model: LlamaForCausalLM, randomly initialised from a fixed seed, with Llama-3-8B layer shapes
(hidden 4096, intermediate 14336, 32 heads, 8 KV heads, rms_norm_eps 1e-5), 4 layers, a 4096-token
vocabulary, bf16, SDPA attention, a static KV cache.

Variants: ``plain`` (transformers as is), ``opforge`` (``opforge.patch(model)``), ``liger``
(``liger_kernel.transformers.apply_liger_kernel_to_llama(model=...)``: its RMSNorm, SwiGLU and
RoPE; the loss options are off, no loss is computed here). Liger also replaces transformers'
Llama classes and RoPE function module-wide, so every variant x mode runs in a process of its
own, on a fresh model built from the same seed (the dry run shares one process: no Liger there).

Modes: ``eager``, and ``compiled``: the decode step (model forward on [batch, 1] tokens + greedy
argmax) under ``torch.compile(mode="reduce-overhead", dynamic=False)``, the same for every
variant. reduce-overhead replays the step as CUDA graphs, which is what transformers' own
static-cache generation uses and what a serving loop runs; launch overhead, which eager mode
shows, is then gone and the GPU work of each variant is compared. Graph breaks are counted.

Per variant x mode x batch: prefill a fixed random prompt; run --check-steps decode steps on
fixed random tokens (teacher forcing, so every variant sees the same inputs) and keep their
logits; --warmup greedy steps; then --repeats timed runs of --steps greedy steps each (CUDA
events around the host loop; nothing in the loop syncs). tokens/s = batch x steps / time;
reported: the median over repeats and the spread (max - min) / median. The check column compares
each variant's check logits with plain's (same mode and batch): max |diff| / max |plain logit|
above --tolerance prints WARN.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

VARIANTS = ("plain", "opforge", "liger")
MODES = ("eager", "compiled")
COMPILE_MODE = "reduce-overhead"
LLAMA3_8B_LAYER = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=4, vocab_size=4096, rms_norm_eps=1e-5)
DRY_LAYER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, vocab_size=256, rms_norm_eps=1e-5)
CHECK_ROWS = 4  # batch rows whose check logits are kept
RESULT_TAG = "e2e_decode"


# ---------------------------------------------------------------------------
# Worker: one process runs its jobs (variant x mode) over every batch size
# ---------------------------------------------------------------------------

def build_model(variant: str, job: dict, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    shapes = DRY_LAYER if job["dry_run"] else LLAMA3_8B_LAYER
    config = LlamaConfig(**shapes, max_position_embeddings=job["cache_len"], attn_implementation="sdpa")
    torch.manual_seed(job["seed"])
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    if variant == "opforge":
        import opforge

        opforge.patch(model)
    elif variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, model=model)
    return model


def position_kwargs(positions: torch.Tensor, cache_position: bool) -> dict:
    """Positions passed explicitly (and cache_position where this transformers version takes it),
    so nothing in a step reads a cache length back to the host."""
    return {"position_ids": positions.view(1, -1), **({"cache_position": positions} if cache_position else {})}


def make_step(model, cache, cache_position: bool):
    """One decode step: logits of the last position and the greedy next tokens."""

    def step(ids, pos):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, **position_kwargs(pos, cache_position))
        logits = out.logits[:, -1, :]
        return logits, logits.argmax(-1, keepdim=True)

    return step


class Clock:
    """CUDA events on a GPU (the host loop included), wall clock on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def start(self):
        if self.cuda:
            self.t0 = torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.t0 = time.perf_counter()

    def stop_s(self) -> float:
        if self.cuda:
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record()
            t1.synchronize()
            return self.t0.elapsed_time(t1) / 1e3
        return time.perf_counter() - self.t0


def decode_run(model, batch: int, job: dict, device: str, compiled: bool) -> tuple[dict, torch.Tensor]:
    from transformers import StaticCache

    gen = torch.Generator().manual_seed(job["seed"] + batch)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, job["prompt"]), generator=gen).to(device)
    forced = torch.randint(0, vocab, (batch, job["check_steps"]), generator=gen).to(device)
    cache = StaticCache(config=model.config, max_cache_len=job["cache_len"])
    cache_position = "cache_position" in inspect.signature(model.model.forward).parameters
    step = make_step(model, cache, cache_position)
    if compiled:
        # The dry run checks the compiled path's tracing without CPU code generation (minutes).
        step = torch.compile(step, dynamic=False, **({"backend": "aot_eager"} if job["dry_run"] else
                                                      {"mode": COMPILE_MODE}))

    def call(ids, pos):
        """(logits, next tokens); advances pos. The same for every variant and mode: the next
        tokens are copied (a CUDA-graph output is overwritten by the next replay, so it cannot be
        fed back as it is) and pos moves on in place."""
        if compiled and not job["dry_run"]:
            torch.compiler.cudagraph_mark_step_begin()
        logits, next_ids = step(ids, pos)
        pos.add_(1)
        return logits, next_ids.clone()

    clock = Clock(device == "cuda")
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1,
              **position_kwargs(torch.arange(job["prompt"], device=device), cache_position))
        pos = torch.tensor([job["prompt"]], device=device)
        check = []
        t_first = time.perf_counter()
        for k in range(job["check_steps"]):
            logits, ids = call(forced[:, k:k + 1], pos)
            check.append(logits[:CHECK_ROWS].float().cpu())
        first_steps_s = time.perf_counter() - t_first  # includes compilation in compiled mode
        for _ in range(job["warmup"]):
            _, ids = call(ids, pos)
        times = []
        for _ in range(job["repeats"]):
            clock.start()
            for _ in range(job["steps"]):
                _, ids = call(ids, pos)
            times.append(clock.stop_s())
    rates = [batch * job["steps"] / t for t in times]
    median = statistics.median(rates)
    return ({"status": "ok", "tokens_per_s": median, "spread": (max(rates) - min(rates)) / median,
             "runs_tokens_per_s": rates, "first_steps_s": first_steps_s}, torch.stack(check))


def run_job(job: dict) -> dict:
    device = "cpu" if job["dry_run"] else "cuda"
    variant, mode = job["variant"], job["mode"]
    result = {"variant": variant, "mode": mode, "batches": {}}
    if device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    try:
        model = build_model(variant, job, device)
    except ImportError as e:
        result["status"] = "not installed" if variant == "liger" else f"ERROR ImportError: {e}"
        return result
    if mode == "compiled":
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
    for batch in job["batches"]:
        t0 = time.time()
        try:
            res, check = decode_run(model, batch, job, device, mode == "compiled")
            path = os.path.join(job["dir"], f"check_{variant}_{mode}_{batch}.pt")
            torch.save(check, path)
            res["check_file"] = path
        except Exception as e:  # one failing batch size or variant leaves the others standing
            res = {"status": f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        result["batches"][str(batch)] = res
        rate = f"{res['tokens_per_s']:.0f} tok/s" if res["status"] == "ok" else res["status"]
        print(f"[{RESULT_TAG}] {variant} {mode} batch {batch}: {rate} ({time.time() - t0:.0f} s)", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    if mode == "compiled":
        result["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    result["status"] = "ok"
    return result


def worker_main(jobs_json: str) -> int:
    jobs = json.loads(jobs_json)
    results = [run_job(job) for job in jobs]
    with open(jobs[0]["result_file"], "w") as f:
        json.dump(results, f)
    return 0


# ---------------------------------------------------------------------------
# Parent: plan jobs, run workers, compare, report
# ---------------------------------------------------------------------------

def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=here, capture_output=True,
                                   text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:
        pass
    return os.environ.get("OPFORGE_COMMIT", "unknown")


def version_of(dist: str):
    try:
        return importlib.metadata.version(dist)
    except Exception:
        return None


def run_workers(groups: list[list[dict]], timeout_s: float) -> list[dict]:
    results = []
    for group in groups:
        result_file = group[0]["result_file"]
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(group)],
                                  timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc == 0 and os.path.exists(result_file):
            with open(result_file) as f:
                results += json.load(f)
        else:
            results += [{"variant": j["variant"], "mode": j["mode"], "batches": {},
                         "status": f"ERROR worker exited with {rc} (its output is above)"} for j in group]
    return results


def compare(results: list[dict], batches: list[int], tolerance: float) -> None:
    """Adds each job's check against plain (same mode and batch) as result["check"][batch]."""
    plain = {r["mode"]: r for r in results if r["variant"] == "plain"}
    for r in results:
        r["check"] = {}
        ref = plain.get(r["mode"])
        for b in map(str, batches):
            mine, theirs = r["batches"].get(b, {}), (ref or {}).get("batches", {}).get(b, {})
            if r["variant"] == "plain" or "check_file" not in mine or "check_file" not in theirs:
                continue
            got, want = torch.load(mine["check_file"]), torch.load(theirs["check_file"])
            rel = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
            r["check"][b] = {"max_rel_diff": rel, "argmax_agree": agree, "ok": rel <= tolerance}


def cell(res: dict | None) -> str:
    if not res:
        return ""
    if res.get("status") != "ok":
        return res.get("status", "")
    return f"{res['tokens_per_s']:,.0f} (±{100 * res['spread'] / 2:.1f}%)"


def render(report: dict) -> str:
    m, batches = report["meta"], [str(b) for b in report["settings"]["batches"]]
    s = report["settings"]
    lines = [f"# End-to-end decode — {m.get('gpu') or 'CPU (dry run, numbers meaningless)'}", "",
             f"LlamaForCausalLM, random init, {s['shapes']}, bf16, SDPA, static KV cache of {s['cache_len']} "
             f"tokens; prompt {s['prompt']} tokens, {s['steps']} greedy decode steps x {s['repeats']} repeats "
             f"after {s['warmup']} warm-up steps (median tokens/s; ± half the max-min spread).", "",
             f"compiled: torch.compile(decode step, {s['compile']}, dynamic=False), the same for every variant.", "",
             f"torch {m['torch']}, transformers {m['transformers']}, "
             f"liger-kernel {m['liger_kernel'] or 'not installed'}, commit {m['commit']}, {m['time_utc']}", ""]
    head = ["variant", "mode"] + [x for b in batches for x in (f"batch {b} tok/s", "vs plain")] + ["check vs plain"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = {(r["variant"], r["mode"]): r for r in report["results"]}
    for r in report["results"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['variant']} | {r['mode']} | {r.get('status', '')} |" + " |" * (len(head) - 3))
            continue
        base = rows.get(("plain", r["mode"]), {}).get("batches", {})
        cells = []
        for b in batches:
            mine, ref = r["batches"].get(b), base.get(b)
            ratio = (f"{mine['tokens_per_s'] / ref['tokens_per_s']:.2f}x"
                     if mine and ref and mine.get("status") == "ok" and ref.get("status") == "ok" else "")
            cells += [cell(mine), ratio]
        if r["variant"] == "plain":
            check = "reference"
        elif not r["check"]:
            check = "n/a"
        else:
            parts = [f"{'ok' if c['ok'] else 'WARN'} b{b}: Δ {100 * c['max_rel_diff']:.2f}%, argmax "
                     f"{100 * c['argmax_agree']:.0f}%" for b, c in r["check"].items()]
            check = "; ".join(parts)
        if r.get("graph_breaks"):
            check += f" ({r['graph_breaks']} graph breaks)"
        lines.append(f"| {r['variant']} | {r['mode']} | " + " | ".join(cells) + f" | {check} |")
    lines += ["", f"check: logits of {s['check_steps']} teacher-forced decode steps (first {CHECK_ROWS} rows) "
              f"against plain in the same mode: Δ = max |diff| / max |plain logit|, WARN above "
              f"{100 * s['tolerance']:.1f}%; argmax = share of equal greedy tokens."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", metavar="DIR", help="write results.md and results.json here")
    p.add_argument("--dry-run", action="store_true", help="tiny model on the CPU, every path, in seconds")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    p.add_argument("--steps", type=int, help="timed decode steps per repeat (default 128; dry run 4)")
    p.add_argument("--repeats", type=int, help="timed repeats (default 9; dry run 2)")
    p.add_argument("--warmup", type=int, help="untimed greedy steps before timing (default 16; dry run 1)")
    p.add_argument("--check-steps", type=int, default=4, help="teacher-forced steps whose logits are compared")
    p.add_argument("--prompt", type=int, help="prompt tokens (default 128; dry run 8)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="max |logit diff| / max |logit| against plain before WARN (default 0.05, bf16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", help="commit to record (default: git rev-parse HEAD, or $OPFORGE_COMMIT)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dry = args.dry_run
    for name, full, small in (("steps", 128, 4), ("repeats", 9, 2), ("warmup", 16, 1), ("prompt", 128, 8)):
        if getattr(args, name) is None:
            setattr(args, name, small if dry else full)
    for name, known in (("variants", VARIANTS), ("modes", MODES)):
        chosen = [v for v in getattr(args, name).split(",") if v]
        if not chosen or set(chosen) - set(known):
            p.error(f"--{name}: {getattr(args, name)!r}; accepted: a comma-separated subset of {', '.join(known)}")
        setattr(args, name, chosen)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches: {args.batches!r} is not a comma-separated list of integers")
    if min(args.batches) < 1 or min(args.steps, args.repeats, args.prompt, args.check_steps) < 1 or args.warmup < 0:
        p.error("--batches, --steps, --repeats, --prompt and --check-steps must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("no CUDA device: nothing timed (use --dry-run to exercise the code paths on CPU)")
        return 0
    t0 = time.time()
    steps_total = args.prompt + args.check_steps + args.warmup + args.repeats * args.steps
    cache_len = -(-steps_total // 64) * 64
    settings = {k: getattr(args, k) for k in ("batches", "steps", "repeats", "warmup", "check_steps", "prompt",
                                              "tolerance", "seed", "variants", "modes")}
    shapes = DRY_LAYER if args.dry_run else LLAMA3_8B_LAYER
    settings.update(cache_len=cache_len, shapes=", ".join(f"{k} {v}" for k, v in shapes.items()),
                    compile="aot_eager backend (dry run)" if args.dry_run else f'mode="{COMPILE_MODE}"')
    liger_found = importlib.util.find_spec("liger_kernel") is not None
    with tempfile.TemporaryDirectory(prefix="e2e_decode_") as tmp:
        jobs, skipped = [], []
        for variant in args.variants:
            for mode in args.modes:
                if variant == "liger" and (not liger_found or args.dry_run):
                    status = "not installed" if not liger_found else "needs CUDA (skipped in the dry run)"
                    skipped.append({"variant": variant, "mode": mode, "batches": {}, "status": status})
                    continue
                jobs.append({"variant": variant, "mode": mode, "dry_run": args.dry_run, "dir": tmp,
                             "cache_len": cache_len, "result_file": os.path.join(tmp, f"{variant}_{mode}.json"),
                             **{k: settings[k] for k in ("batches", "steps", "repeats", "warmup", "check_steps",
                                                         "prompt", "seed")}})
        # A process per job on a GPU (Liger patches transformers module-wide, compiled state and CUDA
        # graph pools stay apart); the dry run has no Liger and shares one process to stay fast.
        groups = [jobs] if args.dry_run and jobs else [[j] for j in jobs]
        results = run_workers(groups, timeout_s=300 if args.dry_run else 1800) + skipped
        order = {(v, m): i for i, (v, m) in enumerate((v, m) for v in args.variants for m in args.modes)}
        results.sort(key=lambda r: order[(r["variant"], r["mode"])])
        compare(results, args.batches, args.tolerance)
    for r in results:  # the check tensors lived in the temporary folder
        for res in r["batches"].values():
            res.pop("check_file", None)
    meta = {"time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "commit": args.commit or git_commit(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "transformers": version_of("transformers"),
            "liger_kernel": version_of("liger-kernel"), "triton": version_of("triton"), "host": platform.node(),
            "gpu": next((r["gpu"] for r in results if r.get("gpu")), None), "wall_s": round(time.time() - t0, 1)}
    report = {"meta": meta, "settings": settings, "results": results}
    text = render(report)
    print()
    print(text, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(text)
        print(f"wrote {args.out}/results.md and results.json")
    # Plain and opforge must run; Liger is a peer whose absence or failure is reported, not fatal.
    failed = [r for r in results if r["variant"] != "liger" and
              (r.get("status") != "ok" or any(b.get("status") != "ok" for b in r["batches"].values()))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
