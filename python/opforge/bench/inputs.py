"""Inputs of a workload, reproducible from a seed.

Random tensors respect the Definition's value domains: integer ranges (optionally unique),
ragged-batch offsets (indptr: non-decreasing from 0 to a total), and otherwise standard normal
floats / uniform bools. Scalars come from the workload; safetensors inputs are loaded and
shape-checked through the TraceSet. The same (definition, workload, seed) always gives the
same values, on every device.
"""

from __future__ import annotations

import torch

from ..trace import RandomInput, SafetensorsInput, ScalarInput


def _random_tensor(definition, name: str, shape: tuple, dtype: torch.dtype, axis_values: dict,
                   gen: torch.Generator) -> torch.Tensor:
    domain = definition.resolve_value_domain(name, axis_values)
    if domain is not None and domain["kind"] == "indptr":
        n = shape[0] if shape else 1
        total = int(domain["total"])
        cuts = torch.sort(torch.randint(0, total + 1, (max(n - 2, 0),), generator=gen)).values
        return torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])[:n].to(dtype)
    if domain is not None:
        low, high = domain["low"], domain["high"]
        count = 1
        for d in shape:
            count *= d
        if domain.get("unique"):
            if high - low < count:
                raise ValueError(f"{definition.name}: input {name}: {count} unique values do not fit in [{low}, {high})")
            return (torch.randperm(int(high - low), generator=gen)[:count] + int(low)).reshape(shape).to(dtype)
        if dtype.is_floating_point:
            return (torch.rand(shape, generator=gen) * (high - low) + low).to(dtype)
        return torch.randint(int(low), int(high), shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -128), min(info.max, 127) + 1, shape, generator=gen).to(dtype)


def generate_inputs(definition, workload, *, seed: int | None = None, device: str = "cpu",
                    trace_set=None) -> list:
    """The workload's inputs in the Definition's order. ``seed`` defaults to the workload's own
    (then 0); values are drawn on the CPU and moved, so they do not depend on the device."""
    axis_values = definition.full_axis_values(workload.axes)
    shapes = definition.resolve_shapes(workload.axes)
    seed = seed if seed is not None else (workload.seed if workload.seed is not None else 0)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    values = []
    for name, spec in definition.inputs.items():
        source = workload.inputs.get(name)
        if isinstance(source, ScalarInput):
            values.append(source.value)
        elif isinstance(source, SafetensorsInput):
            if trace_set is None:
                raise ValueError(f"{definition.name}: input {name} is a safetensors blob; pass the TraceSet")
            values.append(trace_set.load_input_tensor(definition.name, workload, name, device=device))
        elif (isinstance(source, RandomInput) or source is None) and spec.shape is None:
            values.append(float(torch.randn((), generator=gen)))  # a random Python scalar
        elif isinstance(source, RandomInput) or source is None:
            tensor = _random_tensor(definition, name, shapes[name] or (), spec.dtype.to_torch(), axis_values, gen)
            values.append(tensor.to(device))
        else:
            raise ValueError(f"{definition.name}: input {name}: unsupported source {source!r}")
    return values
