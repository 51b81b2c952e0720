"""Inputs the runner generates for NVFP4 Definitions: every FP4 code in both nibbles, scales
spread over the E4M3 binades within the fp16 bound, the blocked scales derived from the plain
ones (never drawn on their own), the same values for the same seed; and the generic pieces
(log_uniform on other dtypes, the FP4 default, derived inputs) on small Definitions."""

from __future__ import annotations

import math

import pytest
import torch

from opforge.bench import generate_inputs
from opforge.bench.inputs import TRANSFORMS
from opforge.ops import nvfp4_format
from opforge.trace import AxisConst, AxisVar, Definition, RandomInput, TensorSpec, Workload
from opforge.trace.extensions import DERIVED_TRANSFORMS
from opforge.trace.templates import TEMPLATES
from opforge.trace.templates.nvfp4 import scale_bound

TEMPLATE = TEMPLATES["nvfp4_gemv"]


def workload(definition, axes: dict, seed: int = 0) -> Workload:
    return Workload(uuid="w", axes=axes, inputs={n: RandomInput() for n in definition.inputs}, seed=seed)


def nvfp4_inputs(m: int, k: int, l: int, seed: int = 0) -> dict:
    d = TEMPLATE.definition(M=m, K=k)
    return dict(zip(d.inputs, generate_inputs(d, workload(d, {"L": l}), seed=seed)))


def nibbles(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raw = packed.view(torch.uint8).flatten()
    return raw & 0xF, raw >> 4


def test_every_fp4_code_in_both_nibbles_about_equally_often():
    x = nvfp4_inputs(64, 256, 2)
    for name in ("a", "b"):
        assert x[name].dtype == torch.float4_e2m1fn_x2
        for nibble in nibbles(x[name]):
            assert sorted(nibble.unique().tolist()) == list(range(16)), name
    low, high = nibbles(x["a"])  # 16384 bytes: ~1024 of each code per nibble
    for nibble in (low, high):
        counts = torch.bincount(nibble.long(), minlength=16)
        assert int(counts.min()) > 850 and int(counts.max()) < 1200, counts.tolist()


@pytest.mark.parametrize("m, k", [(37, 192), (128, 256), (300, 64)])
def test_blocked_scales_are_derived_from_the_plain_ones(m, k):
    x = nvfp4_inputs(m, k, 3)
    for plain, blocked, rows in (("scale_a", "scale_a_permuted", m), ("scale_b", "scale_b_permuted", 1)):
        want = nvfp4_format.to_blocked(x[plain])
        assert x[blocked].shape == nvfp4_format.blocked_shape(rows, k, 3)
        assert torch.equal(x[blocked].view(torch.uint8), want.view(torch.uint8))
        back = nvfp4_format.from_blocked(x[blocked], rows, k // 16)
        assert torch.equal(back.view(torch.uint8), x[plain].view(torch.uint8))


def test_same_seed_same_inputs_other_seed_other_inputs():
    first, again, other = nvfp4_inputs(40, 128, 2, seed=5), nvfp4_inputs(40, 128, 2, seed=5), nvfp4_inputs(40, 128, 2, seed=6)
    for name in first:
        assert torch.equal(first[name].view(torch.uint8), again[name].view(torch.uint8)), name
    for name in ("a", "b", "scale_a", "scale_b"):
        assert not torch.equal(first[name].view(torch.uint8), other[name].view(torch.uint8)), name


@pytest.mark.parametrize("k", [64, 2048, 16384])
def test_scales_spread_over_every_binade_up_to_the_fp16_bound(k):
    x = nvfp4_inputs(256, k, 1, seed=1)
    bound = scale_bound(k)
    scales = x["scale_a"].float().flatten()
    assert float(scales.min()) >= 2.0 ** -9 and float(scales.max()) <= bound
    exponents = torch.frexp(scales).exponent
    want = set(range(-8, math.frexp(bound)[1] + 1))  # 2^-9 = 0.5 * 2^-8 is the lowest binade
    assert set(exponents.unique().tolist()) == want
    counts = torch.bincount(exponents - exponents.min())
    assert int(counts.min()) > 0.5 * scales.numel() / len(want)  # evenly, not skewed to the top
    assert bool((scales < 2.0 ** -6).any())  # E4M3 subnormals


@pytest.mark.parametrize("k", [64, 192, 2048])
def test_generated_workloads_give_finite_fp16_outputs(k):
    d = TEMPLATE.definition(M=64, K=k)
    for seed in range(3):
        c = d.reference_fn()(*generate_inputs(d, workload(d, {"L": 2}), seed=seed))
        assert torch.isfinite(c).all()
        assert float(c.abs().max()) > 0  # not all underflow


def _toy(dtype: str, domain: dict, extra_inputs: dict | None = None, extra_domains: dict | None = None) -> Definition:
    return Definition(
        name="toy_h64", op_type="toy", axes={"n": AxisVar(), "h": AxisConst(value=64)},
        inputs={"x": TensorSpec(shape=["n", "h"], dtype=dtype), **(extra_inputs or {})},
        outputs={"y": TensorSpec(shape=["n", "h"], dtype="float32")},
        reference="def run(*args):\n    return args[0]\n",
        value_domains={"x": domain, **(extra_domains or {})},
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e5m2"])
def test_log_uniform_draws_exact_values_in_bounds_on_other_dtypes(dtype):
    d = _toy(dtype, {"kind": "log_uniform", "low": 0.01, "high": "h / 2"})
    (x,) = generate_inputs(d, workload(d, {"n": 64}), seed=3)
    assert x.dtype == getattr(torch, dtype)
    values = x.double()
    assert float(values.min()) >= 0.01 and float(values.max()) <= 32
    exponents = torch.frexp(values).exponent
    assert set(exponents.unique().tolist()) == set(range(math.frexp(0.01)[1], math.frexp(32)[1] + 1))


def test_log_uniform_without_a_representable_value_is_refused():
    d = _toy("float8_e4m3fn", {"kind": "log_uniform", "low": 449, "high": 10000})
    with pytest.raises(ValueError, match=r"no torch.float8_e4m3fn value lies in \[449"):
        generate_inputs(d, workload(d, {"n": 2}))


def test_fp4_without_a_domain_is_uniform_bytes_in_either_spelling():
    packed = Definition(
        name="toy_h64", op_type="toy", axes={"n": AxisVar(), "h": AxisConst(value=64)},
        inputs={"p": TensorSpec(shape=["n", "h"], dtype="float4_e2m1fn_x2"),
                "q": TensorSpec(shape=["n", "h"], dtype="float4_e2m1")},
        outputs={"y": TensorSpec(shape=["n", "h"], dtype="float32")}, reference="def run(p, q):\n    return p\n")
    p, q = generate_inputs(packed, workload(packed, {"n": 8}))
    assert p.shape == q.shape == (8, 64)  # either spelling: the declared shape is the torch shape
    assert p.dtype == q.dtype == torch.float4_e2m1fn_x2
    assert len(p.view(torch.uint8).unique()) > 200


def test_derived_input_follows_its_source_whatever_the_order():
    # The derived input comes first in the Definition: it is made after every drawn one.
    rows, blocks, l = 130, 8, 2
    d = Definition(
        name="toy_h128", op_type="toy",
        axes={"L": AxisVar(), "rows": AxisConst(value=rows), "blocks": AxisConst(value=blocks),
              "p": AxisConst(value=32), "q": AxisConst(value=4), "rt": AxisConst(value=2), "bt": AxisConst(value=2)},
        inputs={"blocked": TensorSpec(shape=["p", "q", "rt", "q", "bt", "L"], dtype="float8_e4m3fn"),
                "plain": TensorSpec(shape=["rows", "blocks", "L"], dtype="float8_e4m3fn")},
        outputs={"y": TensorSpec(shape=["rows", "blocks", "L"], dtype="float32")},
        reference="def run(blocked, plain):\n    return plain.float()\n",
        value_domains={"blocked": {"kind": "derived", "source": "plain", "transform": "blocked_128x4"},
                       "plain": {"kind": "log_uniform", "low": 1, "high": 8}},
    )
    blocked, plain = generate_inputs(d, workload(d, {"L": l}), seed=2)
    assert torch.equal(blocked.view(torch.uint8), nvfp4_format.to_blocked(plain).view(torch.uint8))


def test_derived_shape_the_definition_misdeclares_is_reported():
    d = TEMPLATE.definition(M=128, K=64).model_copy(deep=True)
    d.inputs["scale_a_permuted"].shape = ["tile_rows", "tile_row_groups", "M_tiles", "tile_blocks", "L", "L"]
    with pytest.raises(ValueError, match="blocked_128x4 of scale_a"):
        generate_inputs(d, workload(d, {"L": 2}))


def test_every_declared_transform_has_an_implementation():
    assert set(TRANSFORMS) == set(DERIVED_TRANSFORMS)
