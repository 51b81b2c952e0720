"""The (workload, solution) pairs of one workload on one device: what every runner does there,
in the trusted process that owns the device (the local runner's device thread, or a cluster's
device worker, see opforge.bench.cluster).

``PairEvaluator.run_workload`` yields one result per solution: a Trace, or a Skipped for what
was not evaluated. Per workload: ``input_sets`` fresh input sets (seeds ``workload_seed``,
``+1``, ...) and their reference outputs, made here; the reference timed; then per solution
(the baseline first): built in its worker, checked on every set (poisoned outputs, input
hashes, memory sharing, allclose; see evaluator.py), timed (timing.py) rotating through them,
and checked once more on a set it has not seen, so a solution that behaves while checked and
cuts corners once timed fails. Solution code runs only in the workers (device.py); their replies
are checked field by field, so a malformed one is that solution's failure.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from ..trace import Correctness, Evaluation, EvaluationStatus, Performance, Trace
from ..trace.trace import utc_timestamp
from .config import CPU_MAX_ELEMENTS, BenchmarkConfig, Settings
from .device import Device
from .evaluator import CallRecord, Check, judge
from .inputs import generate_inputs
from .performance import checked_timing, clock_problem, performance
from .process import WorkerFailure

S = EvaluationStatus
#: Where a Trace's log goes on with what the worker printed.
WORKER_OUTPUT = "--- worker output ---"


@dataclass
class Skipped:
    """A solution or workload that was not evaluated, and why (no Trace is written for it)."""

    definition: str
    solution: str
    workload: str
    reason: str


def workload_seed(run_seed: int, workload_uuid: str) -> int:
    """The seed of a workload's first input set in a run (recorded in its Traces)."""
    return (run_seed + zlib.crc32(workload_uuid.encode())) % 2**31


class _Failed(Exception):
    """An evaluation ended before timing: its status and log."""

    def __init__(self, status: EvaluationStatus, log: str, correctness: Optional[Correctness] = None):
        super().__init__(log)
        self.status, self.log, self.correctness = status, log, correctness


def _failure_status(exc: WorkerFailure) -> EvaluationStatus:
    return S.TIMEOUT if exc.timed_out else S.RUNTIME_ERROR


def _failure_log(exc: WorkerFailure, what: str) -> str:
    return f"{what}: {exc}" + (f"\n{WORKER_OUTPUT}\n{exc.log}" if exc.log.strip() else "")


class PairEvaluator:
    """Evaluates solutions on workloads on one Device (see the module doc).

    ``inputs_source`` serves the workloads' recorded (safetensors) inputs: the TraceSet, or what
    a cluster's driver shipped (its ``load_input_tensor`` is all that is used). A solution that
    failed to build here is not built again: each of its workloads gets that first failure.
    ``stopping`` ends a workload between two solutions.
    """

    def __init__(self, dev: Device, config: BenchmarkConfig, seed: int, inputs_source,
                 stopping: Optional[threading.Event] = None):
        self.dev, self.config, self.seed, self.inputs_source = dev, config, seed, inputs_source
        self.stopping = stopping or threading.Event()
        # solution -> (status or None for a skip, log) of a build that failed on this device.
        self._build_failures: dict[str, tuple[Optional[EvaluationStatus], str]] = {}

    def run_workload(self, definition, workload, solutions, *, missing: Optional[str] = None,
                     earlier_baseline: tuple = (None, None)) -> Iterator:
        """One Trace or Skipped per solution (fewer once ``stopping`` is set). ``missing``: why
        the workload's recorded inputs are not there (every solution is then skipped);
        ``earlier_baseline``: (latency, {timestamp, seed}) of the baseline timed in an earlier
        run on this hardware, used while the baseline is not evaluated here."""
        dev, settings = self.dev, self.config.settings_for(definition)
        if dev.calibration is None:
            dev.hello()
        label = definition.workload_label(workload.axes)
        max_elements = self.config.max_elements
        if max_elements is None and dev.device == "cpu":
            max_elements = CPU_MAX_ELEMENTS
        shapes = definition.resolve_shapes(workload.axes)
        largest = max((torch.Size(s).numel() for s in shapes.values() if s), default=0)
        if max_elements is not None and largest > max_elements:
            for s in solutions:
                yield Skipped(definition.name, s.name, label, f"{largest} elements > max_elements {max_elements}")
            return
        if missing is not None:
            for s in solutions:
                yield Skipped(definition.name, s.name, label, f"inputs not there: {missing}")
            return
        try:
            case = _Case.prepare(self, definition, workload, settings)
        except Exception as exc:  # a workload whose inputs or reference fail is reported, not fatal
            for s in solutions:
                yield Skipped(definition.name, s.name, label, f"reference failed: {type(exc).__name__}: {exc}")
            return
        if self.config.time_reference:
            case.reference_ms = self._reference_latency(definition, case, settings)
        case.baseline = self.config.baseline_for(definition)
        case.baseline_ms, case.baseline_earlier = earlier_baseline if case.baseline is not None else (None, None)
        for solution in solutions:
            if self.stopping.is_set():
                return
            yield self._evaluate(definition, solution, case, settings)
            dev.done_with(solution.name)

    def _reference_latency(self, definition, case: "_Case", settings: Settings) -> float:
        from ..registry import reference_solution

        dev = self.dev
        reference = reference_solution(definition)
        dev.trusted.add(reference.name)  # the Definition's own code, run here too: no isolation needed
        try:
            if _reply_field(dev.build(reference, definition, settings.build_timeout_s), "ok", bool) is not True:
                return 0.0
            dev.load(reference.name, case, settings.timeout_s)
            reply = dev.request(reference.name, {"op": "time", "solution": reference.name,
                                                 "settings": settings.model_dump()}, timeout=settings.timeout_s)
            return checked_timing(reply.get("timing"), settings)["median_ms"]
        except (WorkerFailure, ValueError):
            return 0.0

    def _evaluate(self, definition, solution, case: "_Case", settings: Settings):
        dev = self.dev
        label = definition.workload_label(case.workload.axes)
        failed_build = self._build_failures.get(solution.name)
        if failed_build is not None:
            status, log = failed_build
            return Skipped(definition.name, solution.name, label, log) if status is None \
                else case.trace(solution, status, log)
        try:
            reply = dev.build(solution, definition, settings.build_timeout_s)
            ok = _reply_field(reply, "ok", bool)
            if not ok:
                kind, log = _reply_field(reply, "kind", str), _reply_field(reply, "log", str)
        except WorkerFailure as exc:
            status = S.TIMEOUT if exc.timed_out else S.COMPILE_ERROR
            self._build_failures[solution.name] = (status, _failure_log(exc, "build"))
            return case.trace(solution, status, _failure_log(exc, "build"))
        except ValueError as exc:
            dev.retire(solution.name)
            return case.trace(solution, S.RUNTIME_ERROR, f"build: {exc}")
        if not ok:
            if kind == "UNSUPPORTED":
                self._build_failures[solution.name] = (None, log)
                return Skipped(definition.name, solution.name, label, log)
            self._build_failures[solution.name] = (S.COMPILE_ERROR, f"{kind}: {log}")
            return case.trace(solution, S.COMPILE_ERROR, f"{kind}: {log}")
        try:
            correctness = case.check(solution, None, settings, what="check")
            reply = dev.request(solution.name, {"op": "time", "solution": solution.name,
                                                "settings": settings.model_dump()}, timeout=settings.timeout_s)
            if "error" in reply:
                raise _Failed(S.RUNTIME_ERROR, f"while timing: {reply['error']}")
            try:
                timing = checked_timing(reply.get("timing"), settings)
            except ValueError as exc:
                dev.retire(solution.name)
                raise _Failed(S.RUNTIME_ERROR, f"while timing: the worker's reply is not a timing: {exc}") from None
            clock = clock_problem(timing, reply["wall_s"], settings, cuda=dev.device != "cpu")
            after = case.check(solution, [case.fresh], settings, what="after timing, on a fresh input set")
        except WorkerFailure as exc:
            return case.trace(solution, _failure_status(exc), _failure_log(exc, "running the solution"))
        except _Failed as failed:
            return case.trace(solution, failed.status, failed.log, correctness=failed.correctness)
        correctness = _merge(correctness, after)
        perf = case.performance(timing, settings, clock)
        if solution.name == case.baseline:  # a suspect time is no baseline
            case.baseline_ms = perf.latency_ms if perf.suspect is None else None
            case.baseline_earlier = None
            perf = case.performance(timing, settings, clock)  # against itself now
        return case.trace(solution, S.PASSED, "", correctness=correctness, performance=perf)


def _reply_field(reply: dict, key: str, kind: type):
    """``reply[key]`` when it has the type a real worker sends; ValueError otherwise."""
    value = reply.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"the worker's reply has {key} = {str(value)[:80]!r}, not a {kind.__name__}")
    return value


def _merge(a: Correctness, b: Correctness) -> Correctness:
    fractions = dict((a.extra or {}).get("fraction_within_tolerance", {}))
    for name, value in ((b.extra or {}).get("fraction_within_tolerance", {})).items():
        fractions[name] = min(fractions.get(name, 1.0), value)
    extra = dict(a.extra or {})
    extra["fraction_within_tolerance"] = fractions
    extra["input_sets"] = extra.get("input_sets", 1) + (b.extra or {}).get("input_sets", 1)
    return Correctness(max_relative_error=max(a.max_relative_error, b.max_relative_error),
                       max_absolute_error=max(a.max_absolute_error, b.max_absolute_error), extra=extra)


class _Case:
    """One workload on one device: its input sets and their reference outputs (kept on the
    device, where the comparisons run)."""

    _serials = itertools.count()

    def __init__(self, dev: Device, definition, workload, seed: int):
        self.serial = next(self._serials)
        self.dev, self.definition, self.workload, self.seed = dev, definition, workload, seed
        self.sets: list = []
        self.fresh: list = []
        self.references: dict[int, tuple] = {}  # id(input set) -> reference outputs
        self.reference_ms = 0.0
        self.baseline: Optional[str] = None
        self.baseline_ms: Optional[float] = None
        self.baseline_earlier: Optional[dict] = None  # when the baseline was timed in an earlier run

    @classmethod
    def prepare(cls, pairs: PairEvaluator, definition, workload, settings: Settings) -> "_Case":
        case = cls(pairs.dev, definition, workload, workload_seed(pairs.seed, workload.uuid))
        reference = definition.reference_fn()
        device = torch.device(pairs.dev.device)
        all_sets = [generate_inputs(definition, workload, seed=case.seed + k, trace_set=pairs.inputs_source)
                    for k in range(settings.input_sets + 1)]
        for inputs in all_sets:
            with torch.no_grad():
                out = reference(*[v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for v in inputs])
            out = out if isinstance(out, tuple) else (out,)
            case.references[id(inputs)] = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
        case.sets, case.fresh = all_sets[:-1], all_sets[-1]
        return case

    def check(self, solution, sets: Optional[list], settings: Settings, *, what: str) -> Correctness:
        """Check the solution on ``sets`` (None: the case's own sets, loaded in the worker once)."""
        dev = self.dev
        if sets is None:
            dev.load(solution.name, self, settings.timeout_s)
        reply = dev.request(solution.name, {"op": "check", "solution": solution.name, "input_sets": sets},
                            timeout=settings.timeout_s)
        sets = self.sets if sets is None else sets
        try:
            records = reply.get("records")
            if not isinstance(records, list):
                raise ValueError(f"no call records: {str(reply.get('error', ''))[:2000]}")
            records = [CallRecord.from_wire(r) for r in records]
            # One record per set; fewer only when the last call raised.
            if not (len(records) == len(sets) or (0 < len(records) < len(sets) and records[-1].error is not None)):
                raise ValueError(f"{len(records)} call records for {len(sets)} input sets")
        except ValueError as exc:
            dev.retire(solution.name)
            raise _Failed(S.RUNTIME_ERROR, f"{what}: the worker's reply is malformed: {exc}") from None
        verdicts: list[Check] = []
        for k, (inputs, record) in enumerate(zip(sets, records)):
            verdict = judge(self.definition, record, self.references[id(inputs)], tolerance=settings.tolerance)
            if not verdict.passed:
                log = f"{what} (input set {k + 1} of {len(sets)}): {verdict.log}"
                if reply.get("printed", "").strip():
                    log += f"\n{WORKER_OUTPUT}\n{reply['printed']}"
                raise _Failed(verdict.status, log, verdict.correctness)
            verdicts.append(verdict)
        merged = verdicts[0].correctness
        merged.extra = dict(merged.extra or {}, input_sets=1)
        for v in verdicts[1:]:
            merged = _merge(merged, v.correctness)
        return merged

    def performance(self, timing: dict, settings: Settings, clock: Optional[str]) -> Performance:
        if self.baseline_earlier is not None:
            timing = dict(timing, baseline_earlier=self.baseline_earlier)
        return performance(self.definition, self.definition.full_axis_values(self.workload.axes), timing,
                           self.dev.calibration, settings, reference_ms=self.reference_ms, baseline=self.baseline,
                           baseline_ms=self.baseline_ms, clock=clock)

    def trace(self, solution, status: EvaluationStatus, log: str, *,
              correctness: Optional[Correctness] = None, performance: Optional[Performance] = None) -> Trace:
        evaluation = Evaluation(status=status, environment=self.dev.environment, timestamp=utc_timestamp(), log=log,
                                correctness=correctness, performance=performance,
                                definition_hash=self.definition.content_hash(),
                                solution_hash=solution.content_hash(), seed=self.seed, device=self.dev.label)
        return Trace(definition=self.definition.name, workload=self.workload, solution=solution.name,
                     evaluation=evaluation)
