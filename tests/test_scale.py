"""scale: out = x * factor in fp32, rounded once to x's dtype.

torch computes ``x * factor`` the same way (fp32 math, round to nearest even), so opforge must
be bit-identical to it: this pins the fp16/bf16 <-> fp32 conversions of the CPU code, including
infinities, NaNs, signed zeros, subnormals and overflow at the top of the fp16 range.
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
    assert_same_bits,
    dtype_id,
    laid_out,
    outside_view,
    poisoned,
    poisoned_like,
    shape_params,
    written_late_on_a_side_stream,
)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
half_dtypes = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
devices = pytest.mark.parametrize("device", DEVICES)

FACTORS = (1.0, 0.5, 2.0, 3.0, -1.0, 1 / 3, 0.1, -1.7, 1e-3, 1e-8, 1e4, 65504.0, 0.0, -0.0, 1e39, 1e-45,
           float("inf"), float("-inf"), float("nan"))

SPECIAL = [
    0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"),
    2.0 ** -24, -(2.0 ** -24), 3 * 2.0 ** -24, 2.0 ** -20, 6.097555e-05, 6.1035156e-05,  # fp16 subnormals
    65504.0, -65504.0, 65519.0, 65520.0, -65520.0, 65536.0, 1e5,  # around the fp16 maximum
    1e-40, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 1e30,  # fp32 / bf16 range
    0.1, 1 / 3, 1.0009766, 1.0004883, 1.0039062, 1.0019531, 255.5, -7.25,  # rounding ties
]


def torch_scale(x, factor):
    return x * factor


@dtypes
@devices
@pytest.mark.parametrize("factor", FACTORS, ids=repr)
def test_special_values_bit_identical_to_torch(dtype, device, factor):
    x = torch.tensor(SPECIAL, dtype=torch.float32).to(dtype).to(device)
    got = opforge.scale(x, factor, out=poisoned_like(x))
    assert_same_bits(got, torch_scale(x, factor), what=f"scale({dtype_id(dtype)}, {factor!r})")


@half_dtypes
@devices
def test_every_16_bit_pattern_round_trips(dtype, device):
    """scale(x, 1.0) == x for all 65536 bit patterns (NaNs stay NaN)."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).to(device)
    assert_same_bits(opforge.scale(x, 1.0), x, what="scale(x, 1.0)")


@half_dtypes
@devices
@pytest.mark.parametrize("factor", [0.5, 2.0, 3.0, -1.7, 1e-3, 1e4, 1 / 3], ids=repr)
def test_every_16_bit_pattern_bit_identical_to_torch(dtype, device, factor):
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).to(device)
    assert_same_bits(opforge.scale(x, factor), torch_scale(x, factor))


@devices
@pytest.mark.parametrize("factor", [1.0, 0.5, 3.0, 1e-30, 1e30], ids=repr)
def test_random_fp32_bit_patterns_bit_identical_to_torch(rng, device, factor):
    """fp32 values drawn over every exponent: subnormals, infinities and NaNs included."""
    gen = rng.generator("cpu")
    bits = torch.randint(-(1 << 31), 1 << 31, (1 << 16,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32).to(device)
    assert_same_bits(opforge.scale(x, factor), torch_scale(x, factor))


@pytest.mark.parametrize(
    "x, factor, expected",
    [
        (1.0, 65519.0, 65504.0),  # just under the rounding boundary
        (1.0, 65520.0, float("inf")),  # 65520 (the tie above 65504) rounds to inf
        (1365.0, 48.0, float("inf")),  # 65520 again, as a product
        (-1365.0, 48.0, float("-inf")),
        (65504.0, 1.001, float("inf")),
        (32752.0, 2.0, 65504.0),
        (2.0 ** -24, 0.5, 0.0),  # half the smallest subnormal: ties to even (0)
        (3 * 2.0 ** -24, 0.5, 2 * 2.0 ** -24),  # 1.5 subnormal steps: ties to even (2)
        (2.0 ** -14, 0.5, 2.0 ** -15),  # normal -> subnormal
        (1.0, 1.0 + 2.0 ** -11, 1.0),  # tie between 1 and 1 + 2^-10: even
        (1.0, 1.0 + 3 * 2.0 ** -11, 1.0 + 2 * 2.0 ** -10),  # tie: even
    ],
)
def test_fp16_rounding_by_hand(x, factor, expected):
    got = opforge.scale(torch.tensor([x], dtype=torch.float16), factor)
    assert_same_bits(got, torch.tensor([expected], dtype=torch.float16))


def test_negative_zero_keeps_its_sign():
    for dtype in DTYPES:
        got = opforge.scale(torch.tensor([0.0, -0.0, 1.0], dtype=dtype), -0.0)
        assert torch.equal(torch.signbit(got), torch.tensor([True, False, True]))


@dtypes
@pytest.mark.parametrize("device, rows, cols", shape_params((1, 3, 8, 127, 4096, 65536), gpu_batches=(1, 3, 1000)))
def test_random_bit_identical_to_torch(rng, dtype, device, rows, cols):
    x = rng.randn(rows, cols, dtype=dtype, device=device, scale=100.0)
    before = x.clone()
    out = poisoned_like(x)
    got = opforge.scale(x, 0.37, out=out)
    assert got is out
    assert_same_bits(x, before, what="input (must not be modified)")
    assert_same_bits(got, torch_scale(x, 0.37))


@dtypes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "device, cols",
    [pytest.param("cpu", c, id=f"cpu-{c}") for c in (5, 64, 1000)]
    + [pytest.param("cuda", c, marks=pytest.mark.gpu, id=f"cuda-{c}") for c in (5, 64, 1000, 65536)],
)
def test_strided_and_misaligned_layouts(rng, dtype, layout, device, cols):
    x = laid_out(rng.randn(6, cols, dtype=dtype, device=device), layout)
    out = laid_out(poisoned((6, cols), dtype, device), layout, fill=7.0)
    got = opforge.scale(x, -2.5, out=out)
    assert_same_bits(got, torch_scale(x, -2.5))
    if out._base is not None:
        assert (outside_view(out) == 7.0).all(), "wrote outside the output view"


@dtypes
@devices
@pytest.mark.parametrize("layout", ["contiguous", "padded", "misaligned", "qkv"])
def test_in_place(rng, dtype, device, layout):
    x = laid_out(rng.randn(4, 300, dtype=dtype, device=device), layout)
    expected = torch_scale(x, 1.5)
    got = opforge.scale(x, 1.5, out=x)
    assert got is x
    assert_same_bits(x, expected)


@dtypes
@devices
@pytest.mark.parametrize("shape", [(), (1,), (17,), (2, 3, 5), (2, 1, 3, 4)], ids=str)
def test_any_rank(rng, dtype, device, shape):
    x = rng.randn(*shape, dtype=dtype, device=device)
    got = opforge.scale(x, 3.0)
    assert got.shape == x.shape and got.dtype == dtype
    assert_same_bits(got, torch_scale(x, 3.0))


@devices
@pytest.mark.parametrize("shape", [(0,), (0, 8), (8, 0), (2, 0, 64)], ids=str)
def test_empty(device, shape):
    x = torch.empty(shape, device=device)
    assert opforge.scale(x, 2.0).shape == x.shape


@devices
def test_broadcast_input_rows(rng, device):
    row = rng.randn(1, 33, device=device)
    x = row.expand(4, 33)
    assert_same_bits(opforge.scale(x, 0.75), torch_scale(x, 0.75))


@pytest.mark.parametrize("factor", [2, -3, 0], ids=repr)
def test_integer_factor(rng, factor):
    x = rng.randn(3, 9)
    assert_same_bits(opforge.scale(x, factor), torch_scale(x, factor))


@dtypes
@devices
@pytest.mark.parametrize("backend", ["torch", "native"])
def test_backends_bit_identical(rng, dtype, device, backend):
    x = rng.randn(5, 777, dtype=dtype, device=device)
    chosen = device if backend == "native" else backend
    assert_same_bits(opforge.scale(x, 0.3, backend=chosen), torch_scale(x, 0.3))


@dtypes
@devices
def test_positional_and_keyword_arguments(rng, dtype, device):
    x = rng.randn(4, 8, dtype=dtype, device=device)
    out = poisoned_like(x)
    assert_same_bits(opforge.scale(x=x, factor=0.5, out=out), torch_scale(x, 0.5))


# --- CUDA only -------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(rng):
    x = torch.zeros(32, 4096, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    def step():
        opforge.scale(x, 0.25, out=out)
        return opforge.scale(out, 8.0)

    graph, doubled = capture_graph(step)
    for _ in range(2):
        x0 = rng.randn(32, 4096, dtype=torch.bfloat16, device="cuda")
        x.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits(out, torch_scale(x0, 0.25))
        assert_same_bits(doubled, torch_scale(torch_scale(x0, 0.25), 8.0))


@pytest.mark.gpu
def test_runs_on_the_current_stream(rng):
    x0 = rng.randn(256, 4096, device="cuda")
    x = torch.empty_like(x0)
    assert_same_bits(written_late_on_a_side_stream(x, x0, lambda: opforge.scale(x, 3.0)), torch_scale(x0, 3.0))


@pytest.mark.gpu
def test_tensor_on_a_device_that_is_not_current(rng):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = rng.randn(16, 4096, device="cuda:1")
    with torch.cuda.device(0):
        got = opforge.scale(x, 3.0)
    torch.cuda.synchronize(1)
    assert got.device == torch.device("cuda:1")
    assert_same_bits(got, torch_scale(x, 3.0))


@pytest.mark.gpu
@dtypes
def test_cpu_and_cuda_bit_identical(rng, dtype):
    x = rng.randn(64, 1000, dtype=dtype, scale=1e3)
    assert_same_bits(opforge.scale(x.cuda(), 0.7).cpu(), opforge.scale(x, 0.7))


@pytest.mark.gpu
@dtypes
@pytest.mark.parametrize("rows, cols, stride", [(700, 4104, 4104), (1000, 4096, 4096), (2000, 4096, 4096),
                                                (2100, 4096, 4352), (600, 12288, 12288)])
def test_one_wave_shapes_with_several_vectors_per_thread(rng, dtype, rows, cols, stride):
    """Between one and four waves of one-vector threads a thread takes 2 or 4 vectors (whole and
    partial rows, strided rows, both access widths) and must still write every element once."""
    x = rng.randn(rows, stride, dtype=dtype, device="cuda", scale=100.0)[:, :cols]
    out = poisoned_like(x)
    assert_same_bits(opforge.scale(x, 0.37, out=out), torch_scale(x, 0.37))


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [1, 3, 8, 64])
def test_many_short_rows(rng, cols):
    """More rows than one grid dimension holds (65535 blocks)."""
    x = rng.randn(1 << 21, 64, dtype=torch.bfloat16, device="cuda")[:, :cols]
    assert_same_bits(opforge.scale(x, 1.25), torch_scale(x, 1.25))


@pytest.mark.gpu
@pytest.mark.exclusive_gpu  # tens of GiB: alone on the GPU
def test_more_than_2_31_elements(rng):
    """Offsets past 2^31 elements (int32 overflow) land in the right rows."""
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs 40 GiB of GPU memory")
    x = torch.ones(65537, 32768, dtype=torch.bfloat16, device="cuda")
    x[-4:] = rng.randn(4, 32768, dtype=torch.bfloat16, device="cuda")
    got = opforge.scale(x, 3.0)
    assert_same_bits(got[-4:], torch_scale(x[-4:], 3.0))
    assert_same_bits(got[:2], torch_scale(x[:2], 3.0))
    flat = opforge.scale(x.view(-1), 0.5)  # one row of 2^31 + 2^15 elements
    assert_same_bits(flat[-(1 << 17):], torch_scale(x.view(-1)[-(1 << 17):], 0.5))
