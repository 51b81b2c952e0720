"""A small dataset of benchmark results for the report tests.

``mul_h8`` (from the registry tests' helpers) on four batch sizes, with latencies in ms:

    solution      batch=1     batch=16  batch=256  batch=4096
    reference     0.010       0.020     0.080      1.000
    builtin       0.005       0.008     0.040      0.500       (the baseline)
    fast          0.0001 (S)  0.006     0.020      0.250       (S: suspect timing)
    steady        0.004       0.007     0.025      0.300
    flaky         0.0035      NUMERIC   RUNTIME    0.280
    slow          0.020       0.040     0.100      TIMEOUT     (an older PASSED at 4096)
    broken        COMPILE     COMPILE   COMPILE    COMPILE
    EVIL          RUNTIME     0.050     -          -           (a name and a log with HTML in them)
    unused        -           -         -          -

and batch=65536, a workload of the dataset that no solution has a trace for (the runner
writes none for what it skips, e.g. a tensor over --max-elements).

Plus the stale traces the latest ones must win over, and ``mul_idle``: a definition with a
solution and a workload but no traces. Also the fixtures of the report tests (test modules
import them by name, as the registry tests do): ``trace_set``, ``dataset_json`` and
``browser``. They live here rather than in a conftest.py, which would shadow tests/conftest.py
for the modules that import it by name.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from registry_helpers import mul_definition, solution  # noqa: E402,F401 (the tests import them from here)

from opforge.trace import (Correctness, Environment, Evaluation, EvaluationStatus, Performance,  # noqa: E402
                           RandomInput, Trace, TraceSet, Workload)

DEF = "mul_h8"
REF, BUILTIN = f"{DEF}_reference", f"{DEF}_builtin"
FAST, STEADY, FLAKY, SLOW, BROKEN, UNUSED = (f"{DEF}_{n}" for n in ("fast", "steady", "flaky", "slow", "broken",
                                                                   "unused"))
# Solution names cannot hold "/" (they name files), so no closing tag here; the log has one.
EVIL = f"{DEF}_evil<img src=x onerror=document.body.setAttribute('data-pwned',1)><script>alert(1)"
EVIL_LOG = ("<script>document.body.setAttribute('data-pwned','log')</script> Traceback line one\n"
            "second line of the log with <b>markup</b>")
BATCHES = (1, 16, 256, 4096)
UNTRACED = 65536
HARDWARE = "NVIDIA H200"
LIBS = {"torch": "2.6.0", "triton": "3.2.0"}
KERNEL = "def run(x, w):\n    return x * w\n"

REF_MS = {1: 0.010, 16: 0.020, 256: 0.080, 4096: 1.0}
BUILTIN_MS = {1: 0.005, 16: 0.008, 256: 0.040, 4096: 0.5}
FAST_MS = {1: 0.0001, 16: 0.006, 256: 0.020, 4096: 0.25}
STEADY_MS = {1: 0.004, 16: 0.007, 256: 0.025, 4096: 0.3}
FAST_GBPS = {1: 5000.0, 16: 100.0, 256: 1000.0, 4096: 4000.0}
FAST_PCT = {1: 150.0, 16: 3.0, 256: 30.0, 4096: 80.0}
STEADY_GBPS = {1: 10.0, 16: 90.0, 256: 800.0, 4096: 3300.0}
BUILTIN_GBPS = {1: 8.0, 16: 75.0, 256: 500.0, 4096: 2000.0}
BUILTIN_PCT = {1: 0.2, 16: 2.0, 256: 10.0, 4096: 40.0}
SUSPECT_REASON = "latency below the physical floor (0.0001 ms < 0.0003 ms for the bytes moved)"


def uuid_of(batch: int, definition: str = DEF) -> str:
    return f"{definition}-b{batch}"


def workload(batch: int, definition: str = DEF) -> Workload:
    return Workload(uuid=uuid_of(batch, definition), axes={"batch": batch},
                    inputs={"x": RandomInput(), "w": RandomInput()}, seed=batch)


def at(minute: int) -> str:
    return f"2026-03-01T10:{minute:02d}:00Z"


def evaluation(status, *, timestamp: str, log: str = "", performance=None, correctness=None,
               hardware: str = HARDWARE) -> Evaluation:
    return Evaluation(status=status, environment=Environment(hardware=hardware, libs=dict(LIBS)), timestamp=timestamp,
                      log=log, correctness=correctness, performance=performance, device="cuda:0")


def passed(name: str, batch: int, ms: float, *, minute: int = 0, timestamp=None, gbps=None, pct=None, suspect=None,
           hardware: str = HARDWARE, timing=None) -> Trace:
    """A PASSED trace; ``timing`` replaces the default timing dict (p10 and p90 only, as older
    writers recorded)."""
    if timing is None:
        timing = {"method": "cuda_graph", "iterations": 100, "p10_ms": ms * 0.95, "p90_ms": ms * 1.1}
    perf = Performance(latency_ms=ms, reference_latency_ms=REF_MS[batch], speedup_factor=REF_MS[batch] / ms,
                       achieved_gbps=gbps, percent_of_peak=pct, calibrated_gbps=5000.0 if pct is not None else None,
                       baseline_solution=BUILTIN, baseline_latency_ms=BUILTIN_MS[batch],
                       baseline_speedup_factor=BUILTIN_MS[batch] / ms, suspect=suspect, timing=timing)
    ev = evaluation(EvaluationStatus.PASSED, timestamp=timestamp or at(minute), performance=perf,
                    correctness=Correctness(max_relative_error=1e-6, max_absolute_error=1e-7), hardware=hardware)
    return Trace(definition=DEF, workload=workload(batch), solution=name, evaluation=ev)


def failed(name: str, batch: int, status: str, log: str = "", *, minute: int = 0, timestamp=None) -> Trace:
    correctness = (Correctness(max_relative_error=0.5, max_absolute_error=2.0)
                   if status == EvaluationStatus.INCORRECT_NUMERICAL else None)
    ev = evaluation(EvaluationStatus(status), timestamp=timestamp or at(minute), log=log, correctness=correctness)
    return Trace(definition=DEF, workload=workload(batch), solution=name, evaluation=ev)


def build_trace_set() -> TraceSet:
    ts = TraceSet()
    ts.add_definition(mul_definition(DEF))
    # Added out of report order: the report puts the reference and the builtin first.
    for name in (FAST, REF, STEADY, BUILTIN, FLAKY, SLOW, BROKEN, EVIL, UNUSED):
        ts.add_solution(solution(name, KERNEL, definition=DEF))
    for batch in BATCHES + (UNTRACED,):
        ts.add_workload(DEF, workload(batch))
    traces = []
    for b in BATCHES:
        traces.append(passed(REF, b, REF_MS[b], minute=1))
        traces.append(passed(BUILTIN, b, BUILTIN_MS[b], minute=2, gbps=BUILTIN_GBPS[b], pct=BUILTIN_PCT[b]))
        suspect = SUSPECT_REASON if b == 1 else None
        if b == 256:
            # The newer of two traces, added first; the older one's timestamp sorts after it as
            # text (11:30+02:00 is 09:30Z), so only a parsed comparison picks this one.
            traces.append(passed(FAST, b, FAST_MS[b], timestamp="2026-03-01T10:40:00Z", gbps=FAST_GBPS[b],
                                 pct=FAST_PCT[b]))
            traces.append(failed(FAST, b, "RUNTIME_ERROR", "stale failure", timestamp="2026-03-01T11:30:00+02:00"))
        else:
            traces.append(passed(FAST, b, FAST_MS[b], minute=3, gbps=FAST_GBPS[b], pct=FAST_PCT[b], suspect=suspect))
        if b == 4096:
            # Same timestamp twice: the one added later counts.
            traces.append(passed(STEADY, b, 0.9, minute=4, gbps=1.0))
        traces.append(passed(STEADY, b, STEADY_MS[b], minute=4, gbps=STEADY_GBPS[b]))
        traces.append(failed(BROKEN, b, "COMPILE_ERROR", "kernel.cu(12): error: identifier \"x\" is undefined\n"
                                                         "1 error detected", minute=5))
    traces += [
        passed(FLAKY, 1, 0.0035, minute=6),
        failed(FLAKY, 16, "INCORRECT_NUMERICAL", "max error 2.0 above tolerance\nat index (3, 1)", minute=6),
        failed(FLAKY, 256, "RUNTIME_ERROR", "CUDA error: an illegal memory access was encountered\n  at kernel.py:12",
               minute=6),
        passed(FLAKY, 4096, 0.28, minute=6),
        passed(SLOW, 1, 0.020, minute=7),
        passed(SLOW, 16, 0.040, minute=7),
        passed(SLOW, 256, 0.100, minute=7),
        failed(SLOW, 4096, "TIMEOUT", "timed out after 60 s", minute=7),
        passed(SLOW, 4096, 0.9, timestamp="2026-02-01T10:00:00Z"),  # older: the TIMEOUT counts
        failed(EVIL, 1, "RUNTIME_ERROR", EVIL_LOG, minute=8),
        passed(EVIL, 16, 0.050, minute=8),
    ]
    for t in traces:
        ts.add_trace(t)

    ts.add_definition(mul_definition("mul_idle"))
    ts.add_solution(solution("mul_idle_builtin", KERNEL, definition="mul_idle"))
    ts.add_workload("mul_idle", workload(8, "mul_idle"))
    return ts


# --- fixtures ---------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture
def trace_set():
    return build_trace_set()


@pytest.fixture
def dataset_json(tmp_path):
    """The dataset saved as one .json file."""
    return build_trace_set().save(tmp_path / "results.json")


@pytest.fixture
def browser():
    """Path of a headless-capable Chromium; the test skips without one unless
    OPFORGE_REQUIRE_BROWSER=1 (CI), where a missing browser must not pass silently."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("OPFORGE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"OPFORGE_REQUIRE_BROWSER=1 but none of {', '.join(BROWSERS)} is on PATH")
    pytest.skip("no chromium on PATH (apt-get install chromium)")
