"""The benchmark runner: every Definition × Workload × Solution of a TraceSet is built, checked
against the reference, timed and recorded as a Trace.

    from opforge.trace import TraceSet
    from opforge.bench import Benchmark, BenchmarkConfig

    traces = Benchmark(TraceSet.load("my_dataset"), BenchmarkConfig(devices=["cuda:0"])).run_all()

Trust is split across processes. This process (the parent) never imports solution code: it
draws the inputs from a recorded seed, runs the Definition's reference, and judges what the
solutions did. Solutions are built, called and timed in worker processes (worker.py), one per
solution and device (device.py), under supervisors that kill whatever a worker starts
(supervisor.py); replies are decoded as plain data and tensors only (_wire.py) and checked
field by field, so a malformed one is that solution's failure, never the run's. A crash, an
illegal memory access or a hang costs that worker (it is killed and restarted) and gives the
solution RUNTIME_ERROR or TIMEOUT with its log. A timing is checked against this process's
clock and its spread (performance.py). Devices run in parallel, one thread each, Definitions
shared out between them.

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
import queue
import random
import shutil
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from ..trace import Correctness, Evaluation, EvaluationStatus, Performance, Trace
from ..trace.trace import utc_timestamp
from .config import CPU_MAX_ELEMENTS, BenchmarkConfig, Settings
from .device import Device, SetupError, make_spill_folder, resolve_devices
from .evaluator import CallRecord, Check, judge
from .inputs import generate_inputs
from .performance import checked_timing, clock_problem, performance
from .process import WorkerFailure, WorkerProcess

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
    return f"{what}: {exc}" + (f"\n{WORKER_OUTPUT}\n{exc.log}" if exc.log.strip() else "")


class Benchmark:
    """Runs the solutions of a TraceSet (see the module doc).

    ``on_result(trace_or_skipped)`` is called as each evaluation finishes (from the device's
    thread); ``persist`` appends each Trace to the dataset's traces/ as soon as it is made
    (folder datasets; a single-file dataset is saved at the end).
    """

    def __init__(self, trace_set, config: Optional[BenchmarkConfig] = None, *, persist: bool = True,
                 on_result: Optional[Callable] = None, on_start: Optional[Callable] = None):
        self.trace_set = trace_set
        # Workloads whose safetensors inputs were not there at load: skipped, saying which file.
        self._missing_blobs = {(d, u): why for d, u, why in trace_set.missing_blobs}
        # (device, solution) -> (status or None for a skip, log) of a build that failed there.
        self._build_failures: dict = {}
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
        self._devices: list[Device] = []
        self._modules_of: dict[str, list[str]] = {}  # solution name -> modules registering it
        self.result = RunResult()

    # --- what to run ------------------------------------------------------------------------

    def devices(self) -> list[str]:
        """The devices of this run (SetupError for one that is not here)."""
        return resolve_devices(self.config.devices)

    def definitions(self) -> list:
        ts = self.trace_set
        names = self.config.definitions or list(ts.definitions)
        unknown = [n for n in names if n not in ts.definitions]
        if unknown:
            raise SetupError(f"no definition named {', '.join(unknown)} in the dataset")
        return [ts.definitions[n] for n in names]

    def _discover(self) -> None:
        """Add the Solutions registered by config.modules, each module loaded by a worker of its
        own so that their code is never imported here, and each later solution's worker loads
        only the module that registered it."""
        from ..trace import Solution

        settings = Settings.model_validate({**self.config.defaults.model_dump(), **self.config.overrides})
        known = {s.name for group in self.trace_set.solutions.values() for s in group}
        for module in self.config.modules:
            worker = WorkerProcess("cpu", self.log_dir)
            try:
                reply = worker.request({"op": "discover", "modules": [module]}, timeout=settings.timeout_s)
                solutions = [Solution.from_dict(data) for data in reply["solutions"]] if "error" not in reply else None
            except WorkerFailure as exc:
                tail = "\n".join(exc.log.strip().splitlines()[-10:])
                raise SetupError(f"--module {module}: loading it failed: {exc}"
                                 + (f"\n--- its output (last lines; all in {worker.log_path}) ---\n{tail}" if tail else "")) from None
            except Exception as exc:  # a reply that is not a list of Solutions
                raise SetupError(f"--module {module}: loading it gave no usable solutions: {type(exc).__name__}: {exc}") from None
            finally:
                worker.stop()
            if solutions is None:
                raise SetupError(f"--module {module}: {reply['error']} (the worker's log: {worker.log_path})")
            for solution in solutions:
                if solution.name in self._modules_of:
                    raise SetupError(f"--module {module}: solution {solution.name!r} is also registered by "
                                     f"{self._modules_of[solution.name][0]}")
                self._modules_of[solution.name] = [module]
                if solution.definition in self.trace_set.definitions and solution.name not in known:
                    self.trace_set.add_solution(solution)

    def _check_solution_names(self) -> None:
        if self.config.solutions is None:
            return
        known = {s.name for d in self.definitions() for s in self.trace_set.get_solutions(d.name)}
        unknown = [n for n in self.config.solutions if n not in known]
        if unknown:
            hint = ", ".join(sorted(known)[:8]) + (" ..." if len(known) > 8 else "")
            raise SetupError(f"no solution named {', '.join(unknown)} for the chosen definitions"
                             + (f" (there are: {hint})" if known else ""))

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
        to the TraceSet. SetupError when the run cannot start as asked."""
        devices = self.devices()
        self._discover()
        self._check_solution_names()
        jobs = self.plan()
        if self.on_start:
            self.on_start(sum(len(todo) for _, rows in jobs for _, todo in rows))
        pending: queue.Queue = queue.Queue()
        for job in jobs:
            pending.put(job)
        errors = []

        spill = make_spill_folder()
        self._stopping.clear()

        def drive(device: str) -> None:
            dev = Device(device, self._modules_of, self.log_dir, spill, isolate=self.config.isolate)
            with self._lock:
                self._devices.append(dev)
            try:
                while not self._stopping.is_set():
                    try:
                        definition, rows = pending.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        self._run_definition(dev, definition, rows)
                    finally:
                        dev.finish_definition()
            except BaseException as exc:  # noqa: BLE001 - reported after the other devices finish
                if not self._stopping.is_set():
                    errors.append(exc)
            finally:
                dev.close()

        threads = [threading.Thread(target=drive, args=(d,), name=f"opforge-bench-{d}") for d in devices]
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
                dev.kill()

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

    def _run_definition(self, dev: Device, definition, rows) -> None:
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
            missing = self._missing_blobs.get((definition.name, workload.uuid))
            if missing is not None:
                for s in solutions:
                    self._emit(Skipped(definition.name, s.name, label, f"inputs not there: {missing}"))
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
            case.baseline_ms, case.baseline_earlier = self._earlier_baseline(definition, workload, baseline, dev)
            for solution in solutions:
                if self._stopping.is_set():
                    return
                self._emit(self._evaluate(dev, definition, solution, case, settings))
                dev.done_with(solution.name)

    def _earlier_baseline(self, definition, workload, baseline: Optional[str],
                          dev: Device) -> tuple[Optional[float], Optional[dict]]:
        """The baseline's latency on this workload from the last believable earlier trace on the
        same hardware, and when and with which seed it was timed (used when the baseline is not
        evaluated in this run, e.g. with resume; the Traces say so)."""
        if baseline is None:
            return None, None
        earlier = [t for t in self.trace_set.traces[definition.name]
                   if t.solution == baseline and t.workload.uuid == workload.uuid and t.is_successful()
                   and t.evaluation.performance is not None and t.evaluation.performance.suspect is None
                   and t.evaluation.environment.hardware == dev.environment.hardware]
        if not earlier:
            return None, None
        ev = earlier[-1].evaluation
        return ev.performance.latency_ms, {"timestamp": ev.timestamp, "seed": ev.seed}

    def _reference_latency(self, dev: Device, definition, case: "_Case", settings: Settings) -> float:
        from ..registry import reference_solution

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

    # --- one evaluation -----------------------------------------------------------------------

    def _evaluate(self, dev: Device, definition, solution, case: "_Case", settings: Settings):
        label = definition.workload_label(case.workload.axes)
        # A solution that failed to build on this device is not built again for every workload:
        # each of its workloads gets that first failure.
        failed_build = self._build_failures.get((dev.device, solution.name))
        if failed_build is not None:
            status, log = failed_build
            return Skipped(definition.name, solution.name, label, log) if status is None \
                else case.trace(solution, dev, status, log)
        try:
            reply = dev.build(solution, definition, settings.build_timeout_s)
            ok = _reply_field(reply, "ok", bool)
            if not ok:
                kind, log = _reply_field(reply, "kind", str), _reply_field(reply, "log", str)
        except WorkerFailure as exc:
            status = S.TIMEOUT if exc.timed_out else S.COMPILE_ERROR
            self._build_failures[(dev.device, solution.name)] = (status, _failure_log(exc, "build"))
            return case.trace(solution, dev, status, _failure_log(exc, "build"))
        except ValueError as exc:
            dev.retire(solution.name)
            return case.trace(solution, dev, S.RUNTIME_ERROR, f"build: {exc}")
        if not ok:
            if kind == "UNSUPPORTED":
                self._build_failures[(dev.device, solution.name)] = (None, log)
                return Skipped(definition.name, solution.name, label, log)
            self._build_failures[(dev.device, solution.name)] = (S.COMPILE_ERROR, f"{kind}: {log}")
            return case.trace(solution, dev, S.COMPILE_ERROR, f"{kind}: {log}")
        try:
            correctness = case.check(dev, solution, None, settings, what="check")
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
            after = case.check(dev, solution, [case.fresh], settings, what="after timing, on a fresh input set")
        except WorkerFailure as exc:
            return case.trace(solution, dev, _failure_status(exc), _failure_log(exc, "running the solution"))
        except _Failed as failed:
            return case.trace(solution, dev, failed.status, failed.log, correctness=failed.correctness)
        correctness = _merge(correctness, after)
        perf = case.performance(timing, dev, settings, clock)
        if solution.name == case.baseline:  # a suspect time is no baseline
            case.baseline_ms = perf.latency_ms if perf.suspect is None else None
            case.baseline_earlier = None
            perf = case.performance(timing, dev, settings, clock)  # against itself now
        return case.trace(solution, dev, S.PASSED, "", correctness=correctness, performance=perf)


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

    def __init__(self, runner: Benchmark, definition, workload, seed: int):
        self.serial = next(self._serials)
        self.runner, self.definition, self.workload, self.seed = runner, definition, workload, seed
        self.sets: list = []
        self.fresh: list = []
        self.references: dict[int, tuple] = {}  # id(input set) -> reference outputs
        self.reference_ms = 0.0
        self.baseline: Optional[str] = None
        self.baseline_ms: Optional[float] = None
        self.baseline_earlier: Optional[dict] = None  # when the baseline was timed in an earlier run

    @classmethod
    def prepare(cls, runner: Benchmark, dev: Device, definition, workload, settings: Settings) -> "_Case":
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

    def check(self, dev: Device, solution, sets: Optional[list], settings: Settings, *, what: str) -> Correctness:
        """Check the solution on ``sets`` (None: the case's own sets, loaded in the worker once)."""
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

    def performance(self, timing: dict, dev: Device, settings: Settings, clock: Optional[str]) -> Performance:
        if self.baseline_earlier is not None:
            timing = dict(timing, baseline_earlier=self.baseline_earlier)
        return performance(self.definition, self.definition.full_axis_values(self.workload.axes), timing,
                           dev.calibration, settings, reference_ms=self.reference_ms, baseline=self.baseline,
                           baseline_ms=self.baseline_ms, clock=clock)

    def trace(self, solution, dev: Device, status: EvaluationStatus, log: str, *,
              correctness: Optional[Correctness] = None, performance: Optional[Performance] = None) -> Trace:
        evaluation = Evaluation(status=status, environment=dev.environment, timestamp=utc_timestamp(), log=log,
                                correctness=correctness, performance=performance,
                                definition_hash=self.definition.content_hash(),
                                solution_hash=solution.content_hash(), seed=self.seed, device=dev.device)
        return Trace(definition=self.definition.name, workload=self.workload, solution=solution.name,
                     evaluation=evaluation)
