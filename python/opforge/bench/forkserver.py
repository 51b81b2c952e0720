"""CPU benchmark workers forked from a process that has already imported torch: a worker start
then costs milliseconds instead of a new interpreter's 2 s of CPU importing torch.

    runner --control socket--> fork server --fork--> supervisor --fork--> worker

The runner (process.py) starts a fork server on its first CPU worker start, as
``python -m opforge.bench.forkserver FD``, with the interpreter, working folder and environment
a worker would be started with; a worker start in another environment (or folder, or
interpreter) gets a fork server of its own, and the fork servers of the last two stay. Left out
of that environment, and set in each worker as the runner has them when it starts, are the
variables no import reads (``per_worker``: pytest's marker of the test in progress, opforge's
own but those ``import opforge`` reads).

The fork server imports what a worker imports before it says it is ready (opforge.bench.worker,
and with it torch and opforge) and nothing else: it runs no torch op (no OpenMP thread pool is
live when it forks), does not touch CUDA, and runs no solution code. For each worker the runner
sends it, over a Unix socket pair (SCM_RIGHTS), the worker's end of its socket pair, the read
end of its lifeline, its log file and the write end of a status pipe; it forks the supervisor
and answers with the supervisor's pid and a pidfd of it.

The forked supervisor does what a started one does (supervisor.py): a session of its own,
stdout and stderr to the log, no core files, a child subreaper; it forks the worker from its
own image and runs ``supervisor.watch`` on it. The worker keeps no descriptor but its socket
and stdio (nothing of the fork server's or of other workers'), gets the signal mask and
dispositions a started worker has (SIGINT ignored, as a supervisor leaves it to its children;
SIGTERM's default), new seeds for ``random`` (numpy's global generator where imported,
multiprocessing's authkey), and runs opforge.bench.worker as ``__main__`` with a started
worker's arguments. What it shares with the fork server and the other workers is what a started
worker would have made the same from the same imports in the same environment, memory pages
until one writes them (copy-on-write), and the str hash seed (fixed at interpreter start):
nothing one worker can change for another.

Statuses: the fork server reaps its supervisors and writes each one's exit status (a line) to
its status pipe, whose read end only the runner holds; the supervisor writes its own before it
leaves too, so the runner learns it also when the fork server is gone (``ForkedProcess`` gives
the runner Popen's poll, wait and send_signal; its pidfd says when the supervisor has ended).

Ends: a fork server ends once the runner has closed the control socket (at exit, when it is no
longer among the last two, or by dying: even SIGKILL closes it) and its supervisors have ended;
each supervisor ends with the runner through its lifeline, as a started one does. The fork
server is a child subreaper: a solution that kills its supervisor hands the worker's tree to
it, and it kills the tree. It keeps nothing a worker can reach: the control socket and the
other workers' pipes and pidfds are closed in every child it forks.

Where forking is not possible (not Linux, no pidfds), not wanted (OPFORGE_WORKER_FORK=0, or
opforge's apply or tracing switched on by the environment: they run a dataset's code at
``import opforge``), or where the fork server cannot start or dies, workers start a fresh
interpreter as before (said once in the "opforge.bench" log).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Optional

from . import supervisor

logger = logging.getLogger("opforge.bench")

WORKER_MODULE = "opforge.bench.worker"
#: How the fork server is started, after the interpreter (the tests break it on purpose).
SERVER_ARGS = ["-m", "opforge.bench.forkserver"]
#: Seconds the fork server may take to import torch and opforge and say it is ready.
READY_TIMEOUT_S = 120.0
#: Seconds it may take to fork one supervisor and answer.
ANSWER_TIMEOUT_S = 30.0


# --- the runner's side ----------------------------------------------------------------------


def per_worker(name: str) -> bool:
    """Whether environment variable ``name`` is left out of the fork server's environment (a
    change does not need another fork server) and set in each worker as the runner has it:
    one that no import reads. pytest's marker of the test in progress (it changes with every
    test), and opforge's own variables but those ``import opforge`` reads (config.py says which;
    nothing else reads opforge's)."""
    from .. import config

    return name == "PYTEST_CURRENT_TEST" or (name.startswith("OPFORGE_") and name not in config.READ_AT_IMPORT)


class Unavailable(Exception):
    """The fork server could not start, died, or stopped answering."""


class Refused(Exception):
    """The fork server could not start this worker (it says why)."""


class Lost(Exception):
    """The fork server took a worker's request and ended without an answer: a supervisor it
    forked may hold the worker's socket and lifeline. Start the worker with new ones, and keep
    the old lifeline's write end open (closing it would tell such a supervisor that the runner
    died, and it would remove the run's spill folder); it ends when its worker sees its socket
    close."""


class ForkedProcess:
    """A supervisor forked by the fork server, as the runner sees it: Popen's ``pid``,
    ``returncode``, ``poll``, ``wait`` and ``send_signal``. It has ended when its pidfd says so
    (nothing can fake that); its status is the last line on its status pipe (see the module
    doc) once the pipe reads EOF, or, if something still holds the pipe a second after the
    supervisor ended, the last line so far. None at all (a supervisor killed by SIGKILL after
    the fork server died) reads as SIGKILL."""

    #: Seconds the status pipe may stay open after the supervisor ended (the fork server writes
    #: the status and closes it at once).
    GRACE_S = 1.0

    def __init__(self, pid: int, pidfd: int, status_fd: int):
        self.pid, self.returncode = pid, None
        self._pidfd, self._status = pidfd, status_fd
        self._said, self._ended_at = b"", None
        self._lock = threading.Lock()
        os.set_blocking(status_fd, False)

    def poll(self) -> Optional[int]:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            eof = False
            while not eof:
                try:
                    chunk = os.read(self._status, 256)
                except BlockingIOError:
                    break
                eof = not chunk
                self._said = (self._said + chunk)[-256:]
            if not eof and self._ended_at is None and select.select([self._pidfd], [], [], 0)[0]:
                self._ended_at = time.monotonic()
            if eof or (self._ended_at is not None and time.monotonic() - self._ended_at > self.GRACE_S):
                try:
                    self.returncode = int(self._said.split()[-1])
                except (IndexError, ValueError):
                    self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout)
            # The pipe wakes this when the status comes; the pidfd (which stays readable) only
            # until the supervisor has ended.
            watched = [self._status] if self._ended_at is not None else [self._status, self._pidfd]
            select.select(watched, [], [], 0.1 if left is None else min(left, 0.1))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the supervisor, unless it has ended (the pidfd cannot reach a reused pid)."""
        if self.poll() is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def __del__(self):
        for fd in (self._pidfd, self._status):
            try:
                os.close(fd)
            except OSError:
                pass


class _Server:
    """The runner's end of one fork server."""

    def __init__(self, key: tuple, env: dict):
        self.key = key
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._errors = tempfile.TemporaryFile()  # its stderr: what it said, if it fails
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *SERVER_ARGS, str(theirs.fileno())], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self._errors, pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as exc:
            ours.close()
            raise Unavailable(f"{type(exc).__name__}: {exc}") from None
        finally:
            theirs.close()
        self.control = ours
        ours.settimeout(READY_TIMEOUT_S)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready":
            self.close(kill=True)
            raise Unavailable(self.ended())
        ours.settimeout(ANSWER_TIMEOUT_S)

    def start(self, device: str, sock: int, lifeline: int, log: int, spill: str, env: dict) -> ForkedProcess:
        status_read, status_write = os.pipe()
        request = json.dumps({"device": device, "spill": spill, "env": env}).encode()
        sent = False
        try:
            socket.send_fds(self.control, [request], [sock, lifeline, log, status_write])
            sent = True
            reply, fds, _, _ = socket.recv_fds(self.control, 4096, 1)
        except OSError:
            reply, fds = b"", []
        finally:
            os.close(status_write)
        try:
            answer = json.loads(reply) if reply else {}
        except ValueError:
            answer = {}
        if isinstance(answer.get("pid"), int) and len(fds) == 1:
            return ForkedProcess(answer["pid"], fds[0], status_read)
        for fd in [status_read, *fds]:
            os.close(fd)
        if answer.get("error"):
            raise Refused(str(answer["error"]))
        self.close(kill=True)  # dead, or not answering
        raise (Lost if sent else Unavailable)(self.ended())

    @property
    def closed(self) -> bool:
        return self.control.fileno() == -1

    def close(self, kill: bool = False) -> None:
        """Close the control socket: the fork server ends once its supervisors have ended
        (``kill``: now; they live on)."""
        self.control.close()
        if kill:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def ended(self) -> str:
        """How the fork server ended, with the last lines it wrote."""
        code = self.proc.poll()
        if code is None:
            return "it is still running"
        self._errors.seek(0)
        said = self._errors.read().decode("utf-8", "replace").strip().splitlines()[-3:]
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
        return f"it ended ({how})" + (": " + " | ".join(said) if said else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


#: Fork servers kept open, for the environments used last (a test that sets a variable for
#: itself goes back to the one before).
KEEP_SERVERS = 2

_lock = threading.Lock()
_servers: dict[tuple, _Server] = {}  # by key (interpreter, folder, environment), the last used last
_retired: list[_Server] = []  # closed, still serving their supervisors
_given_up: set = set()  # keys whose fork server failed: their workers start a fresh interpreter
_said: set = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.warning("%s; CPU workers start a fresh interpreter each", message)


def _unwanted() -> Optional[str]:
    """Why workers are not forked here, or None."""
    from .. import config

    if not sys.platform.startswith("linux") or not all(
            hasattr(m, a) for m, a in ((os, "fork"), (os, "pidfd_open"), (socket, "send_fds"),
                                       (signal, "pidfd_send_signal"))):
        return "no fork server on this platform"
    try:
        if not config.worker_fork_enabled():
            return ""  # switched off: nothing to say
        # These run a dataset's solutions at `import opforge`, which the fork server must not.
        if config.apply_enabled() or config.tracing_enabled():
            return "no fork server while opforge's apply or tracing is switched on by the environment"
    except ValueError as exc:
        return f"no fork server: {exc}"
    return None


def start_supervised(device: str, env: dict, sock: int, lifeline: int, log: int, spill: str) -> Optional[ForkedProcess]:
    """The supervisor of a new worker on ``device`` with environment ``env``, forked by this
    process's fork server for that environment, interpreter and working folder (started now if
    there is none). None: start the worker as a fresh interpreter instead; ``Lost``: the same,
    with a new socket pair and lifeline (see there).

    The caller keeps its descriptors (the fork server gets copies) and closes them after."""
    # CUDA workers are not forked: each needs a CUDA context of its own, and a process that
    # forks must not have initialised CUDA (a child can use neither the parent's context nor,
    # reliably, the driver state it inherits). A GPU's workers are started ahead of need
    # (device.py's spare), so their start costs no waiting anyway.
    if device != "cpu":
        return None
    why = _unwanted()
    if why is not None:
        if why:
            _say_once(why)
        return None
    own = {name: value for name, value in env.items() if per_worker(name)}
    env = {name: value for name, value in env.items() if name not in own}
    try:
        key = (sys.executable, os.getcwd(), tuple(sorted(env.items())))
    except OSError:  # a working folder that is gone
        return None
    with _lock:
        _retired[:] = [s for s in _retired if s.proc.poll() is None]
        server = _servers.pop(key, None)
        if server is None:
            if key in _given_up:
                return None
            try:
                server = _Server(key, env)
            except Unavailable as exc:
                _given_up.add(key)
                _say_once(f"the fork server of CPU workers did not start ({exc})")
                return None
        _servers[key] = server
        while len(_servers) > KEEP_SERVERS:
            oldest = _servers.pop(next(iter(_servers)))
            oldest.close()
            _retired.append(oldest)
        try:
            return server.start(device, sock, lifeline, log, spill, own)
        except Refused as exc:
            _say_once(f"the fork server could not start a worker ({exc})")
            return None
        except (Unavailable, Lost) as exc:
            _given_up.add(key)
            del _servers[key]
            _say_once(f"the fork server of CPU workers is gone ({exc})")
            if isinstance(exc, Lost):
                raise
            return None


def server_pid() -> Optional[int]:
    """The pid of the fork server of this process's last forked worker, if it is running."""
    server = next(reversed(_servers.values()), None)
    return server.proc.pid if server is not None and server.proc.poll() is None else None


@atexit.register
def _shutdown() -> None:
    for server in [*_servers.values(), *_retired]:
        if not server.closed:
            server.close()


def _forget_in_child() -> None:
    """A fork of the runner (multiprocessing, say) has none of its fork servers: its copies of
    their control sockets would keep them alive after the runner, and mix two processes'
    requests on one socket."""
    global _servers, _retired, _lock
    for server in [*_servers.values(), *_retired]:
        server.control.close()
    _servers, _retired, _lock = {}, [], threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


# --- the fork server ------------------------------------------------------------------------


class _Job:
    """One worker to start: the descriptors and words the runner sent."""

    def __init__(self, message: bytes, fds: list[int]):
        request = json.loads(message)
        env = request.get("env")
        if len(fds) != 4 or request.get("device") != "cpu" or not isinstance(request.get("spill"), str) or \
                not isinstance(env, dict) or not all(per_worker(k) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"not a CPU worker's request: {request!r} with {len(fds)} descriptors")
        self.sock, self.lifeline, self.log, self.status = fds
        self.device, self.spill, self.env = request["device"], request["spill"], env


def _report(fd: int, code: int) -> None:
    try:
        os.write(fd, b"%d\n" % code)
    except OSError:  # the runner no longer reads it
        pass


def _reap(supervisors: dict, poller) -> None:
    """Collect ended children; a supervisor's status goes to its status pipe."""
    for pid, code in supervisor.reaped():
        if pid in supervisors:
            pidfd, report = supervisors.pop(pid)
            poller.unregister(pidfd)
            os.close(pidfd)
            _report(report, code)
            os.close(report)


def _kill_orphans(supervisors: dict, poller) -> None:
    """Children that are not supervisors came here when their supervisor was killed (this
    process is a subreaper): they die with it, as they would have by its hand."""
    for pid in supervisor.children_of(os.getpid()):
        if pid not in supervisors:
            supervisor.kill_tree(pid, include_root=True, reap=lambda: _reap(supervisors, poller))


def _serve(control: socket.socket) -> Optional[_Job]:
    """Fork a supervisor per request until the runner closes the control socket and the last
    supervisor has ended. Returns only in a forked child: its job."""
    import torch

    supervisors: dict[int, tuple[int, int]] = {}  # pid -> (pidfd, status pipe)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    listening = True
    while listening or supervisors:
        for fd, _ in poller.poll():
            if fd != control.fileno():
                _reap(supervisors, poller)
                _kill_orphans(supervisors, poller)
                continue
            try:
                message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
            except OSError:
                message, fds = b"", []
            if not message:  # the runner is done with this server, or gone
                for fd in fds:
                    os.close(fd)
                poller.unregister(control)
                control.close()
                listening = False
                break
            try:
                job = _Job(message, fds)
                if torch.cuda.is_initialized():  # never here, and never to be forked
                    raise RuntimeError("CUDA is initialised in the fork server")
                pid = os.fork()
            except Exception as exc:
                for fd in fds:
                    os.close(fd)
                _answer(control, {"error": f"{type(exc).__name__}: {exc}"})
                continue
            if pid == 0:
                os.close(control.detach())
                return job
            for fd in (job.sock, job.lifeline, job.log):
                os.close(fd)
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:  # (out of descriptors) then no supervisor: it, and any worker, die
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(job.status)
                _kill_orphans(supervisors, poller)
                _answer(control, {"error": f"{type(exc).__name__}: {exc}"})
                continue
            supervisors[pid] = (pidfd, job.status)
            poller.register(pidfd, select.POLLIN)
            _answer(control, {"pid": pid}, [pidfd])
    return None


def _answer(control: socket.socket, answer: dict, fds: list[int] = ()) -> None:
    try:
        socket.send_fds(control, [json.dumps(answer).encode()], list(fds))
    except OSError:  # the runner is gone: its supervisors see their lifelines close
        pass


def _close_all_but(keep: set[int]) -> None:
    low = 0
    for fd in sorted(keep) + [os.sysconf("SC_OPEN_MAX")]:
        if low < fd:  # closerange(n, n) would close everything from n on
            os.closerange(low, fd)
        low = fd + 1


def _supervise(job: _Job, startup_mask: set) -> int:
    """In the child the fork server forked: become the worker's supervisor (supervisor.py's
    settings and ``watch``), after forking the worker. Returns only in the worker: its socket."""
    code = 70
    try:
        _close_all_but({0, 1, 2, job.sock, job.lifeline, job.log, job.status})
        os.setsid()
        for fd in (1, 2):
            os.dup2(job.log, fd)
        os.close(job.log)
        supervisor.prepare()
        supervisor.become_subreaper()
        signal.signal(signal.SIGTERM, supervisor.stop)
        worker = os.fork()
        if worker == 0:
            os.close(job.lifeline)
            os.close(job.status)
            _fresh_worker_state(startup_mask, job.env)
            return job.sock
        os.close(job.sock)
        code = supervisor.watch(worker, job.lifeline, job.spill)
        _report(job.status, code)
        supervisor.leave_like(code)
    except BaseException:
        try:
            traceback.print_exc()
        finally:
            os._exit(code & 0xFF)
    os._exit(code & 0xFF)  # never into the fork server's code, nor its interpreter's exit


def _fresh_worker_state(startup_mask: set, env: dict) -> None:
    """What a worker gets that the fork (and its supervisor) would otherwise leave it."""
    os.environ.update(env)  # the variables ``per_worker`` names, as the runner has them now
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the supervisor's handler
    signal.pthread_sigmask(signal.SIG_SETMASK, startup_mask)  # as it was when this interpreter started
    random.seed()  # also reseeded at fork (CPython's at-fork hook); said here, not assumed
    numpy_random = sys.modules.get("numpy.random")  # where imported (a worker that imports it seeds it)
    if numpy_random is not None:
        numpy_random.seed()
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)


def _run_worker(sock: int, job: _Job) -> None:
    """Run opforge.bench.worker as ``python -m`` does, with a started worker's arguments: as
    ``__main__``, the module of that name not imported (this server imported it for its
    imports; a solution that imports it gets a copy of its own, as in a started worker)."""
    os.set_inheritable(sock, True)  # as a descriptor passed to a started worker is
    package, _, name = WORKER_MODULE.rpartition(".")
    del sys.modules[WORKER_MODULE]
    delattr(sys.modules[package], name)
    sys.argv = [WORKER_MODULE, str(sock), job.device, job.spill]
    runpy.run_module(WORKER_MODULE, run_name="__main__", alter_sys=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(argv[0]))
    startup_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    supervisor.become_subreaper()
    os.close(os.pidfd_open(os.getpid()))  # fails here, not at the first worker, without pidfds
    from . import worker  # noqa: F401 - what a started worker imports before it is ready
    control.send(b"ready")
    job = _serve(control)
    if job is None:
        return 0
    sock = _supervise(job, startup_mask)  # returns in the worker only
    _run_worker(sock, job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
