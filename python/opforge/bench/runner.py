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
shared out between them; what a device does with each workload is pairs.py's.

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

import queue
import random
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..trace import Trace
from .config import BenchmarkConfig, Settings
from .device import Device, SetupError, make_spill_folder, resolve_devices
from .pairs import WORKER_OUTPUT, PairEvaluator, Skipped
from .process import WorkerFailure, WorkerProcess

__all__ = ["Benchmark", "RunResult", "Skipped", "WORKER_OUTPUT"]


@dataclass
class RunResult:
    traces: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


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

    def _traced(self, solution, workload, hardware: Optional[str] = None) -> bool:
        """Whether the pair has a trace of this solution's code (on ``hardware`` when given)."""
        digest = solution.content_hash()
        return any(t.solution == solution.name and t.workload.uuid == workload.uuid
                   and t.evaluation is not None and t.evaluation.solution_hash in (None, digest)
                   and (hardware is None or t.evaluation.environment.hardware == hardware)
                   for t in self.trace_set.traces[solution.definition])

    def plan(self, hardware: Optional[str] = None) -> list[tuple]:
        """(definition, [(workload trace, [solutions to evaluate])]) for this run; with resume,
        pairs already traced (on ``hardware``, when given) are left out."""
        jobs = []
        for definition in self.definitions():
            solutions = self.solutions_for(definition)
            rows = []
            for wtrace in self.trace_set.get_workloads(definition.name):
                todo = [s for s in solutions
                        if not (self.config.resume and self._traced(s, wtrace.workload, hardware))]
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
            pairs = PairEvaluator(dev, self.config, self.seed, self.trace_set, self._stopping)
            with self._lock:
                self._devices.append(dev)
            try:
                while not self._stopping.is_set():
                    try:
                        definition, rows = pending.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        self._run_definition(pairs, definition, rows)
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

    def _run_definition(self, pairs: PairEvaluator, definition, rows) -> None:
        dev = pairs.dev
        if dev.calibration is None:
            dev.hello()
        baseline = self.config.baseline_for(definition)
        for wtrace, solutions in rows:
            if self._stopping.is_set():
                return
            workload = wtrace.workload
            earlier = self._earlier_baseline(definition, workload, baseline, dev.environment.hardware)
            for item in pairs.run_workload(definition, workload, solutions, earlier_baseline=earlier,
                                           missing=self._missing_blobs.get((definition.name, workload.uuid))):
                self._emit(item)

    def _earlier_baseline(self, definition, workload, baseline: Optional[str],
                          hardware: str) -> tuple[Optional[float], Optional[dict]]:
        """The baseline's latency on this workload from the last believable earlier trace on the
        same hardware, and when and with which seed it was timed (used when the baseline is not
        evaluated in this run, e.g. with resume; the Traces say so)."""
        if baseline is None:
            return None, None
        earlier = [t for t in self.trace_set.traces[definition.name]
                   if t.solution == baseline and t.workload.uuid == workload.uuid and t.is_successful()
                   and t.evaluation.performance is not None and t.evaluation.performance.suspect is None
                   and t.evaluation.environment.hardware == hardware]
        if not earlier:
            return None, None
        ev = earlier[-1].evaluation
        return ev.performance.latency_ms, {"timestamp": ev.timestamp, "seed": ev.seed}
