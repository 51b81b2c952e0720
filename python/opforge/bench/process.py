"""The runner's side of a worker process (worker.py): start it under its supervisor
(supervisor.py), send a request with a timeout, notice when it died, hung or answered garbage,
and hand back its log. Nothing the worker starts outlives it: stopping or killing a worker goes
through the supervisor, which kills the worker's whole tree.

A CPU worker and its supervisor are forked by a fork server that has already imported torch
(forkserver.py: milliseconds instead of a new interpreter's 2 s of CPU); a GPU worker, or any
worker where that is not possible, starts a fresh interpreter under a started supervisor.
Either way the runner holds a process handle of the supervisor (a Popen, or a
forkserver.ForkedProcess: the same poll, wait and send_signal), the worker's socket and the
lifeline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import _wire, supervisor
from .supervisor import kill_tree

if TYPE_CHECKING:
    from .forkserver import ForkedProcess

#: Seconds a new worker may take to import torch and opforge and answer its first request.
START_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000
#: The supervisor runs as a plain script in isolated mode (-I: neither its folder nor the user's
#: site on sys.path), not with ``-m opforge.bench.supervisor``: importing it through the package
#: would import opforge and torch (a second or two of CPU per worker start) for a process that
#: needs only the standard library.
_SUPERVISOR_SCRIPT = str(Path(supervisor.__file__).resolve())


#: Lifelines that a supervisor may hold whom this process cannot reach (forkserver.Lost).
_kept_lifelines: list[int] = []


class WorkerFailure(Exception):
    """The worker died, did not answer in time or answered something that is not a reply;
    ``timed_out`` tells whether it was too slow, ``log`` what it printed while serving the
    request."""

    def __init__(self, message: str, log: str, timed_out: bool):
        super().__init__(message)
        self.log = log
        self.timed_out = timed_out


def worker_environment() -> dict:
    """The environment a worker starts with: this process's, where the worker imports the same
    opforge as this process (wherever that came from), unbuffered."""
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class WorkerProcess:
    """One worker on one device. Started on first use (or ahead of it, with ``start``) and again
    after it dies or is stopped."""

    def __init__(self, device: str, log_dir: Path, spill: Optional[Path] = None):
        self.device = device
        self.spill = spill  # where large tensors of requests and replies go (see _wire)
        self.log_dir = Path(log_dir)
        self.starts = 0
        self._ready = False  # the worker said it is ready (see request)
        self._proc: Optional[subprocess.Popen | ForkedProcess] = None  # the supervisor
        self._conn: Optional[Connection] = None
        self._lifeline: Optional[int] = None  # closing it (or our death) ends the supervisor
        self._log_path: Optional[Path] = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Optional[Path]:
        return self._log_path

    def start(self) -> None:
        self.stop()
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self.log_dir / f"worker-{self.device.replace(':', '')}-{os.getpid()}-{id(self):x}-{self.starts}.log"
        ours, theirs = socket.socketpair()
        lifeline_read, self._lifeline = os.pipe()
        env = worker_environment()
        spill = str(self.spill or "")
        from . import forkserver  # not at import: ``python -m opforge.bench.forkserver`` imports this module first

        with open(self._log_path, "ab") as log:
            try:
                self._proc = forkserver.start_supervised(self.device, env, theirs.fileno(), lifeline_read,
                                                         log.fileno(), spill)
            except forkserver.Lost:  # a supervisor may hold these: new ones (see Lost)
                _kept_lifelines.append(self._lifeline)
                for old in (ours, theirs):
                    old.close()
                os.close(lifeline_read)
                ours, theirs = socket.socketpair()
                lifeline_read, self._lifeline = os.pipe()
                self._proc = None
            if self._proc is None:
                env["OPFORGE_WORKER_FDS"] = str(theirs.fileno())
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", _SUPERVISOR_SCRIPT, str(lifeline_read), spill, "--",
                     sys.executable, "-m", "opforge.bench.worker", str(theirs.fileno()), self.device, spill],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(), lifeline_read), env=env, start_new_session=True)
        theirs.close()
        os.close(lifeline_read)
        self._conn = Connection(ours.detach())
        self._ready = False

    def stop(self) -> None:
        if self._conn is not None:
            try:
                if self.alive:
                    self._conn.send_bytes(_wire.dumps({"op": "exit"}))
            except OSError:
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
            self._proc = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def kill(self) -> None:
        """Kill the worker and anything it started, now (from any thread); a request waiting on
        it fails. The supervisor does the killing (it sees orphans the worker left)."""
        proc = self._proc
        if proc is not None:
            proc.send_signal(signal.SIGTERM)  # nothing once it has ended (it may not be ours to reap)

    def _kill(self) -> None:
        self.kill()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a supervisor that cannot answer: do its job from here
            kill_tree(self._proc.pid, include_root=True)
            self._proc.wait()

    def _log_since(self, offset: int) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text if len(text) <= LOG_TAIL_CHARS else "...\n" + text[-LOG_TAIL_CHARS:]

    def request(self, message: dict, timeout: float) -> dict:
        """Send one request and wait for the reply, a dict. Raises WorkerFailure when the worker
        dies, takes longer than ``timeout`` seconds or answers with anything but a well-formed
        dict (it is then killed); the next request starts a new one. A reply saying the worker
        is no longer healthy also retires it. The reply gets ``printed`` (what the worker wrote
        meanwhile) and ``wall_s`` (this process's clock from sending to the reply)."""
        if not self.alive:
            self.start()
        if not self._ready:
            # The worker says it is ready once torch, opforge and the device are set up, before
            # any solution code runs: the request's own timeout then bounds the solution's
            # imports. (A worker started ahead of need may be ready already.)
            self._receive(START_TIMEOUT_S, 0, "starting")
            self._ready = True
        offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        started = time.perf_counter()
        try:
            self._conn.send_bytes(_wire.dumps(message, self.spill))
        except OSError:
            pass  # a worker that died says so below
        reply = self._receive(timeout, offset, "")
        wall_s = time.perf_counter() - started
        if reply.get("healthy") is False:
            self.stop()
        reply["printed"] = self._log_since(offset)
        reply["wall_s"] = wall_s
        return reply

    def _receive(self, timeout: float, offset: int, what: str) -> dict:
        """The next message from the worker, a dict; WorkerFailure (the worker is then stopped)
        when it dies, is silent for ``timeout`` seconds or sends anything else."""
        malformed = None
        try:
            ready = self._conn.poll(timeout)
            reply = self._conn.recv_bytes(_wire.MAX_MESSAGE_BYTES) if ready else None
            if reply is not None:
                reply = _wire.loads(reply, self.spill)
                if not isinstance(reply, dict):
                    raise _wire.WireError(f"a reply must be a dict, got {type(reply).__name__}")
        except _wire.WireError as exc:
            reply, malformed = None, str(exc)
        except (EOFError, OSError) as exc:
            reply, ready = None, True
            # recv_bytes refuses an oversized message with OSError while the worker lives on.
            malformed = f"{exc}" if self.alive and "message length" in str(exc) else None
        if reply is not None:
            return reply
        prefix = f"while {what}: " if what else ""
        if malformed is not None or not ready:
            self._kill()
            log = self._log_since(offset)
            self.stop()
            if malformed is not None:
                raise WorkerFailure(f"{prefix}the worker answered with a malformed reply ({malformed}); "
                                    "it was killed", log, False)
            raise WorkerFailure(f"{prefix}no answer within {timeout:g} s; the worker was killed", log, True)
        code = self._proc.wait(timeout=30) if self._proc else None
        log = self._log_since(offset)
        self.stop()
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        raise WorkerFailure(f"{prefix}the worker process died ({how})", log, False)
