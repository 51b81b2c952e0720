"""Traces: one measurement of a Solution on a Workload of a Definition.

JSON (FlashInfer-Trace; one object per JSONL line)::

    {"definition": "rmsnorm_h4096",
     "workload": {"axes": {...}, "inputs": {...}, "uuid": "..."},
     "solution": "rmsnorm_triton_v1",
     "evaluation": {"status": "PASSED",
                    "environment": {"hardware": "NVIDIA H100 80GB HBM3", "libs": {"torch": "2.6.0"}},
                    "timestamp": "2025-06-27T12:45:00Z", "log": "",
                    "correctness": {"max_relative_error": 1e-05, "max_absolute_error": 1e-05, "extra": null},
                    "performance": {"latency_ms": 0.008, "reference_latency_ms": 0.019, "speedup_factor": 2.375}}}

A trace with ``solution`` and ``evaluation`` null is a *workload trace*: the lines of
``workloads/<op_type>/<definition>.jsonl``. As in FlashInfer-Trace, ``correctness`` is required
for PASSED and INCORRECT_NUMERICAL, ``performance`` only for PASSED, and neither is allowed for
the other statuses. opforge's optional fields (written only when set):

* ``performance``: ``achieved_gbps``, ``achieved_tflops``, ``percent_of_peak`` (of the copy
  bandwidth calibrated on the same device in the same run, ``calibrated_gbps``),
  ``baseline_solution`` / ``baseline_latency_ms`` / ``baseline_speedup_factor`` (against a
  named solution, by default the builtin one), ``suspect`` (why the number is not to be
  believed, e.g. faster than the physical floor) and ``timing`` (how it was measured: method,
  iterations, spread, host and CUDA-graph times; see opforge.bench.timing);
* ``evaluation``: ``definition_hash`` (Definition.content_hash of what was measured),
  ``solution_hash`` (Solution.content_hash), ``seed`` (of the first input set) and ``device``
  (where it ran, e.g. "cuda:0");
* ``environment``: ``hardware_info`` (SM count, compute capability, memory, clocks).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import Field, field_validator, model_validator

from ._base import TraceModel
from .errors import SchemaError
from .workload import Workload

NonEmptyStr = Annotated[str, Field(min_length=1)]


class EvaluationStatus(str, Enum):
    """Outcome of evaluating a solution on a workload (FlashInfer-Trace's statuses)."""

    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"

    def __str__(self) -> str:
        return self.value


class Environment(TraceModel):
    """Where the evaluation ran: ``hardware`` (device name) and library versions."""

    _omit_when_empty = ("hardware_info",)

    hardware: NonEmptyStr
    libs: dict[str, str] = Field(default_factory=dict)
    hardware_info: Optional[dict[str, Any]] = None


class Correctness(TraceModel):
    """Largest errors of the solution's outputs against the reference (NaN allowed)."""

    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    extra: Optional[dict[str, Any]] = None

    @field_validator("max_relative_error", "max_absolute_error")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if not math.isnan(value) and value < 0:
            raise ValueError(f"must be non-negative or NaN, not {value}")
        return value


class Performance(TraceModel):
    """Timing of the solution and the reference, in milliseconds."""

    _omit_when_empty = ("achieved_gbps", "achieved_tflops", "percent_of_peak", "calibrated_gbps",
                        "baseline_solution", "baseline_latency_ms", "baseline_speedup_factor", "suspect", "timing")

    latency_ms: Annotated[float, Field(ge=0)] = 0.0
    reference_latency_ms: Annotated[float, Field(ge=0)] = 0.0
    speedup_factor: Annotated[float, Field(ge=0)] = 0.0
    achieved_gbps: Optional[Annotated[float, Field(ge=0)]] = None
    achieved_tflops: Optional[Annotated[float, Field(ge=0)]] = None
    percent_of_peak: Optional[Annotated[float, Field(ge=0)]] = None
    calibrated_gbps: Optional[Annotated[float, Field(ge=0)]] = None
    baseline_solution: Optional[str] = None
    baseline_latency_ms: Optional[Annotated[float, Field(ge=0)]] = None
    baseline_speedup_factor: Optional[Annotated[float, Field(ge=0)]] = None
    suspect: Optional[str] = None
    timing: Optional[dict[str, Any]] = None


def utc_timestamp() -> str:
    """The current time in ISO 8601 (UTC), for Evaluation.timestamp."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Evaluation(TraceModel):
    """The result of one evaluation (see the module docstring for which metrics each status
    carries)."""

    _omit_when_empty = ("definition_hash", "solution_hash", "seed", "device")

    status: EvaluationStatus
    environment: Environment
    timestamp: NonEmptyStr
    log: str = ""
    correctness: Optional[Correctness] = None
    performance: Optional[Performance] = None
    definition_hash: Optional[str] = None
    solution_hash: Optional[str] = None
    seed: Optional[Annotated[int, Field(strict=True, ge=0)]] = None
    device: Optional[str] = None

    @model_validator(mode="after")
    def _metrics_match_status(self) -> "Evaluation":
        needs_correctness = self.status in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL)
        needs_performance = self.status == EvaluationStatus.PASSED
        for field, needed in (("correctness", needs_correctness), ("performance", needs_performance)):
            present = getattr(self, field) is not None
            if needed and not present:
                raise SchemaError(field, f"required when status is {self.status.value}")
            if present and not needed:
                raise SchemaError(field, f"must be null when status is {self.status.value}")
        return self


class Trace(TraceModel):
    """A Workload of a Definition, and optionally the Solution measured on it and the result."""

    definition: NonEmptyStr
    workload: Workload
    solution: Optional[str] = None
    evaluation: Optional[Evaluation] = None

    @model_validator(mode="after")
    def _check(self) -> "Trace":
        if self.evaluation is not None and self.solution is None:
            raise SchemaError("solution", "an evaluation needs the name of the solution it measured")
        if self.solution is not None and not self.solution:
            raise SchemaError("solution", "must be a non-empty name or null")
        return self

    def is_workload_trace(self) -> bool:
        """True for a workload entry (no solution, no evaluation)."""
        return self.solution is None and self.evaluation is None

    def is_successful(self) -> bool:
        return self.evaluation is not None and self.evaluation.status == EvaluationStatus.PASSED
