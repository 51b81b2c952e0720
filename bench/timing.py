"""The benchmark scripts' view of opforge.bench.timing, the one timer (the runner measures with
it too). Nothing is measured here: this module only picks the device, converts to µs and keeps
the call forms the scripts use.

Device time (``device_timing`` / ``device_time_us``): ``time_cuda`` (L2 flushed and a spin kernel
queued ahead of each call, CUDA events around it, a device synchronize after it, work left on
other streams counted; median of the calls that fit ``target_s``), ``time_cpu`` without CUDA.
Host loop: ``host_loop_ms``, back-to-back calls then one synchronize. Graph replay:
``graph_ms_per_call``. Copy ceiling: ``calibrate_copy``.

Without CUDA (--dry-run) the device timers fall back to the host clock so every code path still
runs; those numbers mean nothing.
"""
from __future__ import annotations

import torch

from opforge.bench import timing as opforge_timing

#: Calls captured per graph and replays per timed launch: at decode sizes a call takes 1-3 µs, so
#: a graph launch (several µs) is spread over 1000 calls to stay out of the per-call number.
GRAPH_CALLS = 100
GRAPH_REPLAYS = 10


def _cuda0() -> torch.device:
    return torch.device("cuda", 0)


def l2_bytes() -> int:
    return opforge_timing.l2_bytes(_cuda0())


def device_timing(fn, sets, cuda: bool, target_s=0.1, max_iters=2000) -> dict:
    """The timer's statistics (ms) of ``fn(*s)`` over the input sets ``sets``: ``median_ms``,
    ``p10_ms``, ``p90_ms``, ``iterations``, ``method``, ..."""
    timer = opforge_timing.time_cuda if cuda else opforge_timing.time_cpu
    # Three warm-up calls: JIT, autotune, allocator, module load.
    return timer(fn, list(sets), warmup=3, iterations=max_iters, max_time_s=target_s, cuda_graph=False,
                 host_timing=False)


def device_time_us(fn, sets, cuda: bool, target_s=0.1, max_iters=2000) -> float:
    """Median device time of one call, in µs."""
    return 1e3 * device_timing(fn, sets, cuda, target_s, max_iters)["median_ms"]


def host_loop_us(fn, args, cuda: bool, n=None, repeats=9, target_s=0.005) -> float:
    """µs per call of ``n`` back-to-back ``fn(*args)`` then one synchronize (median of
    ``repeats``; ``n=None``: as many calls as fit about ``target_s``, at least 100). Bind
    arguments into ``fn`` once (functools.partial, ``args=()``) so that no per-call wrapper is
    timed with it."""
    return 1e3 * opforge_timing.host_loop_ms(fn, tuple(args), cuda=cuda, calls=n, target_s=target_s, repeats=repeats)


def graph_replay_us(fn, args, replays=GRAPH_REPLAYS, repeats=5) -> float:
    """Device µs per call from replaying GRAPH_CALLS captured calls."""
    return 1e3 * opforge_timing.graph_ms_per_call(fn, args, calls=GRAPH_CALLS, replays=replays, repeats=repeats)


def replay_or_host_us(fn, cuda: bool, target_s=0.001) -> float:
    """``graph_replay_us`` of ``fn()``; without CUDA (dry runs) a host loop stands in, so the
    code path runs (its numbers mean nothing)."""
    return graph_replay_us(fn, ()) if cuda else host_loop_us(fn, (), False, target_s=target_s)


def copy_calibration(cuda: bool) -> dict:
    """``calibrate_copy`` of cuda:0 (or of the CPU): ``gbps`` (read + write), ``bytes``, ``median_ms``."""
    return opforge_timing.calibrate_copy(_cuda0() if cuda else torch.device("cpu"))


def copy_bandwidth_gbps(cuda: bool) -> float:
    """The copy ceiling in GB/s, counting bytes read and written."""
    return copy_calibration(cuda)["gbps"]


def cpu_call_overhead_us(fn, n=2000, repeats=7) -> float:
    """Per-call host time of ``fn()`` (a CPU op) in a tight loop (median of repeats)."""
    return 1e3 * opforge_timing.host_loop_ms(fn, (), cuda=False, calls=n, repeats=repeats, warmup=100)
