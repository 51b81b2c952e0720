"""Workload tracing: the calls a model makes, saved as a FlashInfer-Trace dataset that
``opforge run --dataset`` benchmarks as it is.

From the environment, for any script (read at ``import opforge``)::

    OPFORGE_ENABLE_TRACING=1 OPFORGE_DATASET_PATH=./my-trace python serve.py
    # FlashInfer-Bench's FIB_ENABLE_TRACING / FLASHINFER_BENCH_ENABLE_TRACING and
    # FIB_DATASET_PATH / FLASHINFER_BENCH_DATASET_PATH work too; default folder ./opforge-trace

In code::

    configs = {"rmsnorm_h4096": TracingConfig(tensor_dump_policy="dump_all", dedup_policy="shape_only")}
    with opforge.enable_tracing(tracing_configs=configs, dataset_dir="./my-trace"):
        model(batch)
    tracer = opforge.enable_tracing()      # every Definition, default TracingConfig
    ...
    opforge.disable_tracing()

Every op call that has a Definition (trace.calls) is offered to the tracer before the op runs.
By default every Definition is traced with ``TracingConfig()``: the first call of each shape is
kept, integer tensors are saved and float ones recorded as random (policy.py). The folder gets
the Definition (written the first time a name is seen; an existing file of that name is never
overwritten, see dataset.py), opforge's builtin Solution for it, one JSONL line per kept
workload and a safetensors blob for its saved tensors. Writing happens on a background thread
(writer.py); device copies go through pinned memory on a side stream (capture.py); during CUDA
graph capture only shapes are recorded. Everything kept is written at exit, on SIGTERM / SIGINT
and when tracing is closed (control.py), and a summary (calls seen, workloads kept, payloads
dumped, dropped, per Definition) goes to stderr.

Dedup state is per tracing: a second run into the same folder adds workloads again. A process
forked while tracing (DataLoader workers) traces nothing in the child.

``record(call)`` is the entry for callers other than the op hook (``@apply``-decorated
functions): ``call`` has ``definition``, ``key``, ``axes``, ``inputs`` and
``make_definition()``, like trace.calls.OpCall.
"""

from __future__ import annotations

from .. import intercept
from .control import (DEFAULT_MAX_PENDING_BYTES, DEFAULT_MAX_PENDING_WORKLOADS, current_tracer, disable_tracing,
                      enable_tracing, enable_tracing_from_environment)
from .policy import DEDUP_POLICIES, DUMP_POLICIES, TracingConfig
from .tracer import Tracer


def record(call) -> None:
    """Offer one call to the tracing that is on (nothing when tracing is off). Never raises."""
    tracer = intercept.tracer()
    if tracer is not None:
        tracer.record(call)


__all__ = [
    "DEDUP_POLICIES", "DEFAULT_MAX_PENDING_BYTES", "DEFAULT_MAX_PENDING_WORKLOADS", "DUMP_POLICIES", "Tracer",
    "TracingConfig", "current_tracer", "disable_tracing", "enable_tracing", "enable_tracing_from_environment",
    "record",
]
