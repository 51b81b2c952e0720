"""Shared machinery for the pytest-benchmark suite (bench_*.py).

Each bench module sets FAMILY ("norm", "act" or "scale") and defines one
function taking `case`; pytest_generate_tests below expands it over every op
of that family x implementation x shape x dtype, so the modules stay tiny.

Implementations compared, all on the same tensors:
  opforge        the public op, backend="auto" (CUDA kernels on GPU, C++ on CPU)
  opforge-torch  the public op, backend="torch" (its plain PyTorch path)
  eager          the plain PyTorch formula from opspecs.py

Every benchmark also checks its result against an fp32 reference, so under
`--benchmark-disable` (one call each) the suite is still a correctness test.

Sizes: on a GPU, bf16 at decode sizes (1, 32, 256 rows x 4096) and one large
size; without a GPU, small fp32/bf16 CPU tensors. OPFORGE_BENCH_QUICK=1 (the
default without a GPU) keeps each benchmark to a few tens of milliseconds.
For device time, bandwidth and peers (torch.compile, Liger) use roofline.py.
"""
import functools
import os
import time

import pytest
import torch

import opspecs

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
QUICK = os.environ.get("OPFORGE_BENCH_QUICK", "") not in ("", "0") or not HAS_CUDA
BUDGET_S = 0.03 if QUICK else 0.3  # timed seconds per benchmark
IMPLS = ("opforge", "opforge-torch", "eager")

# family -> [(rows, hidden)]; act hidden = output width d (input is 2d wide)
if HAS_CUDA:
    DTYPES = ("bf16",)
    SHAPES = {"norm": [(1, 4096), (32, 4096), (256, 4096), (32768, 4096)],
              "act": [(1, 4096), (32, 4096), (256, 4096), (16384, 11008)],
              "scale": [(1, 4096), (32, 4096), (256, 4096), (32768, 4096)]}
else:
    DTYPES = ("fp32", "bf16")
    SHAPES = {f: [(1, 4096), (64, 4096)] for f in ("norm", "act", "scale")}


def pytest_generate_tests(metafunc):
    family = getattr(metafunc.module, "FAMILY", None)
    if family is None or "case" not in metafunc.fixturenames:
        return
    cases, ids = [], []
    for spec in opspecs.specs_of(family):
        for rows, hidden in SHAPES[family]:
            for dt in DTYPES:
                for impl in IMPLS:
                    cases.append((spec.name, impl, rows, hidden, dt))
                    ids.append(f"{spec.name}-{rows}x{hidden}-{dt}-{impl}")
    metafunc.parametrize("case", cases, ids=ids)


def _callable(spec, impl, inputs):
    """The implementation with the inputs bound once (no per-call adapter is timed with it)."""
    if impl == "opforge":
        return spec.bound_call(inputs)
    if impl == "opforge-torch":
        return spec.bound_call(inputs, backend="torch")
    return functools.partial(spec.formula, *inputs)


def _rounds(fn):
    """Rounds that fit BUDGET_S, from one timed call after a warm-up call."""
    fn()
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-6)
    return int(min(max(BUDGET_S / dt, 3), 2000))


@pytest.fixture
def op_bench(benchmark):
    """Benchmark one case, then assert its last result matches the reference."""

    def run(case):
        name, impl, rows, hidden, dt = case
        spec = opspecs.SPEC[name]
        inputs = opspecs.make_input_sets(spec, rows, hidden, opspecs.DTYPES[dt], DEVICE)[0]
        fn = _callable(spec, impl, inputs)
        if HAS_CUDA:
            raw = fn

            def fn():
                # Kernels launch asynchronously: without this the timer would
                # measure only the launch. Includes one sync round trip.
                r = raw()
                torch.cuda.synchronize()
                return r
        benchmark.group = f"{name} {rows}x{hidden} {dt}"
        benchmark.extra_info.update(op=name, impl=impl, rows=rows, hidden=hidden, dtype=dt,
                                    bytes=spec.bytes(rows, hidden, inputs[0].element_size()))
        rounds = _rounds(fn) if benchmark.enabled else 1
        result = benchmark.pedantic(fn, rounds=rounds, warmup_rounds=1 if rounds > 1 else 0)
        problem = opspecs.check(spec, inputs, result)
        assert problem is None, f"{name} [{impl}] {rows}x{hidden} {dt}: {problem}"

    return run
