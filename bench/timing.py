"""Timing primitives for roofline.py.

Device time: CUDA events around each call, median of many, with inputs
rotated so the data in flight exceeds 2x L2. A spin kernel (torch.cuda._sleep)
is queued ahead of each chunk of calls so the host can enqueue them before the
GPU reaches them: otherwise a slow host (Python, Triton launches) would leave
the GPU idle between the start event and the kernel, and the events would
measure launch overhead instead of the kernel.

Host loop: N back-to-back calls then one synchronize, wall time per call.
That is what an eager serving loop pays when the host is the bottleneck.

Graph replay: 100 calls captured in one CUDA graph; replay time / 100 is the
device time per call with launch gaps squeezed out.

Without CUDA (--dry-run) the device timers fall back to wall clock so every
code path still runs; those numbers mean nothing.
"""
from __future__ import annotations

import statistics
import time

import torch

from opforge.bench import timing as opforge_timing

GRAPH_CALLS = 100


def sync(cuda: bool):
    if cuda:
        torch.cuda.synchronize()


def l2_bytes() -> int:
    return opforge_timing.l2_bytes(torch.device("cuda", 0))


def _sleep_cycles_per_us() -> float:
    """torch.cuda._sleep counts clock cycles, not time."""
    return opforge_timing.sleep_cycles_per_us(torch.device("cuda", 0))


def _host_costs_us(fn, sets, cuda, k=5):
    """(enqueue, wall) µs per call over k calls: enqueue is the host's cost
    alone (no sync), wall adds the final sync; both size the timing loops."""
    sync(cuda)
    t0 = time.perf_counter_ns()
    for i in range(k):
        fn(*sets[i % len(sets)])
    t1 = time.perf_counter_ns()
    sync(cuda)
    t2 = time.perf_counter_ns()
    return (t1 - t0) / 1e3 / k, (t2 - t0) / 1e3 / k


def device_time_us(fn, sets, cuda: bool, target_s=0.1, max_iters=2000, chunk=64):
    """Median device time of one call, in µs."""
    for s in sets[:3]:  # warm-up: JIT, autotune, allocator, module load
        fn(*s)
    enqueue, per_call = _host_costs_us(fn, sets, cuda)
    n = int(min(max(target_s * 1e6 / per_call, 10), max_iters))
    if not cuda:
        times = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            fn(*sets[i % len(sets)])
            times.append((time.perf_counter_ns() - t0) / 1e3)
        return statistics.median(times)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    # Enough spin for the host to queue a whole chunk (two event records per call included).
    spin = int(min((enqueue + 10) * chunk * 1.5, 50_000) * _sleep_cycles_per_us())
    for i in range(n):
        if i % chunk == 0:
            torch.cuda._sleep(spin)  # keeps the GPU busy while the host queues this chunk
        s = sets[i % len(sets)]
        starts[i].record()
        fn(*s)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends))


def host_loop_us(fn, args, cuda: bool, n=200, repeats=5):
    """Per-call wall time of n back-to-back calls then one sync (median of repeats)."""
    for _ in range(3):
        fn(*args)
    sync(cuda)
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn(*args)
        sync(cuda)
        per.append((time.perf_counter_ns() - t0) / 1e3 / n)
    return statistics.median(per)


def graph_replay_us(fn, args, replays=10, repeats=5):
    """Device µs per call from replaying GRAPH_CALLS captured calls."""
    return 1e3 * opforge_timing.graph_ms_per_call(fn, args, calls=GRAPH_CALLS, replays=replays, repeats=repeats)


def copy_bandwidth_gbps(cuda: bool, nbytes=2 << 30, iters=20):
    """Device-to-device copy of nbytes, counting read + write: the ceiling."""
    device = "cuda" if cuda else "cpu"
    if not cuda:
        nbytes = 16 << 20
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    us = device_time_us(lambda a, b: b.copy_(a), [(src, dst)], cuda, target_s=0.05, max_iters=iters)
    del src, dst
    return 2 * nbytes / (us * 1e3)


def cpu_call_overhead_us(fn, n=2000, repeats=7):
    """Per-call host time of a CPU op in a tight loop (median of repeats)."""
    for _ in range(100):
        fn()
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        per.append((time.perf_counter_ns() - t0) / 1e3 / n)
    return statistics.median(per)
