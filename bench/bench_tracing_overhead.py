#!/usr/bin/env python3
"""Host cost of workload tracing per op call (opforge.tracing).

    python3 bench/bench_tracing_overhead.py                  # CPU tensors
    python3 bench/bench_tracing_overhead.py --device cuda    # on a GPU
    python3 bench/bench_tracing_overhead.py --json out.json  # also write the numbers

Every number is wall time per call in µs: the median over --repeats runs of --calls
back-to-back calls of opforge.rmsnorm on a tiny [rows, 128] input (CUDA: one synchronize at the
end of each run), so the op's host path dominates and the tracing cost shows. Rows:

  op alone               tracing off (the op hook's one flag included)
  bind_call              trace.calls.bind_call alone: the hook's binding of a call to its Definition
  record (dedup hit)     Tracer.record on a call whose shape is already kept: a lookup and a counter
  op + tracing, hit      the op with tracing on, shape_only, every call a dedup hit; "overhead" is
                         this minus "op alone" (the whole hook path: bind_call + record)
  op + tracing, miss     shape_only with a new shape at every call (rows 1, 2, 3, ...; dump_none):
                         each call builds and queues a workload; the final flush is included,
                         so the writer thread's work is amortised over the calls
  op + tracing, dump     keep_all + dump_all at one shape: every call's tensors copied and written
                         (flush included)

The miss and dump rows are compared with the op alone over the same shapes.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time

import torch

import opforge
from opforge import intercept
from opforge.trace.calls import bind_call
from opforge.tracing import TracingConfig, enable_tracing

HIDDEN = 128


def per_call_us(fn, calls: int, repeats: int, cuda: bool, after=None) -> float:
    """Median over ``repeats`` of (time of ``fn(i)`` for i < calls, plus ``after()``) / calls."""
    fn(0)  # warm: first-call paths (Definitions, streams) are not what is measured
    if after is not None:
        after()
    runs = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        if after is not None:
            after()
        if cuda:
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def measure(device: str, calls: int, repeats: int) -> dict:
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(1, HIDDEN, generator=gen).to(device, dtype)
    w = torch.randn(HIDDEN, generator=gen).to(device, dtype)
    big = torch.randn(calls + 1, HIDDEN, generator=gen).to(device, dtype)
    out = {}
    out["op alone"] = per_call_us(lambda i: opforge.rmsnorm(x, w), calls, repeats, cuda)
    out["bind_call"] = per_call_us(lambda i: bind_call("rmsnorm", (x, w), {}), calls, repeats, cuda)
    folder = tempfile.mkdtemp(prefix="opforge-trace-bench-")
    try:
        with enable_tracing(dataset_dir=folder, tracing_configs=None) as tracer:
            call = bind_call("rmsnorm", (x, w), {})
            tracer.record(call)
            out["record (dedup hit)"] = per_call_us(lambda i: tracer.record(call), calls, repeats, cuda)
            out["op + tracing, hit"] = per_call_us(lambda i: opforge.rmsnorm(x, w), calls, repeats, cuda)
        out["overhead, hit"] = out["op + tracing, hit"] - out["op alone"]

        # Misses: a fresh tracing per run, so that every row count is new to it.
        def miss_run() -> float:
            with enable_tracing(dataset_dir=folder, tracing_configs={
                    name: TracingConfig("dump_none", "shape_only")}) as t:
                start = time.perf_counter()
                for i in range(1, calls + 1):
                    opforge.rmsnorm(big[:i], w)
                t.flush()
                if cuda:
                    torch.cuda.synchronize()
                return (time.perf_counter() - start) / calls * 1e6

        name = bind_call("rmsnorm", (x, w), {}).definition
        miss_run()
        out["op + tracing, miss"] = statistics.median(miss_run() for _ in range(repeats))
        out["op alone, same shapes"] = per_call_us(lambda i: opforge.rmsnorm(big[: i % calls + 1], w), calls, repeats,
                                                   cuda)
        out["overhead, miss"] = out["op + tracing, miss"] - out["op alone, same shapes"]

        dump_calls = max(calls // 20, 10)  # each call writes a blob with an fsync: keep it short
        with enable_tracing(dataset_dir=folder, tracing_configs={name: TracingConfig("dump_all", "keep_all")},
                            max_pending_workloads=dump_calls + 2) as t:
            out["op + tracing, dump"] = per_call_us(lambda i: opforge.rmsnorm(x, w), dump_calls, repeats, cuda,
                                                    after=t.flush)
        out["overhead, dump"] = out["op + tracing, dump"] - out["op alone"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert intercept.tracer() is None
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per number; the median is shown (default 5)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible here")
    # The summaries tracing prints at each close are not what this script reports.
    stderr, sys.stderr = sys.stderr, open("/dev/null", "w")
    try:
        numbers = measure(args.device, args.calls, args.repeats)
    finally:
        sys.stderr.close()
        sys.stderr = stderr
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"opforge tracing overhead, rmsnorm [rows, {HIDDEN}] on {where} ({args.device}), µs per call")
    for key, value in numbers.items():
        print(f"  {key:24s} {value:9.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": where, "calls": args.calls, "repeats": args.repeats, "us_per_call": numbers},
                      handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
