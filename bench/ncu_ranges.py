"""Calls to profile under Nsight Compute, each in a profiler range of its own.

    ncu --profile-from-start off --metrics ... python3 SCRIPT.py

``profile_each`` warms every call up first (JIT, autotuning, module loading and allocations stay
out of the profiled ranges), then runs each one ``repeats`` times between cudaProfilerStart and
cudaProfilerStop, printing ``CALL <label>`` before it: ncu lists the kernels in that order, so its
report lines up with the labels. ``norm_calls`` builds the usual row-wise comparison (opforge's
op through its public call, torch.compile of the formula, Liger-Kernel where it has the op).
The scripts under bench/results/*/ that produced an Nsight Compute table import this module.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Iterable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import opspecs  # noqa: E402
from opspecs import SPEC  # noqa: E402
from roofline import configure_dynamo  # noqa: E402

Call = tuple[str, Callable[[], object]]


def norm_calls(cases: Iterable[tuple], dtype: torch.dtype = torch.bfloat16) -> list[Call]:
    """(label, call) for opforge, torch.compile and Liger per case: (op, rows, hidden) or
    (op, rows, hidden, dtype); one input set each, on the GPU."""
    liger, _ = opspecs.liger_peers()
    configure_dynamo()
    calls = []
    for case in cases:
        op, rows, hidden = case[:3]
        dt = case[3] if len(case) > 3 else dtype
        spec = SPEC[op]
        inputs = opspecs.make_input_sets(spec, rows, hidden, dt, "cuda", 1)[0]
        outs = opspecs.make_outputs(spec, inputs)
        comp = torch.compile(spec.formula, dynamic=False, fullgraph=True)
        label = f"{op} {rows}x{hidden}" + (f" {dt}" if len(case) > 3 else "")
        calls.append((f"{label} opforge", spec.bound_call(inputs, outs)))
        calls.append((f"{label} compile", lambda c=comp, i=inputs: c(*i)))
        if spec.liger in liger:
            calls.append((f"{label} liger", lambda f=liger[spec.liger][1], i=inputs: f(*i)))
    return calls


def profile_each(calls: Iterable[Call], warmup: int = 3, repeats: int = 1) -> None:
    """Warm every call up, then run each ``repeats`` times in a profiler range (and an NVTX range
    named by its label) of its own."""
    calls = list(calls)
    with torch.no_grad():
        for _, fn in calls:
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize()
        for label, fn in calls:
            print("CALL", label, flush=True)
            torch.cuda.nvtx.range_push(label)
            torch.cuda.profiler.start()
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            torch.cuda.nvtx.range_pop()
