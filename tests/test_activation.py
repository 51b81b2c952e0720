"""Gated activations: silu_and_mul, gelu_and_mul (erf form), gelu_tanh_and_mul.

input [..., 2d] -> out [..., d] = act(input[..., :d]) * input[..., d:], fp32 math, one rounding.
"""

from __future__ import annotations

import pytest
import torch

import opforge
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
    ref_act_and_mul,
    shape_params,
    axis,
    sweep,
    written_late_on_a_side_stream,
)

OPS = {
    "silu": opforge.silu_and_mul,
    "gelu": opforge.gelu_and_mul,
    "gelu_tanh": opforge.gelu_tanh_and_mul,
}
#: Output widths d (the input is 2d wide).
WIDTHS = (1, 2, 3, 7, 8, 16, 33, 127, 128, 1000, 4096, 4097, 5120, 8192, 16384, 65536)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
acts = pytest.mark.parametrize("act", list(OPS))
devices = pytest.mark.parametrize("device", DEVICES)
DTYPE_AXIS, ACT_AXIS = axis(DTYPES, dtype_id), axis(OPS)


def reaches_new_code(act, dtype, device="cuda"):
    """Whether a CUDA case of an activation and dtype reaches grid, stride and tail code that
    another default case does not: that code (cuda/elementwise.cuh) depends on the element
    width, not on the activation (a functor computing one element) nor on fp16 vs bf16 (both 2
    bytes). On the CPU every case runs one loop: all are kept."""
    return device == "cpu" or (act == "silu" and dtype != torch.float16)


def _reference_case(device, rows, d, dtype, act):
    # Every width in every activation and dtype at decode sizes (1 and 3 rows). From 64 rows on,
    # CUDA cases that reach new code, plus 1000 rows of widths 4097 (scalar) and 16384 (vector)
    # in every activation and dtype: enough vectors for the 4-step unrolled kernel, which is a
    # separate instantiation per activation, dtype and vector width.
    if device == "cpu" or rows <= 3 or reaches_new_code(act, dtype):
        return True
    return rows == 1000 and d in (4097, 16384)


def check(act, got, x):
    ref = ref_act_and_mul(x, act)
    assert_close(got, ref, what=f"{act}_and_mul")
    if got.dtype != torch.float32:
        # Near large negative x the fp32 gelu formulas cancel (1 + erf -> 0), as torch's do; the
        # single-rounding check covers the range where the fp32 formula itself is accurate.
        d = x.shape[-1] // 2
        mask = None if act == "silu" else x[..., :d].abs() <= 2
        assert_rounded_once(got, ref, mask=mask, what=f"{act}_and_mul")


@pytest.mark.parametrize("device, rows, d, dtype, act", sweep(
    shape_params(WIDTHS, cpu_cap=1 << 18, gpu_cap=1 << 24), DTYPE_AXIS, ACT_AXIS, default=_reference_case))
def test_matches_reference(rng, act, dtype, device, rows, d):
    x = rng.randn(rows, 2 * d, dtype=dtype, device=device, scale=2.0)
    before = x.clone()
    out = poisoned((rows, d), dtype, device)
    got = OPS[act](x, out=out)
    assert got is out
    assert_same_bits(x, before, what="input (must not be modified)")
    check(act, got, x)


@acts
@dtypes
@devices
@pytest.mark.parametrize("shape", [(2, 5, 256), (3, 1, 66), (10,), (1, 8194)], ids=str)
def test_allocates_output(rng, act, dtype, device, shape):
    x = rng.randn(*shape, dtype=dtype, device=device)
    got = OPS[act](x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)
    assert got.dtype == dtype and got.device == x.device
    check(act, got, x)


@pytest.mark.parametrize("device, rows, d, layout, dtype, act", sweep(
    [pytest.param("cpu", 6, d, id=f"cpu-6x{d}") for d in (8, 127, 2048)]
    + [pytest.param("cuda", 130, d, marks=pytest.mark.gpu, id=f"cuda-130x{d}") for d in (8, 127, 2048, 14336)],
    axis(LAYOUTS), DTYPE_AXIS, ACT_AXIS,
    default=lambda device, rows, d, layout, dtype, act: reaches_new_code(act, dtype, device)))
def test_strided_and_misaligned_layouts(rng, act, dtype, layout, device, rows, d):
    """Input rows of wider tensors (e.g. a gate_up slice of a fused projection), one element off
    alignment, 3-D qkv-style slices; outputs in the same layouts; nothing written outside them."""
    x = laid_out(rng.randn(rows, 2 * d, dtype=dtype, device=device), layout)
    out = laid_out(poisoned((rows, d), dtype, device), layout, fill=7.0)
    got = OPS[act](x, out=out)
    assert got is out
    check(act, got, x)
    if out._base is not None:
        assert (outside_view(out) == 7.0).all(), "wrote outside the output view"


@acts
@dtypes
@devices
def test_extreme_inputs(act, dtype, device):
    """Saturated activations stay finite: silu(-100) * g is -0-ish, not NaN."""
    vals = [-100.0, -30.0, -10.0, -5.0, -1e-3, 0.0, -0.0, 1e-3, 5.0, 10.0, 30.0, 100.0]
    x = torch.tensor(vals, dtype=dtype, device=device)
    gate = torch.tensor([0.5, -2.0, 3.0] * 4, dtype=dtype, device=device)
    inp = torch.cat([x, gate]).view(1, -1)
    got = OPS[act](inp)
    assert not torch.isnan(got).any()
    assert_close(got, ref_act_and_mul(inp, act))


@acts
@devices
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0), (0,)], ids=str)
def test_empty(act, device, shape):
    x = torch.empty(shape, device=device)
    got = OPS[act](x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)


@acts
@dtypes
@devices
@pytest.mark.parametrize("backend", ["torch", "native", "auto"])
def test_backends(rng, act, dtype, device, backend):
    x = rng.randn(7, 2000, dtype=dtype, device=device)
    chosen = device if backend == "native" else backend
    got = OPS[act](x, out=poisoned((7, 1000), dtype, device), backend=chosen)
    check(act, got, x)
    auto = OPS[act](x)
    if chosen != "torch":
        assert_same_bits(got, auto)
    else:
        assert_close(got, auto.double(), what="torch backend vs native")


@acts
@dtypes
@devices
def test_deterministic(rng, act, dtype, device):
    x = rng.randn(64, 8192, dtype=dtype, device=device)
    assert_same_bits(OPS[act](x), OPS[act](x))


@acts
def test_activations_differ(rng, act):
    """Each op computes its own activation (a mix-up of the codes would still be 'close')."""
    x = rng.randn(4, 64)
    got = OPS[act](x)
    for other in OPS:
        if other != act:
            assert not torch.allclose(got.double(), ref_act_and_mul(x, other), rtol=1e-4, atol=1e-5)


# --- CUDA only -------------------------------------------------------------------------------


@pytest.mark.gpu
@acts
@dtypes
@pytest.mark.parametrize("d", [7, 4096, 14336])
def test_cpu_and_cuda_agree(rng, act, dtype, d):
    x = rng.randn(9, 2 * d, dtype=dtype)
    assert_close(OPS[act](x.cuda()).cpu(), OPS[act](x).double(), what="cuda vs cpu")


@pytest.mark.gpu
@dtypes
def test_cuda_graph_capture_and_replay(rng, dtype):
    x = torch.zeros(16, 2 * 2048, dtype=dtype, device="cuda")
    out = torch.empty(16, 2048, dtype=dtype, device="cuda")

    def step():
        opforge.silu_and_mul(x, out=out)
        return opforge.gelu_and_mul(x), opforge.gelu_tanh_and_mul(x)

    graph, (gelu_out, tanh_out) = capture_graph(step)

    for _ in range(2):
        x0 = rng.randn(16, 2 * 2048, dtype=dtype, device="cuda")
        x.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        check("silu", out, x0)
        check("gelu", gelu_out, x0)
        check("gelu_tanh", tanh_out, x0)


@pytest.mark.gpu
@acts
def test_runs_on_the_current_stream(rng, act):
    x0 = rng.randn(64, 8192, dtype=torch.bfloat16, device="cuda")
    x = torch.empty_like(x0)
    check(act, written_late_on_a_side_stream(x, x0, lambda: OPS[act](x)), x0)


@pytest.mark.gpu
@acts
def test_tensor_on_a_device_that_is_not_current(rng, act):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = rng.randn(16, 4096, dtype=torch.bfloat16, device="cuda:1")
    with torch.cuda.device(0):
        got = OPS[act](x)
    torch.cuda.synchronize(1)
    assert got.device == torch.device("cuda:1")
    check(act, got, x)


@pytest.mark.gpu
@acts
@pytest.mark.parametrize("d", [3, 8, 64])
def test_many_short_rows(rng, act, d):
    """More rows than one grid dimension holds (65535 blocks)."""
    x = rng.randn(1 << 21, 2 * d, dtype=torch.bfloat16, device="cuda")
    check(act, OPS[act](x), x)


@pytest.mark.gpu
@pytest.mark.exclusive_gpu  # tens of GiB: alone on the GPU
def test_more_than_2_31_elements(rng):
    """Offsets past 2^31 elements (int32 overflow) land in the right rows."""
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs 40 GiB of GPU memory")
    rows, d = 65537, 16384
    x = torch.ones(rows, 2 * d, dtype=torch.bfloat16, device="cuda")
    x[-4:] = rng.randn(4, 2 * d, dtype=torch.bfloat16, device="cuda")
    got = opforge.silu_and_mul(x)
    check("silu", got[-4:], x[-4:])
    check("silu", got[:2], x[:2])
