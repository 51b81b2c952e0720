"""The keeper of one worker process: nothing a worker starts may outlive it, or the run.

    python -m opforge.bench.supervisor LIFELINE_FD SPILL_DIR -- WORKER COMMAND...

Started by the runner (process.py) between itself and a worker; it runs no solution code and
imports nothing but the standard library. It forks first: the process the runner started only
relays the runner's SIGTERM and leaves with the supervisor's status, so that the supervisor
itself is not the runner's child. Whoever kills the runner's children with it (Ray does, when a
device worker of a cluster run dies) then kills the relay, and the supervisor still sees its
lifeline close and does its work. The supervisor makes itself a child subreaper (Linux), so every
process the worker's solutions start, even in a new session or after a double fork, stays in its
tree when its parent dies. When the worker ends (exit, crash, a kill), or the runner asks
(SIGTERM), or the runner dies (the lifeline pipe, whose write end only the runner holds, reads
EOF), it kills its whole tree, reaps it, and exits with the worker's status (a worker killed by a
signal makes it die by the same signal, so the runner can say which). When the runner died, it
also removes the run's spill folder in /dev/shm. The relay is a child subreaper too: a solution
that kills its supervisor hands its worker's tree to the relay, which kills it.

CPU workers are started another way (forkserver.py): a fork server forks the supervisor's
process, which runs ``watch`` below on a worker it forked itself; the fork server stands where
the relay stands here.

What it cannot stop: a process of the same user that kills the supervisor and the relay (or the
fork server) first. Closing that needs a separate user or a PID namespace per worker.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def children_of(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, from /proc (Linux)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] != b"Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def descendants_of(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        found += kids
        todo += kids
    return found


def kill_tree(root: int, include_root: bool = False, reap: Callable[[], None] = lambda: None) -> None:
    """SIGKILL every live descendant of ``root`` (and ``root``), again until none is left: a
    process may fork while the sweep runs. ``reap`` collects the dead where they are our
    children (zombies are not counted as alive)."""
    for _ in range(200):
        pids = descendants_of(root) + ([root] if include_root and pid_alive(root) else [])
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        reap()
        if not pids:
            return
        time.sleep(0.005)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


def reaped():
    """(pid, exit code) of each child that has ended, collected without waiting; a negative code
    is death by that signal."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


class _Children:
    """Reaps finished children (adopted orphans included: they are our children now) and keeps
    the worker's exit status."""

    def __init__(self, worker: int):
        self.worker, self.code = worker, None

    def reap(self) -> None:
        for pid, code in reaped():
            if pid == self.worker:
                self.code = code


class _Stop(Exception):
    pass


def leave_like(code: int) -> int:
    """Exit status ``code``; a negative one is death by that signal, passed on as such."""
    if code < 0:
        sys.stdout.flush()
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled (nor set)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _relay(supervisor: int, fds: list[int]) -> int:
    """The half the runner started (see the module doc): it holds none of the supervisor's
    descriptors, passes a SIGTERM on, and leaves as the supervisor left, after killing what a
    supervisor killed before its time left behind (it came here: this process is a subreaper)."""
    for fd in fds:
        os.close(fd)

    def pass_on(signum, frame):
        try:
            os.kill(supervisor, signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, pass_on)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _, status = os.waitpid(supervisor, 0)  # retried after the handler runs (PEP 475)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kill_tree(os.getpid(), reap=_Children(0).reap)
    return leave_like(os.waitstatus_to_exitcode(status))


def prepare() -> None:
    """A supervisor's own settings, made before its worker starts: no core files (the worker
    inherits the limit), Ctrl-C left to the runner (the worker inherits that too), SIGTERM held
    until ``watch`` can take it (install ``stop`` as its handler first)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing worker leaves no core file behind
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def become_subreaper() -> bool:
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def stop(signum, frame):
    """The supervisor's SIGTERM handler: the runner asks it to end its worker."""
    raise _Stop()


def watch(worker: int, lifeline: int, spill: str) -> int:
    """Supervise ``worker`` (a child of this process, which is a subreaper with ``stop`` as its
    SIGTERM handler, still blocked) until it ends, the runner asks or the runner dies; then kill
    and reap the whole tree, remove the spill folder if the runner died, and return the worker's
    status (negative: the signal that killed it)."""
    children = _Children(worker)
    wake = [lifeline]
    try:  # readable when the worker ends, so that its end is seen at once
        wake.append(os.pidfd_open(worker))
    except (AttributeError, OSError):  # no pidfds (not Linux 5.3+): the 0.1 s timeout sees it
        pass
    runner_gone = False
    try:  # the runner's SIGTERM ends this wait
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while children.code is None:
            readable, _, _ = select.select(wake, [], [], 0.1)
            if lifeline in readable and not os.read(lifeline, 1):
                runner_gone = True
                break
            children.reap()
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if children.code is None:  # the worker first, also where there is no /proc to walk
        try:
            os.kill(children.worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_tree(os.getpid(), reap=children.reap)
    for fd in wake[1:]:
        os.close(fd)
    if runner_gone and spill:
        shutil.rmtree(spill, ignore_errors=True)
    return -signal.SIGKILL if children.code is None else children.code


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lifeline, spill = int(argv[0]), argv[1]
    command = argv[argv.index("--") + 1:]
    prepare()
    keep = [int(fd) for fd in os.environ.pop("OPFORGE_WORKER_FDS", "").split(",") if fd]
    become_subreaper()  # the relay's (a forked child does not inherit it)
    supervisor = os.fork()
    if supervisor:
        return _relay(supervisor, [lifeline, *keep])
    become_subreaper()
    signal.signal(signal.SIGTERM, stop)
    worker = subprocess.Popen(command, pass_fds=keep, stdin=subprocess.DEVNULL, preexec_fn=lambda: (
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))).pid
    for fd in keep:
        os.close(fd)
    return leave_like(watch(worker, lifeline, spill))


if __name__ == "__main__":
    sys.exit(main())
