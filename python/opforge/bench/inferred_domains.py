"""Value domains for Definitions that declare none, read from their names and constraints, so
that inputs drawn for FlashInfer-Trace's public Definitions are structurally valid.

The public Definitions (paged attention, ragged prefill, sampling) carry no value domains:
their workloads usually ship the index tensors as safetensors. Drawn at random, an int32
``kv_indptr`` or ``kv_indices`` makes the reference fail (IndexError) and standard-normal
``probs`` are no distribution. For an input without a declared domain:

* a 1-D integer ``*indptr``, ``*offsets`` or ``*cu_seqlens*``: ragged-batch offsets (``indptr``:
  non-decreasing from 0) ending at the total a constraint names (``num_kv_indices ==
  kv_indptr[-1]``, either side, ``.item()`` or not), else at the length of the matching
  ``*indices`` input (``kv_indptr`` -> ``kv_indices``);
* the query offsets of a prefill (``qo_indptr``, ``q_indptr``, ``cu_seqlens_q``) beside key
  offsets (``kv_indptr``, ``cu_seqlens_k``): segment by segment within them (``within``), so no
  request has more query tokens than keys (a causal mask would leave its first queries none,
  and the reference's softmax NaN); key offsets count pages of ``page_size`` where the
  Definition has that axis;
* an integer ``*indices`` where the Definition has a ``num_pages`` axis: page ids in
  ``[0, num_pages)``;
* an integer ``*last_page_len`` where it has a ``page_size`` axis: ``[1, page_size]``;
* integer ``*indices`` (or ``*_idx``) into a pool that another input holds, named by what is
  left of the name (``initial_state_indices`` -> ``initial_state``, ``state_batch_indices`` ->
  ``state``): ``[0, that input's first axis)``; a ``block_table`` / ``page_table`` where the
  Definition has a ``num_pages`` axis: page ids in range;
* sequence lengths (``seq_lens``) of a paged layout: ``[1, max_num_pages * page_size]`` (or
  ``[1, max_seq_len]``);
* token positions (``positions``, ``position_ids``) within ``max_seq_len`` (or
  ``max_position``);
* integer ids (``input_ids``, ``topk_ids``, ``expert_ids``...) where the Definition has the axis
  they count: experts (``num_experts``, ``num_local_experts``) for expert and top-k ids, else
  the vocabulary (``vocab_size``): ``[0, axis)``;
* a floating ``probs`` (or ``*_probs``), in any Definition (the public multinomial one is not
  of op_type ``sampling``, where FlashInfer-Bench looks): drawn standard normal, then normalised
  with a softmax along the last dimension (as FlashInfer-Bench does).

Declared domains always win; nothing is written into the Definition.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from ..trace.extensions import IndptrDomain


def _total_from_constraints(definition, name: str) -> Optional[str]:
    """The axis a constraint equates with ``name[-1]``."""
    last = rf"{re.escape(name)}\s*\[\s*-1\s*\](?:\s*\.\s*item\s*\(\s*\))?"
    for constraint in definition.constraints:
        for pattern in (rf"^\s*(\w+)\s*==\s*{last}\s*$", rf"^\s*{last}\s*==\s*(\w+)\s*$"):
            match = re.match(pattern, constraint)
            if match and match.group(1) in definition.axes:
                return match.group(1)
    return None


def _indices_length(definition, name: str) -> Optional[str]:
    """The length axis of the ``*indices`` input that ``name`` (an indptr) indexes into."""
    for suffix in ("indptr", "offsets"):
        if name.endswith(suffix):
            sibling = definition.inputs.get(name[: -len(suffix)] + "indices")
            if sibling is not None and sibling.shape is not None and len(sibling.shape) == 1:
                return sibling.shape[0]
    return None


def _is_offsets(name: str) -> bool:
    return name.endswith(("indptr", "offsets")) or "cu_seqlens" in name


def _pool_axis(definition, name: str) -> Optional[str]:
    """The first axis of the input that ``name`` (``X_indices``, ``X_batch_indices``, ``X_idx``)
    indexes into, if the Definition has an input ``X`` whose first dimension is an axis."""
    for suffix in ("_batch_indices", "_indices", "_idx"):
        if name.lower().endswith(suffix):
            pool = definition.inputs.get(name[: -len(suffix)])
            if pool is not None and pool.shape and pool.shape[0] in definition.axes:
                return pool.shape[0]
    return None


def _longest_sequence(axes) -> Optional[str]:
    if "max_num_pages" in axes and "page_size" in axes:
        return "max_num_pages * page_size"
    return "max_seq_len" if "max_seq_len" in axes else None


def _position_axis(axes) -> Optional[str]:
    return next((a for a in ("max_seq_len", "max_position", "max_position_embeddings") if a in axes), None)


def scalar_axis(definition, name: str) -> Optional[str]:
    """The axis an integer scalar input states, when the Definition fixes it: the axis of the
    same name (``k`` of a top-k beside its ``k`` axis), else the one axis whose name holds the
    input's (``num_samples`` beside ``num_samples_out``)."""
    if name in definition.axes:
        return name
    holding = [a for a in definition.axes if name in a]
    return holding[0] if len(holding) == 1 else None


def _ids_axis(name: str, axes) -> Optional[str]:
    """The axis that ids named ``name`` count (see the module doc), if the Definition has it."""
    experts = "expert" in name or "topk" in name or "top_k" in name
    for axis in (("num_experts", "num_local_experts") if experts else ("vocab_size",)):
        if axis in axes:
            return axis
    return None


QUERY_OFFSETS = ("qo_indptr", "q_indptr", "cu_seqlens_q")
KEY_OFFSETS = ("kv_indptr", "cu_seqlens_k", "cu_seqlens_kv")


def _pair_queries_with_keys(definition, domains: dict) -> None:
    """Put the inferred query offsets within the key offsets (see the module doc)."""
    queries = [n for n in QUERY_OFFSETS if n in domains]
    keys = [n for n in KEY_OFFSETS if n in definition.inputs]
    if len(queries) != 1 or len(keys) != 1:
        return
    query, key = queries[0], keys[0]
    declared = definition.value_domains.get(key)
    drawn_alone = key in domains or (isinstance(declared, IndptrDomain) and declared.within is None)
    if not drawn_alone or definition.inputs[query].shape != definition.inputs[key].shape:
        return
    domains[query] = {**domains[query], "within": key}
    if "page_size" in definition.axes and "num_pages" in definition.axes:
        domains[query]["page_size"] = "page_size"


def _inferred(definition) -> dict:
    domains = {}
    axes = definition.axes
    for name, spec in definition.inputs.items():
        if name in definition.value_domains or spec.shape is None or not spec.dtype.is_int:
            continue
        lowered = name.lower()
        if len(spec.shape) == 1 and _is_offsets(lowered):
            total = _total_from_constraints(definition, name) or _indices_length(definition, name)
            if total is not None:
                domains[name] = {"kind": "indptr", "total": total}
        elif lowered.endswith("indices") and "num_pages" in axes:
            domains[name] = {"kind": "range", "low": 0, "high": "num_pages"}
        elif lowered.endswith("last_page_len") and "page_size" in axes:
            domains[name] = {"kind": "range", "low": 1, "high": "page_size + 1"}
        elif lowered in ("block_table", "block_tables", "page_table") and "num_pages" in axes:
            domains[name] = {"kind": "range", "low": 0, "high": "num_pages"}
        elif lowered.endswith(("indices", "_idx")) and (pool := _pool_axis(definition, name)) is not None:
            domains[name] = {"kind": "range", "low": 0, "high": pool}
        elif lowered.endswith(("seq_lens", "seqlens")) and (longest := _longest_sequence(axes)) is not None:
            domains[name] = {"kind": "range", "low": 1, "high": f"{longest} + 1"}
        elif lowered.endswith(("positions", "position_ids")) and (longest := _position_axis(axes)) is not None:
            domains[name] = {"kind": "range", "low": 0, "high": longest}
        elif lowered.endswith("ids") and (counted := _ids_axis(lowered, axes)) is not None:
            domains[name] = {"kind": "range", "low": 0, "high": counted}
    _pair_queries_with_keys(definition, domains)
    return domains


#: content hash -> the Definition with its inferred domains (or itself): inputs are drawn per
#: input set, the inference is done once per Definition.
_WITH_DOMAINS: dict = {}


def with_inferred_domains(definition):
    """``definition`` itself when nothing is inferred, else a copy whose value domains add the
    inferred ones (the copy is only for drawing inputs)."""
    key = definition.content_hash()
    found = _WITH_DOMAINS.get(key)
    if found is None:
        inferred = _inferred(definition)
        found = definition
        if inferred:
            data = definition.to_dict()
            found = type(definition).from_dict({**data, "value_domains": {**inferred, **data.get("value_domains", {})}})
        if len(_WITH_DOMAINS) < 4096:
            _WITH_DOMAINS[key] = found
    return found


def is_probability_input(definition, name: str) -> bool:
    spec = definition.inputs[name]
    return ((name == "probs" or name.endswith("_probs")) and name not in definition.value_domains
            and spec.shape is not None and spec.dtype.to_torch().is_floating_point)


def as_probabilities(value: torch.Tensor) -> torch.Tensor:
    """Softmax along the last dimension, computed in fp32, in the tensor's dtype."""
    if value.dim() == 0:
        return torch.ones_like(value)
    return torch.softmax(value.float(), dim=-1).to(value.dtype)
