"""Timing one call the way a GPU engineer would believe it.

CUDA (``time_cuda``), per timed call:

1. L2 is made cold and clean: a buffer twice the L2 size is read before the call (outside the
   timed span), and the input sets rotate, so no call finds its data in L2 from the call before.
   Read, not written: a written buffer leaves L2 full of dirty lines, and the timed call paid
   for their write-back as it evicted them (3-10 us per call past L2 on an H200, for every
   implementation alike; bench/results/2026-11-27_h200_ae5658b_timer_clean_l2/).
2. A spin kernel (``torch.cuda._sleep``) is queued ahead, long enough for the host to enqueue
   the whole call behind it; otherwise a slow host (Python, a Triton launch) leaves the GPU idle
   after the start event and the events measure launch overhead instead of the kernel.
3. start event, the call, end event on the calling stream; then a full device synchronize and
   a third event. ``end -> after-sync`` is constant for a call whose work all finished by its
   end event; an empty call paired with every timed one measures that constant under the same
   conditions (it launches one tiny kernel, so its tail takes the same path). When the call's
   tail is clearly longer (its shortest quarter beats the empty call's longest quarter by
   > 5 us and > half the latency), it left
   work running on other streams, and the latency becomes ``start -> after-sync`` minus the
   constant (method ``cuda_events+device_synchronize``). Short work on another stream can
   finish while the spin kernel still runs, so a second, shorter loop without the spin (the
   work then starts after the start event) looks for it too, with a higher bar (> 10 us and
   > the latency: without the spin, tails vary more). A finding counts only when a second,
   independent loop repeats it (a host hiccup does not come back; hidden work does). When it
   is found only without the spin, the
   latency is that loop's end-to-end time, launch overhead included
   (``..., no lead``): a solution that hides work gets the least flattering number.

The latency is the median over the timed calls (``iterations``, fewer when ``max_time_s`` runs
out), with p10/p90/min/max/stdev beside it. Python's garbage collector is paused during a timed
loop; a loop whose p90/p10 exceeds STEADY_SPREAD (the host fell behind the spin now and then)
runs once more with a lead four times longer, and the steadier loop is kept. Also reported: the host's cost of one call (no
synchronize; what a serving loop pays when the host is the bottleneck) and, optionally, the
device time per call of a captured CUDA graph replayed back to back (launch gaps squeezed out,
L2 warm).

CPU (``time_cpu``): the host clock around each call, input sets rotating.

Host loop (``host_loop_ms``): back-to-back calls, then one synchronize; wall time per call. That
is what an eager serving loop pays per op when the host is the bottleneck (``host_ms`` above is
one call's cost with the device idle, which sizes the spin lead).

``calibrate_copy`` measures the copy bandwidth of a device (read + write), the 100% against
which achieved GB/s are given.

This is the one timer: the runner's workers and the benchmark scripts in bench/ (through
bench/timing.py, which only converts units) both measure with it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from typing import Callable, Optional

import torch

#: Calls replayed per graph launch when timing a captured CUDA graph, and how many launches.
GRAPH_CALLS = 20
GRAPH_REPEATS = 5
#: The shortest spin queued ahead of a timed call (more when the call's host cost is higher).
MIN_LEAD_US = 20.0
#: Calls of each loop without the spin lead (it looks for short hidden work).
BARE_ITERATIONS = 20
#: A p90/p10 ratio above this sends the timed loop round once more with a longer spin lead.
STEADY_SPREAD = 1.5


def l2_bytes(device: torch.device) -> int:
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size) or 64 << 20
    except Exception:
        return 64 << 20


_CYCLES_PER_US: dict[int, float] = {}


def sleep_cycles_per_us(device: torch.device) -> float:
    """``torch.cuda._sleep`` counts clock cycles; how many make a microsecond on this device at
    its highest clock. Measured after a long spin has raised the clock, and the fastest of a few
    tries: a spin sized with it is never shorter than asked (at a lower clock it is longer)."""
    index = torch.device(device).index or 0
    if index not in _CYCLES_PER_US:
        with torch.cuda.device(index):
            torch.cuda._sleep(50_000_000)  # about 25 ms: the clock leaves its idle state
            rates = []
            for _ in range(3):
                cycles = 10_000_000
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda._sleep(cycles)
                b.record()
                b.synchronize()
                rates.append(cycles / max(a.elapsed_time(b) * 1e3, 1.0))
            _CYCLES_PER_US[index] = max(rates)
    return _CYCLES_PER_US[index]


def _stats(samples_ms: list[float]) -> dict:
    ordered = sorted(samples_ms)
    n = len(ordered)
    return {
        "median_ms": statistics.median(ordered),
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[int(0.9 * (n - 1))],
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "stdev_ms": statistics.stdev(ordered) if n > 1 else 0.0,
        "iterations": n,
    }


@contextlib.contextmanager
def _no_gc():
    """Python's garbage collector paused (a collection inside a timed call is not the call's)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _spread(stats: dict) -> float:
    return stats["p90_ms"] / stats["p10_ms"] if stats["p10_ms"] > 0 else float("inf")


def _host_ms(call: Callable, arg_sets: list, cuda: bool, k: int = 10) -> float:
    """Median host cost of one call, without waiting for the device."""
    samples = []
    for i in range(k):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(*arg_sets[i % len(arg_sets)])
        samples.append((time.perf_counter() - t0) * 1e3)
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(samples)


def host_loop_ms(call: Callable, args=(), *, cuda: bool, calls: Optional[int] = None, target_s: float = 0.005,
                 repeats: int = 9, warmup: int = 20) -> float:
    """Host ms per call of ``calls`` back-to-back ``call(*args)``, then one device synchronize
    (median of ``repeats`` loops; ``calls=None`` sizes each loop to about ``target_s``, at least
    100 calls: long enough that the closing synchronize is a small share, short enough that a
    loop the OS interrupted is an outlier the median drops). Python's garbage collector is paused
    during each loop.

    The loop times exactly what ``call`` does: bind the arguments once (``functools.partial``)
    instead of timing a wrapper that rebuilds them on every call, or the wrapper's own cost (an
    import, a keyword dict, a tuple of positional arguments per call) is reported as the op's."""
    for _ in range(warmup):
        call(*args)
    if cuda:
        torch.cuda.synchronize()
    if calls is None:
        probe = 10
        t0 = time.perf_counter()
        for _ in range(probe):
            call(*args)
        if cuda:
            torch.cuda.synchronize()
        per_call = max((time.perf_counter() - t0) / probe, 1e-7)
        calls = int(min(max(target_s / per_call, 100), 100_000))
    samples = []
    for _ in range(repeats):
        with _no_gc():
            t0 = time.perf_counter()
            for _ in range(calls):
                call(*args)
            if cuda:
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(samples)


def graph_ms_per_call(call: Callable, args: list, *, calls: int = GRAPH_CALLS, replays: int = 1,
                      repeats: int = GRAPH_REPEATS) -> float:
    """Device ms per call of ``calls`` calls captured in one CUDA graph, replayed ``replays``
    times back to back (median of ``repeats``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(3):
            call(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call(*args)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / (replays * calls))
    return statistics.median(samples)


def _graph_ms(call: Callable, args: list) -> tuple[Optional[float], Optional[str]]:
    """graph_ms_per_call, or (None, why) when the call cannot be captured."""
    try:
        return graph_ms_per_call(call, args), None
    except Exception as exc:  # not every solution can be captured; that is information, not failure
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def time_cuda(call: Callable, arg_sets: list, *, warmup: int, iterations: int, max_time_s: float,
              flush_l2: bool = True, cuda_graph: bool = True, host_timing: bool = True) -> dict:
    """Time ``call(*args)`` over ``arg_sets`` on the current CUDA device (see the module doc).
    Returns the statistics in ms plus ``method``, ``host_ms``, ``graph_ms``, ``sync_excess_ms``."""
    device = torch.device("cuda", torch.cuda.current_device())
    # Read before each call, never written (see the module doc: a written one leaves L2 dirty).
    flush = torch.zeros(2 * l2_bytes(device) // 8, dtype=torch.int64, device=device) if flush_l2 else None
    for i in range(max(warmup, 1)):
        call(*arg_sets[i % len(arg_sets)])
    torch.cuda.synchronize()
    host_ms = _host_ms(call, arg_sets, cuda=True)
    # The paired call launches one tiny kernel, so that its tail has the same launch and
    # completion path as the timed call's.
    marker = torch.zeros(1, device=device)
    tiny = marker.zero_
    # Enough spin for the host to enqueue the call (twice its host cost, at least 20 us).
    lead_us = min(max(2e3 * host_ms, MIN_LEAD_US), 20_000.0)
    cycles = int(lead_us * sleep_cycles_per_us(device))

    def timed(fn, args, events, lead_cycles: int) -> None:
        if flush is not None:
            flush.amax()
        if lead_cycles:
            torch.cuda._sleep(lead_cycles)
        start, end, after = events
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        after.record()

    def loop(n: int, lead_cycles: int, budget_s: float) -> tuple[list, list, float, float]:
        """(start->end, end->after-sync) per call, the median end->after-sync of the empty call
        paired with each (timed under the same conditions), and how much longer the tails were."""
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(6)] for _ in range(n)]
        done, deadline = 0, time.perf_counter() + budget_s
        with _no_gc():  # a collection between the start event and the launch would be timed
            for i in range(n):
                timed(lambda: tiny(), (), events[i][3:], lead_cycles)
                timed(call, arg_sets[i % len(arg_sets)], events[i][:3], lead_cycles)
                done += 1
                if time.perf_counter() > deadline and done >= 10:
                    break
        torch.cuda.synchronize()
        span = [e[0].elapsed_time(e[1]) for e in events[:done]]
        tail = [e[1].elapsed_time(e[2]) for e in events[:done]]
        empty = sorted(e[4].elapsed_time(e[5]) for e in events[:done])
        # Hidden work lengthens every call's tail; a host hiccup only some: compare the
        # shortest quarter of the tails with the longest quarter of the empty ones.
        excess = sorted(tail)[len(tail) // 4] - empty[(3 * len(empty)) // 4]
        return span, tail, statistics.median(empty), excess

    span, tail, empty_tail, excess = loop(iterations, cycles, max_time_s)
    result = _stats(span)
    # A wide spread means the host fell behind the spin now and then (another process, a page
    # fault): once more with a lead four times longer, keeping the steadier of the two.
    if _spread(result) > STEADY_SPREAD and lead_us < 20_000.0:
        longer_us = min(4 * lead_us, 20_000.0)
        longer = int(longer_us * sleep_cycles_per_us(device))
        again = loop(iterations, longer, max_time_s)
        if _spread(_stats(again[0])) < _spread(result):
            span, tail, empty_tail, excess = again
            result, lead_us, cycles = _stats(span), longer_us, longer
    result.update(method="cuda_events", flush_l2=flush_l2, spin_lead_us=round(lead_us, 1))
    # Work left running on other streams shows as a longer end -> after-sync than the empty
    # call's: with the spin lead when it outlasts the stream's own work, without it (the work
    # then starts after the start event) when it is short.
    span_b, tail_b, empty_tail_b, excess_b = loop(min(iterations, BARE_ITERATIONS), 0, max_time_s / 4)
    result["sync_excess_ms"] = max(excess, excess_b, 0.0)
    lead_bar = max(0.005, 0.5 * result["median_ms"])
    bare_bar = max(0.01, result["median_ms"])  # tails vary more without the spin: a higher bar
    # A flag must hold in a second, independent loop too: host hiccups come and go, hidden work
    # is there every time.
    if excess > lead_bar:
        span2, tail2, empty_tail2, excess2 = loop(iterations, cycles, max_time_s)
        if excess2 > lead_bar:
            result.update(_stats([s + t - empty_tail2 for s, t in zip(span2, tail2)]))
            result["method"] = "cuda_events+device_synchronize"
        result["sync_excess_ms"] = max(min(excess, excess2), excess_b, 0.0)
    if result["method"] == "cuda_events" and excess_b > bare_bar:
        span2, tail2, empty_tail2, excess2 = loop(min(iterations, BARE_ITERATIONS), 0, max_time_s / 4)
        if excess2 > bare_bar:
            result.update(_stats([s + t - empty_tail2 for s, t in zip(span2, tail2)]))
            result["method"] = "cuda_events+device_synchronize, no lead"
    result["host_ms"] = host_ms if host_timing else None
    if cuda_graph:
        result["graph_ms"], why = _graph_ms(call, arg_sets[0])
        if why:
            result["graph_error"] = why
    return result


def time_cpu(call: Callable, arg_sets: list, *, warmup: int, iterations: int, max_time_s: float, **_) -> dict:
    """Host-clock time of ``call(*args)``, input sets rotating (see the module doc)."""
    for i in range(warmup):
        call(*arg_sets[i % len(arg_sets)])
    samples = []
    deadline = time.perf_counter() + max_time_s
    with _no_gc():
        for i in range(iterations):
            t0 = time.perf_counter()
            call(*arg_sets[i % len(arg_sets)])
            samples.append((time.perf_counter() - t0) * 1e3)
            if time.perf_counter() > deadline and len(samples) >= 10:
                break
    result = _stats(samples)
    result["method"] = "host_clock"
    return result


#: Overrides the bytes of the copy a calibration times (both buffers: source and destination
#: each this size), on every device: for a CPU whose last-level cache holds the default, or for a
#: quick run (a copy that fits a cache measures the cache, not memory).
CALIBRATION_BYTES_ENV = "OPFORGE_CALIBRATION_BYTES"
#: The smallest copy a calibration may time (one page).
MIN_CALIBRATION_BYTES = 4096
#: The default copy on a GPU (at most a quarter of its free memory) and on a CPU: past any GPU's
#: L2 and the last-level cache of most server CPUs.
GPU_CALIBRATION_BYTES = 2 << 30
CPU_CALIBRATION_BYTES = 256 << 20


def calibration_bytes() -> Optional[int]:
    """The copy size OPFORGE_CALIBRATION_BYTES asks for (whole pages), None where it is unset."""
    raw = os.environ.get(CALIBRATION_BYTES_ENV, "").strip()
    if not raw:
        return None
    try:
        nbytes = int(raw)
    except ValueError:
        nbytes = 0
    if nbytes < MIN_CALIBRATION_BYTES:
        raise ValueError(f"{CALIBRATION_BYTES_ENV}={raw!r}: give a whole number of bytes, at least "
                         f"{MIN_CALIBRATION_BYTES} (unset: {GPU_CALIBRATION_BYTES >> 30} GiB on a GPU, "
                         f"{CPU_CALIBRATION_BYTES >> 20} MiB on a CPU)")
    return nbytes // MIN_CALIBRATION_BYTES * MIN_CALIBRATION_BYTES


def calibrate_copy(device: torch.device, nbytes: Optional[int] = None) -> dict:
    """Copy bandwidth of ``device`` (GB/s counting read + write) and how it was measured: a copy
    of ``nbytes`` (default: OPFORGE_CALIBRATION_BYTES, else 2 GiB on a GPU, at most a quarter of
    its free memory, and 256 MiB on a CPU)."""
    device = torch.device(device)
    nbytes = nbytes or calibration_bytes()
    if device.type == "cuda":
        with torch.cuda.device(device):
            free, _ = torch.cuda.mem_get_info()
            nbytes = nbytes or min(GPU_CALIBRATION_BYTES, free // 4) // MIN_CALIBRATION_BYTES * MIN_CALIBRATION_BYTES
            src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
            dst = torch.empty_like(src)
            for _ in range(3):
                dst.copy_(src)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for _ in range(10):
                start.record()
                dst.copy_(src)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            del src, dst
            torch.cuda.empty_cache()
    else:
        nbytes = nbytes or CPU_CALIBRATION_BYTES
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            samples.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(samples)
    return {"gbps": 2 * nbytes / (ms * 1e6), "bytes": nbytes, "median_ms": ms}
