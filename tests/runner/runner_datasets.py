"""The small dataset the runner tests share: the mul_h8 Definition with two workloads, the
adversarial solutions (adversaries.py) or a chosen few of them, and quick run settings."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from adversaries import SOURCES  # noqa: E402
from registry_helpers import mul_definition, solution  # noqa: E402

from opforge.bench import BenchmarkConfig, Settings  # noqa: E402
from opforge.trace import TraceSet, Workload  # noqa: E402

DEF = "mul_h8"
BATCHES = (4, 32)
# timeout_s bounds one request to a started worker (a check of 3 small input sets, a timing of 5
# calls): 4 s is ample even on a loaded machine, and the hanging adversary waits it out twice.
FAST = Settings(iterations=5, warmup=1, max_time_s=0.2, timeout_s=4, cuda_graph=False)


def make_dataset(root: Path, names=None) -> TraceSet:
    ts = TraceSet(root)
    ts.add_definition(mul_definition())
    for batch in BATCHES:
        ts.add_workload(DEF, Workload(uuid=f"b{batch}", axes={"batch": batch},
                                      inputs={"x": {"type": "random"}, "w": {"type": "random"}}))
    for name, source in SOURCES.items():
        if names is not None and name not in names:
            continue
        text, options = source if isinstance(source, tuple) else (source, {})
        ts.add_solution(solution(f"{DEF}_{name}", text, dps=options.get("dps", False),
                                 language=options.get("language", "python"), entry=options.get("entry", "kernel.py::run")))
    ts.save(root)
    return TraceSet.load(root)


def config(**kw) -> BenchmarkConfig:
    kw.setdefault("defaults", FAST)
    return BenchmarkConfig(devices=["cpu"], seed=11, baseline=f"{DEF}_honest", **kw)


def by_solution(traces) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in traces:
        out.setdefault(t.solution.removeprefix(f"{DEF}_"), []).append(t)
    return out
