"""The benchmark runner: every Definition × Workload × Solution of a TraceSet is built, checked
against the reference, timed and recorded as a Trace.

    from opforge.trace import TraceSet
    from opforge.bench import Benchmark, BenchmarkConfig

    traces = Benchmark(TraceSet.load("my_dataset"), BenchmarkConfig(devices=["cuda:0"])).run_all()

Trust is split across processes. This process (the parent) never imports solution code: it
draws the inputs from a recorded seed, runs the Definition's reference, and judges what the
solutions did. Solutions are built, called and timed in a worker process per device (worker.py);
a crash, an illegal memory access or a hang costs that worker (it is killed and restarted) and
gives the solution RUNTIME_ERROR or TIMEOUT with its log. Devices run in parallel, one thread and
one worker each, Definitions shared out between them.

Per workload: ``input_sets`` fresh input sets (seeds ``seed``, ``seed+1``, ...), each checked
(poisoned outputs, input hashes, memory sharing, allclose; see evaluator.py); then the timing
(timing.py) rotating through them; then one more check on a set the solution has not seen, so a
solution that behaves while checked and cuts corners once timed fails. The copy bandwidth of
each device is calibrated at the start of the run, and every PASSED Trace gives GB/s (TFLOP/s
when the Definition counts FLOPs) and % of it, flags times below the physical floor as suspect,
and gives the speedup against the reference and against a baseline solution (by default the
Definition's builtin one).
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import tempfile
import random
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from ..trace import Correctness, Environment, Evaluation, EvaluationStatus, Performance, Trace
from ..trace.trace import utc_timestamp
from .config import CPU_MAX_ELEMENTS, BenchmarkConfig, Settings
from .evaluator import Check, judge
from .inputs import generate_inputs
from .process import WorkerFailure, WorkerProcess

S = EvaluationStatus


@dataclass
class Skipped:
    """A solution or workload that was not evaluated, and why (no Trace is written for it)."""

    definition: str
    solution: str
    workload: str
    reason: str


@dataclass
class RunResult:
    traces: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


class _Failed(Exception):
    """An evaluation ended before timing: its status and log."""

    def __init__(self, status: EvaluationStatus, log: str, correctness: Optional[Correctness] = None):
        super().__init__(log)
        self.status, self.log, self.correctness = status, log, correctness


def _failure_status(exc: WorkerFailure) -> EvaluationStatus:
    return S.TIMEOUT if exc.timed_out else S.RUNTIME_ERROR


def _failure_log(exc: WorkerFailure, what: str) -> str:
    return f"{what}: {exc}" + (f"\n--- worker output ---\n{exc.log}" if exc.log.strip() else "")


class _Device:
    """One device: its worker, calibration, environment, and the solutions built in the worker."""

    def __init__(self, device: str, config: BenchmarkConfig, log_dir: Path, spill: Optional[Path]):
        self.device = device
        self.worker = WorkerProcess(device, config.modules, log_dir, spill)
        self.environment: Optional[Environment] = None
        self.calibration: Optional[dict] = None
        self._built: dict[str, tuple[int, dict]] = {}  # solution name -> (worker start, reply)
        self._loaded: Optional[tuple[int, int]] = None  # (worker start, case serial) it holds

    def hello(self) -> None:
        reply = self.worker.request({"op": "hello", "calibrate": True}, timeout=300)
        self.environment = Environment(**reply["environment"])
        self.calibration = reply["calibration"]

    def build(self, solution, definition, timeout: float) -> dict:
        """The build reply ({"ok": ...}), building again in a worker that restarted since."""
        seen = self._built.get(solution.name)
        if seen is not None and seen[0] == self.worker.starts and self.worker.alive:
            return seen[1]
        reply = self.worker.request({"op": "build", "solution": solution.to_dict(),
                                     "definition": definition.to_dict()}, timeout=timeout)
        self._built[solution.name] = (self.worker.starts, reply)
        return reply

    def load(self, case: "_Case", timeout: float) -> None:
        """Send the case's input sets once; again only to a worker that restarted since."""
        if self._loaded != (self.worker.starts, case.serial) or not self.worker.alive:
            self.worker.request({"op": "load", "key": case.workload.uuid, "input_sets": case.sets}, timeout=timeout)
            self._loaded = (self.worker.starts, case.serial)

    def forget(self) -> None:
        self.worker.stop()
        self._built.clear()
        self._loaded = None


class Benchmark:
    """Runs the solutions of a TraceSet (see the module doc).

    ``on_result(trace_or_skipped)`` is called as each evaluation finishes (from the device's
    thread); ``persist`` appends each Trace to the dataset's traces/ as soon as it is made
    (folder datasets; a single-file dataset is saved at the end).
    """

    def __init__(self, trace_set, config: Optional[BenchmarkConfig] = None, *, persist: bool = True,
                 on_result: Optional[Callable] = None, on_start: Optional[Callable] = None):
        self.trace_set = trace_set
        self.config = config or BenchmarkConfig()
        self.persist = persist
        self.on_result = on_result
        self.on_start = on_start
        self.seed = self.config.seed if self.config.seed is not None else random.SystemRandom().randrange(2**31)
        # Worker logs: beside the dataset, or in the temp folder for a TraceSet made in memory.
        root = trace_set.root if trace_set.root is not None else Path(tempfile.gettempdir()) / "opforge"
        self.log_dir = Path(self.config.log_dir) if self.config.log_dir else root / "logs"
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._devices: list[_Device] = []
        self.result = RunResult()

    # --- what to run ------------------------------------------------------------------------

    def devices(self) -> list[str]:
        if self.config.devices:
            return list(self.config.devices)
        if torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        return ["cpu"]

    def definitions(self) -> list:
        ts = self.trace_set
        names = self.config.definitions or list(ts.definitions)
        unknown = [n for n in names if n not in ts.definitions]
        if unknown:
            raise ValueError(f"no definition named {', '.join(unknown)} in the dataset")
        return [ts.definitions[n] for n in names]

    def _discover(self) -> None:
        """Add the Solutions registered by config.modules, found by a worker so that their code
        is never imported here."""
        if not self.config.modules:
            return
        worker = WorkerProcess("cpu", self.config.modules, self.log_dir)
        try:
            reply = worker.request({"op": "discover"}, timeout=600)
        except WorkerFailure as exc:
            raise RuntimeError(_failure_log(exc, "loading the solution modules failed")) from None
        finally:
            worker.stop()
        if "error" in reply:
            raise RuntimeError(f"loading the solution modules failed: {reply['error']}")
        from ..trace import Solution

        for data in reply["solutions"]:
            solution = Solution.from_dict(data)
            if solution.definition in self.trace_set.definitions and \
                    solution.name not in {s.name for g in self.trace_set.solutions.values() for s in g}:
                self.trace_set.add_solution(solution)

    def solutions_for(self, definition) -> list:
        chosen = self.trace_set.get_solutions(definition.name)
        if self.config.solutions is not None:
            chosen = [s for s in chosen if s.name in self.config.solutions]
        baseline = self.config.baseline_for(definition)
        return sorted(chosen, key=lambda s: s.name != baseline)  # the baseline first: others need its time

    def _traced(self, solution, workload) -> bool:
        digest = solution.content_hash()
        return any(t.solution == solution.name and t.workload.uuid == workload.uuid
                   and t.evaluation is not None and t.evaluation.solution_hash in (None, digest)
                   for t in self.trace_set.traces[solution.definition])

    def plan(self) -> list[tuple]:
        """(definition, [(workload trace, [solutions to evaluate])]) for this run."""
        jobs = []
        for definition in self.definitions():
            solutions = self.solutions_for(definition)
            rows = []
            for wtrace in self.trace_set.get_workloads(definition.name):
                todo = [s for s in solutions if not (self.config.resume and self._traced(s, wtrace.workload))]
                if todo:
                    rows.append((wtrace, todo))
            if rows:
                jobs.append((definition, rows))
        return jobs

    # --- running ----------------------------------------------------------------------------

    def run_all(self) -> list[Trace]:
        """Evaluate everything (see the module doc); returns the new Traces, which are also added
        to the TraceSet."""
        self._discover()
        jobs = self.plan()
        if self.on_start:
            self.on_start(sum(len(todo) for _, rows in jobs for _, todo in rows))
        pending: queue.Queue = queue.Queue()
        for job in jobs:
            pending.put(job)
        errors = []

        spill = Path(tempfile.mkdtemp(prefix="opforge-run-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        self._stopping.clear()

        def drive(device: str) -> None:
            dev = _Device(device, self.config, self.log_dir, spill)
            with self._lock:
                self._devices.append(dev)
            try:
                while not self._stopping.is_set():
                    try:
                        definition, rows = pending.get_nowait()
                    except queue.Empty:
                        return
                    self._run_definition(dev, definition, rows)
            except BaseException as exc:  # noqa: BLE001 - reported after the other devices finish
                if not self._stopping.is_set():
                    errors.append(exc)
            finally:
                dev.forget()

        threads = [threading.Thread(target=drive, args=(d,), name=f"opforge-bench-{d}") for d in self.devices()]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)  # a bare join would keep Ctrl-C from reaching this thread
        except KeyboardInterrupt:
            self.stop(kill=True)
            for t in threads:
                t.join()
            raise
        finally:
            self._devices.clear()
        shutil.rmtree(spill, ignore_errors=True)
        if self.persist and self.result.traces:
            self._save()
        if errors:
            raise errors[0]
        return list(self.result.traces)

    def stop(self, kill: bool = False) -> None:
        """Finish after the evaluations in flight (``kill``: abandon them, killing the
        workers); results after this are not recorded. Safe from any thread or callback."""
        self._stopping.set()
        if kill:
            with self._lock:
                devices = list(self._devices)
            for dev in devices:
                dev.worker.kill()

    def _save(self) -> None:
        if self.trace_set.single_file is not None or self._appends:
            self.trace_set.save()

    @property
    def _appends(self) -> bool:
        """Traces go to the dataset folder's files as they are made (a .json file is saved whole
        at the end; a TraceSet made in memory has nowhere to go)."""
        ts = self.trace_set
        return self.persist and ts.single_file is None and ts.root is not None

    def _emit(self, item) -> None:
        with self._lock:
            if self._stopping.is_set() and isinstance(item, Trace) and not item.is_successful():
                return  # most likely the stop's own doing (a killed worker), not the solution's
            if isinstance(item, Trace):
                self.trace_set.add_trace(item, persist=self._appends)
                self.result.traces.append(item)
            else:
                self.result.skipped.append(item)
        if self.on_result:
            self.on_result(item)

    def _run_definition(self, dev: _Device, definition, rows) -> None:
        settings = self.config.settings_for(definition)
        if dev.calibration is None:
            dev.hello()
        max_elements = self.config.max_elements
        if max_elements is None and dev.device == "cpu":
            max_elements = CPU_MAX_ELEMENTS
        baseline = self.config.baseline_for(definition)
        for wtrace, solutions in rows:
            if self._stopping.is_set():
                return
            workload = wtrace.workload
            label = definition.workload_label(workload.axes)
            shapes = definition.resolve_shapes(workload.axes)
            largest = max((torch.Size(s).numel() for s in shapes.values() if s), default=0)
            if max_elements is not None and largest > max_elements:
                for s in solutions:
                    self._emit(Skipped(definition.name, s.name, label, f"{largest} elements > max_elements {max_elements}"))
                continue
            try:
                case = _Case.prepare(self, dev, definition, workload, settings)
            except Exception as exc:  # a workload whose inputs or reference fail is reported, not fatal
                for s in solutions:
                    self._emit(Skipped(definition.name, s.name, label, f"reference failed: {type(exc).__name__}: {exc}"))
                continue
            if self.config.time_reference:
                case.reference_ms = self._reference_latency(dev, definition, case, settings)
            case.baseline = baseline
            case.baseline_ms = self._baseline_latency(definition, workload, baseline, dev)
            for solution in solutions:
                if self._stopping.is_set():
                    return
                self._emit(self._evaluate(dev, definition, solution, case, settings))
                if self.config.isolate:
                    dev.forget()

    def _baseline_latency(self, definition, workload, baseline: Optional[str], dev: _Device) -> Optional[float]:
        """The baseline's latency on this workload from earlier traces on the same hardware
        (used when it is not evaluated in this run, e.g. with resume)."""
        if baseline is None:
            return None
        earlier = [t for t in self.trace_set.traces[definition.name]
                   if t.solution == baseline and t.workload.uuid == workload.uuid and t.is_successful()
                   and t.evaluation.environment.hardware == dev.environment.hardware]
        return earlier[-1].evaluation.performance.latency_ms if earlier else None

    def _reference_latency(self, dev: _Device, definition, case: "_Case", settings: Settings) -> float:
        from ..registry import reference_solution

        reference = reference_solution(definition)
        try:
            if not dev.build(reference, definition, settings.build_timeout_s).get("ok"):
                return 0.0
            dev.load(case, settings.timeout_s)
            reply = dev.worker.request({"op": "time", "solution": reference.name,
                                        "settings": settings.model_dump()}, timeout=settings.timeout_s)
        except WorkerFailure:
            return 0.0
        return reply["timing"]["median_ms"] if "timing" in reply else 0.0

    # --- one evaluation -----------------------------------------------------------------------

    def _evaluate(self, dev: _Device, definition, solution, case: "_Case", settings: Settings):
        label = definition.workload_label(case.workload.axes)
        try:
            reply = dev.build(solution, definition, settings.build_timeout_s)
        except WorkerFailure as exc:
            status = S.TIMEOUT if exc.timed_out else S.COMPILE_ERROR
            return case.trace(solution, dev, status, _failure_log(exc, "build"))
        if not reply["ok"]:
            if reply["kind"] == "UNSUPPORTED":
                return Skipped(definition.name, solution.name, label, reply["log"])
            return case.trace(solution, dev, S.COMPILE_ERROR, f"{reply['kind']}: {reply['log']}")
        try:
            correctness = case.check(dev, solution, None, settings, what="check")
            reply = dev.worker.request({"op": "time", "solution": solution.name, "settings": settings.model_dump()},
                                       timeout=settings.timeout_s)
            if "error" in reply:
                raise _Failed(S.RUNTIME_ERROR, f"while timing: {reply['error']}")
            timing = reply["timing"]
            after = case.check(dev, solution, [case.fresh], settings, what="after timing, on a fresh input set")
        except WorkerFailure as exc:
            return case.trace(solution, dev, _failure_status(exc), _failure_log(exc, "running the solution"))
        except _Failed as failed:
            return case.trace(solution, dev, failed.status, failed.log, correctness=failed.correctness)
        correctness = _merge(correctness, after)
        if solution.name == case.baseline:
            case.baseline_ms = timing["median_ms"]
        return case.trace(solution, dev, S.PASSED, "", correctness=correctness,
                          performance=case.performance(timing, dev, settings))


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

    def __init__(self, runner: Benchmark, definition, workload, seed: int):
        self.serial = next(self._serials)
        self.runner, self.definition, self.workload, self.seed = runner, definition, workload, seed
        self.sets: list = []
        self.fresh: list = []
        self.references: dict[int, tuple] = {}  # id(input set) -> reference outputs
        self.reference_ms = 0.0
        self.baseline: Optional[str] = None
        self.baseline_ms: Optional[float] = None

    @classmethod
    def prepare(cls, runner: Benchmark, dev: _Device, definition, workload, settings: Settings) -> "_Case":
        seed = (runner.seed + zlib.crc32(workload.uuid.encode())) % 2**31
        case = cls(runner, definition, workload, seed)
        reference = definition.reference_fn()
        device = torch.device(dev.device)
        all_sets = [generate_inputs(definition, workload, seed=seed + k, trace_set=runner.trace_set)
                    for k in range(settings.input_sets + 1)]
        for inputs in all_sets:
            with torch.no_grad():
                out = reference(*[v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for v in inputs])
            out = out if isinstance(out, tuple) else (out,)
            case.references[id(inputs)] = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
        case.sets, case.fresh = all_sets[:-1], all_sets[-1]
        return case

    def check(self, dev: _Device, solution, sets: Optional[list], settings: Settings, *, what: str) -> Correctness:
        """Check the solution on ``sets`` (None: the case's own sets, loaded in the worker once)."""
        if sets is None:
            dev.load(self, settings.timeout_s)
        reply = dev.worker.request({"op": "check", "solution": solution.name, "input_sets": sets},
                                   timeout=settings.timeout_s)
        sets = self.sets if sets is None else sets
        verdicts: list[Check] = []
        for k, (inputs, record) in enumerate(zip(sets, reply["records"])):
            verdict = judge(self.definition, record, self.references[id(inputs)], tolerance=settings.tolerance)
            if not verdict.passed:
                log = f"{what} (input set {k + 1} of {len(sets)}): {verdict.log}"
                if reply.get("printed", "").strip():
                    log += f"\n--- worker output ---\n{reply['printed']}"
                raise _Failed(verdict.status, log, verdict.correctness)
            verdicts.append(verdict)
        merged = verdicts[0].correctness
        merged.extra = dict(merged.extra or {}, input_sets=1)
        for v in verdicts[1:]:
            merged = _merge(merged, v.correctness)
        return merged

    def performance(self, timing: dict, dev: _Device, settings: Settings) -> Performance:
        definition, axes = self.definition, self.definition.full_axis_values(self.workload.axes)
        latency = timing["median_ms"]
        nbytes = definition.bytes_moved(axes)
        flops = definition.flop_count(axes)
        gbps = nbytes / (latency * 1e6) if latency > 0 else None
        calibrated = dev.calibration["gbps"]
        percent = 100.0 * gbps / calibrated if gbps is not None else None
        suspect = None
        if latency <= 0:
            suspect = "no measurable time: the timer did not see the solution's work"
        elif percent is not None and percent > settings.suspect_percent_of_peak:
            floor_ms = nbytes / (calibrated * 1e6)
            suspect = (f"faster than the physical floor: {latency * 1e3:.2f} us for {nbytes / 1e6:.3g} MB is "
                       f"{percent:.0f}% of the {calibrated:.0f} GB/s copy bandwidth (floor {floor_ms * 1e3:.2f} us); "
                       "work the events did not see (another stream?) or outputs not computed")
        timing = dict(timing, bytes=nbytes, floor_ms=nbytes / (calibrated * 1e6))
        return Performance(
            latency_ms=latency,
            reference_latency_ms=self.reference_ms,
            speedup_factor=self.reference_ms / latency if self.reference_ms and latency > 0 else 0.0,
            achieved_gbps=gbps,
            achieved_tflops=flops / (latency * 1e9) if flops is not None and latency > 0 else None,
            percent_of_peak=percent,
            calibrated_gbps=calibrated,
            baseline_solution=self.baseline if self.baseline_ms else None,
            baseline_latency_ms=self.baseline_ms,
            baseline_speedup_factor=self.baseline_ms / latency if self.baseline_ms and latency > 0 else None,
            suspect=suspect,
            timing=timing,
        )

    def trace(self, solution, dev: _Device, status: EvaluationStatus, log: str, *,
              correctness: Optional[Correctness] = None, performance: Optional[Performance] = None) -> Trace:
        evaluation = Evaluation(status=status, environment=dev.environment, timestamp=utc_timestamp(), log=log,
                                correctness=correctness, performance=performance,
                                definition_hash=self.definition.content_hash(),
                                solution_hash=solution.content_hash(), seed=self.seed, device=dev.device)
        return Trace(definition=self.definition.name, workload=self.workload, solution=solution.name,
                     evaluation=evaluation)
