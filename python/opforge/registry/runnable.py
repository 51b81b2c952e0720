"""Runnable: a built solution called the Definition's way.

Whatever the solution's convention, a Runnable takes the Definition's inputs (positionally in
the Definition's order, or by name) and returns its outputs: one tensor for a one-output
Definition, else a tuple in the Definition's output order.

* value-returning entries may return a tensor, a tuple/list in output order, or a dict keyed
  by output name (FlashInfer-Trace's convention);
* destination-passing entries get the inputs then freshly allocated outputs (shapes from the
  call's axis values, dtypes from the Definition, on the first input tensor's device) and the
  Runnable returns those; ``call_into`` passes caller-owned outputs instead.

How the entry receives the values (``calling``, decided by checks.check_signature):

* ``positional``: ``entry(x, w)`` (destination-passing: ``entry(x, w, y)``);
* ``by_name``: ``entry(x=..., w=...)``, when its parameters carry the Definition's names;
* ``tuple``: ``entry((x, w))``, one tuple, for an entry with exactly one parameter
  (``def kernel(data: input_t) -> output_t``). Destination-passing, the tuple holds the inputs
  then the outputs, ``(a, b, ..., c)``: the entry fills the outputs and returns them (or None);
  returning any other value is an error, since it would mean the outputs were never written.
  Value-returning, the tuple holds the inputs only and the entry returns its outputs as above.
  The calling style follows the solution's ``destination_passing_style``, not the parameter's
  name or annotation. A value-returning Definition with a single input passes that input
  itself (``entry(x)``): a one-tuple and a one-tensor parameter cannot be told apart, and the
  plain call is what such entries have always received.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .checks import BY_NAME, POSITIONAL, TUPLE


class Runnable:
    """A callable built from a Solution for a Definition (see the module doc).

    Attributes: ``solution``, ``definition``, ``fn`` (the entry callable itself),
    ``destination_passing_style``, ``calling`` (positional, by_name or tuple; see the module
    doc) and ``by_name`` (calling == by_name), ``cache_hit`` (True/False for cached builds,
    None when nothing was cached), ``build_dir`` and ``artifact`` (the compiled library, for
    native languages).
    """

    def __init__(self, fn: Callable, solution, definition, *, dps: bool, calling: str = POSITIONAL,
                 cache_hit: Optional[bool] = None, build_dir=None, artifact=None):
        if calling not in (POSITIONAL, BY_NAME, TUPLE):
            raise ValueError(f"Runnable: calling {calling!r}; accepted: {POSITIONAL}, {BY_NAME}, {TUPLE}")
        self.fn = fn
        self.solution = solution
        self.definition = definition
        self.destination_passing_style = dps
        self.calling = calling
        self.by_name = calling == BY_NAME
        self.cache_hit = cache_hit
        self.build_dir = build_dir
        self.artifact = artifact
        self.input_names = list(definition.inputs)
        self.output_names = list(definition.outputs)
        self._dps_names = self.input_names + self.output_names
        self._name = f"solution {solution.name!r}"

    def __repr__(self) -> str:
        style = "destination-passing" if self.destination_passing_style else "value-returning"
        return f"<Runnable {self.solution.name} for {self.definition.name} ({style}, {self.calling})>"

    # --- calling --------------------------------------------------------------------------

    def _bind(self, args: tuple, kwargs: dict) -> list:
        names = self.input_names
        if len(args) > len(names):
            raise TypeError(f"{self._name}: takes {len(names)} inputs ({', '.join(names)}); got {len(args)}")
        values = list(args)
        for name in names[len(args):]:
            if name not in kwargs:
                raise TypeError(f"{self._name}: missing input {name!r} (inputs: {', '.join(names)})")
            values.append(kwargs.pop(name))
        if kwargs:
            extra = ", ".join(sorted(kwargs))
            raise TypeError(f"{self._name}: unexpected argument(s) {extra} (inputs: {', '.join(names)})")
        return values

    def _call_value_returning(self, values: list):
        if self.calling == TUPLE:
            return self.fn(tuple(values))
        if self.calling == BY_NAME:
            return self.fn(**dict(zip(self.input_names, values)))
        return self.fn(*values)

    def _fill(self, inputs_then_outputs: tuple) -> None:
        """The destination-passing call."""
        if self.calling == TUPLE:
            result = self.fn(inputs_then_outputs)
            if result is not None:
                self._check_returned_outputs(result, inputs_then_outputs[len(self.input_names):])
        elif self.calling == BY_NAME:
            self.fn(**dict(zip(self._dps_names, inputs_then_outputs)))
        else:
            self.fn(*inputs_then_outputs)

    def __call__(self, *args, **kwargs):
        values = self._bind(args, kwargs)
        if self.destination_passing_style:
            outputs = self.allocate_outputs(*values)
            self._fill((*values, *outputs))
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return self._outputs(self._call_value_returning(values))

    def call_into(self, *inputs_then_outputs):
        """Destination-passing call with caller-owned outputs: the inputs, then the outputs, in
        the Definition's order. Returns nothing; the outputs hold the results."""
        if not self.destination_passing_style:
            raise TypeError(f"{self._name} is value-returning; call it with the inputs only")
        n = len(self.input_names) + len(self.output_names)
        if len(inputs_then_outputs) != n:
            raise TypeError(f"{self._name}: call_into takes {n} tensors (inputs then outputs); "
                            f"got {len(inputs_then_outputs)}")
        self._fill(inputs_then_outputs)

    def _check_returned_outputs(self, result, outputs: tuple) -> None:
        """A one-tuple destination-passing entry returns the outputs it was given (``return c``).
        Anything else means it computed elsewhere and left the outputs unwritten: say so here
        rather than let the caller read the untouched buffers."""
        if isinstance(result, dict):
            result = tuple(result.get(n) for n in self.output_names)
        elif not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) == len(outputs) and all(_same_tensor(r, o) for r, o in zip(result, outputs)):
            return
        names = ", ".join(self.output_names)
        raise ValueError(f"{self._name}: returned a value that is not its output {names}; write into the "
                         f"output(s) in the tuple and return them (or None)")

    def _outputs(self, result):
        names = self.output_names
        if isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                raise ValueError(f"{self._name}: returned a dict without output(s) {', '.join(missing)} "
                                 f"(keys: {', '.join(map(str, result))})")
            result = tuple(result[n] for n in names)
        elif isinstance(result, (tuple, list)):
            result = tuple(result)
        elif result is None:
            raise ValueError(f"{self._name}: returned None; a value-returning solution returns its outputs "
                             f"({', '.join(names)}); for one that writes into outputs, set destination_passing_style")
        else:
            result = (result,)
        if len(result) != len(names):
            raise ValueError(f"{self._name}: returned {len(result)} value(s); the Definition has "
                             f"{len(names)} output(s): {', '.join(names)}")
        return result[0] if len(result) == 1 else result

    # --- output allocation ----------------------------------------------------------------

    def axis_values(self, *inputs) -> dict[str, int]:
        """Axis name -> size: the Definition's constants, and variables read from the inputs."""
        values = dict(self.definition.const_axes)
        for (name, spec), value in zip(self.definition.inputs.items(), inputs):
            if spec.shape is None or not isinstance(value, torch.Tensor):
                continue
            if value.dim() != len(spec.shape):
                raise ValueError(f"{self._name}: input {name!r} has shape {tuple(value.shape)}; the Definition "
                                 f"gives it {len(spec.shape)} dimensions [{', '.join(spec.shape)}]")
            for axis, size in zip(spec.shape, value.shape):
                seen = values.setdefault(axis, int(size))
                if seen != size:
                    raise ValueError(f"{self._name}: input {name!r} has {axis}={size}; expected {axis}={seen}")
        return values

    def allocate_outputs(self, *inputs) -> list:
        """Empty output tensors for a call with these inputs (on the first input tensor's device)."""
        try:
            shapes = self.definition.output_shapes(self.axis_values(*inputs))
        except ValueError as exc:
            raise ValueError(f"{self._name}: cannot size the outputs: {exc}") from None
        device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))
        return [torch.empty(shapes[name] or (), dtype=spec.dtype.to_torch(), device=device)
                for name, spec in self.definition.outputs.items()]


def _same_tensor(a, b: torch.Tensor) -> bool:
    """``a`` is ``b``, or a view of exactly the same memory (a buffer that went through DLPack
    comes back as a new tensor object)."""
    return a is b or (isinstance(a, torch.Tensor) and a.device == b.device and a.dtype == b.dtype
                      and a.shape == b.shape and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())
