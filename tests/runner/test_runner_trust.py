"""The runner's trust split, tried as a hostile contributor would: nothing a worker sends can run
code in the parent or end the run, no solution can change another's timing, its own timing must
fit the runner's clock, and nothing a run starts outlives it (also when the runner is killed)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from adversaries import START_DAEMON  # noqa: E402
from registry_helpers import mul_definition, solution  # noqa: E402
from test_runner import DEF, config  # noqa: E402

from opforge.bench import Benchmark, Settings  # noqa: E402
from opforge.bench.supervisor import pid_alive  # noqa: E402
from opforge.trace import TraceSet, Workload  # noqa: E402

HONEST = "def run(x, w):\n    return x * w\n"

# Its output's __reduce__ would create the marker file wherever it was unpickled.
REDUCE = """
import os

class Payload:
    def __reduce__(self):
        return (open, (os.environ["OPFORGE_TEST_MARK"], "w"))

def run(x, w):
    return Payload()
"""

# Frames written straight onto the worker's socket (multiprocessing's 4-byte length framing):
# the parent reads them as the reply.
GARBAGE = """
import os, struct, sys

def run(x, w):
    frame = b"\\x80\\x04garbage, not a reply"
    os.write(int(sys.argv[1]), struct.pack("!i", len(frame)) + frame)
    return x * w
"""
PICKLED_REPLY = """
import os, pickle, struct, sys

class Payload:
    def __reduce__(self):
        return (open, (os.environ["OPFORGE_TEST_MARK"], "w"))

def run(x, w):
    frame = pickle.dumps({"records": [], "healthy": True, "evil": Payload()})
    os.write(int(sys.argv[1]), struct.pack("!i", len(frame)) + frame)
    return x * w
"""

SLOW = "import time\n\ndef run(x, w):\n    time.sleep(0.002)\n    return x * w\n"
# Replaces every timer it can reach, as soon as it is imported: the module's, the worker
# module's, and the one the running worker holds.
TIMER_CHEAT = """
import gc, time
from opforge.bench import timing, worker

FAKE = dict(median_ms=0.004, p10_ms=0.004, p90_ms=0.004, min_ms=0.004, max_ms=0.004, stdev_ms=0.0,
            iterations=ITERATIONS, method="host_clock")

def fake(*args, **kwargs):
    return dict(FAKE)

timing.time_cpu = timing.time_cuda = worker.time_cpu = worker.time_cuda = fake
for obj in gc.get_objects():  # the running worker (its class lives in __main__)
    if type(obj).__name__ == "Worker" and hasattr(obj, "_timer"):
        obj._timer = fake

def run(x, w):
    time.sleep(0.002)
    return x * w
"""

# Starts a process in a new session and a double-forked daemon, then (optionally) leaves.
SPAWNER = """
import os, subprocess, sys, time

PIDS = os.environ["OPFORGE_TEST_PIDS"]
started = []
""" + START_DAEMON + """
def spawn():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    open(os.path.join(PIDS, f"session-{p.pid}"), "w").close()
    start_daemon(PIDS)

def run(x, w):
    if not started:
        started.append(1)
        spawn()
    EXIT
    return x * w
"""


def _dataset(root: Path, sources: dict) -> TraceSet:
    ts = TraceSet(root)
    ts.add_definition(mul_definition())
    for batch in (4, 32):
        ts.add_workload(DEF, Workload(uuid=f"b{batch}", axes={"batch": batch},
                                      inputs={"x": {"type": "random"}, "w": {"type": "random"}}))
    for name, text in sources.items():
        ts.add_solution(solution(f"{DEF}_{name}", text))
    ts.save(root)
    return TraceSet.load(root)


def _statuses(traces) -> dict:
    out: dict = {}
    for t in traces:
        out.setdefault(t.solution.removeprefix(f"{DEF}_"), set()).add(t.evaluation.status.value)
    return out


def _wait_gone(pids, seconds=10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _running(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:  # a zombie is dead, waiting for its parent to read its status
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_nothing_a_worker_sends_runs_code_here_or_ends_the_run(tmp_path, monkeypatch):
    mark = tmp_path / "unpickled"
    monkeypatch.setenv("OPFORGE_TEST_MARK", str(mark))
    ts = _dataset(tmp_path / "ds", {"honest": HONEST, "reduce": REDUCE, "garbage": GARBAGE,
                                    "pickled_reply": PICKLED_REPLY, "zz_after": HONEST})
    traces = Benchmark(ts, config()).run_all()
    got = _statuses(traces)
    assert got == {"honest": {"PASSED"}, "reduce": {"INCORRECT_SHAPE"}, "garbage": {"RUNTIME_ERROR"},
                   "pickled_reply": {"RUNTIME_ERROR"}, "zz_after": {"PASSED"}}, got
    assert not mark.exists()  # no process unpickled the payload
    logs = {t.solution.removeprefix(f"{DEF}_"): t.evaluation.log for t in traces}
    assert "returned Payload, not a tensor" in logs["reduce"]
    assert "malformed reply" in logs["garbage"] and "malformed reply" in logs["pickled_reply"]


def test_a_patched_timer_reaches_no_other_solution(tmp_path):
    settings = Settings(iterations=30, warmup=1, max_time_s=5, timeout_s=20, cuda_graph=False)
    cheat = TIMER_CHEAT.replace("ITERATIONS", str(settings.iterations))
    ts = _dataset(tmp_path / "ds", {"honest": SLOW, "cheat": cheat, "zz_after": SLOW})
    traces = Benchmark(ts, config(defaults=settings)).run_all()
    assert _statuses(traces) == {"honest": {"PASSED"}, "cheat": {"PASSED"}, "zz_after": {"PASSED"}}
    for t in traces:
        perf = t.evaluation.performance
        if t.solution.endswith("cheat"):
            assert perf.latency_ms == 0.004  # on a CPU a lie this small fits the clock
        else:  # the baseline before it and the solution after it: their own 2 ms calls
            assert perf.latency_ms >= 2.0, (t.solution, perf.latency_ms)
            assert perf.baseline_latency_ms >= 2.0


def test_a_timing_that_does_not_fit_the_runners_clock_is_suspect(tmp_path):
    settings = Settings(iterations=30, warmup=1, max_time_s=5, timeout_s=20, cuda_graph=False)
    cheat = TIMER_CHEAT.replace("ITERATIONS", "12")  # stopped early, but long before the budget ran out
    ts = _dataset(tmp_path / "ds", {"honest": SLOW, "cheat": cheat})
    traces = Benchmark(ts, config(defaults=settings)).run_all()
    for t in traces:
        suspect = t.evaluation.performance.suspect
        if t.solution.endswith("cheat"):
            assert suspect and suspect.startswith("timing does not fit the runner's clock"), suspect
        else:
            assert suspect is None, suspect


@pytest.mark.parametrize("leaves", [False, True], ids=["stays", "exits"])
def test_nothing_a_solution_starts_outlives_the_run(tmp_path, monkeypatch, leaves):
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("OPFORGE_TEST_PIDS", str(pids))
    spawner = SPAWNER.replace("EXIT", "os._exit(3)" if leaves else "pass")
    ts = _dataset(tmp_path / "ds", {"spawner": spawner})
    traces = Benchmark(ts, config()).run_all()
    assert _statuses(traces) == {"spawner": {"RUNTIME_ERROR" if leaves else "PASSED"}}
    started = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(started) >= 2 and {p.name.split("-")[0] for p in pids.iterdir()} == {"session", "daemon"}
    assert _wait_gone(started) == []


KILLED_RUNNER = """
import sys
sys.path[:0] = {paths!r}
from test_runner_trust import _dataset, HANG
from test_runner import config
from opforge.bench import Benchmark, Settings
ts = _dataset(__import__("pathlib").Path({root!r}), {{"hang": HANG}})
Benchmark(ts, config(defaults=Settings(iterations=5, warmup=1, timeout_s=600, cuda_graph=False))).run_all()
"""
HANG = SPAWNER.replace("EXIT", "open(os.path.join(PIDS, f'worker-{os.getpid()}'), 'w').close(); time.sleep(600)")

#: How workers start: forked by the fork server (CPU workers, by default), or each a fresh
#: interpreter under a started supervisor (OPFORGE_WORKER_FORK=0, and every GPU worker).
STARTS = [pytest.param("1", id="forked"), pytest.param("0", id="exec")]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("fork", STARTS)
def test_a_killed_runner_leaves_no_process_and_no_shared_memory_behind(tmp_path, fork):
    from opforge.bench.supervisor import children_of, descendants_of

    pids = tmp_path / "pids"
    pids.mkdir()
    here = Path(__file__).resolve()
    script = KILLED_RUNNER.format(paths=[str(here.parent), str(here.parents[1] / "registry")],
                                  root=str(tmp_path / "ds"))
    runner = subprocess.Popen([sys.executable, "-c", script],
                              env=dict(os.environ, OPFORGE_TEST_PIDS=str(pids), OPFORGE_WORKER_FORK=fork))
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 3 and time.monotonic() < deadline:
        assert runner.poll() is None, "the runner ended before its worker hung"
        time.sleep(0.2)
    started = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(started) == 3  # the worker, a process in a new session, a daemon
    spill = list(Path("/dev/shm").glob(f"opforge-run-{runner.pid}-*"))
    assert spill
    # Every process of the run: supervisors (and their relays), workers, what the solution
    # started, the fork server.
    ours = descendants_of(runner.pid)
    assert set(started) <= set(ours) and len(ours) >= 5, ours
    # (forked processes have the fork server's command line)
    servers = [pid for pid in children_of(runner.pid) if b"opforge.bench.forkserver" in _cmdline(pid)]
    assert len(servers) == (1 if fork == "1" else 0)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert _wait_gone(ours) == []
    deadline = time.monotonic() + 10
    while any(p.exists() for p in spill) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.exists() for p in spill)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@functools.lru_cache(maxsize=None)
def _torch_import_cpu_s() -> float:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _links(pid: int) -> dict:
    """fd -> what it points at, for the open descriptors of ``pid``. One closed between listing
    the folder and reading its link (the fork server closes a stopped worker's connection on its
    own time) is not open: it is left out."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return found


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("fork", STARTS)
def test_a_worker_start_costs_no_torch_import_in_the_processes_that_only_watch(tmp_path, monkeypatch, fork):
    """A worker start costs its supervisor's processes too: one that imported opforge (and with
    it torch) would add a second or two of CPU to each, for a process that only watches. A
    started supervisor does not even map torch; a forked one (and its worker) does, from the
    fork server, without paying for it: a forked worker start costs a small part of one import
    of torch."""
    from opforge.bench import forkserver
    from opforge.bench.process import WorkerProcess
    from opforge.bench.supervisor import children_of, descendants_of

    monkeypatch.setenv("OPFORGE_WORKER_FORK", fork)
    torch_cpu = _torch_import_cpu_s()
    for attempt in range(2 if fork == "1" else 1):  # the fork server is up for the second one
        worker = WorkerProcess("cpu", tmp_path)
        try:
            worker.request({"op": "load", "key": "k", "input_sets": []}, timeout=60)  # no torch work
            tree = [worker._proc.pid, *descendants_of(worker._proc.pid)]
            maps = {pid: Path(f"/proc/{pid}/maps").read_text() for pid in tree}
            commands = {pid: _cmdline(pid).split(b"\0") for pid in tree}
            cpu = {pid: _cpu_s(pid) for pid in tree}
            workers = children_of(tree[-2])  # the supervisor's: relay, supervisor, worker or supervisor, worker
            handle, server = type(worker._proc), forkserver.server_pid()
        finally:
            worker.stop()
    with_torch = [pid for pid in tree if "libtorch" in maps[pid]]
    assert len(workers) == 1, commands
    watchers = [pid for pid in tree if pid not in workers]
    assert all(cpu[pid] < torch_cpu / 5 for pid in watchers), (cpu, torch_cpu)
    if fork == "0":
        assert handle is subprocess.Popen
        assert len(tree) == 3 and with_torch == workers, commands  # relay, supervisor, worker
        assert b"opforge.bench.worker" in commands[workers[0]]
        return
    assert handle is forkserver.ForkedProcess and server is not None
    assert len(tree) == 2 and with_torch == tree, commands  # supervisor, worker: mapped, not loaded
    assert cpu[workers[0]] + cpu[tree[0]] < torch_cpu / 5, (cpu, torch_cpu)
    # The fork server imported torch and ran nothing of it: no OpenMP threads, and no CUDA
    # (a CUDA build maps the driver's library; initialising it opens the GPU's device files).
    assert "libtorch" in Path(f"/proc/{server}/maps").read_text()
    opened = list(_links(server).values())
    assert not [path for path in opened if path.startswith("/dev/nvidia")], opened
    if (os.cpu_count() or 1) > 1:  # an intra-op pool has a thread per core beside this one
        assert os.listdir(f"/proc/{server}/task") == [str(server)]


def test_a_module_that_fails_or_hangs_at_import_is_one_line_and_bounded(tmp_path):
    ts = _dataset(tmp_path / "ds", {"honest": HONEST})
    broken = tmp_path / "broken_kernels.py"
    broken.write_text("import os\n\nraise RuntimeError('this module needs a GPU')\n")
    with pytest.raises(ValueError) as info:
        Benchmark(ts, config(modules=[str(broken)])).run_all()
    first = str(info.value).splitlines()[0]
    assert "broken_kernels.py" in first and "RuntimeError: this module needs a GPU" in first and ":3)" in first
    slow = tmp_path / "slow_kernels.py"
    slow.write_text("import time\n\ntime.sleep(60)\n")
    start = time.monotonic()
    with pytest.raises(ValueError, match="no answer within 2 s"):
        Benchmark(ts, config(modules=[str(slow)], overrides={"timeout_s": 2})).run_all()
    assert time.monotonic() - start < 40  # the timeout, plus starting the worker


def test_a_baseline_from_an_earlier_run_is_said_so(tmp_path):
    ts = _dataset(tmp_path / "ds", {"honest": HONEST, "other": HONEST})
    first = Benchmark(ts, config(solutions=[f"{DEF}_honest"])).run_all()
    ts = TraceSet.load(tmp_path / "ds")
    later = Benchmark(ts, config(solutions=[f"{DEF}_other"])).run_all()
    when = {t.workload.uuid: {"timestamp": t.evaluation.timestamp, "seed": t.evaluation.seed} for t in first}
    for t in later:
        perf = t.evaluation.performance
        assert perf.baseline_solution == f"{DEF}_honest"
        assert perf.timing["baseline_earlier"] == when[t.workload.uuid]
    both = Benchmark(TraceSet.load(tmp_path / "ds"), config()).run_all()
    assert all("baseline_earlier" not in t.evaluation.performance.timing for t in both)


def test_unknown_names_and_devices_are_refused_before_anything_runs(tmp_path):
    ts = _dataset(tmp_path / "ds", {"honest": HONEST})
    with pytest.raises(ValueError, match="no solution named mul_h8_nope"):
        Benchmark(ts, config(solutions=["mul_h8_nope"])).run_all()
    def devices(*names):
        return config().model_copy(update={"devices": list(names)})

    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        Benchmark(ts, devices("gpu0")).run_all()
    if torch.cuda.is_available():
        assert Benchmark(ts, devices("cuda")).devices() == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        with pytest.raises(ValueError, match="GPU"):
            Benchmark(ts, devices("cuda:99")).run_all()
    else:
        for name in ("cuda", "cuda:0"):
            with pytest.raises(ValueError, match="no GPU visible here"):
                Benchmark(ts, devices(name)).run_all()


def test_a_worker_that_dies_before_any_solution_says_why(tmp_path, monkeypatch):
    """Its last lines come with the error, not only in its log file."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'CUDA driver initialization failed: no device' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    ts = _dataset(tmp_path / "ds", {"honest": HONEST})
    with pytest.raises(ValueError) as info:
        Benchmark(ts, config()).run_all()
    text = str(info.value)
    assert "failed before any solution ran" in text and "CUDA driver initialization failed" in text


def test_dead_workers_are_reported_with_their_last_lines():
    from opforge.bench import display
    from opforge.trace import Evaluation, EvaluationStatus, Trace

    log = ("running the solution: the worker process died (SIGSEGV)\n--- worker output ---\n"
           "Fatal Python error: Segmentation fault\n  File \"kernel.py\", line 7 in run\n[/oops] not markup\n")
    trace = Trace(definition=DEF, workload=Workload(uuid="w", axes={"batch": 4}, inputs={}), solution="s",
                  evaluation=Evaluation(status=EvaluationStatus.RUNTIME_ERROR, log=log,
                                        environment={"hardware": "cpu"}, timestamp="2026-01-01T00:00:00Z"))
    text = display.worker_output(trace)
    assert text.startswith(f"{DEF}  s  batch=4  ") and "RUNTIME_ERROR" in text.splitlines()[0]
    assert "Segmentation fault" in text and 'line 7 in run' in text
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(text)  # the solution's text is not markup: printing it cannot fail
    assert "[/oops] not markup" in console.export_text()
