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


def test_sampling_probabilities_are_a_distribution():
    d = Definition.from_dict(SAMPLING)
    (probs,) = generate_inputs(d, workload(d, batch_size=3), seed=0)
    assert bool((probs >= 0).all()) and torch.allclose(probs.sum(-1), torch.ones(3))
    assert d.reference_fn()(probs).shape == (3,)


def test_declared_domains_win_and_nothing_is_written_into_the_definition():
    d = Definition.from_dict({**RAGGED, "value_domains": {"cu_seqlens": {"kind": "indptr", "total": 7}}})
    assert with_inferred_domains(d) is d or with_inferred_domains(d).value_domains["cu_seqlens"].total == 7
    plain = Definition.from_dict(RAGGED)
    assert plain.value_domains == {}
    assert "cu_seqlens" in with_inferred_domains(plain).value_domains and plain.value_domains == {}
    # Nothing to infer: the Definition itself.
    other = Definition.from_dict({**SAMPLING, "op_type": "gemm", "name": "gemm_v16"})
    assert with_inferred_domains(other) is other
