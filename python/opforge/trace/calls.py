"""A live call of a built-in op, seen as its Definition: which Definition it belongs to, the values
of the variable axes, the Definition's inputs, and how a solution's outputs become what the op
returns (its ``out=`` and in-place contracts included).

Tracing and apply read this on every call of an op while they are on, so binding is written
per op family by hand (no ``inspect``) and Definitions are made from the op templates once per
name and cached.

The name of a call's Definition follows from the call (op_templates' naming):
``rmsnorm_h4096`` for a bfloat16 call at a public hidden size with the public eps (1e-5 there),
``rmsnorm_h4096_eps`` for another eps at that size (eps an input), ``rmsnorm_h1000`` where
no public name exists (eps an input), ``_f16`` / ``_f32`` appended for other dtypes.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .schema import Definition
from .templates import TEMPLATES, definition_for_name
from .templates.norm import public_eps

_Tensor = torch.Tensor
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_SUFFIX = {torch.bfloat16: "", torch.float16: "_f16", torch.float32: "_f32"}

#: Definition name -> (template prefix, definition keyword arguments); filled as calls are seen.
_SEEN: dict[str, tuple[str, dict]] = {}
_DEFINITIONS: dict[str, Definition] = {}


def definition_named(name: str) -> Optional[Definition]:
    """The Definition a built-in op call is named after (made from its template once), else None."""
    definition = _DEFINITIONS.get(name)
    if definition is None:
        if name in _SEEN:
            prefix, kwargs = _SEEN[name]
            definition = TEMPLATES[prefix].definition(**kwargs)
        else:
            definition = definition_for_name(name)
        if definition is not None:
            _DEFINITIONS[name] = definition
    return definition


class OpCall:
    """One call of a built-in op as its Definition sees it.

    op: the op's name; definition: the Definition's name; axes: the variable axes' values
    (shared between calls of one shape: read only); key: (definition, variable axis values...),
    hashable, for dedup and routing tables; inputs: the Definition's inputs by name, in its
    order (tensors viewed with the Definition's rank, scalars as Python numbers), made on first
    access. ``finish(results)`` turns a solution's outputs (a tuple in the Definition's output
    order) into the op's return value, writing ``out=`` / in-place destinations as the op would.
    """

    __slots__ = ("op", "definition", "key", "axes", "_explicit", "_args", "_kwargs", "_inputs")
    #: The op's parameters in order (positional binding of a call by hand: no inspect per call).
    params: tuple = ()

    def __init__(self, op: str, site: tuple, args: tuple, kwargs: dict):
        self.op = op
        self.definition, self.key, self.axes, self._explicit = site
        self._args = args
        self._kwargs = kwargs
        self._inputs = None

    def arg(self, i: int, default=None):
        """The call's value of the op's i-th parameter."""
        args = self._args
        return args[i] if len(args) > i else self._kwargs.get(self.params[i], default)

    @property
    def inputs(self) -> dict:
        if self._inputs is None:
            self._inputs = self._make_inputs()
        return self._inputs

    def make_definition(self) -> Definition:
        return definition_named(self.definition)

    def __repr__(self) -> str:
        return f"OpCall({self.op} -> {self.definition}, axes={self.axes})"


def _rows(t: _Tensor, width: int) -> _Tensor:
    """``t`` as [rows, width] (leading dimensions folded, a view where the strides allow)."""
    return t if t.dim() == 2 else t.reshape(-1, width)


def _name(prefix: str, const: int, explicit_eps: bool, dtype) -> str:
    """The Definition name of a call; remembers how to make the Definition."""
    template = TEMPLATES[prefix]
    axis = template.const_axes[0]
    kwargs = {axis: const, "eps_input": True} if explicit_eps else {axis: const}
    name = template.name(_DTYPES[dtype], **kwargs)
    _SEEN.setdefault(name, (prefix, {"dtype": _DTYPES[dtype], **kwargs}))
    return name


def _written(dest: Optional[_Tensor], value: _Tensor, shape) -> _Tensor:
    """``value`` (rows-shaped) delivered as the op delivers an output: into ``dest`` when the
    caller gave one, else shaped like the op's own result."""
    if dest is not None:
        dest.copy_(value.view(dest.shape) if value.shape != dest.shape else value)
        return dest
    return value if value.shape == shape else value.reshape(shape)


class _NormCall(OpCall):
    __slots__ = ()
    params = ("input", "weight", "eps", "out")

    def _make_inputs(self) -> dict:
        x = self.arg(0)
        inputs = {"hidden_states": _rows(x, x.shape[-1]), "weight": self.arg(1)}
        if self._explicit:
            inputs["eps"] = float(self.arg(2, DEFAULT_EPS))
        return inputs

    def finish(self, results):
        return _written(self.arg(3), results[0], self.arg(0).shape)


class _AddNormCall(OpCall):
    __slots__ = ()
    params = ("input", "residual", "weight", "eps", "out", "residual_out")

    def _make_inputs(self) -> dict:
        x, r = self.arg(0), self.arg(1)
        hidden = x.shape[-1]
        inputs = {"hidden_states": _rows(x, hidden), "residual": _rows(r, hidden), "weight": self.arg(2)}
        if self._explicit:
            inputs["eps"] = float(self.arg(3, DEFAULT_EPS))
        return inputs

    def finish(self, results):
        x, r = self.arg(0), self.arg(1)
        # The public form has no residual_out output: the new residual is the rounded sum,
        # made before any destination (which may be input or residual itself) is written.
        summed = results[1] if len(results) > 1 else torch.add(x, r)
        residual_result = _written(self.arg(5), summed, r.shape)
        return _written(self.arg(4), results[0], x.shape), residual_result


class _ActCall(OpCall):
    __slots__ = ()
    params = ("input", "out")

    def _make_inputs(self) -> dict:
        x = self.arg(0)
        return {"input": _rows(x, x.shape[-1])}

    def finish(self, results):
        x = self.arg(0)
        return _written(self.arg(1), results[0], (*x.shape[:-1], x.shape[-1] // 2))


class _ScaleCall(OpCall):
    __slots__ = ()
    params = ("x", "factor", "out")

    def _make_inputs(self) -> dict:
        x = self.arg(0)
        return {"x": _rows(x, x.shape[-1]), "factor": float(self.arg(1))}

    def finish(self, results):
        return _written(self.arg(2), results[0], self.arg(0).shape)


class _Nvfp4Call(OpCall):
    __slots__ = ()
    params = ("a", "b", "scale_a", "scale_b", "out")

    def _make_inputs(self) -> dict:
        from ..ops.nvfp4_format import to_blocked

        a, b, scale_a, scale_b = (self.arg(i) for i in range(4))
        # The Definition also takes the scales in the blocked layout, which the op derives from
        # nothing: they follow from the plain ones.
        return {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b,
                "scale_a_permuted": to_blocked(scale_a), "scale_b_permuted": to_blocked(scale_b)}

    def finish(self, results):
        a = self.arg(0)
        return _written(self.arg(4), results[0], (a.shape[0], 1, a.shape[2]))


def _nvfp4_site(a) -> Optional[tuple]:
    """The site of an nvfp4_gemv call: nvfp4_gemv_m{M}_k{K}, L variable."""
    if a.dim() != 3 or a.dtype is not _FP4:
        return None
    m, k, l = a.shape[0], 2 * a.shape[1], a.shape[2]
    if not k or k % 64:
        return None
    name = TEMPLATES["nvfp4_gemv"].name(M=m, K=k)
    _SEEN.setdefault(name, ("nvfp4_gemv", {"M": m, "K": k}))
    return name, (name, l), {"L": l}, False


class _PagedDecodeCall(OpCall):
    __slots__ = ()
    params = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale", "kv_last_page_len", "out", "lse")

    def _make_inputs(self) -> dict:
        q, k_cache = self.arg(0), self.arg(1)
        inputs = {"q": q, "k_cache": k_cache, "v_cache": self.arg(2), "kv_indptr": self.arg(3),
                  "kv_indices": self.arg(4)}
        page_size = k_cache.shape[1]
        if page_size > 1:  # the Definition always has it; the op's None means full last pages
            last = self.arg(6)
            inputs["kv_last_page_len"] = last if last is not None else torch.full(
                (q.shape[0],), page_size, dtype=torch.int32, device=q.device)
        scale = self.arg(5)
        inputs["sm_scale"] = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        return inputs

    def finish(self, results):
        out, lse = results[0], results[1]
        return _written(self.arg(7), out, out.shape), _written(self.arg(8), lse, lse.shape)


#: (dtype, num_qo_heads, num_kv_heads, head_dim, page_size) -> Definition name.
_PAGED_NAMES: dict[tuple, str] = {}


def _paged_decode_site(args: tuple, kwargs: dict) -> Optional[tuple]:
    """The site of a paged_decode_attention call: gqa_paged_decode_h{H}_kv{KV}_d{D}_ps{PS}, from
    the shapes alone (no synchronisation; num_kv_indices is kv_indices' length, which the
    Definition's constraint equates with kv_indptr[-1], as FlashInfer's API has it)."""
    q, k_cache, _, kv_indptr, kv_indices = (args[i] if len(args) > i else kwargs.get(_PagedDecodeCall.params[i])
                                            for i in range(5))
    if not (isinstance(q, _Tensor) and isinstance(k_cache, _Tensor) and isinstance(kv_indptr, _Tensor)
            and isinstance(kv_indices, _Tensor) and q.dim() == 3 and k_cache.dim() == 4 and kv_indptr.dim() == 1
            and kv_indices.dim() == 1 and q.dtype in (torch.bfloat16, torch.float16)):
        return None
    key = (q.dtype, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1])
    name = _PAGED_NAMES.get(key)
    if name is None:
        dtype, hq, hkv, head_dim, page_size = key
        if hkv < 1 or hq % hkv or not hq or not page_size:
            return None  # the op refuses it
        consts = {"num_qo_heads": hq, "num_kv_heads": hkv, "head_dim": head_dim, "page_size": page_size}
        name = TEMPLATES["gqa_paged_decode"].name(_DTYPES[dtype], **consts)
        _SEEN.setdefault(name, ("gqa_paged_decode", {"dtype": _DTYPES[dtype], **consts}))
        _PAGED_NAMES[key] = name
    axes = {"batch_size": q.shape[0], "num_pages": k_cache.shape[0], "len_indptr": kv_indptr.shape[0],
            "num_kv_indices": kv_indices.shape[0]}
    return name, (name, *axes.values()), axes, False


_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
DEFAULT_EPS = 1e-6  # the norms' default, as in ops/norm.py
_NO_SITE = (None,)


def _site(op: str, x, scalar) -> Optional[tuple]:
    """(definition name, key, axes, eps is an input) of a call shaped like ``x`` with this eps
    or factor, or None when no Definition describes it."""
    if not isinstance(x, _Tensor) or not x.dim():
        return None
    if op == "nvfp4_gemv":
        return _nvfp4_site(x)
    if x.dtype not in _SUFFIX:
        return None
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    explicit = False
    if op in _NORMS:
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            return None
        public = public_eps(op, width)
        explicit = public is None or float(scalar) != public
        name = _name(op, width, explicit, x.dtype)
    elif op == "scale":
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            return None
        name = _name(op, width, False, x.dtype)
    else:
        if width % 2:
            return None
        name = _name(op, width // 2, False, x.dtype)
    return name, (name, rows), {"batch_size": rows}, explicit


_NORMS = ("rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm")
#: op -> (call class, position of the op's eps / factor parameter or None).
_KINDS: dict[str, tuple] = {
    "rmsnorm": (_NormCall, 2),
    "gemma_rmsnorm": (_NormCall, 2),
    "fused_add_rmsnorm": (_AddNormCall, 3),
    "gemma_fused_add_rmsnorm": (_AddNormCall, 3),
    "silu_and_mul": (_ActCall, None),
    "gelu_and_mul": (_ActCall, None),
    "gelu_tanh_and_mul": (_ActCall, None),
    "scale": (_ScaleCall, 1),
    "nvfp4_gemv": (_Nvfp4Call, None),
    "paged_decode_attention": (_PagedDecodeCall, None),
}
#: (op, shape, dtype, eps or factor) -> site, or _NO_SITE: the shapes of a model repeat, so a
#: call is bound by one dict lookup. Bounded: cleared when it grows past _MAX_SITES.
_SITES: dict[tuple, tuple] = {}
_MAX_SITES = 4096


def bind_call(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    """The call as its Definition sees it, or None when no Definition describes it (an
    argument the op itself will refuse, a dtype no template names): the op then runs as it
    would without tracing or apply, and raises its own clear error if the call is bad."""
    kind = _KINDS.get(op)
    if kind is None:
        return None
    cls, at = kind
    if cls is _PagedDecodeCall:  # its Definition depends on several tensors: bound per call
        site = _paged_decode_site(args, kwargs)
        return None if site is None else cls(op, site, args, kwargs)
    x = args[0] if args else kwargs.get(cls.params[0])
    if at is None:
        scalar = None
    else:
        scalar = args[at] if len(args) > at else kwargs.get(cls.params[at], DEFAULT_EPS if at != 1 else None)
    try:
        site = _SITES.get((op, x.shape, x.dtype, scalar), _NO_SITE) if isinstance(x, _Tensor) else None
        if site is _NO_SITE:
            site = _site(op, x, scalar)
            if len(_SITES) >= _MAX_SITES:
                _SITES.clear()
            _SITES[(op, x.shape, x.dtype, scalar)] = site
    except (TypeError, ValueError, RuntimeError, IndexError, OverflowError):
        return None  # an unhashable or odd argument: the op judges it
    if site is None:
        return None
    if cls is _AddNormCall and not isinstance(args[1] if len(args) > 1 else kwargs.get("residual"), _Tensor):
        return None
    return cls(op, site, args, kwargs)
