"""Datasets, solutions and settings of the cluster-run tests (test_ray_*.py): ``mul_h8`` (y = x *
w over rows of 8) with solutions written inline, the settings of a quick CPU run, and a
simulated cluster (Ray's cluster utilities; fake GPU slots evaluated on the CPU)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from registry_helpers import mul_definition, solution  # noqa: E402

from opforge.bench import BenchmarkConfig, Settings  # noqa: E402
from opforge.trace import TraceSet, Workload  # noqa: E402

DEF = "mul_h8"
FAST = Settings(iterations=5, warmup=1, max_time_s=0.2, timeout_s=20, cuda_graph=False)
#: The same settings as options of ``opforge run``.
FAST_OPTIONS = ["--devices", "cpu", "--iterations", "5", "--warmup", "1", "--max-time", "0.2", "--timeout", "20",
                "--no-cuda-graph", "--baseline", f"{DEF}_honest"]

HONEST = "def run(x, w):\n    return x * w\n"
WRONG = "def run(x, w):\n    return x * w + 0.01\n"
SEGFAULT = "import ctypes\n\ndef run(x, w):\n    return ctypes.string_at(0)\n"
SLOW = "import time\n\ndef run(x, w):\n    time.sleep(0.05)\n    return x * w\n"
_DEVICE_WORKER = """
import os


def device_worker():  # the closest ancestor that is a Ray worker process
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().startswith(b"ray::"):
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("not under a Ray worker")
"""


def in_step(folder: Path, workers: int) -> str:
    """SLOW, but its first call in each process waits (15 s at most) until ``workers`` device
    workers have entered it (each leaves its pid in ``folder``), then sleeps 2 s: every device
    worker gets a pair of it, and each pair is in flight long enough for its node to be killed
    meanwhile, however quickly the workers start and however many were ready first."""
    return _DEVICE_WORKER + f"""
import time

_calls = []


def run(x, w):
    if not _calls:
        open(os.path.join({str(folder)!r}, str(device_worker())), "w").close()
        deadline = time.monotonic() + 15
        while len(os.listdir({str(folder)!r})) < {workers} and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(0.05 if _calls else 2.0)
    _calls.append(1)
    return x * w
"""


def recorder(folder: Path, body: str) -> str:
    """A solution that leaves a file named after its process in ``folder`` when imported (to
    find its worker processes later), then runs ``body`` (a ``def run(x, w)``)."""
    return f"import os\nopen(os.path.join({str(folder)!r}, str(os.getpid())), 'w').close()\n\n{body}"


#: Takes down the device worker running it.
KILLS_ITS_DEVICE_WORKER = _DEVICE_WORKER + """
import signal


def run(x, w):
    os.kill(device_worker(), signal.SIGKILL)
    return x * w
"""


def make_dataset(root: Path, sources: dict, batches=(4, 32)) -> TraceSet:
    """``root`` holding mul_h8, a workload per batch size and one solution per ``sources`` entry
    (name suffix -> kernel.py)."""
    ts = TraceSet(root)
    ts.add_definition(mul_definition())
    for batch in batches:
        ts.add_workload(DEF, Workload(uuid=f"b{batch}", axes={"batch": batch},
                                      inputs={"x": {"type": "random"}, "w": {"type": "random"}}))
    for name, text in sources.items():
        ts.add_solution(solution(f"{DEF}_{name}", text))
    ts.save(root)
    return TraceSet.load(root)


def config(**kw) -> BenchmarkConfig:
    kw.setdefault("defaults", FAST)
    return BenchmarkConfig(devices=["cpu"], seed=11, baseline=f"{DEF}_honest", **kw)


def pairs(traces) -> set:
    return {(t.solution, t.workload.uuid) for t in traces}


def pids_in(folder: Path) -> list[int]:
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit()]


def all_gone(pids, timeout: float) -> bool:
    """Whether every process in ``pids`` has ended (zombies count as ended) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env
