"""Inputs drawn for FlashInfer-Trace Definitions that declare no value domains (the public ones):
structurally valid index tensors and normalised probabilities, so their references run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opforge.bench import generate_inputs
from opforge.bench.inferred_domains import with_inferred_domains
from opforge.trace import Definition, RandomInput, Workload

BUILTIN = Path(__file__).resolve().parents[2] / "python" / "opforge" / "data" / "builtin" / "definitions"


def public_form(path: Path) -> Definition:
    """A built-in Definition as the public dataset has it: no value domains."""
    data = json.loads(path.read_text())
    data.pop("value_domains", None)
    return Definition.from_dict(data)


def workload(definition, **axes) -> Workload:
    return Workload(uuid="w", axes=axes, inputs={n: RandomInput() for n in definition.inputs})


@pytest.mark.parametrize("name", ["gqa_paged_decode_h32_kv8_d128_ps1", "gqa_paged_decode_h32_kv4_d128_ps64"])
@pytest.mark.parametrize("seed", range(4))
def test_paged_decode_inputs_are_valid_and_the_reference_runs(name, seed):
    d = public_form(BUILTIN / "gqa_paged" / f"{name}.json")
    page_size = d.const_axes["page_size"]
    w = workload(d, batch_size=6, num_pages=40, len_indptr=7, num_kv_indices=25)
    q, k, v, indptr, indices, *rest = generate_inputs(d, w, seed=seed)
    assert indptr[0] == 0 and indptr[-1] == 25 and bool((indptr[1:] >= indptr[:-1]).all())
    assert 0 <= int(indices.min()) and int(indices.max()) < 40
    if page_size > 1:
        last = rest[0]
        assert bool(((last >= 1) & (last <= page_size)).all())
    out, lse = d.reference_fn()(*generate_inputs(d, w, seed=seed))
    assert torch.isfinite(out).all()
    lengths = indptr[1:] - indptr[:-1]
    assert torch.isfinite(lse[lengths > 0]).all() and bool(torch.isneginf(lse[lengths == 0]).all())


RAGGED = {
    "name": "ragged_sum_h4", "op_type": "ragged",
    "axes": {"batch_size": {"type": "var"}, "len_indptr": {"type": "var"}, "total_tokens": {"type": "var"},
             "hidden": {"type": "const", "value": 4}},
    "inputs": {"x": {"shape": ["total_tokens", "hidden"], "dtype": "float32"},
               "cu_seqlens": {"shape": ["len_indptr"], "dtype": "int32"}},
    "outputs": {"out": {"shape": ["batch_size", "hidden"], "dtype": "float32"}},
    "constraints": ["len_indptr == batch_size + 1", "cu_seqlens[-1].item() == total_tokens"],
    "reference": ("import torch\n\ndef run(x, cu_seqlens):\n"
                  "    return torch.stack([x[int(a):int(b)].sum(0) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])])\n"),
}

SAMPLING = {
    "name": "sampling_v16", "op_type": "sampling",
    "axes": {"batch_size": {"type": "var"}, "vocab": {"type": "const", "value": 16}},
    "inputs": {"probs": {"shape": ["batch_size", "vocab"], "dtype": "float32"}},
    "outputs": {"samples": {"shape": ["batch_size"], "dtype": "int64"}},
    "reference": "import torch\n\ndef run(probs):\n    return torch.multinomial(probs, 1).squeeze(-1)\n",
}


def test_offsets_end_at_the_total_a_constraint_names_and_the_reference_runs():
    d = Definition.from_dict(RAGGED)
    x, cu = generate_inputs(d, workload(d, batch_size=5, len_indptr=6, total_tokens=33), seed=3)
    assert cu.tolist()[0] == 0 and cu.tolist()[-1] == 33 and cu.tolist() == sorted(cu.tolist())
    assert d.reference_fn()(x, cu).shape == (5, 4)


@pytest.mark.parametrize("op_type,name", [("sampling", "probs"), ("multinomial", "probs"), ("sampling", "draft_probs")])
def test_sampling_probabilities_are_a_distribution(op_type, name):
    """By name, whatever the op_type (the public multinomial Definition's is not 'sampling')."""
    data = {**SAMPLING, "op_type": op_type, "inputs": {name: SAMPLING["inputs"]["probs"]},
            "reference": SAMPLING["reference"].replace("probs", name)}
    d = Definition.from_dict(data)
    (probs,) = generate_inputs(d, workload(d, batch_size=3), seed=0)
    assert bool((probs >= 0).all()) and torch.allclose(probs.sum(-1), torch.ones(3))
    assert d.reference_fn()(probs).shape == (3,)
    logits = Definition.from_dict({**data, "inputs": {"logits": SAMPLING["inputs"]["probs"]},
                                   "reference": "def run(logits):\n    return logits.argmax(-1)\n"})
    (raw,) = generate_inputs(logits, workload(logits, batch_size=3), seed=0)
    assert bool((raw < 0).any())  # not a probability by name: left as drawn


def test_declared_domains_win_and_nothing_is_written_into_the_definition():
    d = Definition.from_dict({**RAGGED, "value_domains": {"cu_seqlens": {"kind": "indptr", "total": 7}}})
    assert with_inferred_domains(d) is d or with_inferred_domains(d).value_domains["cu_seqlens"].total == 7
    plain = Definition.from_dict(RAGGED)
    assert plain.value_domains == {}
    assert "cu_seqlens" in with_inferred_domains(plain).value_domains and plain.value_domains == {}
    # Nothing to infer: the Definition itself.
    other = Definition.from_dict({**SAMPLING, "op_type": "gemm", "name": "gemm_v16"})
    assert with_inferred_domains(other) is other


# A causal prefill in the public files' form: queries aligned to the end of each request's keys
# (query i sees keys up to i + n_kv - n_q); a request with more queries than keys leaves its
# first queries none, and the softmax over no key is NaN.
CAUSAL_REFERENCE = """import math
import torch

def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -math.inf)
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if q0 == q1:
            continue
        logits = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), k[k0:k1].double()) * sm_scale
        n_q, n_kv = q1 - q0, k1 - k0
        mask = torch.arange(n_kv)[None, :] > torch.arange(n_q)[:, None] + (n_kv - n_q)
        logits = logits.masked_fill(mask, -math.inf)
        lse[q0:q1] = (torch.logsumexp(logits, -1) / math.log(2)).T.float()
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), v[k0:k1].double()).to(q.dtype)
    return out, lse
"""

RAGGED_CAUSAL = {
    "name": "gqa_ragged_prefill_causal_h2_kv1_d8", "op_type": "gqa_ragged",
    "axes": {"total_q": {"type": "var"}, "total_kv": {"type": "var"}, "len_indptr": {"type": "var"},
             "num_qo_heads": {"type": "const", "value": 2}, "num_kv_heads": {"type": "const", "value": 1},
             "head_dim": {"type": "const", "value": 8}},
    "constraints": ["total_q == qo_indptr[-1].item()", "total_kv == kv_indptr[-1].item()"],
    "inputs": {"q": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "float32"},
               "k": {"shape": ["total_kv", "num_kv_heads", "head_dim"], "dtype": "float32"},
               "v": {"shape": ["total_kv", "num_kv_heads", "head_dim"], "dtype": "float32"},
               "qo_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "sm_scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"output": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "float32"},
                "lse": {"shape": ["total_q", "num_qo_heads"], "dtype": "float32"}},
    "reference": CAUSAL_REFERENCE,
}


def lengths(indptr: torch.Tensor) -> torch.Tensor:
    return (indptr[1:] - indptr[:-1]).long()


@pytest.mark.parametrize("total_q,total_kv,batch", [(12, 12, 3), (5, 40, 4), (1, 1, 6), (30, 31, 9), (0, 7, 2)])
@pytest.mark.parametrize("seed", range(3))
def test_causal_prefill_requests_never_have_more_queries_than_keys(total_q, total_kv, batch, seed):
    d = Definition.from_dict(RAGGED_CAUSAL)
    w = workload(d, total_q=total_q, total_kv=total_kv, len_indptr=batch + 1)
    q, k, v, qo_indptr, kv_indptr, sm_scale = inputs = generate_inputs(d, w, seed=seed)
    assert int(qo_indptr[0]) == 0 and int(qo_indptr[-1]) == total_q and bool((lengths(qo_indptr) >= 0).all())
    assert int(kv_indptr[-1]) == total_kv
    assert bool((lengths(qo_indptr) <= lengths(kv_indptr)).all()), (qo_indptr, kv_indptr)
    out, lse = d.reference_fn()(*inputs)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())


def test_more_queries_than_keys_in_all_still_give_offsets_to_the_total():
    d = Definition.from_dict(RAGGED_CAUSAL)
    for seed in range(5):
        _, _, _, qo_indptr, kv_indptr, _ = generate_inputs(d, workload(d, total_q=20, total_kv=6, len_indptr=4),
                                                           seed=seed)
        q_len, kv_len = lengths(qo_indptr), lengths(kv_indptr)
        assert int(qo_indptr[-1]) == 20 and bool((q_len >= kv_len).all())  # each request filled, then more


PAGED_CAUSAL_REFERENCE = """import math
import torch

def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, kv_last_page_len):
    page_size = k_cache.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -math.inf)
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if q0 == q1:
            continue
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        k = torch.cat([k_cache[p] for p in pages])  # no pages: torch.cat of nothing raises
        v = torch.cat([v_cache[p] for p in pages])
        n_kv = (pages.numel() - 1) * page_size + int(kv_last_page_len[b])
        k, v = k[:n_kv], v[:n_kv]
        n_q = q1 - q0
        logits = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), k.double()) * sm_scale
        mask = torch.arange(n_kv)[None, :] > torch.arange(n_q)[:, None] + (n_kv - n_q)
        logits = logits.masked_fill(mask, -math.inf)
        lse[q0:q1] = (torch.logsumexp(logits, -1) / math.log(2)).T.float()
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), v.double()).to(q.dtype)
    return out, lse
"""

PAGED_CAUSAL = {
    "name": "gqa_paged_prefill_causal_h1_kv1_d4_ps4", "op_type": "gqa_paged",
    "axes": {"total_q": {"type": "var"}, "num_kv_indices": {"type": "var"}, "len_indptr": {"type": "var"},
             "num_pages": {"type": "var"}, "num_qo_heads": {"type": "const", "value": 1},
             "num_kv_heads": {"type": "const", "value": 1}, "head_dim": {"type": "const", "value": 4},
             "page_size": {"type": "const", "value": 4}},
    "constraints": ["total_q == qo_indptr[-1].item()", "num_kv_indices == kv_indptr[-1].item()"],
    "inputs": {"q": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "float32"},
               "k_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": "float32"},
               "v_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": "float32"},
               "qo_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
               # Listed before sm_scale here, after it in run's parameters (as in some public files).
               "kv_last_page_len": {"shape": ["len_indptr"], "dtype": "int32"},
               "sm_scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"output": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "float32"},
                "lse": {"shape": ["total_q", "num_qo_heads"], "dtype": "float32"}},
    "reference": PAGED_CAUSAL_REFERENCE,
}


@pytest.mark.parametrize("total_q,pages,batch", [(12, 12, 3), (9, 6, 4), (3, 3, 3), (1, 1, 7)])
@pytest.mark.parametrize("seed", range(3))
def test_paged_causal_prefill_queries_fit_the_tokens_of_their_pages(total_q, pages, batch, seed):
    """p pages hold at least (p - 1) * page_size + 1 tokens whatever the last page's fill, so
    that many queries fit; a request with no page gets none."""
    d = Definition.from_dict(PAGED_CAUSAL)
    w = workload(d, total_q=total_q, num_kv_indices=pages, len_indptr=batch + 1, num_pages=16)
    inputs = generate_inputs(d, w, seed=seed)
    qo_indptr, kv_indptr, last = inputs[3], inputs[4], inputs[6]
    n_pages = lengths(kv_indptr)
    least_tokens = torch.where(n_pages > 0, (n_pages - 1) * 4 + 1, 0)
    assert int(qo_indptr[-1]) == total_q and bool((lengths(qo_indptr) <= least_tokens).all())
    assert bool(((last >= 1) & (last <= 4)).all())
    out, lse = d.reference_fn()(*inputs)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())


def test_a_reference_whose_parameters_name_the_inputs_in_another_order_gets_each_by_name():
    d = Definition.from_dict({
        "name": "axpy_n4", "op_type": "axpy", "axes": {"n": {"type": "const", "value": 4}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "y": {"shape": ["n"], "dtype": "float32"},
                   "a": {"shape": None, "dtype": "float32"}},
        "outputs": {"out": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(a, x, y):\n    return a * x + y\n"})
    x, y = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(d.reference_fn()(x, y, 3.0), 3.0 * x + y)
    # Names that are not the inputs' keep the positional call.
    other = Definition.from_dict({**d.to_dict(), "name": "axpy2_n4", "reference": "def run(u, v, s):\n    return s * u + v\n"})
    torch.testing.assert_close(other.reference_fn()(x, y, 3.0), 3.0 * x + y)


def test_declared_query_offsets_within_keys_are_kept_and_checked():
    data = {**RAGGED_CAUSAL, "value_domains": {"qo_indptr": {"kind": "indptr", "total": "total_q", "within": "kv_indptr"},
                                               "kv_indptr": {"kind": "indptr", "total": "total_kv"}}}
    d = Definition.from_dict(data)
    assert Definition.from_dict(d.to_dict()).value_domains["qo_indptr"].within == "kv_indptr"
    q_len_le_kv = []
    for seed in range(4):
        inputs = generate_inputs(d, workload(d, total_q=10, total_kv=10, len_indptr=5), seed=seed)
        q_len_le_kv.append(bool((lengths(inputs[3]) <= lengths(inputs[4])).all()))
    assert all(q_len_le_kv)


@pytest.mark.parametrize("name,axis,size", [("input_ids", "vocab_size", 11), ("topk_ids", "num_experts", 5),
                                            ("expert_ids", "num_local_experts", 3)])
def test_ids_stay_within_the_axis_they_count(name, axis, size):
    d = Definition.from_dict({
        "name": f"lookup_{name}", "op_type": "lookup",
        "axes": {"n": {"type": "var"}, axis: {"type": "const", "value": size}, "d": {"type": "const", "value": 2}},
        "inputs": {name: {"shape": ["n"], "dtype": "int64"}, "table": {"shape": [axis, "d"], "dtype": "float32"}},
        "outputs": {"out": {"shape": ["n", "d"], "dtype": "float32"}},
        "reference": f"def run({name}, table):\n    assert int({name}.min()) >= 0\n    return table[{name}]\n"})
    ids, table = generate_inputs(d, workload(d, n=400), seed=1)
    assert int(ids.min()) == 0 and int(ids.max()) == size - 1  # the whole range, nothing outside
    assert d.reference_fn()(ids, table).shape == (400, 2)


def test_indices_into_a_pool_that_another_input_holds_stay_in_it():
    """A state pool indexed per request (recurrent-state decode: ``initial_state_indices`` into
    ``initial_state``, ``state_batch_indices`` into ``state``)."""
    d = Definition.from_dict({
        "name": "state_update_d2", "op_type": "ssm",
        "axes": {"batch_size": {"type": "var"}, "pool": {"type": "var"}, "d": {"type": "const", "value": 2}},
        "inputs": {"state": {"shape": ["pool", "d"], "dtype": "float32"},
                   "x": {"shape": ["batch_size", "d"], "dtype": "float32"},
                   "state_batch_indices": {"shape": ["batch_size"], "dtype": "int32"},
                   "initial_state_idx": {"shape": ["batch_size"], "dtype": "int64"}},
        "outputs": {"out": {"shape": ["batch_size", "d"], "dtype": "float32"}},
        "reference": "def run(state, x, state_batch_indices, initial_state_idx):\n"
                     "    return state[state_batch_indices.long()] + x\n"})
    for seed in range(3):
        state, x, slots, unrelated = generate_inputs(d, workload(d, batch_size=64, pool=5), seed=seed)
        assert 0 <= int(slots.min()) and int(slots.max()) < 5 and int(slots.max()) == 4
        assert d.reference_fn()(state, x, slots, unrelated).shape == (64, 2)
        assert int(unrelated.min()) < 0  # no input named initial_state: no domain, plain draw


def test_a_block_table_and_sequence_lengths_fit_the_paged_layout():
    d = Definition.from_dict({
        "name": "paged_gather_ps4", "op_type": "paged",
        "axes": {"batch_size": {"type": "var"}, "num_pages": {"type": "var"}, "max_num_pages": {"type": "var"},
                 "page_size": {"type": "const", "value": 4}, "d": {"type": "const", "value": 2}},
        "inputs": {"cache": {"shape": ["num_pages", "page_size", "d"], "dtype": "float32"},
                   "seq_lens": {"shape": ["batch_size"], "dtype": "int32"},
                   "block_table": {"shape": ["batch_size", "max_num_pages"], "dtype": "int32"}},
        "outputs": {"out": {"shape": ["batch_size", "d"], "dtype": "float32"}},
        "reference": ("import torch\n\ndef run(cache, seq_lens, block_table):\n"
                      "    rows = []\n"
                      "    for b in range(seq_lens.numel()):\n"
                      "        n = int(seq_lens[b])\n"
                      "        pages = block_table[b, : (n + 3) // 4].long()\n"
                      "        rows.append(cache[pages].reshape(-1, 2)[:n].sum(0))\n"
                      "    return torch.stack(rows)\n")})
    cache, lens, table = inputs = generate_inputs(d, workload(d, batch_size=50, num_pages=7, max_num_pages=3), seed=0)
    assert 1 <= int(lens.min()) and int(lens.max()) <= 12 and int(lens.max()) == 12
    assert 0 <= int(table.min()) and int(table.max()) < 7
    assert torch.isfinite(d.reference_fn()(*inputs)).all()


def _scalar_definition(scalars: dict, axes: dict, reference: str, domains=None) -> Definition:
    return Definition.from_dict({
        "name": "scalars_n4", "op_type": "scalars", "axes": {"n": {"type": "const", "value": 4}, **axes},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"},
                   **{name: {"shape": None, "dtype": dtype} for name, dtype in scalars.items()}},
        "outputs": {"out": {"shape": ["n"], "dtype": "float32"}},
        "reference": reference, **({"value_domains": domains} if domains else {})})


def test_scalars_are_drawn_in_their_dtype_and_an_integer_that_names_an_axis_is_its_value():
    d = _scalar_definition({"k": "int64", "num_samples": "int32", "flag": "bool", "scale": "float32"},
                           {"k": {"type": "const", "value": 3}, "num_samples_out": {"type": "const", "value": 1}},
                           "def run(x, k, num_samples, flag, scale):\n    return x * k\n")
    for seed in range(6):
        _, k, num_samples, flag, scale = generate_inputs(d, workload(d), seed=seed)
        assert type(k) is int and k == 3  # the top-k's k axis
        assert type(num_samples) is int and num_samples == 1  # num_samples_out
        assert type(flag) is bool and type(scale) is float
    other = _scalar_definition({"count": "int64"}, {}, "def run(x, count):\n    return x\n")
    counts = {generate_inputs(other, workload(other), seed=s)[1] for s in range(20)}
    assert counts <= set(range(1, 9)) and len(counts) > 1  # small, positive, random


def test_a_declared_range_bounds_a_scalar():
    d = _scalar_definition({"eps": "float32", "k": "int64"}, {}, "def run(x, eps, k):\n    return x\n",
                           domains={"eps": {"low": 1e-6, "high": 1e-5}, "k": {"low": 10, "high": 12}})
    for seed in range(10):
        _, eps, k = generate_inputs(d, workload(d), seed=seed)
        assert 1e-6 <= eps < 1e-5 and k in (10, 11)


def test_positions_index_the_rotary_cache():
    d = Definition.from_dict({
        "name": "rope_lookup_d2", "op_type": "rope",
        "axes": {"num_tokens": {"type": "var"}, "max_seq_len": {"type": "var"}, "d": {"type": "const", "value": 2}},
        "inputs": {"cos_sin_cache": {"shape": ["max_seq_len", "d"], "dtype": "float32"},
                   "positions": {"shape": ["num_tokens"], "dtype": "int64"}},
        "outputs": {"out": {"shape": ["num_tokens", "d"], "dtype": "float32"}},
        "reference": "def run(cos_sin_cache, positions):\n    assert int(positions.min()) >= 0\n"
                     "    return cos_sin_cache[positions]\n"})
    cache, positions = generate_inputs(d, workload(d, num_tokens=100, max_seq_len=9), seed=0)
    assert int(positions.min()) == 0 and int(positions.max()) == 8
    assert d.reference_fn()(cache, positions).shape == (100, 2)
