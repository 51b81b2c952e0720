"""The correctness checks against adversarial solutions: each way of being wrong is caught and
named, and honest solutions (value-returning, destination-passing, in place where allowed) pass."""

from __future__ import annotations

import pytest
import torch

from opforge.bench import check_call, compare_outputs, generate_inputs
from opforge.trace import Definition, EvaluationStatus, Workload
from opforge.trace.templates import TEMPLATES

S = EvaluationStatus


@pytest.fixture
def norm():
    return TEMPLATES["fused_add_rmsnorm"].definition(dtype="bfloat16", hidden_size=512)  # eps and residual_out explicit


@pytest.fixture
def inputs(norm):
    w = Workload(uuid="w", axes={"batch_size": 6}, inputs={"hidden_states": {"type": "random"},
                 "residual": {"type": "random"}, "weight": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}},
                 seed=7)
    return generate_inputs(norm, w)


def reference(norm, inputs):
    return norm.reference_fn()(*inputs)


def honest(x, r, w, eps):
    s = x.float() + r.float()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype), s.to(x.dtype)


def test_honest_solution_passes_and_records_errors(norm, inputs):
    check = check_call(honest, norm, inputs, reference(norm, inputs))
    assert check.passed, check.log
    assert check.correctness.max_absolute_error >= 0
    assert check.correctness.extra["fraction_within_tolerance"] == {"output": 1.0, "residual_out": 1.0}


def test_in_place_where_the_definition_allows_it(norm, inputs):
    want = reference(norm, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])

    def in_place(x, r, w, eps):
        out, res = honest(x, r, w, eps)
        x.copy_(out)
        r.copy_(res)
        return x, r

    assert check_call(in_place, norm, inputs, want).passed


@pytest.mark.parametrize("case, status, words", [
    ("wrong_shape", S.INCORRECT_SHAPE, "shape"),
    ("wrong_dtype", S.INCORRECT_DTYPE, "dtype"),
    ("wrong_values", S.INCORRECT_NUMERICAL, "outside"),
    ("nan_output", S.INCORRECT_NUMERICAL, "NaN"),
    ("mutates_weight", S.INCORRECT_NUMERICAL, "modified its input weight"),
    ("returns_an_input", S.INCORRECT_NUMERICAL, "shares memory with input hidden_states"),
    ("outputs_alias", S.INCORRECT_NUMERICAL, "share memory"),
    ("raises", S.RUNTIME_ERROR, "boom"),
    ("too_few_outputs", S.INCORRECT_SHAPE, "returned 1 output"),
])
def test_wrong_solutions_are_caught(norm, inputs, case, status, words):
    def solution(x, r, w, eps):
        out, res = honest(x, r, w, eps)
        if case == "wrong_shape":
            return out[:, :-1], res
        if case == "wrong_dtype":
            return out.float(), res
        if case == "wrong_values":
            return out * 1.1, res
        if case == "nan_output":
            out[0, 0] = float("nan")
            return out, res
        if case == "mutates_weight":
            w.mul_(2)
            return out, res
        if case == "returns_an_input":
            return out, x  # residual_out may only ever live in residual
        if case == "outputs_alias":
            return out, out
        if case == "raises":
            raise RuntimeError("boom")
        return out

    check = check_call(solution, norm, inputs, reference(norm, inputs))
    assert check.status == status, check.log
    assert words in check.log


def test_unwritten_destination_elements_fail(norm, inputs):
    def lazy_dps(x, r, w, eps, out, res_out):
        o, s = honest(x, r, w, eps)
        out[:-1].copy_(o[:-1])  # forgets the last row: it stays poisoned
        res_out.copy_(s)

    check = check_call(lazy_dps, norm, inputs, reference(norm, inputs), destination_passing=True)
    assert check.status == S.INCORRECT_NUMERICAL and "NaN" in check.log


def test_reference_infinities_and_nans_must_be_matched():
    d = Definition(name="ident", op_type="t", axes={"n": {"type": "var"}},
                   inputs={"x": {"shape": ["n"], "dtype": "float32"}}, outputs={"y": {"shape": ["n"], "dtype": "float32"}},
                   reference="def run(x):\n    return x\n")
    want = torch.tensor([1.0, float("inf"), float("nan")])
    assert compare_outputs(d, want.clone(), want).passed
    assert not compare_outputs(d, torch.tensor([1.0, float("-inf"), float("nan")]), want).passed
    assert not compare_outputs(d, torch.tensor([1.0, float("inf"), 0.0]), want).passed


def test_inputs_reproduce_from_the_seed_and_respect_value_domains():
    d = Definition(name="gather", op_type="t", axes={"n": {"type": "var"}, "m": {"type": "const", "value": 50}},
                   inputs={"idx": {"shape": ["n"], "dtype": "int32"}, "indptr": {"shape": ["n"], "dtype": "int32"},
                           "x": {"shape": ["m"], "dtype": "bfloat16"}},
                   outputs={"y": {"shape": ["n"], "dtype": "bfloat16"}},
                   value_domains={"idx": {"low": 0, "high": "m", "unique": True}, "indptr": {"kind": "indptr", "total": "m"}},
                   reference="def run(idx, indptr, x):\n    return x[idx.long()]\n")
    w = Workload(uuid="u", axes={"n": 20}, inputs={k: {"type": "random"} for k in ("idx", "indptr", "x")}, seed=3)
    a, b = generate_inputs(d, w), generate_inputs(d, w)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    idx, indptr, _ = a
    assert idx.dtype == torch.int32 and idx.min() >= 0 and idx.max() < 50 and len(set(idx.tolist())) == 20
    assert indptr[0] == 0 and indptr[-1] == 50 and bool((indptr[1:] >= indptr[:-1]).all())
    other = generate_inputs(d, w, seed=4)
    assert not torch.equal(other[2], a[2])


def test_an_allowed_alias_still_has_to_hold_the_right_values(norm, inputs):
    def stale_residual(x, r, w, eps):
        out, _ = honest(x, r, w, eps)
        return out, r  # residual_out in residual is allowed, but r was never updated

    check = check_call(stale_residual, norm, inputs, reference(norm, inputs))
    assert check.status == S.INCORRECT_NUMERICAL and "residual_out" in check.log
