#!/usr/bin/env python3
"""opforge's norm calls against FlashInfer's CUDA norm kernels called raw, host path and device.

    python3 bench/flashinfer_norm_host.py --flashinfer flashinfer_python-0.7.2.post1-py3-none-any.whl \\
        --out results.json --markdown bench/results/DATE_GPU_COMMIT_flashinfer_norm/results.md
    python3 bench/flashinfer_norm_host.py --flashinfer DIR      # DIR holds FlashInfer's csrc/ and include/
    python3 bench/flashinfer_norm_host.py --dry-run --flashinfer WHEEL   # only find the sources

The question (issue 11, section 3): does the full public opforge call, its checks on, cost the
host no more than FlashInfer's CUDA norm kernels called raw through tvm-ffi, in the same run?
FlashInfer need not be installed: its norm module is built here from the csrc/ and include/
folders of its released wheel (or of an unpacked copy) with apache-tvm-ffi's ``cpp.load``, as
FlashInfer's own JIT builds it (same sources, its flags). Nothing of FlashInfer is copied into
opforge; the sources are read from the wheel given on the command line.

Per op at decode sizes (bf16, hidden 4096; 1 and 32 rows), µs per call:

* host: a loop of back-to-back calls, then one synchronize (bench/timing.py ``host_loop_us``):
  what a serving loop pays per call on the CPU while the GPU keeps up; the calls of a table take
  turns over ROUNDS rounds and each keeps its median (the host's own load drifts);
* device: CUDA-graph replay (``graph_replay_us``): the kernels alone.

Rows: ``opforge.rmsnorm(x, w, eps, out=o)`` (checks on, then ``skip_check=True``), FlashInfer's
``rmsnorm(o, x, w, eps, enable_pdl)``; ``opforge.fused_add_rmsnorm(x, r, w, eps, out=x,
residual_out=r)`` (in place, FlashInfer's convention) against its ``fused_add_rmsnorm(x, r, w,
eps, enable_pdl)``; the same for the Gemma variants; ``torch.mul(x, 1.0, out=o)`` as the floor of
a torch kernel launch.
"""
from __future__ import annotations

import argparse
import functools
import glob
import os
import statistics
import sys
import tempfile
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from roofline import add_output_args, collect_meta, fmt, start, write as write_results  # noqa: E402

HIDDEN = 4096
ROWS = (1, 32)
EPS = 1e-6
ROUNDS = 9
#: FlashInfer's norm module: what its JIT compiles (flashinfer/jit/norm.py), relative to the
#: wheel's flashinfer/data/ folder, plus the headers under include/.
SOURCES = ("csrc/norm.cu", "csrc/flashinfer_norm_binding.cu")
HEADERS = ("csrc/tvm_ffi_utils.h",)
#: The nvcc flags FlashInfer's JIT gives its norm module (flashinfer/jit/core.py gen_jit_spec's
#: defaults, flashinfer/jit/norm.py's own two).
NVCC_FLAGS = ("-O3", "-DNDEBUG", "-use_fast_math", "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16",
              "-DFLASHINFER_ENABLE_FP8_E4M3", "-DFLASHINFER_ENABLE_FP8_E5M2", "-DENABLE_BF16", "-DENABLE_FP8")


def flashinfer_sources(path: str, into: str) -> str:
    """The folder holding FlashInfer's csrc/ and include/: ``path`` itself, or what is extracted
    from the wheel ``path`` into ``into``. Raises with what is missing."""
    if os.path.isdir(path):
        root = path
    else:
        root = os.path.join(into, "flashinfer", "data")
        prefix = "flashinfer/data/"
        wanted = {prefix + s for s in SOURCES + HEADERS}
        with zipfile.ZipFile(path) as wheel:
            members = [n for n in wheel.namelist() if n in wanted or n.startswith(prefix + "include/")]
            wheel.extractall(into, members)
    missing = [s for s in SOURCES + HEADERS + ("include/flashinfer/norm.cuh",)
               if not os.path.exists(os.path.join(root, s))]
    if missing:
        raise SystemExit(f"{path}: not FlashInfer's sources (missing {', '.join(missing)})")
    return root


def cuda_library_includes() -> list:
    """Include folders of the CUDA libraries whose headers FlashInfer's norm pulls in (cuBLAS,
    cuRAND): the toolkit's, and those of the nvidia-* wheels torch's CUDA build depends on."""
    found = []
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isdir(os.path.join(home, "include")):
            found.append(os.path.join(home, "include"))
    for site in sys.path:
        found += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    return list(dict.fromkeys(found))


def build_flashinfer_norm(root: str, build_dir: str):
    import tvm_ffi.cpp

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major >= 9 else ''}"
    return tvm_ffi.cpp.load(
        "flashinfer_norm_raw", sources=[os.path.join(root, s) for s in SOURCES],
        extra_cuda_cflags=[*NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[os.path.join(root, "include"), os.path.join(root, "csrc"), *cuda_library_includes()],
        build_directory=build_dir)


def cases(fi, rows: int):
    """(op, variant, fn, check) per row of the table: each fn is bound once (functools.partial)
    so the loop times the call itself."""
    import opforge

    x = torch.randn(rows, HIDDEN, device="cuda").bfloat16()
    r = torch.randn(rows, HIDDEN, device="cuda").bfloat16()
    w = torch.randn(HIDDEN, device="cuda").bfloat16()
    o = torch.empty_like(x)
    out = []
    for gemma in (False, True):
        name = "gemma_rmsnorm" if gemma else "rmsnorm"
        ours = opforge.gemma_rmsnorm if gemma else opforge.rmsnorm
        raw = fi.gemma_rmsnorm if gemma else fi.rmsnorm
        out += [(name, "opforge", functools.partial(ours, x, w, EPS, out=o)),
                (name, "opforge skip_check", functools.partial(ours, x, w, EPS, out=o, skip_check=True)),
                (name, "flashinfer raw", functools.partial(raw, o, x, w, EPS, False))]
        name = "gemma_fused_add_rmsnorm" if gemma else "fused_add_rmsnorm"
        ours = opforge.gemma_fused_add_rmsnorm if gemma else opforge.fused_add_rmsnorm
        raw = fi.gemma_fused_add_rmsnorm if gemma else fi.fused_add_rmsnorm
        out += [(name, "opforge", functools.partial(ours, x, r, w, EPS, out=x, residual_out=r)),
                (name, "opforge skip_check", functools.partial(ours, x, r, w, EPS, out=x, residual_out=r,
                                                               skip_check=True)),
                (name, "flashinfer raw", functools.partial(raw, x, r, w, EPS, False))]
    out.append(("torch.mul(out=)", "torch", functools.partial(torch.mul, x, 1.0, out=o)))
    return out, (x, r, w, o)


def agree(fi) -> dict:
    """Both libraries' outputs on the same inputs (max abs difference, bf16): the two are the same
    op before their timings are compared."""
    import opforge

    x = torch.randn(32, HIDDEN, device="cuda").bfloat16()
    w = torch.randn(HIDDEN, device="cuda").bfloat16()
    ours, theirs = opforge.rmsnorm(x, w, EPS), torch.empty_like(x)
    fi.rmsnorm(theirs, x, w, EPS, False)
    r = torch.randn_like(x)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    opforge.fused_add_rmsnorm(x1, r1, w, EPS, out=x1, residual_out=r1)
    fi.fused_add_rmsnorm(x2, r2, w, EPS, False)
    return {"rmsnorm": float((ours.float() - theirs.float()).abs().max()),
            "fused_add_rmsnorm": float((x1.float() - x2.float()).abs().max()),
            "fused_add_rmsnorm residual": float((r1.float() - r2.float()).abs().max())}


def render(results: dict) -> str:
    m = results["meta"]
    lines = [f"# opforge norms against FlashInfer's norm kernels called raw — {m.get('gpu', 'CPU (dry run)')}\n",
             f"torch {m['torch']}, commit {m['commit']}, {m['time_utc']}; FlashInfer sources: "
             f"{m.get('flashinfer', '?')}; hidden {HIDDEN}, bf16, eps {EPS}\n",
             f"Host: µs per call of a loop of back-to-back calls then one synchronize, median of {ROUNDS} "
             "interleaved rounds. Device: µs per call, "
             "CUDA-graph replay. FlashInfer raw: its tvm-ffi functions, no Python wrapper, PDL off.\n"]
    if results.get("agreement"):
        lines.append("Max |opforge - FlashInfer| on the same inputs (bf16): " +
                     ", ".join(f"{k} {v:.3g}" for k, v in results["agreement"].items()) + "\n")
    lines.append("Host over FlashInfer raw: the median over the rounds of this call's host time minus FlashInfer's "
                 "raw call of the same op timed beside it in the same round (robust to the host's drift).\n")
    lines += ["| op | rows | call | host µs | host over FlashInfer raw µs | device µs |", "|---|---|---|---|---|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['op']} | {row['rows']} | {row['variant']} | {fmt(row.get('host_us'), 2)} | "
                     f"{fmt(row.get('host_over_flashinfer_us'), 2)} | {fmt(row.get('device_us'), 2)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, "only find FlashInfer's norm sources (no GPU, nothing built or timed)")
    p.add_argument("--flashinfer", required=True,
                   help="FlashInfer's released wheel (flashinfer_python-*.whl) or a folder with its csrc/ and include/")
    p.add_argument("--build-dir", help="where tvm-ffi builds the module (default: a temporary folder)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = flashinfer_sources(args.flashinfer, tmp)
        print(f"FlashInfer norm sources: {root}", flush=True)
        label = os.path.basename(args.flashinfer.rstrip("/"))
        cuda = start(args, render, flashinfer=label)
        if not cuda:
            return 0
        fi = build_flashinfer_norm(root, args.build_dir or os.path.join(tmp, "build"))
        results = {"meta": collect_meta(args, cuda, flashinfer=label),
                   "agreement": agree(fi), "rows": []}
        for rows in ROWS:
            table, _keep = cases(fi, rows)
            # Host times drift with whatever else the machine's CPU does: every call of the table
            # is timed once per round, ROUNDS rounds, and each keeps its median.
            hosts = {(op, variant): [] for op, variant, _ in table}
            for _ in range(ROUNDS):
                for op, variant, fn in table:
                    hosts[(op, variant)].append(timing.host_loop_us(fn, (), cuda=True))
            for op, variant, fn in table:
                try:
                    device, problem = timing.graph_replay_us(fn, ()), None
                except Exception as exc:  # e.g. a call that cannot be captured in a graph
                    device, problem = None, f"{type(exc).__name__}: {str(exc)[:200]}"
                    torch.cuda.synchronize()
                # This host's speed drifts by more than the differences in question from one
                # process (or minute) to the next; the calls of one op, timed side by side in
                # each round, are compared round by round.
                raw = hosts.get((op, "flashinfer raw"))
                over = (statistics.median(a - b for a, b in zip(hosts[(op, variant)], raw))
                        if raw is not None and variant != "flashinfer raw" else None)
                results["rows"].append({"op": op, "rows": rows, "variant": variant,
                                        "host_us": statistics.median(hosts[(op, variant)]),
                                        "host_over_flashinfer_us": over,
                                        "host_rounds_us": hosts[(op, variant)], "device_us": device,
                                        **({"device_problem": problem} if problem else {})})
                print(results["rows"][-1], flush=True)
    write_results(results, args.out, args.markdown, render=render)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
