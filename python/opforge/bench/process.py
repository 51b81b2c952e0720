"""The runner's side of a worker process (worker.py): start it, send a request with a timeout,
notice when it died or hung, and hand back its log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

from . import _wire

#: Seconds a new worker may take to import torch and opforge and answer its first request.
START_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000


class WorkerFailure(Exception):
    """The worker died or did not answer in time; ``timed_out`` tells which, ``log`` what it
    printed while serving the request."""

    def __init__(self, message: str, log: str, timed_out: bool):
        super().__init__(message)
        self.log = log
        self.timed_out = timed_out


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class WorkerProcess:
    """One worker on one device. Started on first use and again after it dies or is stopped."""

    def __init__(self, device: str, modules: list[str], log_dir: Path, spill: Optional[Path] = None):
        self.device = device
        self.spill = spill  # where large tensors of requests and replies go (see _wire)
        self.modules = list(modules)
        self.log_dir = Path(log_dir)
        self.starts = 0
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
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
        self._log_path = self.log_dir / f"worker-{self.device.replace(':', '')}-{os.getpid()}-{self.starts}.log"
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        # The worker imports the same opforge as this process, wherever that one came from.
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "opforge.bench.worker", str(theirs.fileno()), self.device,
                 json.dumps(self.modules), str(self.spill or "")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                env=env, start_new_session=True)
        theirs.close()
        self._conn = Connection(ours.detach())

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

    def kill(self) -> None:
        """Kill the worker and anything it started, now (from any thread); a request waiting on
        it fails."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()

    def _kill(self) -> None:
        self.kill()
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
        """Send one request and wait for the reply. Raises WorkerFailure when the worker dies or
        takes longer than ``timeout`` seconds (it is then killed); the next request starts a
        new one. A reply saying the worker is no longer healthy also retires it."""
        first = not self.alive
        if first:
            self.start()
        offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        limit = timeout + (START_TIMEOUT_S if first else 0.0)
        try:
            self._conn.send_bytes(_wire.dumps(message, self.spill))
            ready = self._conn.poll(limit)
            reply = _wire.loads(self._conn.recv_bytes()) if ready else None
        except (EOFError, OSError):
            reply, ready = None, True
        if reply is None:
            if not ready:
                self._kill()
                log = self._log_since(offset)
                self.stop()
                raise WorkerFailure(f"no answer within {timeout:g} s; the worker was killed", log, True)
            code = self._proc.wait(timeout=30) if self._proc else None
            log = self._log_since(offset)
            self.stop()
            how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
            raise WorkerFailure(f"the worker process died ({how})", log, False)
        if reply.get("healthy") is False:
            self.stop()
        reply["printed"] = self._log_since(offset)
        return reply
