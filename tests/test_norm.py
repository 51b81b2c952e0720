"""RMSNorm family: rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm.

Every result is compared with an fp64 reference computed from the same inputs; 16-bit results
must also be the reference rounded once (fp32 math, one rounding to the dtype), and the fused
ops' residual_out must be bit-identical to the fp32 sum rounded to the dtype.
"""

from __future__ import annotations

import pytest
import torch

import opforge
from opforge import _C
from conftest import (
    DEVICES,
    capture_graph,
    DTYPES,
    LAYOUTS,
    assert_close,
    assert_rounded_once,
    assert_same_bits,
    dtype_id,
    laid_out,
    outside_view,
    poisoned,
    poisoned_like,
    ref_residual,
    ref_rmsnorm,
    shape_params,
    axis,
    sweep,
    written_late_on_a_side_stream,
)

#: name -> (op, gemma, fused add)
OPS = {
    "rmsnorm": (opforge.rmsnorm, False, False),
    "gemma_rmsnorm": (opforge.gemma_rmsnorm, True, False),
    "fused_add_rmsnorm": (opforge.fused_add_rmsnorm, False, True),
    "gemma_fused_add_rmsnorm": (opforge.gemma_fused_add_rmsnorm, True, True),
}
FUSED = [name for name, (_, _, add) in OPS.items() if add]
HIDDEN = (1, 2, 3, 7, 8, 16, 33, 127, 128, 1000, 4096, 4097, 5120, 8192, 16384, 65536)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
ops = pytest.mark.parametrize("name", list(OPS))
fused_ops = pytest.mark.parametrize("name", FUSED)
devices = pytest.mark.parametrize("device", DEVICES)
DTYPE_AXIS, OP_AXIS = axis(DTYPES, dtype_id), axis(OPS)


def reaches_new_code(name, dtype, device="cuda"):
    """Whether a CUDA case of an op and dtype reaches launch code that another default case does
    not: the launch shape (vector width, vectors per thread, rows per block, the big-batch
    choice) depends on the element width and on the fused add only, so fp16 repeats bf16 (both
    2 bytes) and the Gemma ops repeat their plain forms (Gemma's 1 + weight is a run-time
    offset in the same kernels). On the CPU every case runs one loop: all are kept."""
    return device == "cpu" or (dtype != torch.float16 and not OPS[name][1])


def make_inputs(rng, name, shape, dtype, device, weight_scale=1.0):
    """(input, residual or None, weight) with fresh random values."""
    _, gemma, add = OPS[name]
    x = rng.randn(*shape, dtype=dtype, device=device)
    residual = rng.randn(*shape, dtype=dtype, device=device) if add else None
    # Gemma checkpoints store small weights around 0 (applied as 1 + w).
    w = rng.randn(shape[-1], dtype=dtype, device=device, scale=0.1 if gemma else weight_scale)
    return x, residual, w


def call(name, x, residual, w, eps=1e-6, out=None, residual_out=None, **kw):
    """Runs the op; returns (out, residual_out or None)."""
    fn, _, add = OPS[name]
    if add:
        return fn(x, residual, w, eps, out=out, residual_out=residual_out, **kw)
    return fn(x, w, eps, out=out, **kw), None


def check(name, got_out, got_res, x, residual, w, eps=1e-6):
    """Compares with the references computed from (copies of) the inputs before the call."""
    _, gemma, add = OPS[name]
    ref = ref_rmsnorm(x, w, eps, gemma, residual)
    assert_close(got_out, ref, what=f"{name} out")
    if x.dtype != torch.float32:
        assert_rounded_once(got_out, ref, what=f"{name} out")
    if add:
        assert_same_bits(got_res, ref_residual(x, residual), what=f"{name} residual_out")


def _reference_case(device, rows, hidden, dtype, name):
    # Every hidden size (vector tails, every launch shape up to the streaming kernel) in every op
    # and dtype at decode sizes (1 and 3 rows); from 64 rows (several rows per block, partial
    # last blocks, the big-batch launch) on CUDA in the op/dtype pairs that reach new code. CPU
    # rows beyond 2^18 elements repeat the same row loop (the GIL is already released from 2^16
    # elements on: 1x65536, 3x65536, 64x4096).
    if device == "cpu":
        return rows * hidden <= 1 << 18
    return rows <= 3 or reaches_new_code(name, dtype)


@pytest.mark.parametrize("device, rows, hidden, dtype, name",
                         sweep(shape_params(HIDDEN), DTYPE_AXIS, OP_AXIS, default=_reference_case))
def test_matches_reference(rng, name, dtype, device, rows, hidden):
    _, _, add = OPS[name]
    x, residual, w = make_inputs(rng, name, (rows, hidden), dtype, device)
    originals = [t.clone() for t in (x, residual, w) if t is not None]
    out = poisoned_like(x)
    residual_out = poisoned_like(x) if add else None

    got_out, got_res = call(name, x, residual, w, out=out, residual_out=residual_out)

    assert got_out is out
    assert got_res is residual_out
    for before, after in zip(originals, [t for t in (x, residual, w) if t is not None]):
        assert_same_bits(after, before, what="an input (must not be modified)")
    check(name, got_out, got_res, x, residual, w)


@ops
@dtypes
@devices
@pytest.mark.parametrize("shape", [(2, 5, 128), (3, 1, 33), (1, 7), (4097,)], ids=str)
def test_allocates_output_of_input_shape(rng, name, dtype, device, shape):
    _, _, add = OPS[name]
    x, residual, w = make_inputs(rng, name, shape, dtype, device)
    got_out, got_res = call(name, x, residual, w)
    for t in (got_out, got_res) if add else (got_out,):
        assert t.shape == x.shape and t.dtype == dtype and t.device == x.device
        assert t.data_ptr() not in (x.data_ptr(), w.data_ptr())
    check(name, got_out, got_res, x, residual, w)


@pytest.mark.parametrize("device, rows, hidden, layout, dtype, name", sweep(
    [pytest.param("cpu", 6, h, id=f"cpu-6x{h}") for h in (8, 127, 4096)]
    + [pytest.param("cuda", 130, h, marks=pytest.mark.gpu, id=f"cuda-130x{h}") for h in (8, 127, 4096, 5120, 65536)],
    axis(LAYOUTS), DTYPE_AXIS, OP_AXIS,
    default=lambda device, rows, hidden, layout, dtype, name: reaches_new_code(name, dtype, device)))
def test_strided_and_misaligned_layouts(rng, name, dtype, layout, device, rows, hidden):
    """Inputs and outputs as rows of wider tensors, one element off alignment, or 3-D qkv slices;
    nothing outside the output views may be written."""
    _, _, add = OPS[name]
    x0, r0, w = make_inputs(rng, name, (rows, hidden), dtype, device)
    x = laid_out(x0, layout)
    residual = laid_out(r0, layout) if add else None
    out = laid_out(poisoned_like(x0), layout, fill=7.0)
    residual_out = laid_out(poisoned_like(x0), layout, fill=7.0) if add else None

    got_out, got_res = call(name, x, residual, w, out=out, residual_out=residual_out)

    assert got_out is out
    check(name, got_out, got_res, x, residual, w)
    for t in (out, residual_out) if add else (out,):
        if t._base is not None:
            assert (outside_view(t) == 7.0).all(), "wrote outside the output view"


@pytest.mark.parametrize("device, hidden, layout, dtype, name", sweep(
    [pytest.param("cpu", h, id=f"cpu-{h}") for h in (1000, 65536)]
    + [pytest.param("cuda", h, marks=pytest.mark.gpu, id=f"cuda-{h}") for h in (1000, 4096, 65536)],
    axis(["contiguous", "padded", "misaligned", "qkv"]), DTYPE_AXIS, OP_AXIS,
    default=lambda device, hidden, layout, dtype, name: reaches_new_code(name, dtype, device)))
def test_in_place(rng, name, dtype, device, layout, hidden):
    """out=input (and residual_out=residual) updates the tensors in place (65536: the streaming
    kernel, which reads each row twice)."""
    _, _, add = OPS[name]
    x0, r0, w = make_inputs(rng, name, (6, hidden), dtype, device)
    x = laid_out(x0, layout)
    residual = laid_out(r0, layout) if add else None
    got_out, got_res = call(name, x, residual, w, out=x, residual_out=residual)
    assert got_out is x
    assert got_res is residual
    check(name, x, residual, x0.view(x.shape), r0.view(x.shape) if add else None, w)


@fused_ops
@dtypes
@devices
def test_fused_in_place_swapped(rng, name, dtype, device):
    """out=residual, residual_out=input is also an exact alias of an input: allowed."""
    x, r, w = make_inputs(rng, name, (5, 4096), dtype, device)
    x0, r0 = x.clone(), r.clone()
    got_out, got_res = call(name, x, r, w, out=r, residual_out=x)
    assert got_out is r and got_res is x
    check(name, r, x, x0, r0, w)


@fused_ops
@devices
def test_fused_norm_uses_unrounded_sum(name, device):
    """fp16: 60000 + 10000 overflows the dtype, so residual_out is inf, but the norm of the fp32
    sum is finite: out must not be computed from the rounded residual_out."""
    x = torch.full((2, 16), 60000.0, dtype=torch.float16, device=device)
    r = torch.full((2, 16), 10000.0, dtype=torch.float16, device=device)
    r[:, ::2] = -10000.0
    w = torch.full((16,), 0.5, dtype=torch.float16, device=device)
    got_out, got_res = call(name, x, r, w)
    assert torch.isinf(got_res[:, 1::2]).all()
    assert torch.isfinite(got_out).all()
    check(name, got_out, got_res, x, r, w)


@ops
@devices
def test_fp16_math_is_fp32(name, device):
    """Squares of 2e4 overflow fp16 (max 65504); fp32 math normalises them correctly."""
    x = torch.tensor([[2.0e4, -3.0e4, 1.0e4, 2.5e4, 5.0, -60000.0, 0.0, 1.0]], dtype=torch.float16, device=device)
    w = torch.linspace(-1, 1, 8, dtype=torch.float16, device=device)
    residual = torch.zeros_like(x) if OPS[name][2] else None
    got_out, got_res = call(name, x, residual, w)
    assert torch.isfinite(got_out).all()
    check(name, got_out, got_res, x, residual, w)


@ops
@devices
@pytest.mark.parametrize("eps", [0.0, 1e-2, 1.0, 10])
def test_eps_is_applied(rng, name, device, eps):
    x, residual, w = make_inputs(rng, name, (4, 64), torch.float32, device)
    x = x * 0.05  # mean square around eps, so eps changes the result
    if residual is not None:
        residual = residual * 0.05
    got_out, got_res = call(name, x, residual, w, eps=eps)
    check(name, got_out, got_res, x, residual, w, eps=eps)


@ops
@dtypes
@devices
def test_zero_rows_give_zeros(name, dtype, device):
    x = torch.zeros(3, 256, dtype=dtype, device=device)
    w = torch.ones(256, dtype=dtype, device=device)
    residual = torch.zeros_like(x) if OPS[name][2] else None
    got_out, _ = call(name, x, residual, w)
    assert (got_out == 0).all()


@ops
@devices
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0), (0,)], ids=str)
def test_empty(name, device, shape):
    _, _, add = OPS[name]
    x = torch.empty(shape, device=device)
    w = torch.ones(shape[-1], device=device)
    residual = torch.empty(shape, device=device) if add else None
    got_out, got_res = call(name, x, residual, w)
    assert got_out.shape == x.shape
    if add:
        assert got_res.shape == x.shape


@ops
@dtypes
@devices
def test_broadcast_input_rows(rng, name, dtype, device):
    """Read-only inputs may repeat one row (row stride 0); every output row is its norm."""
    _, _, add = OPS[name]
    row, r_row, w = make_inputs(rng, name, (1, 48), dtype, device)
    x = row.expand(5, 48)
    residual = r_row.expand(5, 48) if add else None
    out = poisoned((5, 48), dtype, device)
    residual_out = poisoned((5, 48), dtype, device) if add else None
    got_out, got_res = call(name, x, residual, w, out=out, residual_out=residual_out)
    check(name, got_out, got_res, x, residual, w)


@ops
@dtypes
@devices
@pytest.mark.parametrize("backend", ["torch", "native", "auto"])
def test_backends(rng, name, dtype, device, backend):
    """backend="torch" (plain PyTorch) and the explicit native backend give the reference too;
    the native backend named explicitly is bit-identical to auto."""
    x, residual, w = make_inputs(rng, name, (7, 1000), dtype, device)
    chosen = device if backend == "native" else backend
    got_out, got_res = call(name, x, residual, w, backend=chosen)
    check(name, got_out, got_res, x, residual, w)
    auto_out, auto_res = call(name, x, residual, w)
    if chosen != "torch":
        assert_same_bits(got_out, auto_out)
    else:
        assert_close(got_out, auto_out.double(), what="torch backend vs native")


@ops
@devices
@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_parameter_weight_without_grad(rng, name, device, grad_mode):
    x, residual, w = make_inputs(rng, name, (3, 64), torch.float32, device)
    p = torch.nn.Parameter(w.clone())
    with torch.no_grad() if grad_mode == "no_grad" else torch.inference_mode():
        got_out, got_res = call(name, x, residual, p)
    check(name, got_out, got_res, x, residual, w)


@ops
@dtypes
@devices
def test_deterministic(rng, name, dtype, device):
    x, residual, w = make_inputs(rng, name, (64, 4096), dtype, device)
    first = call(name, x, residual, w)
    second = call(name, x, residual, w)
    for a, b in zip(first, second):
        if a is not None:
            assert_same_bits(a, b)


@ops
def test_positional_and_keyword_arguments(rng, name):
    fn, _, add = OPS[name]
    x, residual, w = make_inputs(rng, name, (3, 40), torch.float32, "cpu")
    if add:
        a = fn(x, residual, w, 1e-5)
        b = fn(input=x, residual=residual, weight=w, eps=1e-5)
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    else:
        assert torch.equal(fn(x, w, 1e-5), fn(input=x, weight=w, eps=1e-5))


@ops
def test_long_row_sum_of_squares_is_accurate(rng, name):
    """The CPU sum of squares of a 4M-element fp32 row stays as accurate as a short row's: a
    single running fp32 sum loses about n * 2^-24 (8e-5 here) of the rms. All values positive,
    so rounding errors do not cancel."""
    fn, gemma, add = OPS[name]
    n = 1 << 22
    x = rng.uniform(1, n, low=0.5, high=1.5)
    residual = rng.uniform(1, n, low=0.5, high=1.5) if add else None
    w = torch.zeros(n) if gemma else torch.ones(n)  # applied as 1: out = s * rstd
    if add:
        out, s = fn(x, residual, w)  # residual_out is the fp32 sum s itself
    else:
        out, s = fn(x, w), x
    got_rstd = (out.double() / s.double()).median()
    ref_rstd = torch.rsqrt(s.double().pow(2).mean() + 1e-6)
    assert abs(got_rstd / ref_rstd - 1) < 1e-6


# --- CUDA only -------------------------------------------------------------------------------


@pytest.mark.gpu
@ops
@dtypes
@pytest.mark.parametrize("hidden", [7, 4096, 5120, 65536])
def test_cpu_and_cuda_agree(rng, name, dtype, hidden):
    x, residual, w = make_inputs(rng, name, (9, hidden), dtype, "cpu")
    cpu_out, cpu_res = call(name, x, residual, w)
    to = (lambda t: None if t is None else t.cuda())
    gpu_out, gpu_res = call(name, to(x), to(residual), to(w))
    assert_close(gpu_out.cpu(), cpu_out.double(), what="cuda vs cpu out")
    if cpu_res is not None:
        assert_same_bits(gpu_res.cpu(), cpu_res, what="cuda vs cpu residual_out")


@pytest.mark.gpu
@dtypes
def test_cuda_graph_capture_and_replay(rng, dtype):
    """A graph of several norm calls (one allocating its output, one fused in place) replays
    correctly on new input values."""
    h = 4096
    x = torch.zeros(8, h, dtype=dtype, device="cuda")
    r = torch.zeros(8, h, dtype=dtype, device="cuda")
    w = rng.randn(h, dtype=dtype, device="cuda")
    out = torch.empty_like(x)

    def step():
        opforge.rmsnorm(x, w, out=out)
        g = opforge.gemma_rmsnorm(x, w)
        opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
        return g

    graph, gemma_out = capture_graph(step)

    for _ in range(2):
        x0 = rng.randn(8, h, dtype=dtype, device="cuda")
        r0 = rng.randn(8, h, dtype=dtype, device="cuda")
        x.copy_(x0)
        r.copy_(r0)
        graph.replay()
        torch.cuda.synchronize()
        check("rmsnorm", out, None, x0, None, w)
        check("gemma_rmsnorm", gemma_out, None, x0, None, w)
        check("fused_add_rmsnorm", x, r, x0, r0, w)


@pytest.mark.gpu
@ops
def test_runs_on_the_current_stream(rng, name):
    """The kernel is ordered after earlier work on a user stream: the input is written there
    after a long sleep, so a kernel launched on another stream would read stale values."""
    x0, r0, w = make_inputs(rng, name, (64, 4096), torch.bfloat16, "cuda")
    x = torch.empty_like(x0)
    got_out, got_res = written_late_on_a_side_stream(x, x0, lambda: call(name, x, r0, w))
    check(name, got_out, got_res, x0, r0, w)


@pytest.mark.gpu
@ops
def test_tensor_on_a_device_that_is_not_current(rng, name):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x, residual, w = make_inputs(rng, name, (16, 4096), torch.bfloat16, "cuda:1")
    with torch.cuda.device(0):
        got_out, got_res = call(name, x, residual, w)
    torch.cuda.synchronize(1)
    assert got_out.device == torch.device("cuda:1")
    check(name, got_out, got_res, x, residual, w)



@pytest.mark.gpu
@ops
@pytest.mark.parametrize("hidden", [3, 8, 128])
def test_many_short_rows(rng, name, hidden):
    x, residual, w = make_inputs(rng, name, (1 << 20, hidden), torch.bfloat16, "cuda")
    got_out, got_res = call(name, x, residual, w)
    check(name, got_out, got_res, x, residual, w)


@pytest.mark.gpu
@pytest.mark.exclusive_gpu  # tens of GiB: alone on the GPU
def test_more_than_2_31_elements(rng):
    """Offsets past 2^31 elements (int32 overflow) land in the right rows."""
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs 40 GiB of GPU memory")
    rows, h = 65537, 32768
    x = torch.empty(rows, h, dtype=torch.bfloat16, device="cuda")
    x[-4:] = rng.randn(4, h, dtype=torch.bfloat16, device="cuda")
    x[:-4] = 1.0
    r = torch.ones_like(x)
    w = rng.randn(h, dtype=torch.bfloat16, device="cuda")
    out, res = opforge.fused_add_rmsnorm(x, r, w)
    check("fused_add_rmsnorm", out[-4:], res[-4:], x[-4:], r[-4:], w)
    check("fused_add_rmsnorm", out[:2], res[:2], x[:2], r[:2], w)
    del out, res, r
    out = opforge.rmsnorm(x, w)
    check("rmsnorm", out[-4:], None, x[-4:], None, w)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden, layout, vpt, dtype, name", sweep(
    [pytest.param(h, lay, id=f"{h}-{lay}") for h, lay in [(8, "contiguous"), (127, "contiguous"), (4096, "contiguous"),
                                                          (4096, "offset"), (5120, "padded"), (16384, "contiguous")]],
    axis([0, 1, 2, 4, 8]), DTYPE_AXIS, OP_AXIS,
    # Every instantiation (dtype x vector width x vectors per thread x fused add) is reached by
    # the plain ops; the Gemma ones run the same kernels with another run-time weight offset.
    default=lambda hidden, layout, vpt, dtype, name: not OPS[name][1]))
def test_every_kernel_variant(rng, name, dtype, vpt, hidden, layout):
    """Every CUDA kernel instantiation, forced through the launch-shape override used for
    tuning (not only the ones the heuristic picks for these shapes); an override that cannot
    fit the row is refused with a CudaError instead of launching."""
    _, gemma, add = OPS[name]
    rows = 37
    x0, r0, w = make_inputs(rng, name, (rows, hidden), dtype, "cuda")
    x = laid_out(x0, layout)
    residual = laid_out(r0, layout) if add else None
    out = laid_out(poisoned_like(x0), layout)
    residual_out = laid_out(poisoned_like(x0), layout) if add else None
    wide = 16 // dtype.itemsize
    vec = wide if layout != "offset" and hidden % wide == 0 else 1
    feasible = _C.norm_launch_shape(rows, hidden, vec, 132, vpt)["vecs_per_thread"] == vpt

    def run():
        _C.norm(out, x, residual, residual_out, w, 1e-6, gemma, torch.cuda.current_stream().cuda_stream, True,
                vpt=vpt)
        torch.cuda.synchronize()

    if not feasible:
        with pytest.raises(opforge.CudaError):
            run()
        return
    run()
    check(name, out, residual_out, x, residual, w)


def test_narrow_access_rule():
    """8-byte accesses exactly for 16-bit decode batches (up to 256 rows) of rows up to 1024
    elements, 2^17 in all, never under the tuning override (test_build checks the launch they
    take)."""
    for rows, hidden in ((256, 512), (128, 1024), (1, 1024), (1, 4), (256, 128)):
        assert _C.norm_narrow_access(rows, hidden, 2, 132), (rows, hidden)
    for rows, hidden, elem_bytes, vpt in ((257, 128, 2, -1), (1, 1028, 2, -1), (256, 516, 2, -1), (129, 1024, 2, -1),
                                         (1, 1024, 4, -1), (1, 1024, 2, 2)):
        assert not _C.norm_narrow_access(rows, hidden, elem_bytes, 132, vpt), (rows, hidden, elem_bytes, vpt)


def shifted(src: torch.Tensor, shift: int, fill: float = float("nan")) -> torch.Tensor:
    """``src``'s values in a view whose rows start ``shift`` elements past a 16-byte boundary
    (rows 8 elements apart more than their length)."""
    flat = src.dim() == 1
    rows = src.reshape(1, -1) if flat else src
    view = torch.full((rows.shape[0], rows.shape[1] + 8), fill, dtype=src.dtype, device=src.device)
    view = view[:, shift:shift + rows.shape[1]]
    view.copy_(rows)
    return view[0] if flat else view


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0, 4, 1], ids=["aligned", "8-byte", "2-byte"])
@pytest.mark.parametrize("rows, hidden", [(1, 1024), (3, 4), (256, 512), (37, 136), (256, 516), (257, 128), (2, 1028)],
                         ids=str)
@dtypes
@ops
def test_narrow_accesses(rng, name, dtype, rows, hidden, shift):
    """Decode batches of rows up to 1024 16-bit elements read and write through 8-byte accesses
    where every row and the weight start on 8 bytes (also 8 bytes off a 16-byte boundary, where
    the 16-byte kernels would fall back to scalar ones), the rest as before: the same results
    either way, nothing written outside the output views, in place too."""
    _, _, add = OPS[name]
    x0, r0, w0 = make_inputs(rng, name, (rows, hidden), dtype, "cuda")
    x, w = shifted(x0, shift), shifted(w0, shift)
    residual = shifted(r0, shift) if add else None
    out = shifted(poisoned_like(x0), shift, fill=7.0)
    residual_out = shifted(poisoned_like(x0), shift, fill=7.0) if add else None
    got_out, got_res = call(name, x, residual, w, out=out, residual_out=residual_out)
    check(name, got_out, got_res, x, residual, w)
    for t in (out, residual_out) if add else (out,):
        assert (outside_view(t) == 7.0).all(), "wrote outside the output view"
    if add:  # in place: out = x, residual_out = residual
        x_before, r_before = x.clone(), residual.clone()
        call(name, x, residual, w, out=x, residual_out=residual)
        check(name, x, residual, x_before, r_before, w)
