"""Shared pieces of the opforge test suite.

* ``rng``: a per-test random source seeded from the test's node id (parameters included), so a
  failing case draws the same inputs when rerun alone.
* ``poisoned`` / ``poisoned_like``: NaN-filled outputs, so an element the op forgot to write
  fails the comparison.
* ``TOLERANCES`` and ``assert_close`` / ``assert_rounded_once``: comparisons against fp64
  references computed here from the same (upcast) inputs.
* ``ref_*``: the fp64 references.
* ``DEVICES`` and the ``gpu`` marker: CUDA cases are skipped cleanly without a GPU or without
  CUDA kernels in this build; ``compile`` marks the torch.compile tests (``-m "not compile"``).
* ``exclusive_gpu``: a test that needs the GPU to itself (it asserts on timings, or takes most
  of the GPU's memory); with pytest-xdist on a GPU machine the other workers' ``gpu`` tests wait
  while it runs (``gpu_turn``): every test that uses the GPU carries the ``gpu`` marker.
* ``sweep`` and the ``slow`` marker: a parametrization keeps in the default run the cases that
  reach distinct code (every dtype, backend, kernel variant, tail and error path) and marks the
  rest of its product ``slow``; ``python -m pytest tests -m slow`` runs those (pyproject's
  addopts deselects them otherwise).

Test modules import the helpers with ``from conftest import ...``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.bench.timing import CALIBRATION_BYTES_ENV

HAS_GPU = torch.cuda.is_available() and bool(opforge.build_info()["cuda"])

# Every benchmark run here calibrates its device's copy bandwidth, whose value no CPU test checks:
# 16 MiB instead of 256 MiB on a CPU (0.02 s against 0.35-0.8 s per run, some 40 s of the suite).
# Set before any test starts a process, so workers, fork servers, command-line runs and the
# simulated cluster's nodes inherit it; test_runner_parts covers the default size. Not on a GPU
# machine: the variable sizes every device's copy, and 16 MiB would calibrate a GPU's L2.
if not HAS_GPU:
    os.environ.setdefault(CALIBRATION_BYTES_ENV, str(16 << 20))
# Before its first CPU kernel in a process, Inductor confirms each vector ISA the CPU's flags
# report by compiling and running a test program with the host compiler: 8-10 s of the first CPU
# torch.compile in every test process and subprocess (a cold cache on the 2-core CI machine: 15-18 s
# against 7.2 s without it; about 14 s on the GPU machine). The ISA it picks comes from the CPU's
# flags either way (`pick_vec_isa()` answers the same), so the compile tests still build the
# vectorised code users get; what goes unchecked is only the host compiler's support for it.
# Inductor reads the variable when its config is first imported, which `import torch` does not do.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
GPU_SKIP_REASON = "needs a CUDA device and an opforge build with CUDA kernels"

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.gpu))

#: (rtol, atol) per dtype for |got - ref| <= atol + rtol * |ref| against an fp64 reference.
TOLERANCES = {
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1e-2, 1e-5),
}

#: Explicitly stored mantissa bits and smallest exponent of one ulp, per dtype.
_MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
_MIN_ULP_EXP = {torch.float32: -149, torch.float16: -24, torch.bfloat16: -133}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "compile: runs torch.compile (deselect with -m 'not compile')")
    config.addinivalue_line("markers", "slow: the rest of an exhaustive sweep (deselected by default; -m slow)")
    config.addinivalue_line("markers", "exclusive_gpu: needs the GPU to itself (timings, most of its memory)")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        # Each xdist worker gets its share of the cores: torch's default (every core, in every
        # worker) oversubscribes them, and its thread pool then spins waiting for threads that
        # are not running.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cores // int(workers)))
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the workers' order (longest_files_first)
        config.option.loadscopereorder = False


# pytest-xdist (--dist loadfile) hands whole files to its workers in the order the workers
# collected them; left to itself it orders them by their number of tests, which put the Ray
# cluster file (a few tests, about a minute on a 2-core CI machine) near the end, where it ran
# alone while the other worker idled. These files, the longest there, go first; the rest follow
# by their number of tests as before (about 10 s of a 3.5-minute run on 2 workers).
LONGEST_FILES_FIRST = (
    "tests/runner/test_ray_cluster.py",
    "tests/registry/test_native_builder.py",
    "tests/runner/test_worker_fork.py",
    "tests/registry/test_cache_damage.py",
    "tests/tracing/test_process.py",
    "tests/integrations/test_e2e_decode_script.py",
    "tests/runner/test_runner_trust.py",
    "tests/test_paged_decode_attention.py",
    "tests/runner/test_runner_cli.py",
    "tests/runner/test_runner_features.py",
)


def longest_files_first(items):
    """Reorders ``items`` (in place) file by file: LONGEST_FILES_FIRST, then by number of tests;
    a file's tests keep their order."""
    def path(item):
        return item.nodeid.split("::")[0]

    counts = collections.Counter(path(item) for item in items)
    rank = {p: i for i, p in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: (rank.get(path(item), len(rank)), -counts[path(item)]))


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the schedule
        longest_files_first(items)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, mode)
        yield  # closing the file releases the lock, also when the process dies


@pytest.fixture(autouse=True)
def gpu_turn(request):
    """With pytest-xdist on a GPU machine, every ``gpu`` test holds the GPU shared and an
    ``exclusive_gpu`` test holds it alone: one that times kernels would otherwise measure other
    workers' kernels too (processes take turns on a GPU), and one that fills the GPU's memory
    would make others fail to allocate. A waiting exclusive test goes first (it holds the
    turnstile, which every gpu test passes through), so it is not starved by a stream of shared
    ones. Tests without the ``gpu`` marker never touch the GPU and run on meanwhile: a minute of
    torch.compile on the CPU must not hold the GPU's turn. Without xdist or without a GPU this
    does nothing."""
    keywords = request.keywords
    uses_gpu = "gpu" in keywords or "exclusive_gpu" in keywords
    if not HAS_GPU or "PYTEST_XDIST_WORKER" not in os.environ or not uses_gpu:
        yield
        return
    import fcntl

    shared = request.getfixturevalue("tmp_path_factory").getbasetemp().parent  # the run's, not the worker's
    turnstile, gpu = shared / "gpu.turnstile", shared / "gpu.lock"
    if "exclusive_gpu" in keywords:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(gpu, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass
    with _flock(gpu, fcntl.LOCK_SH):
        yield


#: For tests that run a Triton solution in triton's interpreter (TRITON_INTERPRET=1): CPU coverage
#: for machines without a GPU. Where a GPU is visible the GPU tests run the compiled kernel
#: instead (and triton releases before 3.7 cannot interpret a loop over a run-time bound under
#: numpy 2: "only 0-dimensional arrays can be converted to Python scalars").
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="a GPU is here: its tests run the compiled Triton kernel")


def shape_params(hidden_sizes, cpu_batches=(1, 3, 64), gpu_batches=(1, 3, 64, 1000, 8192), cpu_cap=1 << 19,
                 gpu_cap=1 << 25):
    """(device, rows, hidden) parameters: every hidden size with a few batch sizes per device;
    batches above 3 rows only while rows * hidden stays under the device's cap (CPU is slow)."""
    params = []
    for device, batches, cap in (("cpu", cpu_batches, cpu_cap), ("cuda", gpu_batches, gpu_cap)):
        marks = (pytest.mark.gpu,) if device == "cuda" else ()
        for h in hidden_sizes:
            for b in batches:
                if b <= 3 or b * h <= cap:
                    params.append(pytest.param(device, b, h, marks=marks, id=f"{device}-{b}x{h}"))
    return params


def sweep(*axes, default):
    """One parametrization over the product of ``axes``, each a list of ``pytest.param`` (its
    values, marks and id are kept; ids are joined with "-" in axis order). A combination for which
    ``default(*values)`` is false is marked ``slow``: the default run keeps the combinations that
    reach distinct code, ``-m slow`` runs the rest of the product (the exhaustive sweep)."""
    params = []
    for combo in itertools.product(*axes):
        values = tuple(v for p in combo for v in p.values)
        marks = [m for p in combo for m in p.marks]
        if not default(*values):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(*values, marks=marks, id="-".join(p.id for p in combo)))
    return params


def axis(values, ids=str) -> list:
    """Plain values as one-value ``pytest.param`` s for ``sweep``, with ids from ``ids``."""
    return [pytest.param(v, id=ids(v)) for v in values]


def outside_view(view: torch.Tensor) -> torch.Tensor:
    """The elements of ``view``'s base tensor that ``view`` does not cover."""
    base = view._base if view._base is not None else view
    covered = torch.zeros(base.numel(), dtype=torch.bool, device=base.device)
    covered.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset()).fill_(True)
    return base.reshape(-1)[~covered]


def dtype_id(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


# --- random inputs ---------------------------------------------------------------------------


class Rng:
    """Random tensors from generators seeded once per test (one generator per device)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, device) -> torch.Generator:
        key = str(torch.device(device))
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=key).manual_seed(self.seed)
        return self._generators[key]

    def randn(self, *shape, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self.generator(device), device=device, dtype=torch.float32)
        if scale != 1.0:
            t = t * scale
        return t.to(dtype)

    def uniform(self, *shape, low: float, high: float, dtype=torch.float32, device="cpu") -> torch.Tensor:
        t = torch.rand(shape, generator=self.generator(device), device=device, dtype=torch.float32)
        return (t * (high - low) + low).to(dtype)


def capture_graph(step):
    """Run ``step`` once on a side stream (the warm-up torch's CUDA-graph docs ask for: lazy
    initialisation and allocations happen outside the capture), then capture it. Returns the
    graph and what the captured call returned (the static outputs replays write)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def written_late_on_a_side_stream(target: torch.Tensor, values: torch.Tensor, call):
    """``call()`` on a user stream right after that stream writes ``values`` into ``target``
    (zeroed first) behind a long sleep: a kernel launched on any other stream reads the zeros.
    Returns what ``call`` returned, once the stream has finished."""
    target.zero_()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        target.copy_(values)
        result = call()
    side.synchronize()
    return result


@pytest.fixture
def fresh_dynamo():
    """torch.compile tests start and end with no compiled graphs cached (a cached graph of another
    test would hide a recompilation, or its error)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def seed() -> int:
    """A fresh random seed per test (OPFORGE_TEST_SEED fixes it, to replay a failure)."""
    fixed = os.environ.get("OPFORGE_TEST_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**31)


def replay(seed: int) -> str:
    """How a failure message names its seed."""
    return f"seed {seed} (replay with OPFORGE_TEST_SEED={seed})"


#: (device, backend) of an op with native CPU and CUDA code: its C++ CPU version, its plain
#: PyTorch version on each device, and its CUDA kernel.
NATIVE_BACKENDS = [pytest.param("cpu", "cpu", id="cpu"), pytest.param("cpu", "torch", id="torch"),
                   pytest.param("cuda", "cuda", id="cuda", marks=pytest.mark.gpu),
                   pytest.param("cuda", "torch", id="cuda-torch", marks=pytest.mark.gpu)]


@pytest.fixture
def rng(request) -> Rng:
    return Rng(zlib.crc32(request.node.nodeid.encode()))


# --- outputs that fail when left unwritten ---------------------------------------------------


def poisoned(shape, dtype, device="cpu") -> torch.Tensor:
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


@pytest.fixture(name="poisoned_like")
def poisoned_like_fixture():
    return poisoned_like


# --- layouts of a [rows..., h] tensor --------------------------------------------------------

#: contiguous: a plain tensor; padded: rows of a wider tensor (big[:, :h]); offset: rows that
#: start one element into a wider tensor (big[:, 1:1+h], so neither the pointer nor the row
#: stride is 16-byte aligned); misaligned: a contiguous view one element into a buffer
#: (buf[1:1+n*h].view(n, h)); qkv: the first third of a [b, s, 3h] tensor (3-D, strided rows).
LAYOUTS = ("contiguous", "padded", "offset", "misaligned", "qkv")


def laid_out(src: torch.Tensor, layout: str, fill: float = float("nan")) -> torch.Tensor:
    """A view with ``src``'s values (2-D [n, h]) in the given layout; padding holds ``fill``.

    For "qkv" the result is 3-D [n // 2, 2, h] (n must be even) holding src's rows in order.
    """
    n, h = src.shape
    kw = dict(dtype=src.dtype, device=src.device)
    if layout == "contiguous":
        view = torch.empty((n, h), **kw)
    elif layout == "padded":
        view = torch.full((n, h + 8), fill, **kw)[:, :h]
    elif layout == "offset":
        view = torch.full((n, h + 3), fill, **kw)[:, 1 : 1 + h]
    elif layout == "misaligned":
        view = torch.full((n * h + 2,), fill, **kw)[1 : 1 + n * h].view(n, h)
    elif layout == "qkv":
        assert n % 2 == 0
        view = torch.full((n // 2, 2, 3 * h), fill, **kw)[..., :h]
        view.copy_(src.view(n // 2, 2, h))
        return view
    else:
        raise AssertionError(layout)
    view.copy_(src)
    return view


# --- comparisons -----------------------------------------------------------------------------


def _describe_worst(got: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor, err: torch.Tensor) -> str:
    idx = torch.nonzero(bad)
    first = tuple(idx[0].tolist())
    worst_flat = int(torch.argmax(torch.where(bad, err, torch.zeros_like(err))).item())
    worst = tuple(torch.unravel_index(torch.tensor(worst_flat), bad.shape))
    worst = tuple(int(i) for i in worst)
    return (
        f"{int(bad.sum())} of {bad.numel()} elements out of tolerance; first at {first}: "
        f"got {got[first].item()!r}, expected {ref[first].item()!r}; worst at {worst}: "
        f"got {got[worst].item()!r}, expected {ref[worst].item()!r}"
    )


def assert_close(got: torch.Tensor, ref: torch.Tensor, dtype=None, rtol=None, atol=None, what: str = "result"):
    """|got - ref| <= atol + rtol * |ref| element-wise (NaN only where ref is NaN), and the
    relative norm error ||got - ref|| / ||ref|| <= rtol / 2. ``ref`` is an fp64 reference."""
    dtype = got.dtype if dtype is None else dtype
    d_rtol, d_atol = TOLERANCES[dtype]
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if got.numel() == 0:
        return
    g = got.detach().to(torch.float64)
    r = ref.detach().to(g.device, torch.float64)
    nan_g, nan_r = torch.isnan(g), torch.isnan(r)
    assert torch.equal(nan_g, nan_r), (
        f"{what}: NaN pattern differs ({int(nan_g.sum())} NaNs, expected {int(nan_r.sum())}); first "
        f"mismatch at {tuple(torch.nonzero(nan_g != nan_r)[0].tolist())}"
    )
    inf_r = torch.isinf(r)
    assert torch.equal(g[inf_r], r[inf_r]), f"{what}: infinities differ"
    finite = ~(nan_r | inf_r)
    g0, r0 = torch.where(finite, g, 0.0), torch.where(finite, r, 0.0)
    err = (g0 - r0).abs()
    bad = err > atol + rtol * r0.abs()
    assert not bad.any(), f"{what} ({dtype_id(dtype)}, rtol={rtol}, atol={atol}): " + _describe_worst(g, r, bad, err)
    ref_norm = float(torch.linalg.vector_norm(r0))
    if ref_norm > 0:
        rel = float(torch.linalg.vector_norm(g0 - r0)) / ref_norm
        assert rel <= rtol / 2, f"{what}: relative norm error {rel:.3g} > {rtol / 2:.3g}"


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` values at the magnitude of each fp64 ``ref`` element."""
    _, exp = torch.frexp(ref.abs())  # ref = m * 2**exp with m in [0.5, 1)
    e = (exp.to(torch.float64) - 1 - _MANTISSA_BITS[dtype]).clamp(min=_MIN_ULP_EXP[dtype])
    return torch.where(ref == 0, 2.0 ** _MIN_ULP_EXP[dtype], torch.exp2(e))


def assert_rounded_once(got: torch.Tensor, ref: torch.Tensor, rel_slack: float = 2e-5, mask=None,
                        what: str = "result"):
    """A 16-bit result is the fp64 ``ref`` rounded once to nearest: within half an ulp, plus
    ``rel_slack`` * |ref| for the fp32 arithmetic before the rounding. A second rounding (say of
    an intermediate to the 16-bit type) shows up as errors near a whole ulp. ``mask`` limits the
    check to some elements (where the fp32 formula itself is accurate)."""
    dtype = got.dtype
    assert dtype in (torch.float16, torch.bfloat16)
    g = got.detach().to(torch.float64)
    r = ref.detach().to(g.device, torch.float64)
    finite = torch.isfinite(r) & (r.abs() < torch.finfo(dtype).max)
    if mask is not None:
        finite &= mask.to(g.device)
    err = torch.where(finite, (g - r).abs(), 0.0)
    bound = 0.5 * ulp(r, dtype) + rel_slack * r.abs()
    bad = err > bound
    assert not bad.any(), f"{what} ({dtype_id(dtype)}, not rounded once): " + _describe_worst(g, r, bad, err / ulp(r, dtype))


def assert_same_bits(got: torch.Tensor, ref: torch.Tensor, what: str = "result"):
    """Bit-identical, except that any NaN matches any NaN."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, f"{what}: {got.shape}/{got.dtype} vs {ref.shape}/{ref.dtype}"
    g, r = got.detach().cpu(), ref.detach().cpu()
    nan_g, nan_r = torch.isnan(g), torch.isnan(r)
    assert torch.equal(nan_g, nan_r), f"{what}: NaN pattern differs"
    int_t = torch.int32 if g.dtype == torch.float32 else torch.int16
    gb, rb = g.view(int_t)[~nan_g], r.view(int_t)[~nan_r]
    diff = gb != rb
    if diff.any():
        i = int(torch.nonzero(diff)[0])
        raise AssertionError(
            f"{what}: {int(diff.sum())} of {gb.numel()} values differ in their bits; first: got "
            f"{g[~nan_g][i].item()!r} ({int(gb[i]):#x}), expected {r[~nan_r][i].item()!r} ({int(rb[i]):#x})"
        )


# --- fp64 references -------------------------------------------------------------------------


def ref_rmsnorm(x, weight, eps=1e-6, gemma=False, residual=None) -> torch.Tensor:
    """RMSNorm in fp64 of the (unrounded) sum ``x + residual``."""
    s = x.double()
    if residual is not None:
        s = s + residual.double()
    rstd = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    return s * rstd * (weight.double() + (1.0 if gemma else 0.0))


def ref_residual(x, residual) -> torch.Tensor:
    """residual_out: the fp32 sum rounded once to the input dtype."""
    return (x.float() + residual.float()).to(x.dtype)


ACTIVATIONS = {
    "silu": F.silu,
    "gelu": lambda v: F.gelu(v, approximate="none"),
    "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
}


def ref_act_and_mul(x, activation: str) -> torch.Tensor:
    d = x.shape[-1] // 2
    v = x.double()
    return ACTIVATIONS[activation](v[..., :d]) * v[..., d:]
