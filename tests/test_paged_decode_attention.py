"""paged_decode_attention (GQA decode over a paged KV cache) and its forge Definitions.

Random inputs come from a fresh seed per test run (reported in every failure; set
OPFORGE_TEST_SEED to replay one): random lengths (empty requests, single tokens, page
boundaries, partly filled last pages), pages in random order out of a larger pool, head
configurations from Llama / Mixtral and tensor-parallel shards (h5_kv1, h20_kv4) to more than 16
query heads per KV head. Results are compared with an fp64 reference computed here from the same
inputs. CPU: fp32 math then one rounding, so the output is within the dtype's rounding
(conftest.TOLERANCES) and lse (fp32) within 2e-4. CUDA: the probabilities are rounded to the
input dtype for the tensor-core P.V product, so the output gets a few ulps of the dtype relative
to its largest magnitude (2e-2 bf16, 4e-3 fp16) and lse (fp32 sums of exact products) 1e-3.
Outputs start NaN-poisoned: an element left unwritten fails. A request without pages must give
exactly zeros and lse = -inf.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import opforge
from opforge import _C
from conftest import (DEVICES, NATIVE_BACKENDS, TOLERANCES, assert_close, capture_graph, interpreter_only, replay,
                      written_late_on_a_side_stream)

LN2 = math.log(2.0)
devices = pytest.mark.parametrize("device", DEVICES)
dtypes = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
trials = pytest.mark.parametrize("trial", range(3))  # a fresh seed each

#: (num_qo_heads, num_kv_heads, head_dim, page_size): the seven built-in Definitions, shards,
#: G = 1, G = 20 (two 16-head chunks), every head_dim, odd page sizes.
CONFIGS = [(32, 8, 128, 1), (32, 4, 128, 1), (32, 8, 128, 64), (32, 4, 128, 64), (16, 2, 128, 64),
           (24, 8, 128, 64), (48, 8, 128, 1), (5, 1, 128, 1), (20, 4, 128, 16), (6, 1, 64, 3), (8, 8, 256, 2),
           (40, 2, 64, 7), (12, 3, 256, 1)]


# --- inputs ----------------------------------------------------------------------------------


def random_lengths(gen: torch.Generator, batch: int, page_size: int, longest: int) -> list[int]:
    """A mix: empty requests, single tokens, whole pages, random lengths up to ``longest``."""
    kinds = torch.randint(0, 5, (batch,), generator=gen).tolist()
    lengths = []
    for kind in kinds:
        if kind == 0:
            lengths.append(0)
        elif kind == 1:
            lengths.append(1)
        elif kind == 2:
            lengths.append(page_size * int(torch.randint(1, max(longest // page_size, 1) + 1, (), generator=gen)))
        else:
            lengths.append(int(torch.randint(1, longest + 1, (), generator=gen)))
    return lengths


class Problem:
    """One call's inputs (CPU tensors, moved by ``args``) and their fp64 reference."""

    def __init__(self, gen, lengths, num_qo_heads, num_kv_heads, head_dim, page_size, dtype, spare_pages=3,
                 sm_scale=None, last_len=True, index_slack=0):
        self.lengths, self.page_size = lengths, page_size
        pages = [-(-n // page_size) for n in lengths]
        total = sum(pages)
        self.num_pages = total + spare_pages
        offsets = [0]
        for p in pages:
            offsets.append(offsets[-1] + p)
        self.kv_indptr = torch.tensor(offsets, dtype=torch.int32)
        # Distinct pages in random order; entries past kv_indptr[-1] are never read.
        used = torch.randperm(self.num_pages, generator=gen)[:total].int()
        self.kv_indices = torch.cat([used, torch.full((index_slack,), -7, dtype=torch.int32)])
        # The last page's valid tokens; an empty request's entry is never read.
        tails = [n - (p - 1) * page_size if p else 0 for n, p in zip(lengths, pages)]
        if not last_len:
            assert all(t in (0, page_size) for t in tails)
        self.kv_last_page_len = torch.tensor(tails, dtype=torch.int32) if last_len else None
        batch = len(lengths)
        self.q = torch.randn(batch, num_qo_heads, head_dim, generator=gen).to(dtype)
        shape = (self.num_pages, page_size, num_kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=gen).to(dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(dtype)
        self.sm_scale = sm_scale

    def args(self, device="cpu") -> tuple:
        return (self.q.to(device), self.k_cache.to(device), self.v_cache.to(device), self.kv_indptr.to(device),
                self.kv_indices.to(device))

    def kwargs(self, device="cpu") -> dict:
        kw = {"sm_scale": self.sm_scale}
        if self.kv_last_page_len is not None:
            kw["kv_last_page_len"] = self.kv_last_page_len.to(device)
        return kw

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) in float64: per request, its tokens' logits, softmax, base-2 lse."""
        q, k, v = self.q.double(), self.k_cache.double(), self.v_cache.double()
        batch, num_qo_heads, head_dim = q.shape
        num_kv_heads = k.shape[2]
        group = num_qo_heads // num_kv_heads
        scale = self.sm_scale if self.sm_scale is not None else 1 / math.sqrt(head_dim)
        out = torch.zeros(batch, num_qo_heads, head_dim, dtype=torch.float64)
        lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float64)
        offsets = self.kv_indptr.tolist()
        for b, n in enumerate(self.lengths):
            if not n:
                continue
            pages = self.kv_indices[offsets[b]:offsets[b + 1]].long()
            kk = k[pages].reshape(-1, num_kv_heads, head_dim)[:n]
            vv = v[pages].reshape(-1, num_kv_heads, head_dim)[:n]
            logits = torch.einsum("hgd,thd->hgt", q[b].view(num_kv_heads, group, head_dim), kk) * scale
            lse[b] = (torch.logsumexp(logits, dim=-1) / LN2).reshape(num_qo_heads)
            out[b] = torch.einsum("hgt,thd->hgd", torch.softmax(logits, dim=-1), vv).reshape(num_qo_heads, head_dim)
        return out, lse


def random_problem(gen, config, dtype, batch=None, longest=None, **kw) -> Problem:
    num_qo_heads, num_kv_heads, head_dim, page_size = config
    batch = batch if batch is not None else int(torch.randint(1, 7, (), generator=gen))
    longest = longest if longest is not None else 3 * page_size + int(torch.randint(1, 200, (), generator=gen))
    return Problem(gen, random_lengths(gen, batch, page_size, longest), num_qo_heads, num_kv_heads, head_dim,
                   page_size, dtype, **kw)


def poisoned_outputs(problem: Problem, device, layout="contiguous") -> tuple[torch.Tensor, torch.Tensor]:
    batch, num_qo_heads, head_dim = problem.q.shape
    nan = float("nan")
    if layout == "contiguous":
        out = torch.full((batch, num_qo_heads, head_dim), nan, dtype=problem.q.dtype, device=device)
        lse = torch.full((batch, num_qo_heads), nan, device=device)
    else:  # strided views inside wider buffers (rows still 16-byte aligned), lse transposed
        out = torch.full((batch, num_qo_heads + 1, head_dim + 8), nan, dtype=problem.q.dtype, device=device)
        out = out[:, 1:, :head_dim]
        lse = torch.full((num_qo_heads, batch), nan, device=device).t()
    return out, lse


def check(got: tuple, problem: Problem, device: str, seed: int, what: str = ""):
    """The tolerances of the module doc; exact zeros and -inf for empty requests."""
    out, lse = got
    ref_out, ref_lse = problem.reference()
    tag = f"{what} {replay(seed)}"
    empty = torch.tensor([n == 0 for n in problem.lengths])
    if empty.any():
        assert torch.equal(out[empty.to(out.device)].cpu().float(), torch.zeros_like(ref_out[empty]).float()), \
            f"empty requests: output not zero; {tag}"
        assert torch.isneginf(lse[empty.to(lse.device)].cpu()).all(), f"empty requests: lse not -inf; {tag}"
    dtype = out.dtype
    if device == "cpu":
        rtol, atol = TOLERANCES[dtype]
        assert_close(out.cpu(), ref_out, dtype=dtype, rtol=rtol, atol=atol, what=f"out {tag}")
        assert_close(lse.cpu(), ref_lse, dtype=torch.float32, rtol=1e-5, atol=2e-4, what=f"lse {tag}")
    else:
        tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
        scale = float(ref_out.abs().max()) if ref_out.numel() else 0.0
        assert_close(out.cpu(), ref_out, dtype=dtype, rtol=tol, atol=tol * scale, what=f"out {tag}")
        assert_close(lse.cpu(), ref_lse, dtype=torch.float32, rtol=1e-4, atol=1e-3, what=f"lse {tag}")


def run(problem: Problem, device, layout="contiguous", **kw) -> tuple:
    out, lse = poisoned_outputs(problem, device, layout)
    got = opforge.paged_decode_attention(*problem.args(device), **problem.kwargs(device), out=out, lse=lse, **kw)
    assert got[0] is out and got[1] is lse
    return got


backends = pytest.mark.parametrize("device, backend", NATIVE_BACKENDS)


# --- results ---------------------------------------------------------------------------------


@backends
@dtypes
@trials
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "h{}_kv{}_d{}_ps{}".format(*c))
def test_matches_reference(seed, trial, device, backend, dtype, config):
    problem = random_problem(torch.Generator().manual_seed(seed), config, dtype)
    check(run(problem, device, backend=backend), problem, device, seed, f"{config} {problem.lengths}")


@backends
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_out_and_lse_buffers_are_written_in_place(seed, device, backend, layout):
    problem = random_problem(torch.Generator().manual_seed(seed), (32, 8, 128, 16), torch.bfloat16)
    out, lse = run(problem, device, layout, backend=backend)
    check((out, lse), problem, device, seed)
    base = out._base if out._base is not None else out
    assert torch.isnan(base[:, :1]).all() or layout == "contiguous", "a padding row of out was written"


@devices
def test_one_output_given(seed, device):
    problem = random_problem(torch.Generator().manual_seed(seed), (8, 2, 64, 4), torch.float16)
    out, _ = poisoned_outputs(problem, device)
    got_out, got_lse = opforge.paged_decode_attention(*problem.args(device), **problem.kwargs(device), out=out)
    assert got_out is out and got_lse.dtype == torch.float32 and got_lse.shape == problem.q.shape[:2]
    _, lse = poisoned_outputs(problem, device)
    got = opforge.paged_decode_attention(*problem.args(device), **problem.kwargs(device), lse=lse)
    assert got[1] is lse and got[0].is_contiguous()
    check(got, problem, device, seed)


@devices
def test_strided_inputs(seed, device):
    """k_cache and v_cache as the two halves of one [pages, 2, page_size, kv heads, head_dim]
    buffer, q as the first heads of a fused qkv projection: used as they are."""
    gen = torch.Generator().manual_seed(seed)
    problem = random_problem(gen, (16, 4, 128, 8), torch.bfloat16)
    q, k, v, indptr, indices = problem.args(device)
    kv = torch.stack([k, v], dim=1)
    qkv = torch.cat([q, torch.randn(q.shape[0], 8, q.shape[2], generator=gen).to(q.dtype).to(device)], dim=1)
    got = opforge.paged_decode_attention(qkv[:, :16], kv[:, 0], kv[:, 1], indptr, indices, **problem.kwargs(device))
    check(got, problem, device, seed)


@devices
def test_defaults(seed, device):
    """sm_scale None is 1 / sqrt(head_dim); kv_last_page_len None is every page full, and page
    size 1 needs none."""
    gen = torch.Generator().manual_seed(seed)
    full = Problem(gen, [32, 0, 96, 16], 8, 2, 128, 16, torch.bfloat16, last_len=False)
    check(opforge.paged_decode_attention(*full.args(device)), full, device, seed, "full pages")
    ones = Problem(gen, [5, 0, 9], 8, 2, 64, 1, torch.float16)
    check(opforge.paged_decode_attention(*ones.args(device)), ones, device, seed, "page size 1")
    check(opforge.paged_decode_attention(*ones.args(device), kv_last_page_len=ones.kv_last_page_len.to(device)),
          ones, device, seed, "page size 1 with ones")


@devices
def test_layout_within_larger_buffers(seed, device):
    """kv_indices longer than kv_indptr[-1] (a serving engine's buffer, garbage past the end) and
    kv_indptr not starting at 0."""
    gen = torch.Generator().manual_seed(seed)
    problem = Problem(gen, [40, 7, 0, 130], 16, 4, 128, 16, torch.bfloat16, index_slack=9, sm_scale=0.3)
    problem.kv_indices = torch.cat([torch.tensor([-5, 10**6], dtype=torch.int32), problem.kv_indices])
    problem.kv_indptr += 2
    check(run(problem, device), problem, device, seed)


@devices
@dtypes
def test_only_empty_requests(device, dtype):
    problem = Problem(torch.Generator().manual_seed(0), [0, 0, 0], 8, 2, 128, 4, dtype)
    out, lse = run(problem, device)
    assert torch.equal(out.cpu(), torch.zeros_like(out.cpu())) and torch.isneginf(lse).all()
    none = Problem(torch.Generator().manual_seed(0), [], 8, 2, 128, 4, dtype)
    out, lse = opforge.paged_decode_attention(*none.args(device))
    assert out.shape == (0, 8, 128) and lse.shape == (0, 8)


@devices
def test_extreme_logits(seed, device):
    """Logits of +-400 (sm_scale 25 on unit vectors): the softmax stays finite, lse exact."""
    gen = torch.Generator().manual_seed(seed)
    problem = Problem(gen, [200, 3, 64], 8, 1, 64, 16, torch.float16, sm_scale=25.0)
    problem.q = torch.nn.functional.normalize(problem.q.float(), dim=-1).to(torch.float16)
    problem.k_cache = torch.nn.functional.normalize(problem.k_cache.float(), dim=-1).to(torch.float16)
    check(run(problem, device), problem, device, seed)


def test_backends_agree(seed):
    problem = random_problem(torch.Generator().manual_seed(seed), (24, 8, 128, 64), torch.bfloat16)
    cpu = opforge.paged_decode_attention(*problem.args(), **problem.kwargs(), backend="cpu")
    formula = opforge.paged_decode_attention(*problem.args(), **problem.kwargs(), backend="torch")
    assert torch.allclose(cpu[0].float(), formula[0].float(), rtol=1e-2, atol=1e-2), replay(seed)
    assert torch.allclose(cpu[1], formula[1], rtol=1e-5, atol=1e-4, equal_nan=True), replay(seed)
    again = opforge.paged_decode_attention(*problem.args(), **problem.kwargs())
    assert torch.equal(cpu[0], again[0]) and torch.equal(cpu[1], again[1]), "the CPU op is not deterministic"


def test_keyword_arguments(seed):
    problem = random_problem(torch.Generator().manual_seed(seed), (8, 2, 64, 4), torch.bfloat16)
    q, k, v, indptr, indices = problem.args()
    kw = problem.kwargs()
    a = opforge.paged_decode_attention(kv_indices=indices, kv_indptr=indptr, v_cache=v, k_cache=k, q=q, **kw)
    b = opforge.paged_decode_attention(q, k, v, indptr, indices, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --- bad arguments ---------------------------------------------------------------------------


def valid_args(page_size=4, head_dim=128, hq=8, hkv=2) -> dict:
    problem = Problem(torch.Generator().manual_seed(1), [5, 0, 9], hq, hkv, head_dim, page_size, torch.bfloat16)
    q, k, v, indptr, indices = problem.args()
    out, lse = poisoned_outputs(problem, "cpu")
    return {"q": q, "k_cache": k, "v_cache": v, "kv_indptr": indptr, "kv_indices": indices,
            "kv_last_page_len": problem.kv_last_page_len, "out": out, "lse": lse}


def changed(name, value_fn):
    return lambda s: s.update({name: value_fn(s)})


def out_over_k(s):
    s["out"] = s["k_cache"].view(-1)[: s["q"].numel()].view(s["q"].shape)


def set_value(name, index, value):
    def change(s):
        t = s[name].clone()
        t[index] = value
        s[name] = t
    return change


ERRORS = {
    # name: (change, exception, words the message must contain)
    "q-float32": (changed("q", lambda s: s["q"].float()), TypeError, ("q has dtype float32", "float16, bfloat16")),
    "k-float16": (changed("k_cache", lambda s: s["k_cache"].half()), TypeError,
                  ("k_cache has dtype float16 but q has bfloat16",)),
    "out-float32": (changed("out", lambda s: s["out"].float()), TypeError, ("out has dtype float32",)),
    "lse-bfloat16": (changed("lse", lambda s: s["lse"].bfloat16()), TypeError, ("lse has dtype bfloat16", "float32")),
    "indptr-int64": (changed("kv_indptr", lambda s: s["kv_indptr"].long()), TypeError,
                     ("kv_indptr has dtype int64", "int32")),
    "indices-float": (changed("kv_indices", lambda s: s["kv_indices"].float()), TypeError,
                      ("kv_indices has dtype float32", "int32")),
    "last-int64": (changed("kv_last_page_len", lambda s: s["kv_last_page_len"].long()), TypeError,
                   ("kv_last_page_len has dtype int64", "int32")),
    "q-2d": (changed("q", lambda s: s["q"][:, 0]), ValueError,
             ("q has shape (3, 128)", "[batch, num_qo_heads, head_dim]")),
    "k-3d": (changed("k_cache", lambda s: s["k_cache"][0]), ValueError,
             ("k_cache has shape", "[num_pages, page_size, num_kv_heads, head_dim]")),
    "indptr-2d": (changed("kv_indptr", lambda s: s["kv_indptr"].view(1, -1)), ValueError, ("kv_indptr", "1-d")),
    "head-dim-mismatch": (lambda s: s.update(k_cache=valid_args(head_dim=64)["k_cache"],
                                             v_cache=valid_args(head_dim=64)["v_cache"]), ValueError,
                          ("k_cache has head_dim 64", "q has 128")),
    "head-dim-unsupported": (lambda s: s.update({n: v[..., :96] for n, v in s.items() if n in ("q", "k_cache",
                                                                                                 "v_cache", "out")}),
                             ValueError, ("head_dim 96", "64, 128, 256")),
    "page-size-mismatch": (changed("v_cache", lambda s: valid_args(page_size=8)["v_cache"]), ValueError,
                           ("v_cache has shape", "page_size differ")),
    "heads-not-divisible": (lambda s: s.update(q=s["q"][:, :7], out=s["out"][:, :7], lse=s["lse"][:, :7]), ValueError,
                            ("num_qo_heads = 7", "not a multiple of num_kv_heads = 2")),
    "indptr-length": (changed("kv_indptr", lambda s: s["kv_indptr"][:3]), ValueError,
                      ("kv_indptr has shape (3,)", "[batch + 1] = (4)")),
    "last-length": (changed("kv_last_page_len", lambda s: s["kv_last_page_len"][:2]), ValueError,
                    ("kv_last_page_len has shape (2,)", "(3)")),
    "out-shape": (changed("out", lambda s: s["out"][:2]), ValueError, ("out has shape (2, 8, 128)",)),
    "lse-shape": (changed("lse", lambda s: s["lse"][:, :4]), ValueError, ("lse has shape (3, 4)",)),
    "q-strided-head-dim": (changed("q", lambda s: s["q"].repeat_interleave(2, dim=2)[..., ::2]), ValueError,
                           ("q has stride 2 along head_dim", "contiguous")),
    "indices-strided": (changed("kv_indices", lambda s: s["kv_indices"].repeat_interleave(2)[::2]), ValueError,
                        ("kv_indices has stride 2", "contiguous")),
    "out-overlaps-k": (out_over_k, ValueError, ("out overlaps k_cache",)),
    "out-expanded": (changed("out", lambda s: s["out"][:1].expand(3, 8, 128)), ValueError, ("out", "overlap")),
    "lse-is-out": (changed("lse", lambda s: s["out"].view(torch.float32)[..., :1].reshape(3, 8)), ValueError,
                   ("out overlaps lse",)),
    "page-size-0": (lambda s: s.update(k_cache=s["k_cache"][:, :0], v_cache=s["v_cache"][:, :0]), ValueError,
                    ("page_size 0",)),
    "out-on-meta": (changed("out", lambda s: torch.empty(3, 8, 128, dtype=torch.bfloat16, device="meta")),
                    ValueError, ("out", "meta")),
    "indptr-decreasing": (set_value("kv_indptr", 2, 0), ValueError,
                          ("kv_indptr is not non-decreasing", "kv_indptr[1] = 2 > kv_indptr[2] = 0")),
    "indptr-negative": (set_value("kv_indptr", 0, -1), ValueError, ("kv_indptr[0] = -1", ">= 0")),
    "indptr-past-indices": (set_value("kv_indptr", 3, 9), ValueError,
                            ("kv_indptr[-1] = 9 but kv_indices has only 5 entries",)),
    "page-out-of-range": (set_value("kv_indices", 3, 8), ValueError,
                          ("kv_indices[3] = 8 is not a page of the cache", "[0, num_pages = 8)")),
    "page-negative": (set_value("kv_indices", 0, -1), ValueError, ("kv_indices[0] = -1",)),
    "last-page-too-long": (set_value("kv_last_page_len", 2, 5), ValueError,
                           ("kv_last_page_len[2] = 5", "1 .. page_size = 4")),
    "last-page-zero": (set_value("kv_last_page_len", 0, 0), ValueError, ("kv_last_page_len[0] = 0",)),
    "q-list": (changed("q", lambda s: [1.0]), TypeError, ("q", "torch.Tensor", "list")),
    "sm-scale-text": (lambda s: s.update(sm_scale="0.1"), TypeError, ("sm_scale must be a float",)),
    "max-kv-len-float": (lambda s: s.update(max_kv_len=2048.0), TypeError, ("max_kv_len must be an int or None",)),
    "max-kv-len-bool": (lambda s: s.update(max_kv_len=True), TypeError, ("max_kv_len must be an int or None",)),
    "max-kv-len-negative": (lambda s: s.update(max_kv_len=-1), ValueError,
                            ("max_kv_len = -1", "the longest request's tokens")),
}
#: Cases the compiled binding finds (so also with skip_check=True and every backend). max_kv_len is
#: a hint for the CUDA plan: only the Python-level check sees it on CPU tensors.
COMPILED = [n for n in ERRORS if n not in ("q-list", "sm-scale-text") and not n.startswith("max-kv-len")]


@pytest.mark.parametrize("name, skip_check", [pytest.param(n, skip, id=f"{n}{'-skip_check' if skip else ''}")
                                              for n in ERRORS for skip in (False, True) if not skip or n in COMPILED])
@pytest.mark.parametrize("backend", ["auto", "cpu", "torch"])
def test_bad_arguments(name, backend, skip_check):
    """Each error names the op, the argument, what was given and what is accepted, and nothing
    is written; the compiled checks hold with skip_check=True and on every backend."""
    change, exc, needles = ERRORS[name]
    args = valid_args()
    out, lse = args["out"], args["lse"]
    change(args)
    q = args.pop("q")
    with pytest.raises(exc) as info:
        opforge.paged_decode_attention(q, **args, backend=backend, skip_check=skip_check)
    message = str(info.value)
    assert message.startswith("opforge.paged_decode_attention:"), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert torch.isnan(out).all() and torch.isnan(lse).all(), "a rejected call wrote out or lse"


def test_inputs_that_require_grad():
    args = valid_args()
    args["q"] = args["q"].float().requires_grad_().bfloat16()
    with pytest.raises(ValueError, match="^opforge.paged_decode_attention: .*q requires grad"):
        opforge.paged_decode_attention(**args)
    with torch.no_grad():
        opforge.paged_decode_attention(**args)


def test_unknown_and_impossible_backends():
    with pytest.raises(opforge.BackendError, match="'triton'"):
        opforge.paged_decode_attention(**valid_args(), backend="triton")
    with pytest.raises(ValueError, match="^opforge.paged_decode_attention: .*CUDA"):
        opforge.paged_decode_attention(**valid_args(), backend="cuda")


# --- the CUDA plan (plain C++, checked without a GPU) ------------------------------------------


def plan(batch, hq, hkv, tokens, head_dim=128, sms=132, page_size=1, **force):
    return _C.paged_decode_attention_plan(batch, hq, hkv, head_dim, tokens, page_size, sms, **force)


@pytest.mark.parametrize("batch, tokens, parts, splits, token_warps",
                         [(128, 128 * 2048, 4, 1, 4), (32, 32 * 2048, 16, 4, 4), (8, 8 * 2048, 16, 4, 4),
                          (8, 8 * 512, 4, 1, 4), (1, 32768, 132, 33, 4), (1, 8192, 64, 16, 4), (1, 2048, 64, 16, 4),
                          (1, 512, 64, 16, 4), (1, 16, 2, 1, 2), (2, 2 * 512, 32, 8, 4), (4, 4 * 512, 16, 4, 4),
                          (32, 32 * 512, 4, 1, 4), (128, 128 * 512, 4, 1, 4), (256, 256 * 2048, 2, 1, 2),
                          (8, 8 * 128, 1, 1, 1), (8, 8 * 40, 1, 1, 1), (128, 128 * 64, 1, 1, 1)], ids=str)
def test_plan_of_the_decode_shapes(batch, tokens, parts, splits, token_warps):
    """h32_kv8 on 132 SMs: each request cut into parts until four waves of 1056 warps, but no
    more than one CTA of four warps per SM (4 x floor(132 / tasks) parts; two where that leaves
    64 tokens per part: batch 1 x 32768) or 16 parts, whichever is more, each part keeping at
    least 128 tokens of an average request (8 with at most 33 tasks: batch 1 to 4); up to 4 of
    the parts are warps of one CTA, the rest splits (the examples in the header)."""
    p = plan(batch, 32, 8, tokens, page_ranges=False)
    assert splits == -(-parts // token_warps)
    assert (p["head_chunks"], p["splits"], p["token_warps"], p["warps_per_cta"], p["ranges"]) == \
        (1, splits, token_warps, token_warps, 0), p
    assert p["ctas"] == batch * 8 * splits
    assert p["workspace"] == (splits * batch * 32 * 129 if splits > 1 else 0)
    # Where the GPU has the shared memory for page ranges, the one cut here with splits and
    # 3/4 of the SMs' worth of tasks (32 x 2048) takes them (test_plan_without_lengths).
    assert plan(batch, 32, 8, tokens) == p or (batch, tokens) == (32, 32 * 2048)


@pytest.mark.parametrize("batch, context, splits",
                         [(128, 2048, 16), (128, 512, 4), (32, 2048, 16), (32, 512, 16), (8, 2048, 33), (8, 8192, 33),
                          (1, 512, 16), (1, 2048, 64), (1, 32768, 128)], ids=str)
def test_plan_at_256_dims(batch, context, splits):
    """h8_kv1_d256 on 132 SMs (two warps of dims per CTA, so every part is a split merged through
    memory): four waves of warps (batch 128: 16 splits), two two-warp CTAs per SM with few tasks
    (batch 8: floor(264 / 8) = 33), 32 tokens per split at least with at most one task per four
    SMs (batch 1 x 512: 16)."""
    p = plan(batch, 8, 1, batch * context, head_dim=256)
    assert (p["splits"], p["token_warps"], p["warps_per_cta"]) == (splits, 1, 2), p


def test_plan_heads_and_dims():
    assert plan(4, 40, 2, 4096)["head_chunks"] == 2  # 20 query heads per KV head: two 16-row tiles
    assert plan(4, 64, 1, 4096)["head_chunks"] == 4
    # Two-warp CTAs at 256 dims: no token warps; 32 tasks are few: 16 splits (four warps per SM
    # in two-warp CTAs would be floor(264 / 32) = 8); at 128 dims a full wave of four-warp CTAs,
    # 4 x floor(264 / 32) = 32 parts, keeps 256 tokens per part.
    wide, narrow = plan(32, 8, 1, 32 * 8192, head_dim=256), plan(32, 8, 1, 32 * 8192, head_dim=128)
    assert (wide["warps_per_cta"], wide["splits"], wide["token_warps"]) == (2, 16, 1)
    assert (narrow["warps_per_cta"], narrow["splits"], narrow["token_warps"]) == (4, 8, 4)
    # h32_kv4, batch 8 (32 tasks): a full wave (8 x 4) from 64 tokens per part, half of one below.
    kv4 = [plan(8, 32, 4, 8 * n) for n in (512, 2048, 8192, 32768)]
    assert [(p["splits"], p["token_warps"]) for p in kv4] == [(4, 4), (8, 4), (8, 4), (8, 4)]
    # One task of h32_kv4 at batch 1 x 32768 takes 66 splits of 4 warps: the cap of 128 counts
    # splits, not parts.
    assert (plan(1, 32, 4, 32768)["splits"], plan(1, 32, 4, 32768)["token_warps"]) == (66, 4)
    # Tasks whose token warps fill a wave without a split take none: 512 tasks x 4 token warps
    # (h32_kv4 at batch 128; 256 tasks at batch 64 still split). Not without token warps (256
    # dims), where splits are what even out unequal lengths.
    cuts = [plan(b, 32, 4, b * 2048, page_ranges=False) for b in (64, 128)]
    assert [(p["splits"], p["token_warps"]) for p in cuts] == [(4, 4), (1, 4)]
    assert [plan(b, 16, 8, b * 2048, head_dim=256)["splits"] for b in (64, 128)] == [4, 2]
    one = plan(1, 8, 1, 1 << 20)  # one task: capped by the most splits
    assert (one["splits"], one["token_warps"]) == (128, 4)
    assert plan(0, 32, 8, 0)["ctas"] == 0


def test_plan_with_even_lengths():
    """A caller that knows its batch's longest request (max_kv_len) lets an even batch skip the
    splits the plan otherwise hedges with against one long request: once its tasks give three
    quarters of the SMs two CTAs (one split), and from two tasks per three SMs up to one per SM
    (one split where a step's 16 rows lie in one page, page_size a multiple of 16; else two, as a
    page id per token needs more rows in flight); skewed batches, fewer tasks, the tasks between
    one and 1.75 per SM (one split would load some SMs twice) and 256 dims (splits only) keep the
    plan of the shapes."""
    def cut(batch, hq, hkv, context, max_tokens, head_dim=128, tokens=None, page_size=1):
        p = plan(batch, hq, hkv, tokens if tokens is not None else batch * context, head_dim=head_dim,
                 max_tokens=max_tokens, page_size=page_size, page_ranges=max_tokens > 0)
        return ("ranges", p["ranges"]) if p["ranges"] else (p["splits"], p["token_warps"])
    # h32_kv8 32 x 2048 and 32 x 8192, h32_kv4 64 x 2048: 256 tasks on 132 SMs, at every page size.
    for batch, hkv, context in ((32, 8, 2048), (32, 8, 8192), (64, 4, 2048)):
        for page_size in (1, 16, 64):
            assert cut(batch, 32, hkv, context, 0, page_size=page_size) == (4, 4)
            assert cut(batch, 32, hkv, context, context, page_size=page_size) == (1, 4)
            assert cut(batch, 32, hkv, context, context * 5 // 4, page_size=page_size) == (1, 4)  # 1.25 x the average
            assert cut(batch, 32, hkv, context, context * 5 // 4 + 1, page_size=page_size) == (4, 4)
    # h32_kv4 (4 tasks a request) x 2048: 88 to 132 tasks (batch 22 to 33) take one split where
    # pages hold whole steps, two where not; 84 (batch 21) and 136 to 228 (batch 34 to 57) keep
    # the cuts of the shapes; 232 (batch 58) take one split at every page size.
    batches = (21, 22, 24, 32, 33, 34, 48, 57, 58)
    shapes = [cut(b, 32, 4, 2048, 0) for b in batches]
    assert shapes == [(4, 4)] * 9
    for page_size, few in ((16, (1, 4)), (32, (1, 4)), (48, (1, 4)), (64, (1, 4)), (1, (2, 4)), (8, (2, 4)),
                           (24, (2, 4))):
        assert [cut(b, 32, 4, 2048, 2048, page_size=page_size) for b in batches] == \
            [shapes[0]] + [few] * 4 + shapes[5:8] + [(1, 4)], page_size
    # ... and never more parts than the shapes' plan (batch 32 x 512: 1 x 4 either way).
    assert cut(32, 32, 4, 512, 512) == cut(32, 32, 4, 512, 0) == (1, 4)
    # A long request among short ones (32 x tail: 1520 tokens on average, 32768 at most) is no
    # even batch (test_plan_with_skewed_lengths).
    for page_size in (1, 16):
        assert cut(32, 32, 8, 0, 32768, tokens=32 * 1520, page_size=page_size)[0] != 1
    # Fewer tasks (h32_kv8 batch 8: 64; h32_kv4 batch 16: 64) and 256 dims keep their plans.
    for page_size in (1, 16):
        assert cut(8, 32, 8, 2048, 2048, page_size=page_size) == cut(8, 32, 8, 2048, 0, page_size=page_size)
        assert cut(16, 32, 4, 8192, 8192, page_size=page_size) == cut(16, 32, 4, 8192, 0) == (4, 4)
        assert cut(32, 16, 8, 2048, 2048, head_dim=256, page_size=page_size) == cut(32, 16, 8, 2048, 0, head_dim=256)
    # Batches that already take one split are unchanged.
    assert cut(128, 32, 8, 2048, 2048) == cut(128, 32, 8, 2048, 0) == (1, 4)
    with pytest.raises(ValueError, match="max_kv_len = -1"):
        plan(32, 32, 8, 32 * 2048, max_tokens=-1)
    with pytest.raises(ValueError, match="page_size >= 1"):
        plan(32, 32, 8, 32 * 2048, page_size=0)


def test_plan_with_skewed_lengths():
    """A caller whose longest request is at least 4x the average (max_kv_len) gets page ranges
    where the plan would otherwise hedge with splits and the tasks give three quarters of the
    SMs one: a wave of 264 CTAs on 132 SMs. Lengths not known, or spread less, keep the cut; so do
    fewer tasks, batches that take one split anyway and 256 dims."""
    def ranges(batch, hkv, avg, longest, head_dim=128, sms=132):
        p = plan(batch, 32, hkv, batch * avg, head_dim=head_dim, sms=sms, max_tokens=longest)
        return p["ranges"]
    assert ranges(32, 8, 1520, 32768) == 33 and ranges(32, 4, 1520, 32768) == 66  # 32 x tail
    assert ranges(32, 8, 1520, 4 * 1520) == 33 and ranges(32, 8, 1520, 4 * 1520 - 1) == 0
    assert ranges(32, 8, 2310, 3796) == 0  # 32 x uniform lengths: 1.6 x the average at most
    assert ranges(12, 8, 1520, 32768) == 0 and ranges(13, 8, 1520, 32768) == 33  # 96 tasks < 99 <= 104
    assert ranges(8, 4, 1520, 32768) == 0  # 32 tasks: the cut
    assert ranges(128, 8, 512, 32768) == 0  # one split anyway (1 x 4)
    assert ranges(32, 8, 1520, 32768, head_dim=256) == 0  # splits only
    p = plan(32, 32, 8, 32 * 1520, max_tokens=32768)
    assert (p["splits"], p["token_warps"], p["warps_per_cta"], p["ctas"], p["workspace"], p["even_splits"]) == \
        (1, 4, 4, 8 * 33, 2 * 8 * 33 * 16 * 129, 0)  # told it is skewed: no check of the lengths on the GPU
    assert plan(32, 32, 8, 32 * 1520, max_tokens=32768, page_ranges=False)["ranges"] == 0


def test_plan_without_lengths():
    """A caller that does not say how long its longest request is gets page ranges wherever a
    skewed batch would (the cut hedges with splits, and the tasks give 3/4 of the SMs one), with
    the splits of the cut an even batch takes (even_splits) for the kernels to use if they find
    the batch balanced (the longest request at most 7/4 of the average pages): one at 256 tasks
    (1 x 4, h32_kv8 32 x 2048), two for 128 tasks where pages hold less than a step (h32_kv4
    32 x 2048 at page size 1), one where they hold whole steps. None where that cut has fewer
    than four warps or more CTAs than the wave's ranges."""
    def ranged(batch, hq, hkv, context, page_size=1, head_dim=128, sms=132):
        p = plan(batch, hq, hkv, batch * context, page_size=page_size, head_dim=head_dim, sms=sms)
        return (p["ranges"], p["even_splits"])
    for page_size in (1, 16, 64):
        assert ranged(32, 32, 8, 2048, page_size) == ranged(32, 32, 8, 8192, page_size) == (33, 1)
        assert ranged(64, 32, 4, 2048, page_size) == (66, 1)
    assert ranged(32, 32, 4, 2048, 1) == ranged(32, 32, 4, 2048, 5) == (66, 2)
    assert ranged(32, 32, 4, 2048, 16) == (66, 1)
    assert ranged(13, 32, 8, 2048, 1) == (33, 2) and ranged(16, 32, 8, 2048, 1) == (33, 2)  # 104, 128 tasks
    assert ranged(17, 32, 8, 2048, 1) == (33, 0)  # 136 tasks: its even cut (4 x 4) hedges too
    assert ranged(128, 5, 1, 2048) == (264, 2) and ranged(128, 5, 1, 2048, 16) == (264, 1)  # h5_kv1: 264 ranges
    # The cut stays where it has no splits, with fewer tasks than 3/4 of the SMs, and at 256 dims.
    assert ranged(128, 32, 8, 2048) == ranged(32, 32, 8, 512) == ranged(12, 32, 8, 2048) == (0, 0)
    assert ranged(32, 16, 8, 2048, head_dim=256) == (0, 0)
    # A hint of even lengths takes the even cut; one of lengths neither even nor skewed, the cut.
    assert plan(32, 32, 8, 32 * 2048, max_tokens=2048)["ranges"] == 0
    assert plan(32, 32, 8, 32 * 2310, max_tokens=3796)["ranges"] == 0


def test_forced_plans():
    p = plan(3, 32, 8, 300, splits=5)
    assert (p["splits"], p["ctas"], p["workspace"]) == (5, 3 * 8 * 5, 5 * 3 * 32 * 129)
    for bad in (-2, 129):
        with pytest.raises(ValueError, match="splits"):
            plan(3, 32, 8, 300, splits=bad)
    p = plan(3, 32, 8, 300, splits=2, token_warps=4)
    assert (p["splits"], p["token_warps"], p["warps_per_cta"], p["ctas"]) == (2, 4, 4, 3 * 8 * 2)
    assert plan(3, 32, 8, 300, splits=2)["token_warps"] == 1
    for bad in (dict(splits=2, token_warps=3), dict(splits=2, token_warps=8), dict(splits=2, token_warps=0),
                dict(token_warps=2), dict(splits=1, token_warps=2, head_dim=256)):
        with pytest.raises(ValueError, match="token_warps"):
            plan(3, 32, 8, 300, **bad)
    with pytest.raises(ValueError, match="plan needs"):
        plan(3, 30, 8, 300)


def test_forced_page_ranges():
    """splits=0 forces page ranges: token_warps of them per KV head and chunk of 16 query heads
    (-1: one wave of two 4-warp CTAs per SM), a CTA each; the workspace holds two slots of a
    chunk's rows (output and lse) per range."""
    p = plan(3, 32, 8, 300, splits=0, token_warps=12)
    assert (p["ranges"], p["warps_per_cta"], p["ctas"], p["workspace"]) == (12, 4, 8 * 12, 2 * 12 * 8 * 16 * 129)
    assert plan(3, 32, 8, 300, splits=0)["ranges"] == 132 * 2 // 8  # a wave: 264 CTAs over 8 KV heads
    assert plan(3, 32, 4, 300, splits=0)["ranges"] == 66
    assert plan(3, 40, 2, 300, splits=0)["ranges"] == 132 * 2 // 4  # 20 query heads per KV head: two chunks
    assert plan(3, 32, 32, 300, splits=0, sms=10)["ranges"] == 1  # at least one
    assert plan(2048, 32, 8, 300, splits=0)["ranges"] == 33  # batches up to 2048
    for bad in (dict(token_warps=0), dict(token_warps=4097), dict(token_warps=8, head_dim=256)):
        head_dim = bad.pop("head_dim", 128)
        with pytest.raises(ValueError, match="page ranges"):
            plan(3, 32, 8, 300, head_dim=head_dim, splits=0, **bad)
    with pytest.raises(ValueError, match="batch <= 2048"):
        plan(2049, 32, 8, 300, splits=0)
    assert plan(3, 32, 8, 300)["ranges"] == 0
    # even_splits: the plan's (-1, the default), none (0), or forced where batch x even_splits
    # fits the ranges; for page ranges only.
    assert plan(32, 32, 8, 32 * 2048, splits=0)["even_splits"] == 1
    assert plan(32, 32, 4, 32 * 2048, splits=0)["even_splits"] == 2
    assert plan(32, 32, 8, 32 * 2048, splits=0, token_warps=31)["even_splits"] == 0  # 32 requests > 31 ranges
    assert plan(32, 32, 8, 32 * 2048, splits=0, even_splits=0)["even_splits"] == 0
    p = plan(3, 32, 8, 300, splits=0, token_warps=12, even_splits=4)
    assert (p["even_splits"], p["ctas"], p["workspace"]) == (4, 8 * 12, 2 * 12 * 8 * 16 * 129)
    for bad in (dict(even_splits=5), dict(even_splits=-2), dict(token_warps=2, even_splits=1)):
        with pytest.raises(ValueError, match="even_splits"):
            plan(3, 32, 8, 300, splits=0, **{"token_warps": 12, **bad})
    with pytest.raises(ValueError, match="even_splits=1 is for page ranges"):
        plan(3, 32, 8, 300, splits=2, even_splits=1)


# --- torch.library / torch.compile -----------------------------------------------------------


def test_registered_op():
    schema = torch.ops.opforge.paged_decode_attention.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"out", "lse"} and len(schema.returns) == 0
    args = valid_args()
    torch.library.opcheck(torch.ops.opforge.paged_decode_attention.default,
                          (args["out"], args["lse"], args["q"], args["k_cache"], args["v_cache"], args["kv_indptr"],
                           args["kv_indices"], args["kv_last_page_len"], 0.125),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
@devices
def test_compiled_matches_eager(seed, device):
    def f(q, k, v, indptr, indices, last):
        out, lse = opforge.paged_decode_attention(q, k, v, indptr, indices, kv_last_page_len=last)
        return out.float() * 2, lse + 1

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):  # the second call runs the cached graph on new values (same shapes)
        problem = Problem(gen, [17, 1, 64, 40], 8, 2, 128, 16, torch.bfloat16)
        args = (*problem.args(device), problem.kv_last_page_len.to(device))
        got, want = compiled(*args), f(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), replay(seed)


@pytest.mark.compile
@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_reports_shape_mismatch():
    args = valid_args()
    compiled = torch.compile(lambda q, k, v, i, j: opforge.paged_decode_attention(q, k, v, i, j), fullgraph=True)
    with pytest.raises(Exception, match="do not match"):
        compiled(args["q"], args["k_cache"], args["v_cache"][:, :, :1], args["kv_indptr"], args["kv_indices"])


# --- the forge: Definitions, generated inputs, solutions, tracing ----------------------------


def test_definitions_have_the_public_form():
    """FlashInfer-Trace's names, axes, input order and dtypes; kv_last_page_len only past page 1."""
    from opforge.trace.templates import definition_for_name

    d = definition_for_name("gqa_paged_decode_h32_kv8_d128_ps64")
    assert d.op_type == "gqa_paged"
    assert [(n, a.type, getattr(a, "value", None)) for n, a in d.axes.items()] == [
        ("batch_size", "var", None), ("num_qo_heads", "const", 32), ("num_kv_heads", "const", 8),
        ("head_dim", "const", 128), ("num_pages", "var", None), ("page_size", "const", 64),
        ("len_indptr", "var", None), ("num_kv_indices", "var", None)]
    assert [(n, s.shape, s.dtype.value) for n, s in d.inputs.items()] == [
        ("q", ["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
        ("k_cache", ["num_pages", "page_size", "num_kv_heads", "head_dim"], "bfloat16"),
        ("v_cache", ["num_pages", "page_size", "num_kv_heads", "head_dim"], "bfloat16"),
        ("kv_indptr", ["len_indptr"], "int32"), ("kv_indices", ["num_kv_indices"], "int32"),
        ("kv_last_page_len", ["batch_size"], "int32"), ("sm_scale", None, "float32")]
    assert [(n, s.shape, s.dtype.value) for n, s in d.outputs.items()] == [
        ("output", ["batch_size", "num_qo_heads", "head_dim"], "bfloat16"),
        ("lse", ["batch_size", "num_qo_heads"], "float32")]
    assert d.constraints == ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"]
    ps1 = definition_for_name("gqa_paged_decode_h48_kv8_d128_ps1_f16")
    assert list(ps1.inputs) == ["q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale"]
    assert ps1.inputs["q"].dtype.value == ps1.outputs["output"].dtype.value == "float16"
    assert definition_for_name("gqa_paged_decode_h5_kv1_d128_ps1").axes["num_qo_heads"].value == 5


def _builtin(name):
    from opforge.trace import builtin

    return next(d for d in builtin.builtin_definitions() if d.name == name)


@pytest.mark.parametrize("name", ["gqa_paged_decode_h32_kv8_d128_ps1", "gqa_paged_decode_h16_kv2_d128_ps64_f16"])
def test_generated_inputs_are_valid_layouts(name):
    """What the runner draws for the built-in workloads: kv_indptr from 0 to num_kv_indices,
    non-decreasing (lengths differ inside a batch), distinct pages of the pool, last page
    lengths in [1, page_size]; the constraints hold on the tensors too."""
    from opforge.bench import generate_inputs
    from opforge.trace import builtin

    d = _builtin(name)
    page_size = d.axes["page_size"].value
    for w in builtin.builtin_workloads(d)[:4]:
        inputs = dict(zip(d.inputs, generate_inputs(d, w)))
        d.check_constraints(w.axes, inputs)
        indptr, indices = inputs["kv_indptr"], inputs["kv_indices"]
        assert indptr[0] == 0 and indptr[-1] == w.axes["num_kv_indices"] and (indptr[1:] >= indptr[:-1]).all()
        assert indices.unique().numel() == indices.numel() and 0 <= int(indices.min()) and \
            int(indices.max()) < w.axes["num_pages"]
        if page_size > 1:
            last = inputs["kv_last_page_len"]
            assert 1 <= int(last.min()) and int(last.max()) <= page_size
        assert inputs["sm_scale"] == pytest.approx(1 / math.sqrt(128))
        if w.axes["batch_size"] >= 8:
            assert len(set((indptr[1:] - indptr[:-1]).tolist())) > 1, "every request has the same length"


@pytest.mark.parametrize("name", ["gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps64",
                                  "gqa_paged_decode_h24_kv8_d128_ps64_f16"])
def test_builtin_and_torch_solutions_match_the_reference(name):
    from opforge.bench import compare_outputs, generate_inputs
    from opforge.registry import build
    from opforge.solutions import shipped_solutions
    from opforge.trace import builtin
    from opforge.trace.own_op import language_label

    d = _builtin(name)
    solutions = [builtin.builtin_solution_for(d), *shipped_solutions(d, "gqa_paged_decode")]
    assert [language_label(s) for s in solutions] == ["builtin", "python", "triton"]  # opforge's op, PyTorch, Triton
    solutions = solutions[:2]  # the Triton one runs in the interpreter: test_triton_solution_in_the_interpreter
    runs = [build(s, d, "cpu") for s in solutions]
    for w in builtin.builtin_workloads(d)[:3]:
        inputs = generate_inputs(d, w)
        want = d.reference_fn()(*inputs)
        for solution, fn in zip(solutions, runs):
            verdict = compare_outputs(d, fn(*inputs), want)
            assert verdict.passed, f"{solution.name} {w.axes}: {verdict.log}"


#: Run in a child process: triton's interpreter must be chosen before triton is first imported.
_TRITON_CASES = """
import sys, torch
from opforge.bench import compare_outputs, generate_inputs
from opforge.solutions import gqa_paged_decode_triton as sol
from opforge.trace import RandomInput, ScalarInput, Workload
from opforge.trace.templates import definition_for_name
failed = []
for name, splits in [("gqa_paged_decode_h32_kv8_d128_ps1", 1), ("gqa_paged_decode_h32_kv4_d128_ps64_f16", 3),
                     ("gqa_paged_decode_h24_kv8_d128_ps64", 2), ("gqa_paged_decode_h5_kv1_d128_ps1_f16", 4)]:
    d = definition_for_name(name)
    sol._splits = lambda *args, n=splits: n  # the merge of split partials too
    page_size = d.axes["page_size"].value
    for batch, used in ((1, 3), (5, 200 // page_size + 6)):
        axes = {"batch_size": batch, "num_pages": used + 4, "len_indptr": batch + 1, "num_kv_indices": used}
        inputs = {n: ScalarInput(value=0.09) if s.shape is None else RandomInput() for n, s in d.inputs.items()}
        args = generate_inputs(d, Workload(uuid="w", axes=axes, inputs=inputs, seed=int(sys.argv[1]) + batch))
        verdict = compare_outputs(d, sol.run(**dict(zip(d.inputs, args))), d.reference_fn()(*args))
        if not verdict.passed:
            failed.append(f"{name} splits={splits} batch={batch}: {verdict.log}")
print("\\n".join(failed) or "ok")
"""


@interpreter_only
def test_triton_solution_in_the_interpreter(seed):
    """The shipped Triton solution on CPU (TRITON_INTERPRET=1) against the reference, ps1 and
    ps64, bf16 and fp16, split partials merged, empty requests included."""
    pytest.importorskip("triton", reason="triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", _TRITON_CASES, str(seed)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "ok", f"{done.stdout[-4000:]} {replay(seed)}"


def test_call_binds_to_its_definition(seed):
    """Tracing and apply see a call as its Definition: the name from the shapes, the inputs in
    the Definition's order (full last pages spelled out), and finish() writes out= and lse=."""
    from opforge.trace.calls import bind_call

    problem = Problem(torch.Generator().manual_seed(seed), [32, 0, 48], 16, 2, 128, 16, torch.bfloat16,
                      last_len=False)
    out, lse = poisoned_outputs(problem, "cpu")
    args = problem.args()
    call = bind_call("paged_decode_attention", args, {"out": out, "lse": lse})
    assert call.definition == "gqa_paged_decode_h16_kv2_d128_ps16"
    assert call.key == (call.definition, 3, problem.num_pages, 4, problem.kv_indices.numel())
    d = call.make_definition()
    assert list(call.inputs) == list(d.inputs)
    assert call.inputs["kv_last_page_len"].tolist() == [16, 16, 16]
    assert call.inputs["sm_scale"] == pytest.approx(1 / math.sqrt(128))
    got = call.finish(d.reference_fn()(*call.inputs.values()))
    assert got[0] is out and got[1] is lse
    check(got, problem, "cpu", seed)
    assert bind_call("paged_decode_attention", (args[0].float(), *args[1:]), {}) is None  # no fp32 Definition


# --- CUDA only -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("splits, token_warps", [(2, 1), (16, 1), (17, 1), (1, 4), (2, 2), (17, 4)], ids=str)
@pytest.mark.parametrize("config", [(32, 8, 128, 16), (6, 1, 64, 3), (40, 2, 256, 5)],
                         ids=lambda c: "h{}_kv{}_d{}_ps{}".format(*c))
def test_many_rows_merge(seed, splits, token_warps, config):
    """Enough (request, head) rows for a merge block of them on every SM: up to 16 splits take
    the one-pass merge (every split of a row loaded at once), 17 the per-row one; token warps
    combined inside the CTA, alone or with splits; a bad page in one request makes that request
    NaN and leaves the others bit for bit as they were."""
    if token_warps > 1 and config[2] > 128:
        pytest.skip("token warps only at head_dim <= 128 (test_forced_plans checks the refusal)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_per_block = 256 // (config[2] // 4)
    batch = -(-(rows_per_block * sms + 1) // config[0])
    problem = random_problem(torch.Generator().manual_seed(seed), config, torch.bfloat16, batch=batch, longest=300)
    last = problem.kv_last_page_len.cuda()
    scale = 1 / math.sqrt(config[2])
    stream = torch.cuda.current_stream().cuda_stream

    def run(args):
        out, lse = poisoned_outputs(problem, "cuda", "strided")
        need = _C.paged_decode_attention(out, lse, *args, last, None, scale, stream, True, splits, token_warps)
        workspace = torch.full((need,), float("nan"), device="cuda")
        assert _C.paged_decode_attention(out, lse, *args, last, workspace, scale, stream, True, splits,
                                         token_warps) == 0
        torch.cuda.synchronize()
        return out, lse

    args = list(problem.args("cuda"))
    good = run(args)
    check(good, problem, "cuda", seed, f"splits={splits} token_warps={token_warps}")
    bad_request = next(b for b in range(batch) if problem.lengths[b] > 0)
    args[4] = args[4].clone()
    args[4][int(problem.kv_indptr[bad_request])] = problem.num_pages  # one past the last page
    out, lse = run(args)
    assert torch.isnan(out[bad_request]).all() and torch.isnan(lse[bad_request]).all(), replay(seed)
    keep = torch.arange(batch) != bad_request
    assert torch.equal(out[keep], good[0][keep]) and torch.equal(lse[keep], good[1][keep]), replay(seed)


@pytest.mark.gpu
@pytest.mark.parametrize("token_warps", [1, 2, 4])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16, 17, 128])
@pytest.mark.parametrize("config", [(32, 8, 128, 1), (32, 4, 128, 64), (6, 1, 64, 3), (40, 2, 256, 5),
                                    (8, 2, 128, 48)],  # 48: whole 16-token steps in pages that are no power of two
                         ids=lambda c: "h{}_kv{}_d{}_ps{}".format(*c))
def test_every_split_count(seed, splits, token_warps, config):
    """Split plans and token warps forced past the heuristic (more parts than some requests have
    tokens, so some warps and splits are empty), the workspace NaN-poisoned: the merge reads only
    what the first kernel wrote."""
    if token_warps > 1 and config[2] > 128:
        pytest.skip("token warps only at head_dim <= 128 (test_forced_plans checks the refusal)")
    problem = random_problem(torch.Generator().manual_seed(seed), config, torch.bfloat16, batch=5, longest=700)
    args = problem.args("cuda")
    out, lse = poisoned_outputs(problem, "cuda", "strided")
    last = problem.kv_last_page_len.cuda()
    scale = 1 / math.sqrt(config[2])
    stream = torch.cuda.current_stream().cuda_stream
    need = _C.paged_decode_attention(out, lse, *args, last, None, scale, stream, True, splits, token_warps)
    if splits > 1:
        assert need == splits * 5 * config[0] * (config[2] + 1)
        workspace = torch.full((need,), float("nan"), device="cuda")
        assert _C.paged_decode_attention(out, lse, *args, last, workspace, scale, stream, True, splits,
                                         token_warps) == 0
    else:
        assert need == 0
    torch.cuda.synchronize()
    check((out, lse), problem, "cuda", seed, f"splits={splits} token_warps={token_warps} {problem.lengths}")


def run_forced(problem, args, splits, token_warps, last=None, layout="strided", even_splits=-1):
    """The raw CUDA call with a forced plan, its workspace NaN-poisoned; (out, lse) after a sync."""
    out, lse = poisoned_outputs(problem, "cuda", layout)
    last = problem.kv_last_page_len.cuda() if last is None else last
    scale = 1 / math.sqrt(problem.q.shape[2])
    stream = torch.cuda.current_stream().cuda_stream
    plan = dict(splits=splits, token_warps=token_warps) | (dict(even_splits=even_splits) if splits == 0 else {})
    need = _C.paged_decode_attention(out, lse, *args, last, None, scale, stream, True, **plan)
    if need:
        workspace = torch.full((need,), float("nan"), device="cuda")
        assert _C.paged_decode_attention(out, lse, *args, last, workspace, scale, stream, True, **plan) == 0
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("ranges", [1, 3, 12, -1, 4096], ids=lambda r: "wave" if r == -1 else str(r))
@pytest.mark.parametrize("config", [(32, 8, 128, 1), (32, 4, 128, 64), (6, 1, 64, 3), (40, 2, 128, 5),
                                    (8, 2, 128, 48)],
                         ids=lambda c: "h{}_kv{}_d{}_ps{}".format(*c))
def test_page_ranges(seed, ranges, config):
    """Page-range plans (equal runs of the batch's pages per CTA, whatever the lengths; no check
    for a balanced batch): requests held by one range and by many, requests without pages, ranges
    without pages (4096 of them for a few hundred pages), two chunks of query heads per KV head
    (h40_kv2), a workspace NaN-poisoned; a bad page id in one request makes that request NaN and
    leaves the others bit for bit as they were."""
    problem = random_problem(torch.Generator().manual_seed(seed), config, torch.bfloat16, batch=9, longest=700)
    args = list(problem.args("cuda"))
    good = run_forced(problem, args, 0, ranges, even_splits=0)
    check(good, problem, "cuda", seed, f"ranges={ranges} {problem.lengths}")
    bad_request = next(b for b in range(problem.q.shape[0]) if problem.lengths[b] > 0)
    args[4] = args[4].clone()
    args[4][int(problem.kv_indptr[bad_request + 1]) - 1] = problem.num_pages  # its last page: one past the end
    out, lse = run_forced(problem, args, 0, ranges, even_splits=0)
    assert torch.isnan(out[bad_request]).all() and torch.isnan(lse[bad_request]).all(), replay(seed)
    keep = torch.arange(problem.q.shape[0]) != bad_request
    assert torch.equal(out[keep], good[0][keep]) and torch.equal(lse[keep], good[1][keep]), replay(seed)


EVEN_CONFIGS = [((32, 8, 128, 16), 1), ((32, 4, 128, 1), 2), ((40, 2, 128, 5), 3), ((6, 1, 64, 3), 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["even", "at the bound", "past the bound", "a request without pages", "a bad page",
                                  "a bad last page length", "fewer pages than runs"])
@pytest.mark.parametrize("config, even_splits", EVEN_CONFIGS,
                         ids=[f"h{h}_kv{kv}_d{d}_ps{ps}_even{k}" for (h, kv, d, ps), k in EVEN_CONFIGS])
def test_page_ranges_of_balanced_batches(seed, config, even_splits, kind):
    """A page-range plan with even_splits checks the lengths on the GPU: where the longest request
    has at most 7/4 of the average pages, range r takes run r % even_splits of request
    r / even_splits (bit for bit what the cut of one split x 4 warps gives, where even_splits is
    one), else the page runs (bit for bit what even_splits=0 gives). A request without pages gets
    zeros and lse -inf; a bad page id or last page length makes its request NaN only. Requests of
    fewer pages than runs (some runs empty) are merged from the runs that have pages."""
    hq, hkv, head_dim, page_size = config
    gen = torch.Generator().manual_seed(seed)
    batch = 12
    pages = torch.randint(9, 12, (batch,), generator=gen).tolist()
    if kind == "a request without pages":
        pages = [10] * batch
    if kind == "fewer pages than runs":
        pages = [max(1, even_splits - 1)] * batch
    if kind in ("at the bound", "past the bound"):
        others = sum(pages[1:])
        longest = max(n for n in range(1, 100) if 4 * n * batch <= 7 * (others + n))  # the kernels' test, in pages
        pages[0] = longest + (kind == "past the bound")
    if kind == "a request without pages":
        pages[4] = 0
    assert (4 * max(n * batch for n in pages) <= 7 * sum(pages)) == (kind != "past the bound"), pages
    lengths = [(n - 1) * page_size + int(torch.randint(1, page_size + 1, (), generator=gen)) if n else 0
               for n in pages]
    problem = Problem(gen, lengths, hq, hkv, head_dim, page_size, torch.bfloat16)
    args = list(problem.args("cuda"))
    good = run_forced(problem, args, 0, -1, even_splits=even_splits)
    check(good, problem, "cuda", seed, f"even_splits={even_splits} {kind} {lengths}")
    if kind == "past the bound":
        same = run_forced(problem, args, 0, -1, even_splits=0)
    elif even_splits == 1:
        same = run_forced(problem, args, 1, 4)
    else:
        same = None
    if same is not None:
        assert torch.equal(good[0], same[0]) and torch.equal(good[1], same[1]), f"{kind} {replay(seed)}"
    if kind in ("a bad page", "a bad last page length"):
        last = problem.kv_last_page_len.cuda().clone()
        if kind == "a bad page":
            args[4] = args[4].clone()
            args[4][int(problem.kv_indptr[4]) + 2] = problem.num_pages
        else:
            last[4] = page_size + 1
        out, lse = run_forced(problem, args, 0, -1, last=last, even_splits=even_splits)
        assert torch.isnan(out[4]).all() and torch.isnan(lse[4]).all(), replay(seed)
        keep = torch.arange(batch) != 4
        assert torch.equal(out[keep], good[0][keep]) and torch.equal(lse[keep], good[1][keep]), replay(seed)


@pytest.mark.gpu
def test_page_ranges_bad_layouts_give_nan(seed):
    """What the unchecked path (skip_check=True) may pass a page-range plan: a last page length out
    of range makes its request NaN (the others stay right); kv_indptr not monotone, or past
    kv_indices, makes every row NaN (the cut assumes it), never a read out of bounds."""
    problem = Problem(torch.Generator().manual_seed(seed), [40, 17, 0, 300, 64], 16, 2, 128, 5, torch.bfloat16)
    args = list(problem.args("cuda"))
    good = run_forced(problem, args, 0, 8)
    check(good, problem, "cuda", seed)
    # Request 0's 8 pages lie in the first of 8 ranges (85 pages in all); request 3's 60 cross many.
    for bad_request in (0, 3):
        last = problem.kv_last_page_len.cuda().clone()
        last[bad_request] = 6 if bad_request else 0
        out, lse = run_forced(problem, args, 0, 8, last=last)
        assert torch.isnan(out[bad_request]).all() and torch.isnan(lse[bad_request]).all()
        keep = torch.arange(5) != bad_request
        assert torch.equal(out[keep], good[0][keep]) and torch.equal(lse[keep], good[1][keep]), replay(seed)
    for broken in ("decreasing", "past the end", "negative"):
        indptr = args[3].clone()
        if broken == "decreasing":
            indptr[2], indptr[3] = indptr[3].item(), indptr[2].item() - 1
        elif broken == "past the end":
            indptr[-1] = args[4].numel() + 1
        else:
            indptr[0] = -1
        out, lse = run_forced(problem, [*args[:3], indptr, args[4]], 0, 8)
        assert torch.isnan(out).all() and torch.isnan(lse).all(), f"{broken} {replay(seed)}"


@pytest.mark.gpu
@pytest.mark.parametrize("hkv, batch, hint", [(8, 32, "exact"), (4, 64, "exact"), (8, 32, "too short"),
                                              (8, 32, "too long"), (4, 32, "skewed"), (8, 32, "none, even"),
                                              (4, 32, "none, uneven")], ids=str)
def test_cuda_max_kv_len_changes_only_the_plan(seed, hkv, batch, hint):
    """max_kv_len picks the cut, not the result: even batches with the true longest length, a
    skewed one with it (page ranges), batches told a wrong one (too short, so skewed ones lose
    the splits they need; too long: page ranges), and batches without it (page ranges that check
    the lengths on the GPU), all match the CPU op."""
    gen = torch.Generator().manual_seed(seed)
    even = hint in ("exact", "none, even")
    lengths = [2048] * batch if even else torch.randint(1, 4096, (batch,), generator=gen).tolist()
    if hint in ("too short", "skewed"):
        lengths[0] = 20000
    problem = Problem(gen, lengths, 32, hkv, 128, 16, torch.bfloat16)
    max_kv_len = {"exact": max(lengths), "skewed": max(lengths), "too short": 2048, "too long": 1 << 40}.get(hint)
    if hint not in ("exact", "too short"):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        p = _C.paged_decode_attention_plan(batch, 32, hkv, 128, problem.kv_indices.numel() * 16, 16, sms,
                                           max_tokens=max_kv_len or 0)
        assert p["ranges"] > 0 and (p["even_splits"] > 0) == (max_kv_len is None), p
    got = run(problem, "cuda", max_kv_len=max_kv_len)
    cpu = opforge.paged_decode_attention(*problem.args(), **problem.kwargs())
    scale = float(cpu[0].float().abs().max())
    assert_close(got[0].cpu(), cpu[0].double(), dtype=torch.bfloat16, rtol=2e-2, atol=2e-2 * scale,
                 what=f"cuda vs cpu {replay(seed)}")
    assert_close(got[1].cpu(), cpu[1].double(), dtype=torch.float32, rtol=1e-4, atol=1e-3, what="lse")


@pytest.mark.gpu
@dtypes
@pytest.mark.parametrize("batch, context", [(1, 32768), (8, 8192), (32, 2048), (128, 512)], ids=str)
def test_cuda_serving_shapes(seed, dtype, batch, context):
    """The benchmark's shapes with mixed lengths (h32_kv8, page size 1 and 16), the CUDA kernel
    against the CPU op (the same formula in fp32) and, for the smaller ones, the reference."""
    gen = torch.Generator().manual_seed(seed)
    for page_size in (1, 16):
        lengths = torch.randint(1, 2 * context, (batch,), generator=gen).tolist()
        problem = Problem(gen, lengths, 32, 8, 128, page_size, dtype, spare_pages=64)
        got = run(problem, "cuda")
        cpu = opforge.paged_decode_attention(*problem.args(), **problem.kwargs())
        tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
        scale = float(cpu[0].float().abs().max())
        assert_close(got[0].cpu(), cpu[0].double(), dtype=dtype, rtol=tol, atol=tol * scale,
                     what=f"cuda vs cpu {replay(seed)}")
        assert_close(got[1].cpu(), cpu[1].double(), dtype=torch.float32, rtol=1e-4, atol=1e-3, what="lse")
        if batch * context <= 1 << 15:
            check(got, problem, "cuda", seed)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 5])  # a step within one page, or across pages
def test_cuda_bad_layout_is_refused_or_gives_nan(seed, page_size):
    """Checked: a clear error. With skip_check=True (no synchronisation): the request whose
    layout is bad gets NaN, never a read out of bounds; the others stay right."""
    problem = Problem(torch.Generator().manual_seed(seed), [40, 17, 64], 16, 2, 128, page_size, torch.bfloat16)
    q, k, v, indptr, indices = problem.args("cuda")
    bad = indices.clone()
    bad[int(problem.kv_indptr[1])] = 10**6  # request 1's first page
    last = problem.kv_last_page_len.cuda()
    with pytest.raises(ValueError, match="kv_indices.* is not a page of the cache"):
        opforge.paged_decode_attention(q, k, v, indptr, bad, kv_last_page_len=last)
    out, lse = opforge.paged_decode_attention(q, k, v, indptr, bad, kv_last_page_len=last, skip_check=True)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    good = opforge.paged_decode_attention(q, k, v, indptr, indices, kv_last_page_len=last)
    assert torch.equal(out[0], good[0][0]) and torch.equal(out[2], good[0][2])
    long_last = last.clone()
    long_last[2] = page_size + 1
    out, lse = opforge.paged_decode_attention(q, k, v, indptr, indices, kv_last_page_len=long_last, skip_check=True)
    assert torch.isnan(lse[2]).all() and not torch.isnan(lse[:2]).any()


@pytest.mark.gpu
def test_misaligned_rows_are_refused():
    problem = Problem(torch.Generator().manual_seed(0), [5, 9], 8, 2, 128, 4, torch.bfloat16)
    q, k, v, indptr, indices = problem.args("cuda")
    shifted = torch.empty(k.numel() + 1, dtype=k.dtype, device="cuda")[1:].view(k.shape)
    shifted.copy_(k)
    with pytest.raises(ValueError, match="k_cache has rows that do not start on 16 bytes"):
        opforge.paged_decode_attention(q, shifted, v, indptr, indices, kv_last_page_len=problem.kv_last_page_len.cuda())


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(seed):
    """Captured calls (into out=/lse=, allocating, and a split plan with its workspace) replay
    correctly on new values of q and the caches."""
    gen = torch.Generator().manual_seed(seed)
    problems = [Problem(gen, [300, 0, 41, 1024], 32, 8, 128, 16, torch.bfloat16),
                Problem(gen, [4000], 32, 4, 128, 1, torch.bfloat16)]
    static = [(p.args("cuda"), p.kv_last_page_len.cuda()) for p in problems]
    out, lse = poisoned_outputs(problems[0], "cuda")

    def step():
        (a0, l0), (a1, l1) = static
        opforge.paged_decode_attention(*a0, kv_last_page_len=l0, out=out, lse=lse)
        return opforge.paged_decode_attention(*a1, kv_last_page_len=l1)

    graph, second = capture_graph(step)
    for _ in range(2):
        for p, (args, _) in zip(problems, static):
            for dst in args[:3]:
                dst.copy_(torch.randn(dst.shape, generator=gen).to(dst.dtype))
            p.q, p.k_cache, p.v_cache = (t.cpu() for t in args[:3])
        graph.replay()
        torch.cuda.synchronize()
        check((out, lse), problems[0], "cuda", seed, "replayed into out=")
        check(second, problems[1], "cuda", seed, "replayed, allocated")


@pytest.mark.gpu
def test_page_ranges_in_a_cuda_graph(seed):
    """Page-range plans captured and replayed on new values of q and the caches: a balanced batch
    (one run per request) and a skewed one (equal page runs, partials merged), each with a request
    without pages, their workspaces NaN-poisoned before every replay."""
    gen = torch.Generator().manual_seed(seed)
    balanced = [int(n) for n in torch.randint(150, 200, (12,), generator=gen)]
    skewed = [int(n) for n in torch.randint(1, 60, (12,), generator=gen)]
    balanced[5] = skewed[7] = 0
    skewed[2] = 2000
    problems = [Problem(gen, lengths, 32, 8, 128, 16, torch.bfloat16) for lengths in (balanced, skewed)]
    scale = 1 / math.sqrt(128)
    calls = []
    for p in problems:
        args = p.args("cuda")
        out, lse = poisoned_outputs(p, "cuda")
        plan = dict(splits=0, token_warps=16, even_splits=1)
        last = p.kv_last_page_len.cuda()
        need = _C.paged_decode_attention(out, lse, *args, last, None, scale, None, True, **plan)
        calls.append((args, last, out, lse, torch.empty(need, device="cuda"), plan))

    def step():
        for args, last, out, lse, workspace, plan in calls:
            _C.paged_decode_attention(out, lse, *args, last, workspace, scale, None, True, **plan)

    graph, _ = capture_graph(step)
    for _ in range(2):
        for p, (args, _, out, lse, workspace, _) in zip(problems, calls):
            for dst in args[:3]:
                dst.copy_(torch.randn(dst.shape, generator=gen).to(dst.dtype))
            p.q, p.k_cache, p.v_cache = (t.cpu() for t in args[:3])
            for t in (out, lse, workspace):
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for p, (_, _, out, lse, _, _) in zip(problems, calls):
            check((out, lse), p, "cuda", seed, f"replayed {p.lengths}")


@pytest.mark.gpu
def test_runs_on_the_current_stream(seed):
    problem = Problem(torch.Generator().manual_seed(seed), [5000, 300], 32, 8, 128, 16, torch.bfloat16)
    q, k, v, indptr, indices = problem.args("cuda")
    last = problem.kv_last_page_len.cuda()
    got = written_late_on_a_side_stream(k, k.clone(), lambda: opforge.paged_decode_attention(
        q, k, v, indptr, indices, kv_last_page_len=last, skip_check=True))
    check(got, problem, "cuda", seed)


@pytest.mark.gpu
def test_cuda_and_cpu_tensors_mixed():
    args = valid_args()
    args["kv_indptr"] = args["kv_indptr"].cuda()
    with pytest.raises(ValueError, match="kv_indptr is on cuda:0 but q is on cpu"):
        opforge.paged_decode_attention(**args)
