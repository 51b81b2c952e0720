"""Runnable: a built solution called the Definition's way.

Whatever the solution's convention, a Runnable takes the Definition's inputs (positionally in
the Definition's order, or by name) and returns its outputs: one tensor for a one-output
Definition, else a tuple in the Definition's output order.

* value-returning entries may return a tensor, a tuple/list in output order, or a dict keyed
  by output name (FlashInfer-Trace's convention);
* destination-passing entries get the inputs then freshly allocated outputs (shapes from the
  call's axis values, dtypes from the Definition, on the first input tensor's device) and the
  Runnable returns those; ``call_into`` passes caller-owned outputs instead.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch


class Runnable:
    """A callable built from a Solution for a Definition (see the module doc).

    Attributes: ``solution``, ``definition``, ``fn`` (the entry callable itself),
    ``destination_passing_style``, ``by_name`` (entry called with keyword arguments),
    ``cache_hit`` (True/False for cached builds, None when nothing was cached), ``build_dir``
    and ``artifact`` (the compiled library, for native languages).
    """

    def __init__(self, fn: Callable, solution, definition, *, dps: bool, by_name: bool,
                 cache_hit: Optional[bool] = None, build_dir=None, artifact=None):
        self.fn = fn
        self.solution = solution
        self.definition = definition
        self.destination_passing_style = dps
        self.by_name = by_name
        self.cache_hit = cache_hit
        self.build_dir = build_dir
        self.artifact = artifact
        self.input_names = list(definition.inputs)
        self.output_names = list(definition.outputs)
        self._name = f"solution {solution.name!r}"

    def __repr__(self) -> str:
        style = "destination-passing" if self.destination_passing_style else "value-returning"
        return f"<Runnable {self.solution.name} for {self.definition.name} ({style})>"

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

    def _invoke(self, values: list, names: list[str]):
        if self.by_name:
            return self.fn(**dict(zip(names, values)))
        return self.fn(*values)

    def __call__(self, *args, **kwargs):
        values = self._bind(args, kwargs)
        if self.destination_passing_style:
            outputs = self.allocate_outputs(*values)
            self._invoke(values + outputs, self.input_names + self.output_names)
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return self._outputs(self._invoke(values, self.input_names))

    def call_into(self, *inputs_then_outputs):
        """Destination-passing call with caller-owned outputs: the inputs, then the outputs, in
        the Definition's order. Returns nothing; the outputs hold the results."""
        if not self.destination_passing_style:
            raise TypeError(f"{self._name} is value-returning; call it with the inputs only")
        n = len(self.input_names) + len(self.output_names)
        if len(inputs_then_outputs) != n:
            raise TypeError(f"{self._name}: call_into takes {n} tensors (inputs then outputs); "
                            f"got {len(inputs_then_outputs)}")
        self._invoke(list(inputs_then_outputs), self.input_names + self.output_names)

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
