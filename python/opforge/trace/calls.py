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

from typing import Callable, Optional

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

    op: the op's name; definition: the Definition's name; axes: the variable axes' values;
    key: (definition, variable axis values...), hashable, for dedup and routing tables;
    inputs: the Definition's inputs by name, in its order (tensors viewed with the Definition's
    rank, scalars as Python numbers), made on first access. ``finish(results)`` turns a
    solution's outputs (a tuple in the Definition's output order) into the op's return value,
    writing ``out=`` / in-place destinations as the op would.
    """

    __slots__ = ("op", "definition", "axes", "key", "_args", "_inputs")

    def __init__(self, op: str, definition: str, rows: int, args: tuple):
        self.op = op
        self.definition = definition
        self.axes = {"batch_size": rows}
        self.key = (definition, rows)
        self._args = args
        self._inputs = None

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


_NAMES: dict[tuple, str] = {}


def _name(prefix: str, const: int, explicit_eps: bool, dtype) -> str:
    """The Definition name of a call (cached); remembers how to make the Definition."""
    key = (prefix, const, explicit_eps, dtype)
    name = _NAMES.get(key)
    if name is None:
        template = TEMPLATES[prefix]
        axis = template.const_axes[0]
        kwargs = {axis: const, "eps_input": True} if explicit_eps else {axis: const}
        name = _NAMES[key] = template.name(_DTYPES[dtype], **kwargs)
        _SEEN.setdefault(name, (prefix, {"dtype": _DTYPES[dtype], **kwargs}))
    return name


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _written(dest: Optional[_Tensor], value: _Tensor, shape) -> _Tensor:
    """``value`` (rows-shaped) delivered as the op delivers an output: into ``dest`` when the
    caller gave one, else shaped like the op's own result."""
    if dest is not None:
        dest.copy_(value.view(dest.shape) if value.shape != dest.shape else value)
        return dest
    return value if value.shape == shape else value.reshape(shape)


def _norm_name(prefix: str, x: _Tensor, eps: float) -> tuple[str, bool]:
    """The Definition name of a norm call, and whether eps is one of its inputs."""
    hidden = x.shape[-1]
    public = public_eps(prefix, hidden)
    explicit = public is None or eps != public
    return _name(prefix, hidden, explicit, x.dtype), explicit


def _row_count(x: _Tensor, width: int) -> int:
    return x.numel() // width if width else 0


class _NormCall(OpCall):
    __slots__ = ()

    def _make_inputs(self) -> dict:
        x, w, eps, _, explicit = self._args
        inputs = {"hidden_states": _rows(x, x.shape[-1]), "weight": w}
        if explicit:
            inputs["eps"] = eps
        return inputs

    def finish(self, results):
        x, _, _, out, _ = self._args
        return _written(out, results[0], x.shape)


class _AddNormCall(OpCall):
    __slots__ = ()

    def _make_inputs(self) -> dict:
        x, r, w, eps, _, _, explicit = self._args
        hidden = x.shape[-1]
        inputs = {"hidden_states": _rows(x, hidden), "residual": _rows(r, hidden), "weight": w}
        if explicit:
            inputs["eps"] = eps
        return inputs

    def finish(self, results):
        x, r, _, _, out, residual_out, _ = self._args
        normed = results[0]
        # The public form has no residual_out output: the new residual is the rounded sum,
        # made before any destination (which may be input or residual itself) is written.
        summed = results[1] if len(results) > 1 else torch.add(x, r)
        residual_result = _written(residual_out, summed, r.shape)
        return _written(out, normed, x.shape), residual_result


class _ActCall(OpCall):
    __slots__ = ()

    def _make_inputs(self) -> dict:
        x = self._args[0]
        return {"input": _rows(x, x.shape[-1])}

    def finish(self, results):
        x, out = self._args
        return _written(out, results[0], (*x.shape[:-1], x.shape[-1] // 2))


class _ScaleCall(OpCall):
    __slots__ = ()

    def _make_inputs(self) -> dict:
        x, factor, _ = self._args
        return {"x": _rows(x, x.shape[-1]), "factor": float(factor)}

    def finish(self, results):
        x, _, out = self._args
        return _written(out, results[0], x.shape)


def _bind_norm(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    x = _arg(args, kwargs, 0, "input")
    eps = float(_arg(args, kwargs, 2, "eps", 1e-6))
    if not isinstance(x, _Tensor) or not x.dim() or x.dtype not in _SUFFIX:
        return None
    name, explicit = _norm_name(op, x, eps)
    values = (x, _arg(args, kwargs, 1, "weight"), eps, _arg(args, kwargs, 3, "out"), explicit)
    return _NormCall(op, name, _row_count(x, x.shape[-1]), values)


def _bind_add_norm(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    x = _arg(args, kwargs, 0, "input")
    r = _arg(args, kwargs, 1, "residual")
    eps = float(_arg(args, kwargs, 3, "eps", 1e-6))
    if not isinstance(x, _Tensor) or not isinstance(r, _Tensor) or not x.dim() or x.dtype not in _SUFFIX:
        return None
    name, explicit = _norm_name(op, x, eps)
    values = (x, r, _arg(args, kwargs, 2, "weight"), eps, _arg(args, kwargs, 4, "out"),
              _arg(args, kwargs, 5, "residual_out"), explicit)
    return _AddNormCall(op, name, _row_count(x, x.shape[-1]), values)


def _bind_act(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    x = _arg(args, kwargs, 0, "input")
    if not isinstance(x, _Tensor) or not x.dim() or x.dtype not in _SUFFIX or x.shape[-1] % 2:
        return None
    width = x.shape[-1]
    return _ActCall(op, _name(op, width // 2, False, x.dtype), _row_count(x, width), (x, _arg(args, kwargs, 1, "out")))


def _bind_scale(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    x = _arg(args, kwargs, 0, "x")
    factor = _arg(args, kwargs, 1, "factor")
    if not isinstance(x, _Tensor) or not x.dim() or x.dtype not in _SUFFIX or isinstance(factor, bool) \
            or not isinstance(factor, (int, float)):
        return None
    width = x.shape[-1]
    return _ScaleCall(op, _name(op, width, False, x.dtype), _row_count(x, width), (x, factor, _arg(args, kwargs, 2, "out")))


_BINDERS: dict[str, Callable] = {
    "rmsnorm": _bind_norm,
    "gemma_rmsnorm": _bind_norm,
    "fused_add_rmsnorm": _bind_add_norm,
    "gemma_fused_add_rmsnorm": _bind_add_norm,
    "silu_and_mul": _bind_act,
    "gelu_and_mul": _bind_act,
    "gelu_tanh_and_mul": _bind_act,
    "scale": _bind_scale,
}


def bind_call(op: str, args: tuple, kwargs: dict) -> Optional[OpCall]:
    """The call as its Definition sees it, or None when no Definition describes it (an
    argument the op itself will refuse, a dtype no template names): the op then runs as it
    would without tracing or apply, and raises its own clear error if the call is bad."""
    binder = _BINDERS.get(op)
    if binder is None:
        return None
    try:
        return binder(op, args, kwargs)
    except (TypeError, ValueError, RuntimeError, IndexError, OverflowError):
        return None
