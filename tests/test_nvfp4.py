"""nvfp4_gemv (batched GEMV of NVFP4 operands) and the NVFP4 format helpers.

Random inputs come from a fresh seed per test run (reported in every failure; set
OPFORGE_TEST_SEED to replay one). Results are compared with the fp64 reference
``nvfp4_gemv_reference`` (rounded to fp16 once) with rtol = atol = 1e-3, the atol relative to the
largest output magnitude: both sides are fp16 roundings of sums that differ only by fp32 rounding
(the block terms are exact everywhere), so they are equal or one fp16 ulp apart, and one ulp is at
most 2^-10 < 1e-3 of the value; the atol term covers outputs far below the largest (cancellation,
fp16 subnormals, whose ulp is absolute). A wrong code, nibble, scale block or batch moves outputs
by much more. Inputs whose sums are exact in fp32 must match bit for bit on every backend.
"""

from __future__ import annotations

import math

import pytest
import torch

import opforge
from opforge import _C
from opforge.ops import nvfp4_format as fmt
from opforge.ops.nvfp4 import nvfp4_gemv_torch
from conftest import DEVICES, NATIVE_BACKENDS, axis, capture_graph, replay, sweep, written_late_on_a_side_stream

FP4 = torch.float4_e2m1fn_x2
E4M3 = torch.float8_e4m3fn
FP16_MAX = 65504.0
TOL = 1e-3
#: Every E4M3 byte with its value (NaN codes left out).
E4M3_VALUES = [(code, v) for code, v in enumerate(torch.arange(256, dtype=torch.uint8).view(E4M3).float().tolist())
               if not math.isnan(v)]

devices = pytest.mark.parametrize("device", DEVICES)
trials = pytest.mark.parametrize("trial", range(3))  # a fresh seed each


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- inputs ----------------------------------------------------------------------------------

#: How a [rows, n, L] operand lies in memory (n along K is always contiguous):
#: seed: permuted from a contiguous [L, rows, n] (the layout of the problem's seed tensors);
#: rows_outer: from [rows, L, n]; padded: [L, rows, n + 48][..., :n] (rows further apart, still
#: 16-byte aligned); offset: one byte into a buffer (nothing aligned: the GPU's byte-load path).
LAYOUTS = ("seed", "rows_outer", "padded", "offset")


def laid_out(values: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (uint8 [rows, n, L]) in ``layout``, viewed as ``dtype`` (1 byte per element)."""
    rows, n, l = values.shape
    kw = dict(dtype=torch.uint8, device=values.device)
    if layout == "seed":
        view = torch.empty((l, rows, n), **kw).permute(1, 2, 0)
    elif layout == "rows_outer":
        view = torch.empty((rows, l, n), **kw).permute(0, 2, 1)
    elif layout == "padded":
        view = torch.full((l, rows, n + 48), 0x7F, **kw)[..., :n].permute(1, 2, 0)
    elif layout == "offset":
        view = torch.full((values.numel() + 1,), 0x7F, **kw)[1:].view(l, rows, n).permute(1, 2, 0)
    else:
        raise AssertionError(layout)
    view.copy_(values)
    return view.view(dtype)


def packed(codes: torch.Tensor) -> torch.Tensor:
    """Codes [rows, K, L] (0..15) -> bytes [rows, K/2, L], the even element in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def scale_bytes(gen, shape, low: float, high: float, negative: bool = False) -> torch.Tensor:
    """E4M3 bytes whose |value| lies in [low, high], uniform over those codes (so about
    log-uniform), positive unless ``negative`` (then either sign)."""
    codes = torch.tensor([c for c, v in E4M3_VALUES if low <= v <= high], dtype=torch.int64)
    assert len(codes), (low, high)
    picked = codes[torch.randint(len(codes), shape, generator=gen)]
    if negative:
        picked |= torch.randint(2, shape, generator=gen) << 7
    return picked.to(torch.uint8)


def bound(k: int) -> float:
    """Largest |scale_a * scale_b| that keeps every output finite in fp16 (36 is 6 * 6)."""
    return FP16_MAX / (36 * k)


class Problem:
    """One call's operands (as uint8 bytes until laid out) and its reference."""

    def __init__(self, a, b, sa, sb):
        self.bytes = (a, b, sa, sb)
        self.m, half_k, self.l = a.shape
        self.k = 2 * half_k

    def args(self, device="cpu", layout="seed"):
        a, b, sa, sb = (t.to(device) for t in self.bytes)
        return (laid_out(a, layout, FP4), laid_out(b, layout, FP4), laid_out(sa, layout, E4M3),
                laid_out(sb, layout, E4M3))

    def reference(self) -> torch.Tensor:
        return fmt.nvfp4_gemv_reference(*self.args())


def random_problem(gen, m, k, l, sa_range, sb_range, negative=False) -> Problem:
    a = packed(torch.randint(16, (m, k, l), generator=gen))
    b = packed(torch.randint(16, (1, k, l), generator=gen))
    sa = scale_bytes(gen, (m, k // 16, l), *sa_range, negative=negative)
    sb = scale_bytes(gen, (1, k // 16, l), *sb_range, negative=negative)
    return Problem(a, b, sa, sb)


def regime_ranges(regime: str, k: int) -> tuple:
    """(scale_a range, scale_b range) keeping every output finite for any codes."""
    if regime == "balanced":  # both log-uniform up to sqrt of the bound (the template's domain)
        high = math.sqrt(bound(k))
        return (2.0**-9, high), (2.0**-9, high)
    if regime == "a_full":  # scale_a over the whole E4M3 range, scale_b as small as it must be
        return (2.0**-9, 448.0), (2.0**-9, bound(k) / 448)
    if regime == "b_full":
        return (2.0**-9, bound(k) / 448), (2.0**-9, 448.0)
    if regime == "subnormal":  # every scale an E4M3 subnormal
        return (2.0**-9, 7 * 2.0**-9), (2.0**-9, 7 * 2.0**-9)
    raise AssertionError(regime)


def poisoned_out(m, l, device, layout="contiguous") -> torch.Tensor:
    if layout == "contiguous":
        return torch.full((m, 1, l), float("nan"), dtype=torch.float16, device=device)
    if layout == "seed":
        return torch.full((l, m, 1), float("nan"), dtype=torch.float16, device=device).permute(1, 2, 0)
    if layout == "strided":  # inside a wider buffer of 7s, which must stay untouched
        return torch.full((m, 3, l + 2), 7.0, dtype=torch.float16, device=device)[:, 1:2, 1 : l + 1]
    raise AssertionError(layout)


def assert_matches(got: torch.Tensor, ref: torch.Tensor, seed: int, what: str = "c"):
    """|got - ref| <= 1e-3 * |ref| + 1e-3 * max|ref| (+ half of fp16's smallest subnormal), with
    NaN and inf exactly where the reference has them."""
    assert got.shape == ref.shape and got.dtype == torch.float16, f"{what}: {got.shape} {got.dtype}, {replay(seed)}"
    g, r = got.detach().cpu().double(), ref.cpu().double()
    assert torch.equal(torch.isnan(g), torch.isnan(r)), f"{what}: NaN pattern differs; {replay(seed)}"
    inf = torch.isinf(r)
    assert torch.equal(g[inf], r[inf]) and not torch.isinf(g[~inf]).any(), f"{what}: infinities differ; {replay(seed)}"
    finite = torch.isfinite(r)
    if not finite.any():
        return
    g, r = g[finite], r[finite]
    scale = float(r.abs().max())
    err = (g - r).abs()
    limit = TOL * r.abs() + TOL * scale + 2.0**-25
    bad = err > limit
    if bad.any():
        i = int(torch.argmax(err - limit))
        raise AssertionError(f"{what}: {int(bad.sum())} of {r.numel()} outputs off by more than 1e-3 (of the "
                             f"output and of its largest magnitude {scale:.4g}); worst: got {g[i].item()!r}, expected "
                             f"{r[i].item()!r}; {replay(seed)}")


def run(problem: Problem, device, layout="seed", out_layout="contiguous", **kw):
    args = problem.args(device, layout)
    out = poisoned_out(problem.m, problem.l, device, out_layout)
    got = opforge.nvfp4_gemv(*args, out=out, **kw)
    assert got is out
    return got


backends = pytest.mark.parametrize("device, backend", NATIVE_BACKENDS)


# --- results ---------------------------------------------------------------------------------


@backends
@pytest.mark.parametrize("scale_exp", [-9, -4, -1])
def test_exact_sums_are_bit_exact(seed, device, backend, scale_exp):
    """All 256 bytes at every position of A (both nibbles, every sign, +-0) against random B,
    with power-of-two scales within 4 binades (E4M3 subnormals for -9): every sum is exact in
    fp32 whatever its order, so each backend must return the reference bit for bit."""
    gen = seeded(seed)
    m, k, l = 256, 1024, 2
    rows = torch.arange(m).view(m, 1, 1)
    a = ((rows + torch.arange(k // 2).view(1, -1, 1) * 7 + torch.arange(l).view(1, 1, -1) * 3) % 256).to(torch.uint8)
    b = torch.randint(256, (1, k // 2, l), generator=gen).to(torch.uint8)

    def powers(shape):  # exponents scale_exp .. scale_exp + 3 as E4M3 bytes
        e = torch.randint(4, shape, generator=gen) + scale_exp
        return torch.exp2(e.float()).to(E4M3).view(torch.uint8)

    problem = Problem(a, b, powers((m, k // 16, l)), powers((1, k // 16, l)))
    got = run(problem, device, backend=backend)
    ref = problem.reference()
    assert torch.equal(got.cpu(), ref), f"not bit-exact: {int((got.cpu() != ref).sum())} outputs differ; {replay(seed)}"


SHAPES = [(1, 64, 1), (3, 64, 2), (17, 192, 3), (130, 1024, 2), (37, 4096, 1), (5, 16384, 1)]


@trials
@backends
@pytest.mark.parametrize("m, k, l", SHAPES, ids=lambda v: str(v))
def test_matches_reference(seed, trial, device, backend, m, k, l):
    """Random codes and balanced scales, M not a multiple of the row tile, L > 1, K from 64."""
    problem = random_problem(seeded(seed), m, k, l, *regime_ranges("balanced", k))
    assert_matches(run(problem, device, backend=backend), problem.reference(), seed)


@backends
@pytest.mark.parametrize("which", ["a", "b", "scale_a", "scale_b", "all"])
def test_operands_strided_along_k_are_copied_not_refused(seed, device, backend, which):
    """A contiguous [rows, K/n, L] operand with L > 1 (stride L along K, as a plain allocation of
    the declared shape lies) gives the same result as the task's layout; the caller's tensor is
    left as it was."""
    problem = random_problem(seeded(seed), 37, 256, 3, *regime_ranges("balanced", 256))
    args = dict(zip(("a", "b", "scale_a", "scale_b"), problem.args(device)))
    want = opforge.nvfp4_gemv(**args, backend=backend)
    names = ("a", "b", "scale_a", "scale_b") if which == "all" else (which,)
    for name in names:
        args[name] = k_major(args[name])
        assert args[name].stride(1) != 1
    before = {name: args[name].view(torch.uint8).clone() for name in names}
    got = opforge.nvfp4_gemv(**args, backend=backend)
    assert torch.equal(got, want), replay(seed)
    assert all(torch.equal(args[name].view(torch.uint8), before[name]) for name in names)


@backends
@pytest.mark.parametrize("regime", ["a_full", "b_full", "subnormal"])
@pytest.mark.parametrize("k", [64, 256])
def test_scales_across_the_e4m3_range(seed, device, backend, regime, k):
    """One operand's scales span E4M3 from its smallest subnormal to 448 (the other's small
    enough that outputs stay finite), or every scale is subnormal; both signs."""
    problem = random_problem(seeded(seed), 70, k, 3, *regime_ranges(regime, k), negative=True)
    assert_matches(run(problem, device, backend=backend), problem.reference(), seed)


@backends
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_layout", ["contiguous", "seed", "strided"])
def test_layouts(seed, device, backend, layout, out_layout):
    """Operands and outputs with any strides outside K; nothing outside the output view is
    written."""
    problem = random_problem(seeded(seed), 45, 512, 3, *regime_ranges("balanced", 512))
    got = run(problem, device, layout, out_layout, backend=backend)
    assert_matches(got, problem.reference(), seed)
    if out_layout == "strided":
        outside = torch.ones_like(got._base, dtype=torch.bool)
        outside[:, 1:2, 1:-1] = False
        assert (got._base[outside] == 7.0).all(), "wrote outside the output view"


@backends
def test_overflow_nan_and_signs(device, backend):
    """Sums beyond fp16 become +-inf as in the reference, a NaN scale poisons its row (scale_a)
    or every row of its batch (scale_b), and -0 codes count as zero."""
    m, k, l = 4, 64, 3
    six, minus_six, minus_zero = 0x77, 0xFF, 0x88  # bytes of two equal codes
    a = torch.full((m, k // 2, l), six, dtype=torch.uint8)
    a[1] = minus_six
    a[3] = minus_zero
    b = torch.full((1, k // 2, l), six, dtype=torch.uint8)
    sa = torch.full((m, k // 16, l), 448.0).to(E4M3).view(torch.uint8)
    sb = torch.full((1, k // 16, l), 1.0).to(E4M3).view(torch.uint8)
    sa[2, 1, 0] = 0x7F  # NaN
    sb[0, 3, 2] = 0xFF  # -NaN
    problem = Problem(a, b, sa, sb)
    got, ref = run(problem, device, backend=backend).cpu(), problem.reference()
    assert torch.isinf(ref[0, 0, :2]).all() and (ref[0, 0, :2] > 0).all() and (ref[1, 0, :2] < 0).all()
    assert torch.isnan(ref[2, 0, 0]) and torch.isnan(ref[:, 0, 2]).all() and ref[3, 0, 0] == 0
    assert_matches(got, ref, 0)


@backends
def test_out_is_written_in_place(seed, device, backend):
    """out= is filled and returned, its version counter bumped as by torch's in-place ops."""
    problem = random_problem(seeded(seed), 9, 128, 2, *regime_ranges("balanced", 128))
    out = poisoned_out(9, 2, device, "seed")
    version = out._version
    got = opforge.nvfp4_gemv(*problem.args(device), out=out, backend=backend)
    assert got is out and out._version > version
    assert_matches(out, problem.reference(), seed)


@devices
@pytest.mark.parametrize("layout", ["seed", "rows_outer"])
def test_allocated_out_follows_a(seed, device, layout):
    problem = random_problem(seeded(seed), 6, 64, 3, *regime_ranges("balanced", 64))
    a, b, sa, sb = problem.args(device, layout)
    got = opforge.nvfp4_gemv(a, b, sa, sb)
    assert got.shape == (6, 1, 3) and got.dtype == torch.float16 and got.device == a.device
    assert (got.stride(2) > got.stride(0)) == (a.stride(2) > a.stride(0))
    assert_matches(got, problem.reference(), seed)


@backends
@pytest.mark.parametrize("m, k, l", [(0, 64, 2), (3, 64, 0), (0, 0, 0), (4, 0, 2)], ids=str)
def test_empty_dimensions(device, backend, m, k, l):
    """M = 0 or L = 0: an empty result; K = 0: zeros (an empty sum)."""
    args = Problem(torch.zeros((m, k // 2, l), dtype=torch.uint8), torch.zeros((1, k // 2, l), dtype=torch.uint8),
                   torch.zeros((m, k // 16, l), dtype=torch.uint8),
                   torch.zeros((1, k // 16, l), dtype=torch.uint8)).args(device)
    got = opforge.nvfp4_gemv(*args, backend=backend)
    assert got.shape == (m, 1, l) and got.dtype == torch.float16
    assert (got == 0).all()


@devices
def test_backends_agree_and_repeat(seed, device):
    """The native backend and plain PyTorch agree; the native one is deterministic."""
    problem = random_problem(seeded(seed), 300, 2048, 2, *regime_ranges("balanced", 2048))
    args = problem.args(device)
    native = opforge.nvfp4_gemv(*args)
    assert torch.equal(native, opforge.nvfp4_gemv(*args)), replay(seed)
    assert_matches(native, opforge.nvfp4_gemv(*args, backend="torch"), seed, "native vs torch")
    assert_matches(nvfp4_gemv_torch(*args), problem.reference(), seed, "torch formula")


def test_keyword_arguments(seed):
    problem = random_problem(seeded(seed), 5, 64, 1, *regime_ranges("balanced", 64))
    a, b, sa, sb = problem.args()
    assert torch.equal(opforge.nvfp4_gemv(scale_b=sb, scale_a=sa, b=b, a=a), opforge.nvfp4_gemv(a, b, sa, sb))


# --- bad arguments ---------------------------------------------------------------------------


def valid_args(m=4, k=64, l=2) -> dict:
    p = Problem(torch.zeros((m, k // 2, l), dtype=torch.uint8), torch.zeros((1, k // 2, l), dtype=torch.uint8),
                torch.full((m, k // 16, l), 0x38, dtype=torch.uint8), torch.full((1, k // 16, l), 0x38, dtype=torch.uint8))
    a, b, sa, sb = p.args()
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "out": poisoned_out(m, l, "cpu")}


def k_major(t: torch.Tensor) -> torch.Tensor:
    """The same values stored contiguously as [rows, K, L], so K is not contiguous."""
    return t.view(torch.uint8).contiguous().view(t.dtype)


def freed(t: torch.Tensor) -> torch.Tensor:
    t = t.view(torch.uint8).clone().view(t.dtype) if t.dtype != torch.float16 else t.clone()
    t.untyped_storage().resize_(0)
    return t


def out_over_a(args):
    """a and out share bytes of one buffer."""
    a = args["a"]
    buf = torch.zeros(a.numel() + 64, dtype=torch.uint8)
    args["a"] = buf[: a.numel()].view(a.shape[2], a.shape[0], a.shape[1]).permute(1, 2, 0).view(FP4)
    args["out"] = buf[a.numel() - 8 : a.numel() - 8 + 2 * 4 * 2].view(torch.float16).view(4, 1, 2)


ERRORS = {
    # name: (change, exception, words the message must contain)
    "a-uint8": (lambda s: s.update(a=s["a"].view(torch.uint8)), TypeError,
                ("a has dtype uint8", "float4_e2m1fn_x2", "a.view(torch.float4_e2m1fn_x2)")),
    "b-float16": (lambda s: s.update(b=torch.zeros(1, 32, 2, dtype=torch.float16)), TypeError,
                  ("b has dtype float16", "float4_e2m1fn_x2")),
    "scale_a-float32": (lambda s: s.update(scale_a=s["scale_a"].float()), TypeError,
                        ("scale_a has dtype float32", "float8_e4m3fn")),
    "scale_b-uint8": (lambda s: s.update(scale_b=s["scale_b"].view(torch.uint8)), TypeError,
                      ("scale_b", "uint8", "scale_b.view(torch.float8_e4m3fn)")),
    "scale_a-e5m2": (lambda s: s.update(scale_a=s["scale_a"].view(torch.float8_e5m2)), TypeError,
                     ("float8_e5m2", "float8_e4m3fn")),
    "out-float32": (lambda s: s.update(out=torch.zeros(4, 1, 2)), TypeError, ("out has dtype float32", "float16")),
    "a-2d": (lambda s: s.update(a=s["a"][:, :, 0]), ValueError, ("a has shape (4, 32)", "[M, K/2, L]")),
    "k-not-multiple-of-64": (lambda s: s.update(**valid_args(k=96)), ValueError, ("K = 96", "multiple of 64")),
    "b-k-mismatch": (lambda s: s.update(b=valid_args(k=128)["b"]), ValueError, ("b has shape (1, 64, 2)", "K/2")),
    "b-l-mismatch": (lambda s: s.update(b=valid_args(l=3)["b"]), ValueError, ("b has shape (1, 32, 3)", "L")),
    "b-first-dim-2": (lambda s: s.update(b=valid_args(m=2)["a"]), ValueError, ("b has shape (2, 32, 2)", "(1, 32, 2)")),
    "scale_a-shape": (lambda s: s.update(scale_a=valid_args(m=5)["scale_a"]), ValueError,
                      ("scale_a has shape (5, 4, 2)", "(4, 4, 2)")),
    "scale_b-shape": (lambda s: s.update(scale_b=valid_args(k=128)["scale_b"]), ValueError,
                      ("scale_b has shape (1, 8, 2)", "(1, 4, 2)")),
    "scale_a-blocked": (lambda s: s.update(scale_a=fmt.to_blocked(s["scale_a"].view(torch.uint8)).view(E4M3)),
                        ValueError, ("scale_a", "blocked", "from_blocked")),
    "out-shape": (lambda s: s.update(out=poisoned_out(4, 3, "cpu")), ValueError, ("out has shape (4, 1, 3)", "(4, 1, 2)")),
    "out-expanded": (lambda s: s.update(out=poisoned_out(1, 2, "cpu").expand(4, 1, 2)), ValueError,
                     ("out", "overlap")),
    "out-overlaps-a": (out_over_a, ValueError, ("out overlaps a", "separate")),
    "out-on-meta": (lambda s: s.update(out=torch.empty(4, 1, 2, dtype=torch.float16, device="meta")), ValueError,
                    ("out", "meta")),
    "a-storage-freed": (lambda s: s.update(a=freed(s["a"])), ValueError, ("a", "storage", "holds 0 bytes")),
    "scale_a-list": (lambda s: s.update(scale_a=[1.0]), TypeError, ("scale_a", "torch.Tensor", "list")),
}
#: Cases the compiled binding finds (so also with skip_check=True and every backend).
COMPILED = [n for n in ERRORS if n != "scale_a-list"]


@pytest.mark.parametrize("name, skip_check", [pytest.param(n, skip, id=f"{n}{'-skip_check' if skip else ''}")
                                              for n in ERRORS for skip in (False, True) if not skip or n in COMPILED])
@pytest.mark.parametrize("backend", ["auto", "cpu", "torch"])
def test_bad_arguments(name, backend, skip_check):
    """Each error names the op, the argument, what was given and what is accepted, and nothing
    is written; the compiled checks hold with skip_check=True and on every backend."""
    change, exc, needles = ERRORS[name]
    args = valid_args()
    out = args["out"]
    change(args)
    a = args.pop("a")
    with pytest.raises(exc) as info:
        opforge.nvfp4_gemv(a, **args, backend=backend, skip_check=skip_check)
    message = str(info.value)
    assert message.startswith("opforge.nvfp4_gemv:"), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert torch.isnan(out).all(), "a rejected call wrote out"


def test_scale_that_requires_grad():
    """fp8 scales can require grad; the op has no backward, so they are refused in grad mode
    and accepted under no_grad."""
    args = valid_args()
    args["scale_a"] = args["scale_a"].float().requires_grad_().to(E4M3)
    with pytest.raises(ValueError, match="^opforge.nvfp4_gemv: .*scale_a requires grad"):
        opforge.nvfp4_gemv(**args)
    with torch.no_grad():
        opforge.nvfp4_gemv(**args)


def test_unknown_and_impossible_backends():
    with pytest.raises(opforge.BackendError, match="'triton'"):
        opforge.nvfp4_gemv(**valid_args(), backend="triton")
    with pytest.raises(ValueError, match="^opforge.nvfp4_gemv: .*CUDA"):
        opforge.nvfp4_gemv(**valid_args(), backend="cuda")


# --- the CUDA plan (plain C++, checked without a GPU) ------------------------------------------


def plan(m, k, l, sms=132, **force):
    return _C.nvfp4_gemv_plan(m, k, l, sms, **force)


@pytest.mark.parametrize("m, k, l, group, blocks_per_sm", [(7168, 16384, 1, 32, 2), (4096, 7168, 8, 16, 2),
                                                            (7168, 2048, 4, 16, 4)], ids=str)
def test_plan_of_the_decode_shapes(m, k, l, group, blocks_per_sm):
    """Enough rows x batches to fill an H100 with 4-row groups: no split, no workspace, every
    block resident at once, the tasks dealt over them; 16-thread groups where they still fill 3/4
    of the resident threads, a warp where they would not; 4 blocks per SM (4 vectors in flight
    per thread) where a thread reads at most 8 vectors of a row, 2 (8 in flight) for longer rows
    (the plans measured fastest on an H100, bench/results)."""
    p = plan(m, k, l)
    assert (p["rows"], p["group"], p["splits"], p["workspace"]) == (4, group, 1, 0), p
    assert (p["blocks_per_sm"], p["blocks"]) == (blocks_per_sm, 132 * blocks_per_sm), p


def test_plan_occupancy_follows_the_row_slice_per_thread():
    """8 vectors of a row's slice per thread still take the 4-block kernel, 9 the 2-block one;
    a split shortens the slice."""
    assert plan(4096, 8 * 32 * 32, 8, rows=4, group=32, splits=1)["blocks_per_sm"] == 4
    assert plan(4096, 9 * 32 * 32, 8, rows=4, group=32, splits=1)["blocks_per_sm"] == 2
    assert plan(4096, 9 * 32 * 32, 8, rows=4, group=32, splits=2)["blocks_per_sm"] == 4
    small = plan(100, 1024, 1)  # fewer blocks than SMs: one per SM, whatever the occupancy
    assert small["blocks"] <= 132 and small["blocks_per_sm"] in (2, 4)


@pytest.mark.parametrize("m", [128, 256])
def test_plan_of_few_rows_spreads_k_over_wide_groups(m):
    """Small M at decode (128-256 rows, K = 7168): one row per group of 128 threads, no split."""
    p = plan(m, 7168, 1)
    assert (p["rows"], p["group"], p["splits"]) == (1, 128, 1), p


def test_plan_splits_k_only_for_few_long_rows():
    few = plan(8, 65536, 1)
    assert few["rows"] == 1 and few["group"] == 256 and few["splits"] > 1, few
    assert few["workspace"] == few["splits"] * 8
    assert plan(8, 4096, 1)["splits"] == 1  # short rows: one pass reads them all at once
    assert plan(4096, 65536, 1)["splits"] == 1


@pytest.mark.parametrize("m, k, l", [(1, 64, 1), (3, 192, 5), (100, 1024, 1), (512, 16384, 1), (1, 0, 1)], ids=str)
def test_plan_is_well_formed(m, k, l):
    p = plan(m, k, l)
    assert p["rows"] in (1, 2, 4) and p["rows"] <= max(m, 1)
    group = p["group"]
    assert group & (group - 1) == 0 and 1 <= group <= 256
    assert group <= max(k // 32, 1)  # no lane without a vector


def test_forced_plans():
    assert plan(100, 1024, 2, rows=2, group=64, splits=3)["workspace"] == 600
    with pytest.raises(ValueError, match="plan"):
        plan(100, 1024, 2, rows=3, group=64, splits=1)
    with pytest.raises(ValueError, match="plan"):
        plan(100, 1024, 2, rows=1, group=48, splits=1)
    # the occupancy alone: the heuristic's plan, at that occupancy
    chosen = plan(7168, 2048, 4)
    deep = plan(7168, 2048, 4, blocks_per_sm=2)
    assert (deep["rows"], deep["group"], deep["splits"]) == (chosen["rows"], chosen["group"], chosen["splits"])
    assert (deep["blocks_per_sm"], deep["blocks"]) == (2, 264)
    assert plan(7168, 2048, 4, rows=4, group=16, splits=1, blocks_per_sm=2)["blocks_per_sm"] == 2
    for bad in (1, 3, 8):
        with pytest.raises(ValueError, match="blocks_per_sm 2 or 4"):
            plan(7168, 2048, 4, blocks_per_sm=bad)


# --- NVFP4 layout helpers --------------------------------------------------------------------


@trials
def test_blocked_layout_both_ways(seed, trial):
    """to_blocked puts scale[i, j, l] at [i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, l]
    with zero padding; from_blocked inverts it."""
    gen = seeded(seed)
    rows, blocks, l = (int(torch.randint(1, high, (), generator=gen)) for high in (300, 40, 4))
    scale = scale_bytes(gen, (rows, blocks, l), 2.0**-9, 448.0).view(E4M3)
    blocked = fmt.to_blocked(scale)
    assert tuple(blocked.shape) == fmt.blocked_shape(rows, 16 * blocks, l) == (32, 4, -(-rows // 128), 4,
                                                                               -(-blocks // 4), l)
    raw = blocked.view(torch.uint8)
    i, j, b = torch.meshgrid(torch.arange(rows), torch.arange(blocks), torch.arange(l), indexing="ij")
    placed = raw[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, b]
    assert torch.equal(placed, scale.view(torch.uint8)), replay(seed)
    assert int(raw.sum(dtype=torch.int64)) == int(scale.view(torch.uint8).sum(dtype=torch.int64)), "padding not zero"
    back = fmt.from_blocked(blocked, rows, blocks)
    assert torch.equal(back.view(torch.uint8), scale.view(torch.uint8)) and back.is_contiguous()
    # and from an arbitrary blocked tensor: the formula read backwards
    noise = torch.randint(256, tuple(blocked.shape), generator=gen, dtype=torch.uint8)
    assert torch.equal(fmt.from_blocked(noise, rows, blocks), noise[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, b])


# --- torch.library / torch.compile -----------------------------------------------------------


def test_registered_op():
    schema = torch.ops.opforge.nvfp4_gemv.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"out"} and len(schema.returns) == 0
    # opcheck's schema test copies tensors, which torch cannot do for float4_e2m1fn_x2.
    args = valid_args(m=5, k=128, l=2)
    torch.library.opcheck(torch.ops.opforge.nvfp4_gemv.default,
                          (args["out"], args["a"], args["b"], args["scale_a"], args["scale_b"]),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
@devices
def test_compiled_matches_eager(seed, device):
    def f(a, b, sa, sb):
        return opforge.nvfp4_gemv(a, b, sa, sb).float() * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    gen = seeded(seed)
    for _ in range(2):  # the second call runs the cached graph on new values
        args = random_problem(gen, 33, 256, 2, *regime_ranges("balanced", 256)).args(device)
        assert torch.equal(compiled(*args), f(*args)), replay(seed)


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_reports_shape_mismatch():
    args = valid_args()
    args["b"] = valid_args(k=128)["b"]
    compiled = torch.compile(lambda a, b, sa, sb: opforge.nvfp4_gemv(a, b, sa, sb), fullgraph=True)
    with pytest.raises(Exception, match="do not match"):
        compiled(args["a"], args["b"], args["scale_a"], args["scale_b"])


# --- CUDA only -------------------------------------------------------------------------------


def _forced_plans():
    return [pytest.param(r, g, s, bps, marks=pytest.mark.gpu, id=f"rows{r}-group{g}-splits{s}-bps{bps}")
            for r in (1, 2, 4) for g in (1, 4, 32, 64, 256) for s, bps in ((1, 2), (1, 4), (3, -1))]


@pytest.mark.parametrize("rows, group, splits, blocks_per_sm", _forced_plans())
@pytest.mark.parametrize("layout", ["seed", "offset"])
def test_every_cuda_kernel_variant(seed, rows, group, splits, blocks_per_sm, layout):
    """Every instantiation (rows x aligned loads at either occupancy / byte loads) with group
    widths across and within warps and K split or not, forced past the heuristic: M not a
    multiple of rows, an uneven split of K, L > 1."""
    problem = random_problem(seeded(seed), 37, 2112, 3, *regime_ranges("balanced", 2112))
    a, b, sa, sb = problem.args("cuda", layout)
    out = poisoned_out(37, 3, "cuda", "seed")
    stream = torch.cuda.current_stream().cuda_stream
    forced = (rows, group, splits, blocks_per_sm)
    need = _C.nvfp4_gemv(out, a, b, sa, sb, None, stream, True, *forced)
    assert need == (37 * 3 * splits if splits > 1 else 0)
    if need:
        workspace = torch.full((need,), float("nan"), device="cuda")
        assert _C.nvfp4_gemv(out, a, b, sa, sb, workspace, stream, True, *forced) == 0
    torch.cuda.synchronize()
    assert_matches(out, problem.reference(), seed)


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, l", [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4), (8, 65536, 1),
                                     (1, 64, 1)], ids=str)
def test_cuda_shapes(seed, m, k, l):
    """The decode shapes, a split plan (few long rows) and the smallest problem, against the
    CPU op (same block terms, other fp32 order) and, for the small ones, the reference."""
    problem = random_problem(seeded(seed), m, k, l, *regime_ranges("balanced", k))
    got = run(problem, "cuda")
    assert_matches(got, run(problem, "cpu"), seed, "cuda vs cpu")
    if m * k * l <= 1 << 24:
        assert_matches(got, problem.reference(), seed)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(seed):
    """Captured calls (one into out=, one allocating, one with a split plan and its workspace)
    replay correctly on new operand values."""
    gen = seeded(seed)
    shapes = [(300, 2048, 2), (64, 1024, 1), (8, 65536, 1)]
    problems = [random_problem(gen, *s, *regime_ranges("balanced", s[1])) for s in shapes]
    static = [p.args("cuda") for p in problems]
    out = poisoned_out(300, 2, "cuda")

    def step():
        opforge.nvfp4_gemv(*static[0], out=out)
        return opforge.nvfp4_gemv(*static[1]), opforge.nvfp4_gemv(*static[2])

    graph, outs = capture_graph(step)
    for _ in range(2):
        fresh = [random_problem(gen, *s, *regime_ranges("balanced", s[1])) for s in shapes]
        for dst, p in zip(static, fresh):
            for d, s in zip(dst, p.args("cuda")):
                d.view(torch.uint8).copy_(s.view(torch.uint8))
        graph.replay()
        torch.cuda.synchronize()
        for got, p in zip((out, *outs), fresh):
            assert_matches(got, p.reference(), seed)


@pytest.mark.gpu
@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_with_cuda_graphs(seed):
    """mode="reduce-overhead" captures the op into CUDA graphs and replays it."""
    compiled = torch.compile(lambda *args: opforge.nvfp4_gemv(*args).float() + 1, mode="reduce-overhead",
                             fullgraph=True, dynamic=False)
    gen = seeded(seed)
    for _ in range(4):
        problem = random_problem(gen, 256, 4096, 2, *regime_ranges("balanced", 4096))
        args = problem.args("cuda")
        assert torch.equal(compiled(*args), opforge.nvfp4_gemv(*args).float() + 1), replay(seed)


@pytest.mark.gpu
def test_runs_on_the_current_stream(seed):
    """The kernel is ordered after earlier work on a user stream."""
    problem = random_problem(seeded(seed), 1024, 4096, 1, *regime_ranges("balanced", 4096))
    args = problem.args("cuda")
    a_bytes = args[0].view(torch.uint8)
    got = written_late_on_a_side_stream(a_bytes, a_bytes.clone(), lambda: opforge.nvfp4_gemv(*args))
    assert_matches(got, problem.reference(), seed)


@pytest.mark.gpu
def test_tensors_on_a_device_that_is_not_current(seed):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    problem = random_problem(seeded(seed), 64, 1024, 2, *regime_ranges("balanced", 1024))
    with torch.cuda.device(0):
        got = opforge.nvfp4_gemv(*problem.args("cuda:1"))
    torch.cuda.synchronize(1)
    assert got.device == torch.device("cuda:1")
    assert_matches(got, problem.reference(), seed)


@pytest.mark.gpu
def test_cuda_and_cpu_tensors_mixed():
    args = valid_args()
    args["scale_b"] = args["scale_b"].cuda()
    with pytest.raises(ValueError, match="scale_b is on cuda:0 but a is on cpu"):
        opforge.nvfp4_gemv(**args)


# --- the Triton solution (GPU) ----------------------------------------------------------------


def _triton_solution():
    pytest.importorskip("triton")
    from opforge.solutions import nvfp4_gemv_triton

    return nvfp4_gemv_triton


@pytest.mark.gpu
@pytest.mark.parametrize("splits, layout, m, k, l", sweep(
    axis([None, 1, 3]), axis(LAYOUTS),
    [pytest.param(*s, id=str(s)) for s in [(1, 64, 1), (37, 2112, 3), (128, 7168, 1), (33, 4096, 1), (300, 2048, 2),
                                            (7168, 2048, 1)]],
    # "rows_outer" and "padded" take the 32-bit word path as "seed" does, only with other
    # strides (run-time values): each split count runs on both read paths ("seed": words,
    # "offset": bytes), the other layouts once, unsplit.
    default=lambda splits, layout, m, k, l: splits is None or layout in ("seed", "offset")))
def test_triton_solution(seed, m, k, l, layout, splits):
    """The Triton solution the built-in dataset ships, on both of its read paths (32-bit words
    where K rows are 4-byte aligned, bytes for the offset layout), L = 1 and L > 1, M not a
    multiple of its row tile, K split or not."""
    solution = _triton_solution()
    problem = random_problem(seeded(seed), m, k, l, *regime_ranges("balanced", k))
    out = poisoned_out(m, l, "cuda", "seed")
    got = solution.nvfp4_gemv(*problem.args("cuda", layout), out, splits=splits)
    torch.cuda.synchronize()
    assert got is out
    assert_matches(got, problem.reference(), seed)


@pytest.mark.gpu
@pytest.mark.parametrize("regime", ["a_full", "b_full", "subnormal"])
def test_triton_solution_entry_across_the_e4m3_range(seed, regime):
    """Seed 003's one-tuple entry (blocked scales passed along, plain ones read) over the scale
    regimes that stress the exponent handling."""
    solution = _triton_solution()
    problem = random_problem(seeded(seed), 130, 1024, 2, *regime_ranges(regime, 1024))
    a, b, sa, sb = problem.args("cuda")
    c = poisoned_out(130, 2, "cuda")
    got = solution.triton_kernel((a, b, sa, sb, fmt.to_blocked(sa), fmt.to_blocked(sb), c))
    torch.cuda.synchronize()
    assert got is c
    assert_matches(got, problem.reference(), seed)
