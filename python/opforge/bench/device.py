"""One device of a run: which devices a run may use, the calibration and environment of each
(measured by a worker that never loads solution code), and one worker process per solution.

Every solution gets a worker of its own on each device (kept for the Definition's workloads,
then stopped): what a solution does to its process (patching torch, the timer, the worker's
code) cannot reach another solution's inputs, outputs or timings. ``isolate`` goes further: a
fresh worker for every evaluation.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from ..trace import Environment
from .process import WorkerFailure, WorkerProcess
from .supervisor import pid_alive
from .timing import calibration_bytes

#: Seconds a calibration may take (a 2 GiB copy, ten times, and the clocks).
HELLO_TIMEOUT_S = 300.0
_SPILL_PREFIX = "opforge-run-"


class SetupError(ValueError):
    """The run cannot start as asked (devices, modules, names); the message says why in a line
    or two."""


def resolve_devices(asked: Optional[list[str]]) -> list[str]:
    """The devices to run on: as asked (``cuda`` = every visible GPU) or every GPU, else the CPU.
    SetupError for a device that is not here, or for a calibration size that is no size (the
    workers would each fail on it)."""
    try:
        calibration_bytes()
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    if not asked:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else ["cpu"]
    found: list[str] = []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for name in asked:
        m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", name.strip())
        if m is None:
            raise SetupError(f"unknown device {name!r}; accepted: cpu, cuda (every GPU), cuda:N")
        if m[1] == "cpu":
            if m[2] is not None:
                raise SetupError(f"unknown device {name!r}; the CPU is 'cpu'")
            found.append("cpu")
            continue
        if count == 0:
            raise SetupError(f"--devices {name}: no GPU visible here (torch {torch.__version__}, "
                             f"CUDA {'available' if torch.version.cuda else 'not in this build of torch'}); "
                             "use --devices cpu")
        if m[2] is None:
            found += [f"cuda:{i}" for i in range(count)]
        elif int(m[2]) >= count:
            raise SetupError(f"--devices {name}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})")
        else:
            found.append(f"cuda:{int(m[2])}")
    return list(dict.fromkeys(found))


def make_spill_folder() -> Path:
    """A folder for large tensors on their way between processes (in /dev/shm where there is
    one), named after this process so a later run can tell it is stale; folders of runs that
    died first are removed here."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    for old in Path(parent).glob(f"{_SPILL_PREFIX}*"):
        m = re.match(rf"{_SPILL_PREFIX}(\d+)-", old.name)
        try:
            stale = m is not None and old.lstat().st_uid == os.getuid() and not pid_alive(int(m[1]))
        except OSError:
            continue
        if stale:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_SPILL_PREFIX}{os.getpid()}-", dir=parent))


class Device:
    """One device: its calibration, environment, and a worker per solution with what was built
    and loaded in each.

    Solutions that need no isolation from each other (``trusted``: the Definitions' references,
    whose code this process runs itself) share one worker for the whole run. On a GPU a blank
    worker is kept started ahead of need (torch imported, the device set up, no solution code),
    so a solution rarely waits for a process to start. Not on the CPU: starting one there (a
    second or so of a core) would compete with the solution being timed on the same cores.
    """

    def __init__(self, device: str, modules_of: dict[str, list[str]], log_dir: Path, spill: Optional[Path],
                 isolate: bool = False, label: Optional[str] = None):
        self.device = device
        self.label = label or device  # what the Traces call it (a cluster's GPU: its index on its node)
        self.modules_of = modules_of  # solution name -> the modules that register it
        self.log_dir, self.spill, self.isolate = log_dir, spill, isolate
        self.environment: Optional[Environment] = None
        self.calibration: Optional[dict] = None
        self.trusted: set[str] = set()
        self.workers: dict[str, WorkerProcess] = {}  # by solution name; "" is the trusted one
        self._spare: Optional[WorkerProcess] = None
        self._built: dict[str, tuple[int, dict]] = {}  # solution name -> (worker start, reply)
        self._loaded: dict[str, tuple[int, int]] = {}  # worker key -> (worker start, case serial)

    def _new_worker(self) -> WorkerProcess:
        return WorkerProcess(self.device, self.log_dir, self.spill)

    def hello(self) -> None:
        """Calibrate and describe the device, in a worker that loads no solution code (it stays
        blank, so it serves as the first spare)."""
        worker = self._spare = self._spare or self._new_worker()
        try:
            reply = worker.request({"op": "hello", "calibrate": True}, timeout=HELLO_TIMEOUT_S)
        except WorkerFailure as exc:
            tail = "\n".join(exc.log.strip().splitlines()[-15:])
            raise SetupError(f"the worker on {self.device} failed before any solution ran: {exc}"
                             + (f"\n--- its output (last lines; all in {worker.log_path}) ---\n{tail}" if tail else "")) from None
        if "error" in reply:
            raise SetupError(f"the worker on {self.device} failed before any solution ran: {reply['error']}")
        self.calibration = reply["calibration"]
        environment = reply["environment"]
        # Every Trace says what its device's copy bandwidth measured in this run, failures too.
        environment["hardware_info"] = dict(environment.get("hardware_info") or {},
                                            copy_gbps=round(self.calibration["gbps"], 1))
        self.environment = Environment(**environment)

    def _key(self, solution: str) -> str:
        return "" if solution in self.trusted else solution

    def worker(self, solution: str) -> WorkerProcess:
        key = self._key(solution)
        if key not in self.workers:
            self.workers[key] = self._spare if self._spare is not None else self._new_worker()
            self._spare = None
            if self.device != "cpu":
                self._spare = self._new_worker()
                self._spare.start()  # it gets ready while this one works
        return self.workers[key]

    def request(self, solution: str, message: dict, timeout: float) -> dict:
        return self.worker(solution).request(message, timeout)

    def build(self, solution, definition, timeout: float) -> dict:
        """The build reply ({"ok": ...}), building again in a worker that restarted since."""
        worker = self.worker(solution.name)
        seen = self._built.get(solution.name)
        if seen is not None and seen[0] == worker.starts and worker.alive:
            return seen[1]
        reply = worker.request({"op": "build", "solution": solution.to_dict(), "definition": definition.to_dict(),
                                "modules": self.modules_of.get(solution.name, [])}, timeout=timeout)
        self._built[solution.name] = (worker.starts, reply)
        return reply

    def load(self, solution: str, case, timeout: float) -> None:
        """Send the case's input sets to the solution's worker once; again only to a worker that
        restarted since."""
        key, worker = self._key(solution), self.worker(solution)
        if self._loaded.get(key) != (worker.starts, case.serial) or not worker.alive:
            worker.request({"op": "load", "key": case.workload.uuid, "input_sets": case.sets}, timeout=timeout)
            self._loaded[key] = (worker.starts, case.serial)

    def done_with(self, solution: str) -> None:
        """The solution's evaluation on a workload is over: with ``isolate``, its worker goes."""
        if self.isolate and solution not in self.trusted:
            self.retire(solution)

    def retire(self, solution: str) -> None:
        key = self._key(solution)
        worker = self.workers.pop(key, None)
        if worker is not None:
            worker.stop()
        self._loaded.pop(key, None)
        for name in [n for n in self._built if self._key(n) == key]:
            del self._built[name]

    def finish_definition(self) -> None:
        """The Definition's solutions are done: their workers go (the trusted one stays)."""
        for key in [k for k in self.workers if k]:
            self.retire(key)

    def close(self) -> None:
        self.finish_definition()
        for worker in [self.workers.pop("", None), self._spare]:
            if worker is not None:
                worker.stop()
        self._spare = None
        self._built.clear()
        self._loaded.clear()

    def kill(self) -> None:
        for worker in list(self.workers.values()) + ([self._spare] if self._spare else []):
            worker.kill()
