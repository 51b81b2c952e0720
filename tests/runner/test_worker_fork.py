"""CPU workers forked by the fork server (opforge.bench.forkserver), tried as a hostile solution
would: a forked worker is set up as a started one (environment, paths, descriptors, signals,
session, log) and holds nothing of the fork server's or of other workers' (no control socket, no
shared random state); a solution that kills its supervisor or the fork server takes down at most
itself, and what it started dies with it; forking switched off, impossible or failing leaves
workers starting a fresh interpreter, said once."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_runner_trust import _dataset, _links, _running, _statuses, _wait_gone  # noqa: E402
from adversaries import START_DAEMON  # noqa: E402
from runner_datasets import config  # noqa: E402

from opforge.bench import Benchmark  # noqa: E402
from opforge.bench import forkserver  # noqa: E402
from opforge.bench.process import WorkerFailure, WorkerProcess, worker_environment  # noqa: E402
from opforge.bench.supervisor import children_of  # noqa: E402

pytestmark = pytest.mark.skipif(forkserver._unwanted() == "no fork server on this platform",
                                reason="forking workers needs Linux with pidfds")

# Loaded by a worker (a "discover" request): writes what its process looks like to a file named
# after it in OUT (a folder written in here: no variable of the test changes the environment,
# which would start another fork server).
PROBE = """
import faulthandler, json, os, random, sys

def link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None

fds = {fd: link(fd) for fd in os.listdir("/proc/self/fd")}
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
main = sys.modules["__main__"]
try:
    import numpy
    numpy_draw = int(numpy.random.randint(0, 2**62))
except ImportError:
    numpy_draw = None
import multiprocessing
print("probe ran", flush=True)
with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
    json.dump({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "env": dict(os.environ), "path": sys.path, "argv": sys.argv, "cwd": os.getcwd(),
        "fds": {k: v for k, v in fds.items() if v is not None},
        "inheritable": {k: os.get_inheritable(int(k)) for k, v in fds.items() if v is not None},
        "signals": {k: status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")},
        "faulthandler": faulthandler.is_enabled(), "main": [main.__name__, main.__file__],
        "worker_imported": "opforge.bench.worker" in sys.modules,
        "random": random.getrandbits(64), "numpy": numpy_draw,
        "authkey": multiprocessing.current_process().authkey.hex(),
    }, f)
"""


@pytest.fixture
def own_fork_server(monkeypatch):
    """A fork server of this test's own: what the test does to it (kill it, make it fail)
    reaches no other test of this process, whose fork server is set aside meanwhile."""
    for name, value in (("_servers", {}), ("_retired", []), ("_given_up", set()), ("_said", set())):
        monkeypatch.setattr(forkserver, name, value)
    monkeypatch.delenv("OPFORGE_WORKER_FORK", raising=False)
    yield forkserver
    for server in [*forkserver._servers.values(), *forkserver._retired]:
        server.close(kill=True)


@pytest.fixture
def probe(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    path = tmp_path / "probe_module.py"
    path.write_text(f"OUT = {str(out)!r}\n{PROBE}")

    def run(worker: WorkerProcess) -> dict:
        before = set(out.iterdir())
        reply = worker.request({"op": "discover", "modules": [str(path)]}, timeout=60)
        assert "error" not in reply, reply
        (new,) = set(out.iterdir()) - before
        return json.loads(new.read_text())

    return run


def test_a_forked_worker_is_set_up_as_a_started_one(tmp_path, monkeypatch, probe):
    """(With this process's fork server, as the tests before it left it.)"""
    monkeypatch.delenv("OPFORGE_WORKER_FORK", raising=False)
    other = WorkerProcess("cpu", tmp_path / "logs")  # another solution's, alive meanwhile
    forked, started = WorkerProcess("cpu", tmp_path / "logs"), WorkerProcess("cpu", tmp_path / "logs")
    try:
        other.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)
        seen = probe(forked)
        server, supervisor = forkserver.server_pid(), forked._proc.pid
        server_fds, supervisor_fds = _links(server), _links(supervisor)
        assert isinstance(forked._proc, forkserver.ForkedProcess)
        monkeypatch.setenv("OPFORGE_WORKER_FORK", "0")
        fresh = probe(started)
        monkeypatch.delenv("OPFORGE_WORKER_FORK")
        assert isinstance(started._proc, subprocess.Popen)
    finally:
        for worker in (other, forked, started):
            worker.stop()
    fresh["env"].pop("OPFORGE_WORKER_FORK")
    for key in ("env", "path", "cwd", "signals", "faulthandler", "main", "worker_imported"):
        assert seen[key] == fresh[key], (key, seen[key], fresh[key])
    assert seen["argv"][0] == fresh["argv"][0] and seen["argv"][2:] == fresh["argv"][2:]
    assert seen["signals"]["SigBlk"] == "0000000000000000"
    ignored = int(seen["signals"]["SigIgn"], 16)
    assert ignored & (1 << (signal.SIGINT - 1)) and not ignored & (1 << (signal.SIGTERM - 1))
    # Its descriptors: stdin /dev/null, stdout and stderr its own log, its socket; nothing else.
    for got, worker in ((seen, forked), (fresh, started)):
        sock = got["argv"][1]
        assert set(got["fds"]) == {"0", "1", "2", sock}, got["fds"]
        assert got["fds"]["0"] == "/dev/null" and got["fds"]["1"] == got["fds"]["2"] == str(worker.log_path)
        assert got["fds"][sock].startswith("socket:") and all(got["inheritable"].values())
        assert "probe ran" in worker.log_path.read_text()
    # None of them is the fork server's (the control socket) or reaches it; the supervisor
    # holds no socket at all (it closed the worker's after forking it).
    server_sockets = {v for v in server_fds.values() if v.startswith("socket:")}
    assert len(server_sockets) == 1 and seen["fds"][seen["argv"][1]] not in server_sockets
    assert not any(v.startswith("socket:") for v in supervisor_fds.values()), supervisor_fds
    # The supervisor: stdio, its lifeline, its status pipe (of the two the fork server holds,
    # the other worker's being the other), a pidfd of its worker.
    assert sorted(supervisor_fds.values()) == sorted(["/dev/null", str(forked.log_path), str(forked.log_path),
                                                      "anon_inode:[pidfd]", *[v for v in supervisor_fds.values()
                                                                              if v.startswith("pipe:")]])
    server_pipes = {v for v in server_fds.values() if v.startswith("pipe:")}
    supervisor_pipes = [v for v in supervisor_fds.values() if v.startswith("pipe:")]
    assert len(server_pipes) >= 2 and len(supervisor_pipes) == 2 and len(server_pipes & set(supervisor_pipes)) == 1
    # Its own session and process group (its supervisor's), as a started one has (its relay's).
    assert seen["ppid"] == supervisor and seen["sid"] == seen["pgid"] == supervisor
    assert fresh["sid"] == fresh["pgid"] != os.getsid(0)


def test_forked_workers_share_no_random_state(tmp_path, monkeypatch, probe):
    monkeypatch.delenv("OPFORGE_WORKER_FORK", raising=False)
    workers = [WorkerProcess("cpu", tmp_path) for _ in range(3)]
    try:
        seen = [probe(w) for w in workers]
    finally:
        for w in workers:
            w.stop()
    assert all(isinstance(w, dict) for w in seen)
    for key in ("random", "numpy", "authkey"):
        values = [s[key] for s in seen]
        assert len(set(values)) == len(values), (key, values)


def test_workers_started_from_several_threads_at_once_each_get_their_own(tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_WORKER_FORK", raising=False)
    workers = [WorkerProcess("cpu", tmp_path) for _ in range(4)]
    errors = []

    def start(worker):
        try:
            worker.request({"op": "load", "key": "k", "input_sets": []}, timeout=120)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(w,)) for w in workers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert all(isinstance(w._proc, forkserver.ForkedProcess) for w in workers)
        supervisors = [w._proc.pid for w in workers]
        assert len(set(supervisors)) == 4
        assert set(supervisors) <= set(children_of(forkserver.server_pid()))  # one fork server
    finally:
        for w in workers:
            w.stop()


def test_a_changed_environment_or_folder_gets_its_own_fork_server(tmp_path, monkeypatch, own_fork_server, probe):
    """The fork servers of the last two environments stay; an older one ends once the workers
    it started have. A variable no import reads (opforge's, but those read at import) needs no
    fork server of its own: it is set in the worker."""
    workers = {name: WorkerProcess("cpu", tmp_path / "logs") for name in ("first", "second", "again", "third")}
    servers, seen = {}, {}
    value, own = f"{random.getrandbits(64):x}", f"{random.getrandbits(64):x}"
    monkeypatch.chdir(tmp_path)
    try:
        for name, worker in workers.items():
            if name == "second":  # a variable, and the working folder
                monkeypatch.setenv("FORKSERVER_TEST_VALUE", value)
                (tmp_path / "elsewhere").mkdir()
                monkeypatch.chdir(tmp_path / "elsewhere")
            if name == "again":  # back to the first environment, but for a variable of opforge's
                monkeypatch.delenv("FORKSERVER_TEST_VALUE")
                monkeypatch.chdir(tmp_path)
                monkeypatch.setenv("OPFORGE_TEST_VALUE", own)
            if name == "third":
                monkeypatch.setenv("FORKSERVER_TEST_VALUE", "third")
            seen[name] = probe(worker)
            servers[name] = own_fork_server.server_pid()
        assert "FORKSERVER_TEST_VALUE" not in seen["first"]["env"] and seen["first"]["cwd"] == str(tmp_path)
        assert seen["second"]["env"]["FORKSERVER_TEST_VALUE"] == value
        assert seen["second"]["cwd"] == str(tmp_path / "elsewhere")
        assert seen["again"]["env"] == dict(seen["first"]["env"], OPFORGE_TEST_VALUE=own)
        assert seen["again"]["cwd"] == str(tmp_path)
        assert seen["third"]["env"]["FORKSERVER_TEST_VALUE"] == "third"
        assert servers["again"] == servers["first"]
        assert len({servers["first"], servers["second"], servers["third"]}) == 3
        # The second environment's fork server, the least recently used of three, is closed
        # but still serves its worker.
        assert _running(servers["second"])
        assert workers["second"].request({"op": "load", "key": "k", "input_sets": []}, timeout=60) is not None
    finally:
        for worker in workers.values():
            worker.stop()
    assert _wait_gone([servers["second"]]) == []
    assert _running(servers["first"]) and _running(servers["third"])


KILLS_ITS_SUPERVISOR = """
import os, signal, time

PIDS = PIDS_FOLDER
""" + START_DAEMON + """
def daemons():
    return {name for name in os.listdir(PIDS) if name.startswith("daemon-")}

def run(x, w):
    open(os.path.join(PIDS, f"worker-{os.getpid()}"), "w").close()
    before = daemons()
    start_daemon(PIDS)
    # This workload's daemon, not an earlier workload's, must be on record before the kill.
    while not daemons() - before:
        time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
    return x * w
"""

# Finds the fork server (its supervisor's parent, when it is one) and kills it, then goes on.
KILLS_THE_FORK_SERVER = """
import os, signal

PIDS = os.environ["OPFORGE_TEST_PIDS"]

def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def run(x, w):
    supervisor = os.getppid()
    server = parent_of(supervisor)
    with open(f"/proc/{server}/cmdline", "rb") as f:
        if b"opforge.bench.forkserver" in f.read():
            open(os.path.join(PIDS, f"server-{server}"), "w").close()
            os.kill(server, signal.SIGKILL)
    open(os.path.join(PIDS, f"worker-{os.getpid()}"), "w").close()
    open(os.path.join(PIDS, f"supervisor-{supervisor}"), "w").close()
    return x * w
"""

RECORDS_ITS_START = """
import os

with open("/proc/self/cmdline", "rb") as f:
    started = b"opforge.bench.worker" in f.read()
open(os.path.join(os.environ["OPFORGE_TEST_PIDS"], f"after-{os.getpid()}-{int(started)}"), "w").close()

def run(x, w):
    return x * w
"""

HONEST = "def run(x, w):\n    return x * w\n"


def _pids(folder: Path, kind: str) -> list[int]:
    return [int(p.name.split("-")[1]) for p in folder.iterdir() if p.name.startswith(f"{kind}-")]


@pytest.mark.parametrize("fork", [pytest.param("1", id="forked"), pytest.param("0", id="exec")])
def test_a_solution_that_kills_its_supervisor_takes_down_only_its_own_worker(tmp_path, monkeypatch, fork):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("OPFORGE_WORKER_FORK", fork)
    killer = KILLS_ITS_SUPERVISOR.replace("PIDS_FOLDER", repr(str(pids)))
    ts = _dataset(tmp_path / "ds", {"honest": HONEST, "killer": killer})
    traces = Benchmark(ts, config()).run_all()
    # The honest solution's worker, alive meanwhile, goes on to the second workload.
    assert _statuses(traces) == {"honest": {"PASSED"}, "killer": {"RUNTIME_ERROR"}}
    for t in traces:
        if t.solution.endswith("killer"):
            assert "the worker process died (SIGKILL)" in t.evaluation.log, t.evaluation.log
    # Its worker (once per workload) and the daemon it left: killed, though their supervisor
    # was gone, by whoever it handed them to (the fork server, or the relay).
    workers, daemons = _pids(pids, "worker"), _pids(pids, "daemon")
    assert len(workers) == len(daemons) == 2
    assert _wait_gone(workers + daemons) == []


def test_a_solution_that_kills_the_fork_server_leaves_the_run_going(tmp_path, monkeypatch, own_fork_server,
                                                                   caplog):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("OPFORGE_TEST_PIDS", str(pids))
    ts = _dataset(tmp_path / "ds", {"honest": HONEST, "killer": KILLS_THE_FORK_SERVER, "zz_after": RECORDS_ITS_START})
    with caplog.at_level(logging.WARNING, logger="opforge.bench"):
        traces = Benchmark(ts, config()).run_all()
    # The killer's worker lives on under its supervisor (which reports its own status now);
    # the workers after it start a fresh interpreter, said once.
    assert _statuses(traces) == {"honest": {"PASSED"}, "killer": {"PASSED"}, "zz_after": {"PASSED"}}
    (server,) = _pids(pids, "server")
    assert not _running(server)
    said = [r.getMessage() for r in caplog.records if r.name == "opforge.bench"]
    assert len(said) == 1 and "is gone" in said[0] and "fresh interpreter" in said[0], said
    assert [p.name.rsplit("-", 1)[1] for p in pids.iterdir() if p.name.startswith("after-")] == ["1"]
    assert _wait_gone(_pids(pids, "worker") + _pids(pids, "supervisor")) == []


def test_a_worker_outlives_its_fork_server_and_still_reports_its_exit_status(tmp_path, own_fork_server, caplog):
    leaves = tmp_path / "leaves.py"
    code = random.randint(3, 120)
    leaves.write_text(f"import os\nprint('leaving', flush=True)\nos._exit({code})\n")
    first, second = WorkerProcess("cpu", tmp_path), WorkerProcess("cpu", tmp_path)
    try:
        first.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)
        server = own_fork_server.server_pid()
        os.kill(server, signal.SIGKILL)
        assert _wait_gone([server]) == []
        with caplog.at_level(logging.WARNING, logger="opforge.bench"):
            second.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)
        assert isinstance(second._proc, subprocess.Popen)  # started, the fork server being gone
        assert len([r for r in caplog.records if r.name == "opforge.bench" and "is gone" in r.getMessage()]) == 1
        with pytest.raises(WorkerFailure, match=f"the worker process died \\(exit code {code}\\)") as info:
            first.request({"op": "discover", "modules": [str(leaves)]}, timeout=60)
        assert "leaving" in info.value.log
    finally:
        first.stop()
        second.stop()


# A fork server that dies at the worst time: it has forked a supervisor for the request (which
# holds the worker's socket and lifeline) and ends before it answers. The supervisor writes
# "eof" to MARK if its lifeline closes (it would then remove the run's spill folder).
DIES_BEFORE_ANSWERING = """
import os, select, socket, sys
control = socket.socket(fileno=int(sys.argv[-1]))
control.send(b"ready")
message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
sock, lifeline, log, status = fds
if os.fork() == 0:
    control.close()  # as the fork server's children do
    open(MARK + ".pid", "w").write(str(os.getpid()))
    select.select([lifeline], [], [])
    if not os.read(lifeline, 1):
        open(MARK, "w").write("eof")
    os._exit(0)
os._exit(0)
"""


def test_a_fork_server_that_dies_mid_request_costs_no_spill_folder(tmp_path, monkeypatch, own_fork_server, caplog):
    mark = tmp_path / "lifeline"
    server = DIES_BEFORE_ANSWERING.replace("MARK", repr(str(mark)))
    monkeypatch.setattr(forkserver, "SERVER_ARGS", ["-c", server])
    caplog.set_level(logging.WARNING, logger="opforge.bench")
    worker = WorkerProcess("cpu", tmp_path)
    try:
        worker.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)  # on new descriptors
        assert isinstance(worker._proc, subprocess.Popen)
    finally:
        worker.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "opforge.bench"]
    assert len(said) == 1 and "is gone" in said[0], said
    stray = int(Path(f"{mark}.pid").read_text())
    try:
        time.sleep(0.5)
        assert _running(stray) and not mark.exists()  # its lifeline is still open
    finally:
        os.kill(stray, signal.SIGKILL)


def test_workers_start_a_fresh_interpreter_where_forking_is_off_or_fails(tmp_path, monkeypatch, own_fork_server,
                                                                        caplog):
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "opforge.bench"]

    def start() -> type:
        """A worker's supervisor handle once it answered."""
        worker = WorkerProcess("cpu", tmp_path)
        try:
            worker.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)
            return type(worker._proc)
        finally:
            worker.stop()

    def ask() -> object:
        """What the fork server gives a CPU worker now, without starting one when it is None."""
        return own_fork_server.start_supervised("cpu", worker_environment(), -1, -1, -1, "")

    caplog.set_level(logging.WARNING, logger="opforge.bench")
    monkeypatch.setenv("OPFORGE_WORKER_FORK", "0")
    assert start() is subprocess.Popen
    assert not own_fork_server._servers and not said()  # switched off: nothing to say
    monkeypatch.setenv("OPFORGE_WORKER_FORK", "maybe")
    assert ask() is None and ask() is None
    assert len(said()) == 1 and "OPFORGE_WORKER_FORK='maybe'" in said()[0], said()
    caplog.clear()
    monkeypatch.delenv("OPFORGE_WORKER_FORK")
    code = random.randint(3, 120)
    monkeypatch.setattr(forkserver, "SERVER_ARGS", ["-c", f"import sys; print('no torch here', file=sys.stderr); "
                                                          f"sys.exit({code})"])
    assert start() is subprocess.Popen
    assert ask() is None  # not tried again for the same environment, nor said again
    (message,) = said()
    assert "did not start" in message and f"exit code {code}" in message and "no torch here" in message, message


def test_a_stopped_worker_runs_its_exit_handlers_and_leaves_nothing(tmp_path, monkeypatch, probe):
    """A worker ends without the interpreter's teardown (worker.py's _end_here), but after the
    exit handlers a solution registered, and with what it printed in its log."""
    monkeypatch.delenv("OPFORGE_WORKER_FORK", raising=False)
    mark = tmp_path / f"exited-{random.getrandbits(32):x}"
    module = tmp_path / "at_exit.py"
    module.write_text(f"import atexit\n\natexit.register(lambda: open({str(mark)!r}, 'w').write('bye'))\n"
                      "print('unflushed', end='')\n")
    worker = WorkerProcess("cpu", tmp_path)
    try:
        assert "error" not in worker.request({"op": "discover", "modules": [str(module)]}, timeout=60)
        handle = worker._proc
        tree = [handle.pid, *children_of(handle.pid)]
    finally:
        worker.stop()
    assert handle.returncode == 0 and mark.read_text() == "bye"
    assert worker.log_path.read_text().endswith("unflushed")
    assert _wait_gone(tree) == []


def test_only_cpu_workers_are_forked(tmp_path, own_fork_server):
    """A GPU worker needs a CUDA context of its own: it never comes from the fork server (here
    without starting it: the answer comes before any process starts)."""
    for device in ("cuda:0", "cuda:1"):
        assert forkserver.start_supervised(device, dict(os.environ), -1, -1, -1, "") is None
    assert not own_fork_server._servers
