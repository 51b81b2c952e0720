"""Where a Definition's axes sit in a call's input tensors: checking a call against the
Definition (dtypes, ranks, constant axes, tensors agreeing on shared axes) and reading its
variable axis values.

Routing does this on every call, so the common case (everything fits, tensors contiguous, on
the device kind the traces were measured on) is one function generated per Definition with the
checks written out straight, no loops: Python's per-step cost is what the ~1 µs budget of a
routing decision is made of. Anything else takes the general path (``prepare``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..trace import Definition

_Tensor = torch.Tensor


class InputLayout:
    """The tensor inputs of one Definition (see the module doc). ``on_cuda``: the device kind
    calls must be on to be routed; None (tracing): any, and no ``read`` is generated."""

    def __init__(self, definition: Definition, on_cuda: Optional[bool] = None):
        self.definition = definition
        self.on_cuda = on_cuda
        self.var_axes = tuple(definition.var_axes)
        index = {axis: k for k, axis in enumerate(self.var_axes)}
        const = definition.const_axes
        self.tensors = []
        for i, spec in enumerate(definition.inputs.values()):
            if spec.shape is not None:
                dims = tuple((d, const.get(axis), index.get(axis)) for d, axis in enumerate(spec.shape))
                self.tensors.append((i, len(spec.shape), spec.dtype.to_torch(), dims))
        self.first = self.tensors[0][0] if self.tensors else None
        #: ``read(inputs)``: the variable axis values when the call fits, its tensors are contiguous
        #: and on the ``on_cuda`` device kind; else None (then see ``prepare``). ``inputs`` is a
        #: sequence in the Definition's order; ``read_named`` takes them by name (a dict).
        self.read: Optional[Callable[[tuple], Optional[tuple]]] = None
        self.read_named: Optional[Callable[[dict], Optional[tuple]]] = None
        if on_cuda is not None:
            self.read = self._compile_reader(named=False)
            self.read_named = self._compile_reader(named=True)

    def _compile_reader(self, named: bool) -> Callable:
        env = {"Tensor": _Tensor, "isinstance": isinstance, "len": len, "CUDA": self.on_cuda}
        names = list(self.definition.inputs)
        lines = ["def read(inputs):"]
        first_of: dict[int, str] = {}  # variable axis -> where the first tensor showing it holds it
        for i, rank, dtype, dims in self.tensors:
            env[f"D{i}"] = dtype
            lines.append(f"    t{i} = inputs[{names[i]!r}]" if named else f"    t{i} = inputs[{i}]")
            device = f" or t{i}.is_cuda is not CUDA" if i == self.first else ""
            lines.append(f"    if not isinstance(t{i}, Tensor) or t{i}.dtype is not D{i}{device} "
                         f"or not t{i}.is_contiguous():")
            lines.append("        return None")
            lines.append(f"    s{i} = t{i}.shape")
            checks = [f"len(s{i}) != {rank}"]
            for d, const, k in dims:
                if const is not None:
                    checks.append(f"s{i}[{d}] != {const}")
                elif k in first_of:
                    checks.append(f"s{i}[{d}] != {first_of[k]}")
                else:
                    first_of[k] = f"s{i}[{d}]"
            lines.append(f"    if {' or '.join(checks)}:")
            lines.append("        return None")
        if len(first_of) != len(self.var_axes):  # an axis no input tensor shows: nothing to route on
            return lambda inputs: None
        lines.append(f"    return ({''.join(first_of[k] + ', ' for k in range(len(self.var_axes)))})")
        namespace: dict = {}
        exec(compile("\n".join(lines), f"<opforge.apply reader of {self.definition.name}>", "exec"), env, namespace)
        return namespace["read"]

    def values(self, inputs) -> Optional[tuple]:
        """The variable axis values of a call, or None when its tensors do not fit the Definition
        (dtype, rank, a constant axis, two tensors disagreeing on an axis); any layout, any
        device."""
        found = [None] * len(self.var_axes)
        for i, rank, dtype, dims in self.tensors:
            t = inputs[i]
            if not isinstance(t, _Tensor) or t.dim() != rank or t.dtype != dtype:
                return None
            shape = t.shape
            for d, const, k in dims:
                size = shape[d]
                if const is not None:
                    if size != const:
                        return None
                elif found[k] is None:
                    found[k] = size
                elif found[k] != size:
                    return None
        if None in found:
            return None
        return tuple(found)

    def prepare(self, inputs) -> Optional[tuple[tuple, list]]:
        """(values, inputs as a solution gets them) for a call ``read`` turned down, or None when
        it does not fit or is on another device kind. Solutions get contiguous tensors: the
        workloads they were measured on (FlashInfer-Trace's) are."""
        values = self.values(inputs)
        if values is None or self.first is None or inputs[self.first].is_cuda is not self.on_cuda:
            return None
        inputs = list(inputs)
        for i, _, _, _ in self.tensors:
            if not inputs[i].is_contiguous():
                inputs[i] = inputs[i].contiguous()
        return values, inputs
