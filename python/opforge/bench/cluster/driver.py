"""The driver of a cluster run: ``RayBenchmark`` plans, hands tasks to device workers anywhere
in a Ray cluster, and alone writes the dataset.

    from opforge.bench.cluster import RayBenchmark, RayConfig
    traces = RayBenchmark(TraceSet.load("my_dataset"), BenchmarkConfig(seed=7), RayConfig("auto")).run_all()

One device worker (actor.py) per GPU of the cluster. Each says hello with its hardware and
calibration; the first of each GPU model brings that model's work into the scheduler
(schedule.py): every pair not yet traced on that model (with resume), so a Trace says which
hardware measured it. One thread here per device worker feeds it tasks and streams its results
back as they are made; each is appended to the dataset at once (append-only, like a
single-host run), so ``--resume`` goes on from whatever the driver or a node left behind. A
worker that dies costs the pairs in flight there (see schedule.py for how they are retried).
Ctrl-C kills every device worker, and with them every solution process on every node.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...trace import Environment, Evaluation, EvaluationStatus, Trace
from ...trace.trace import utc_timestamp
from ..device import SetupError
from ..pairs import Skipped, workload_seed
from ..runner import Benchmark
from .actor import DeviceWorker
from .schedule import GivenUp, Scheduler, Slot, Task
from .shipping import ShippedInputs, pack_modules

RAY_MISSING = ("--ray needs Ray, an optional extra of opforge: pip install 'opforge[ray]' (or pip install ray); "
               "every node of the cluster needs Ray and the same opforge")


def require_ray():
    """The ray module; SetupError saying how to install it when it is not there."""
    try:
        import ray
    except ImportError:
        raise SetupError(RAY_MISSING) from None
    return ray


@dataclass
class RayConfig:
    """Where and how a run uses a Ray cluster.

    ``address``: None or "" starts a Ray instance on this machine for the run; "auto" joins the
    cluster this machine belongs to; else a cluster address ("host:6379", "ray://host:10001").
    When this process is connected to Ray already, that connection is used. ``device``:
    "cuda", or "cpu" to evaluate on each GPU slot's node CPU (a dry run on machines without
    GPUs: ``ray start --num-gpus N`` gives one N slots). ``start_timeout_s``: how long a device
    worker may take to start (to be placed on a GPU, import, calibrate) before it is let go."""

    address: Optional[str] = None
    device: str = "cuda"
    start_timeout_s: float = 300.0

    def __post_init__(self):
        if self.device not in ("cuda", "cpu"):
            raise SetupError(f"a cluster run evaluates on every GPU (cuda) or on the nodes' CPUs (cpu), not {self.device!r}")


@dataclass(eq=False)
class _Worker:
    """The driver's record of one device worker."""

    handle: object
    slot: Optional[Slot] = None
    label: str = ""  # its device, as the Traces name it
    environment: Optional[Environment] = None
    failed: Optional[str] = None  # why it never started
    abandoned: bool = False  # let go before it started
    thread: Optional[threading.Thread] = None
    started: float = field(default_factory=time.monotonic)


@dataclass
class ClusterLog:
    """What happened to the cluster's workers during a run, for the closing lines."""

    groups: dict = field(default_factory=dict)  # hardware -> [(slot name, copy GB/s)]
    retried: list = field(default_factory=list)  # "definition / workload / solution" retried elsewhere
    given_up: list = field(default_factory=list)  # the same, recorded as RUNTIME_ERROR
    lost: list = field(default_factory=list)  # "worker: reason"
    never_started: list = field(default_factory=list)  # "worker: reason"


def _reason(exc: BaseException) -> str:
    """One line on why a worker is gone: Ray's own words, without the ids and addresses."""
    text = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
    text = re.sub(r"\s*\b(class_name|actor_id|pid|namespace|ip|name): \S+", "", text)
    text = re.sub(r" [0-9a-f]{16,}\b", "", text)
    text = text.split(" Some common causes include")[0]
    return f"{type(exc).__name__}: {text[:300] + ' ...' if len(text) > 300 else text}"


class RayBenchmark(Benchmark):
    """A Benchmark run by device workers of a Ray cluster (see the module doc). ``on_note`` gets
    one line of text for each event of the cluster a user wants to see (a GPU model joining, a
    worker lost); ``cluster`` keeps them for the end of the run."""

    #: The device workers' class (bench/ray_overhead.py gives them one that evaluates nothing, to
    #: time the scheduling alone).
    worker_class = DeviceWorker

    def __init__(self, trace_set, config=None, ray_config: Optional[RayConfig] = None, *, persist: bool = True,
                 on_result: Optional[Callable] = None, on_start: Optional[Callable] = None,
                 on_note: Optional[Callable[[str], None]] = None):
        super().__init__(trace_set, config, persist=persist, on_result=on_result, on_start=on_start)
        self.ray_config = ray_config or RayConfig()
        self.on_note = on_note
        self.cluster = ClusterLog()
        self.scheduler = Scheduler()
        self._workers: list[_Worker] = []
        self._errors: list[BaseException] = []
        self._total = 0
        self._refs: dict[tuple, object] = {}
        self._spawn_worker: Optional[Callable[[], None]] = None
        self._replacements = 0

    def _note(self, text: str) -> None:
        if self.on_note:
            self.on_note(text)

    # --- the run ----------------------------------------------------------------------------

    def run_all(self) -> list[Trace]:
        ray = require_ray()
        self._discover()
        self._check_solution_names()
        if not any(self.solutions_for(d) and self.trace_set.get_workloads(d.name) for d in self.definitions()):
            return []  # nothing chosen: no cluster to start
        started = False
        if not ray.is_initialized():
            address = self.ray_config.address or "local"
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise SetupError(f"--ray {address}: cannot connect to a Ray cluster there: {_reason(exc)}") from None
            started = True
        try:
            return self._run(ray)
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray) -> list[Trace]:
        slots = int(ray.cluster_resources().get("GPU", 0))
        if slots < 1:
            raise SetupError("the Ray cluster has no GPU (ray.cluster_resources() lists none); a node without GPUs "
                             "can lend slots for a CPU dry run with `ray start --num-gpus N` and --devices cpu")
        setup = {"config": self.config.model_dump(by_alias=True), "seed": self.seed, "run_id": uuid.uuid4().hex[:12],
                 "device": self.ray_config.device, "log_dir": self.config.log_dir, "modules_of": self._modules_of}
        modules = ray.put(pack_modules(self.config.modules))
        actor = ray.remote(self.worker_class).options(num_gpus=1, num_cpus=0, max_restarts=0, max_concurrency=2)
        self._stopping.clear()

        def spawn() -> None:
            w = _Worker(actor.remote(setup, modules))
            w.thread = threading.Thread(target=self._serve, args=(ray, w), name="opforge-cluster-worker", daemon=True)
            with self._lock:
                self._workers.append(w)
            w.thread.start()

        self._spawn_worker, self._workers, self._replacements = spawn, [], slots
        for _ in range(slots):
            spawn()
        try:
            self._wait(ray)
        except KeyboardInterrupt:
            self.stop(kill=True)
            for w in list(self._workers):
                w.thread.join()
            raise
        finally:
            for w in list(self._workers):
                self._kill(ray, w)
        if not self._stopping.is_set():
            for task in self.scheduler.stranded():
                for s in task.solutions:
                    self._emit(Skipped(task.definition, s.name, self._label(task), "not run: every device worker of "
                                       f"{task.group} is gone; `--resume` runs it later"))
        if self.persist and self.result.traces:
            self._save()
        if self._errors:
            raise self._errors[0]
        if not any(w.slot for w in self._workers) and not self._stopping.is_set():
            why = "; ".join(dict.fromkeys(w.failed for w in self._workers if w.failed)) or "none started"
            raise SetupError(f"no device worker of the cluster could start: {why}")
        return list(self.result.traces)

    def _wait(self, ray) -> None:
        """Until every thread is done. A worker still starting is let go once the others have
        done all the work (its GPU is busy elsewhere), or after start_timeout_s."""
        while any(w.thread.is_alive() for w in list(self._workers)):
            time.sleep(0.1)  # not a bare join, which would keep Ctrl-C from reaching this thread
            workers = list(self._workers)
            joined = [w for w in workers if w.slot is not None]
            done = joined and not any(w.thread.is_alive() for w in joined) and not self.scheduler.queued()
            for index, w in enumerate(workers):
                if w.slot is not None or w.failed is not None or w.abandoned:
                    continue
                late = time.monotonic() - w.started > self.ray_config.start_timeout_s
                if late or done:
                    w.abandoned = True
                    w.failed = (f"not started within {self.ray_config.start_timeout_s:g} s" if late
                                else "still waiting for a GPU when the work was done")
                    self.cluster.never_started.append(f"device worker {index + 1}: {w.failed}")
                    self._kill(ray, w)

    def stop(self, kill: bool = False) -> None:
        """Finish after the pairs in flight (``kill``: abandon them, killing every device worker
        and so every solution process on every node); results after this are not recorded."""
        self._stopping.set()
        self.scheduler.stop()
        ray = require_ray()
        for w in list(self._workers):
            if kill:
                self._kill(ray, w)
            else:
                try:
                    w.handle.stop.remote()
                except Exception:  # noqa: BLE001 - a worker that is gone has nothing to stop
                    pass

    @staticmethod
    def _kill(ray, w: _Worker) -> None:
        try:
            ray.kill(w.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - dead already
            pass

    # --- one device worker ------------------------------------------------------------------

    def _serve(self, ray, w: _Worker) -> None:
        try:
            hello = ray.get(w.handle.hello.remote())
        except Exception as exc:  # noqa: BLE001 - it never started: said, and the run goes on
            if not (w.abandoned or self._stopping.is_set()):
                w.failed = _reason(getattr(exc, "cause", None) or exc)
                self.cluster.never_started.append(f"device worker {self._workers.index(w) + 1}: {w.failed}")
                self._note(f"a device worker could not start: {w.failed}")
            return
        if w.abandoned or self._stopping.is_set():
            return
        w.environment, w.label = Environment.from_dict(hello["environment"]), hello["label"]
        name = f"{hello['host']} (node {hello['node_id'][:8]}) {hello['label']}"
        w.slot = Slot(name=name, node=hello["node_id"], group=w.environment.hardware)
        self._join(w)
        alive = True
        try:
            while alive:
                task = self.scheduler.take(w.slot)
                if task is None:
                    break
                alive = self._run_task(ray, w, task)
        except BaseException as exc:  # noqa: BLE001 - raised by run_all once every thread is done
            if not self._stopping.is_set():  # an error of the runner itself, here or in the worker
                self._errors.append(getattr(exc, "cause", None) or exc)
                self.stop(kill=True)
            self.scheduler.leave(w.slot)
            return
        self._kill(ray, w)  # its work is done: its solution processes go with it

    def _join(self, w: _Worker) -> None:
        """Add the worker to the scheduler, with its GPU model's work when it is the first."""
        group = w.environment.hardware
        tasks = None
        with self._lock:
            first = group not in self.cluster.groups
            self.cluster.groups.setdefault(group, []).append((w.slot.name, w.environment.hardware_info["copy_gbps"]))
            if first:
                tasks = [Task(group, d.name, wtrace, tuple(solutions)) for d, rows in self.plan(hardware=group)
                         for wtrace, solutions in rows]
                pairs = sum(len(t.solutions) for t in tasks)
                self._total += pairs
        if first:
            self._note(f"{group}: first device worker ready on {w.slot.name}; {pairs} pairs to measure on this model")
            if self.on_start:
                self.on_start(self._total)
        self.scheduler.join(w.slot, tasks)

    def _run_task(self, ray, w: _Worker, task: Task) -> bool:
        """Send the task and record its results as they come; False when the worker died."""
        definition = self.trace_set.definitions[task.definition]
        workload = task.workload.workload
        missing = self._missing_blobs.get((definition.name, workload.uuid))
        baseline = self.config.baseline_for(definition)
        payload = {"definition": (definition.name, self._ref(ray, "definition", definition)),
                   "workload": workload.to_dict(),
                   "solutions": [(s.name, self._ref(ray, "solution", s)) for s in task.solutions],
                   "missing": missing,
                   "earlier_baseline": self._earlier_baseline(definition, workload, baseline, task.group)}
        inputs = ShippedInputs.read(self.trace_set, definition, workload) if missing is None else None
        reported: set[str] = set()
        try:
            for ref in w.handle.run.remote(payload, inputs):
                kind, data = ray.get(ref)
                item = Trace.from_dict(data) if kind == "trace" else Skipped(**data)
                reported.add(item.solution)
                self._emit(item)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            self._kill(ray, w)
            if self._stopping.is_set():
                self.scheduler.leave(w.slot)
                return False
            reason = _reason(exc)
            given_up = self.scheduler.lost(w.slot, task, reported, reason)
            left = [s for s in task.solutions if s.name not in reported]
            self.cluster.lost.append(f"{w.slot.name}: {reason}")
            news = "nothing was in flight there"
            if left:
                what = f"{task.definition} / {self._label(task)} / {left[0].name}"
                (self.cluster.given_up if given_up else self.cluster.retried).append(what)
                news = f"{what} was in flight there: " + \
                    ("lost a second time, recorded as RUNTIME_ERROR" if given_up else "retried on another worker")
            self._note(f"device worker {w.slot.name} died ({reason}); {news}")
            for g in given_up:
                self._emit(self._given_up_trace(g, w))
            self._replace()
            return False
        self.scheduler.done(w.slot, task)
        return True

    def _replace(self) -> None:
        """Start a device worker in place of one that died: Ray places it on a free GPU (the
        dead one's, when its node is still up). At most as many as the run started with; one
        that finds no GPU is let go when the work is done."""
        with self._lock:
            if self._stopping.is_set() or self._replacements <= 0:
                return
            self._replacements -= 1
        self._spawn_worker()

    def _ref(self, ray, kind: str, obj):
        """An object-store copy of a Definition or Solution, made once per run."""
        key = (kind, obj.name)
        with self._lock:
            if key not in self._refs:
                self._refs[key] = ray.put(obj.to_dict())
            return self._refs[key]

    def _label(self, task: Task) -> str:
        return self.trace_set.definitions[task.definition].workload_label(task.workload.workload.axes)

    def _given_up_trace(self, g: GivenUp, w: _Worker) -> Trace:
        definition = self.trace_set.definitions[g.task.definition]
        workload = g.task.workload.workload
        first = g.after or g
        losses = "\n".join(f"- on {where}: {why}" for where, why in first.losses)
        if g.after is None:
            log = (f"the device worker evaluating it died each of the {len(first.losses)} times it ran, so it is "
                   f"not retried again:\n{losses}")
        else:
            log = (f"not run: on {first.task.definition} / {self._label(first.task)} the device worker evaluating "
                   f"this solution died each of the {len(first.losses)} times it ran, so its other pairs on this "
                   f"hardware are not run in this run:\n{losses}")
        evaluation = Evaluation(status=EvaluationStatus.RUNTIME_ERROR, environment=w.environment,
                                timestamp=utc_timestamp(), log=log, definition_hash=definition.content_hash(),
                                solution_hash=g.solution.content_hash(), seed=workload_seed(self.seed, workload.uuid),
                                device=w.label)
        return Trace(definition=definition.name, workload=workload, solution=g.solution.name, evaluation=evaluation)
