"""The runner and its timer on a GPU: honest solutions get device times that match what they do,
host overhead is not counted, work left on another stream is, an illegal memory access costs
only its worker, and several GPUs run in parallel."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import GPU_SKIP_REASON, HAS_GPU  # noqa: E402
from registry_helpers import mul_definition, solution  # noqa: E402

from opforge.bench import Benchmark, BenchmarkConfig, Settings  # noqa: E402
from opforge.bench.timing import time_cuda  # noqa: E402
from opforge.trace import TraceSet, Workload  # noqa: E402

# exclusive_gpu: these check device times, which another process's kernels on the GPU would lengthen.
pytestmark = [pytest.mark.gpu, pytest.mark.exclusive_gpu, pytest.mark.skipif(not HAS_GPU, reason=GPU_SKIP_REASON)]

DEF = "mul_h8"

HONEST = "import torch\n\ndef run(x, w):\n    return x * w\n"

SIDE_STREAM = """
import torch

_side = {}

def run(x, w):
    s = _side.setdefault(x.device, torch.cuda.Stream(x.device))
    y = torch.empty_like(x)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(40):
            torch.mul(x, w, out=y)
    return y
"""

ILLEGAL_ACCESS = """
import torch
import triton
import triton.language as tl

@triton.jit
def _bad(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs + (1 << 40), tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)

def run(x, w):
    y = torch.empty_like(x)
    _bad[(1,)](y, y.numel(), BLOCK=128)
    return y
"""


def dataset(root: Path, sources: dict, batches=(4096, 1 << 20)) -> TraceSet:
    ts = TraceSet(root)
    ts.add_definition(mul_definition())
    for b in batches:
        ts.add_workload(DEF, Workload(uuid=f"b{b}", axes={"batch": b},
                                      inputs={"x": {"type": "random"}, "w": {"type": "random"}}))
    for name, text in sources.items():
        ts.add_solution(solution(f"{DEF}_{name}", text, target=("cuda",)))
    ts.save(root)
    return TraceSet.load(root)


def run(ts, **kw) -> dict:
    kw.setdefault("devices", ["cuda:0"])
    kw.setdefault("defaults", Settings(iterations=30, max_time_s=1.0))
    config = BenchmarkConfig(seed=3, baseline=f"{DEF}_honest", **kw)
    return {(t.solution.removeprefix(f"{DEF}_"), t.workload.uuid): t for t in Benchmark(ts, config).run_all()}


def test_honest_solution_on_cuda(tmp_path):
    got = run(dataset(tmp_path / "ds", {"honest": HONEST}))
    for (name, uuid), t in got.items():
        assert t.is_successful(), t.evaluation.log
        p, env = t.evaluation.performance, t.evaluation.environment
        assert p.timing["method"] == "cuda_events" and p.timing["flush_l2"] is True
        assert p.timing["graph_ms"] > 0 and p.timing["host_ms"] > 0
        assert p.calibrated_gbps > 500 and 0 < p.percent_of_peak < 110 and p.suspect is None
        assert env.hardware == torch.cuda.get_device_name(0)
        assert env.hardware_info["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
        assert env.libs["cuda"] == torch.version.cuda
        assert t.evaluation.device == "cuda:0"
    big = got[("honest", f"b{1 << 20}")].evaluation.performance
    assert big.percent_of_peak > 40  # 64 MiB through x * w runs near the copy bandwidth


def test_work_left_on_another_stream_is_counted_or_flagged(tmp_path):
    got = run(dataset(tmp_path / "ds", {"honest": HONEST, "side_stream": SIDE_STREAM}))
    for uuid in (f"b{4096}", f"b{1 << 20}"):
        t = got[("side_stream", uuid)]
        assert t.is_successful(), t.evaluation.log
        p = t.evaluation.performance
        counted = p.timing["method"].startswith("cuda_events+device_synchronize")
        assert counted or p.suspect, p.timing
    # 40 multiplies of 64 MiB on the side stream: far longer than the spin lead, so counted, and
    # at least 20x what one honest multiply takes.
    big = got[("side_stream", f"b{1 << 20}")].evaluation.performance
    assert big.timing["method"] == "cuda_events+device_synchronize"
    assert big.latency_ms > 20 * got[("honest", f"b{1 << 20}")].evaluation.performance.latency_ms


def test_illegal_memory_access_costs_only_the_worker(tmp_path):
    pytest.importorskip("triton")
    got = run(dataset(tmp_path / "ds", {"honest": HONEST, "zz_illegal": ILLEGAL_ACCESS, "zzz_after": HONEST},
                      batches=(4096,)))
    bad = got[("zz_illegal", "b4096")].evaluation
    assert bad.status.value == "RUNTIME_ERROR"
    assert "illegal" in bad.log.lower() or "died" in bad.log, bad.log
    assert got[("zzz_after", "b4096")].is_successful()


def test_devices_run_in_parallel(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    ts = dataset(tmp_path / "ds", {"honest": HONEST})
    for k in range(3):  # more Definitions than devices, so both get work
        name = f"mul_h8_{k}"
        ts.add_definition(mul_definition(name=name))
        ts.add_workload(name, Workload(uuid=f"{name}_b64", axes={"batch": 64},
                                       inputs={"x": {"type": "random"}, "w": {"type": "random"}}))
        ts.add_solution(solution(f"{name}_honest", HONEST, target=("cuda",), definition=name))
    traces = Benchmark(ts, BenchmarkConfig(seed=3, devices=["cuda:0", "cuda:1"], baseline=None,
                                           defaults=Settings(iterations=10, max_time_s=0.5))).run_all()
    assert len(traces) == 5 and all(t.is_successful() for t in traces)
    assert {t.evaluation.device for t in traces} == {"cuda:0", "cuda:1"}


def test_timer_measures_device_time_not_host_time():
    x = torch.ones(1 << 10, device="cuda")
    cycles_per_us = __import__("opforge.bench.timing", fromlist=["x"]).sleep_cycles_per_us(x.device)

    def spin_50us(t):
        torch.cuda._sleep(int(50 * cycles_per_us))

    def slow_host(t):
        time.sleep(300e-6)  # the host dawdles before a tiny kernel
        t.add_(1)

    spin = time_cuda(spin_50us, [[x]], warmup=2, iterations=30, max_time_s=2, cuda_graph=False)
    assert 0.045 < spin["median_ms"] < 0.06, spin
    host = time_cuda(slow_host, [[x]], warmup=2, iterations=30, max_time_s=2, cuda_graph=False)
    assert host["median_ms"] < 0.05 and host["host_ms"] > 0.25, host


def test_a_patched_timer_on_a_gpu_is_suspect_and_reaches_no_one_else(tmp_path):
    """The 4 us lie: its own timing does not fit the runner's clock; the baseline before it and
    the solution after it keep their own device times."""
    from test_runner_trust import TIMER_CHEAT

    # 1000 calls claimed: on the clock they need at least 2 spin leads each (40 ms), which the
    # instant fake answer cannot have taken even on a host loaded by other tests' compiles (with
    # 30 calls, 1.2 ms: one slow scheduling of the worker let the lie through).
    cheat = TIMER_CHEAT.replace("ITERATIONS", "1000").replace('method="host_clock"', 'method="cuda_events"')
    slow = "import torch\n\ndef run(x, w):\n    torch.cuda._sleep(2_000_000)\n    return x * w\n"
    got = run(dataset(tmp_path / "ds", {"honest": slow, "cheat": cheat, "zz_after": slow}, batches=(4096,)),
              defaults=Settings(iterations=1000, max_time_s=1.0))
    cheat_perf = got[("cheat", "b4096")].evaluation.performance
    assert cheat_perf.suspect and cheat_perf.suspect.startswith("timing does not fit the runner's clock"), cheat_perf
    for name in ("honest", "zz_after"):
        perf = got[(name, "b4096")].evaluation.performance
        assert perf.suspect is None and perf.latency_ms > 0.3, (name, perf)
