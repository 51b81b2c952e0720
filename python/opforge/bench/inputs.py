"""Inputs of a workload, reproducible from a seed.

Random tensors respect the Definition's value domains (extensions.py): integer ranges
(optionally unique), ragged-batch offsets (indptr: non-decreasing from 0 to a total), positive
values spread over binades (log_uniform), and inputs derived from another input (derived: a
rearrangement, never random). Definitions that declare none (FlashInfer-Trace's public ones) get
the obvious ones from their input names and constraints (inferred_domains.py). Without a domain:
standard normal floats, uniform bools, and for FP4 E2M1 uniform bytes (every code in both
nibbles). Scalars come from the workload, else are drawn in their dtype (_random_scalar);
safetensors inputs are loaded and shape-checked through the TraceSet. The same (definition,
workload, seed) always gives the same values, on every device.
"""

from __future__ import annotations

import torch

from ..trace import DType, RandomInput, SafetensorsInput, ScalarInput
from ..trace.extensions import DerivedDomain
from .inferred_domains import as_probabilities, is_probability_input, scalar_axis, with_inferred_domains


def _blocked_128x4(scale: torch.Tensor) -> torch.Tensor:
    from ..ops.nvfp4_format import to_blocked

    return to_blocked(scale)


#: The implementation of each transform a ``derived`` domain may name (extensions.DERIVED_TRANSFORMS).
TRANSFORMS = {"blocked_128x4": _blocked_128x4}


def _log_uniform(shape: tuple, dtype: torch.dtype, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    """Representable values of ``dtype`` in [low, high]: a binade uniformly, then one of its
    values uniformly (the dtype's encodings are enumerated, so every value is exact)."""
    bits = torch.finfo(dtype).bits
    codes = torch.arange(2 ** bits, dtype=torch.int32)
    codes = torch.where(codes >= 2 ** (bits - 1), codes - 2 ** bits, codes)  # two's complement
    values = codes.to(torch.int8 if bits == 8 else torch.int16).view(dtype).to(torch.float64)
    values = torch.unique(values[torch.isfinite(values) & (values >= low) & (values <= high)])  # sorted
    if not values.numel():
        raise ValueError(f"no {dtype} value lies in [{low}, {high}]")
    _, binade = torch.frexp(values)
    _, counts = torch.unique_consecutive(binade, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    pick = torch.randint(0, counts.numel(), shape, generator=gen)
    within = (torch.rand(shape, generator=gen, dtype=torch.float64) * counts[pick]).long()
    return values[starts[pick] + torch.minimum(within, counts[pick] - 1)].to(dtype)


def _indptr(n: int, total: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` offsets from 0 to ``total``, the inner ones uniform cuts (int64)."""
    cuts = torch.sort(torch.randint(0, total + 1, (max(n - 2, 0),), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])[:n]


def _indptr_within(total: int, partner: torch.Tensor, page_size, gen: torch.Generator) -> torch.Tensor:
    """Offsets to ``total`` whose segments fit those of ``partner`` (an indptr of the same
    length; with ``page_size``, counting pages of that many tokens, the last one at least one
    token full). Random shares of ``total`` in proportion to each segment's room, cut to the
    room, then what is left goes to segments with room in a random order. A ``total`` beyond
    all the room fills every segment and spreads the excess as a plain indptr would."""
    segments = torch.diff(partner.to("cpu", torch.int64))
    if page_size is not None:
        segments = torch.where(segments > 0, (segments - 1) * int(page_size) + 1, 0)
    room = segments.clamp(min=0)
    capacity = int(room.sum())
    if total >= capacity:
        lengths = room + torch.diff(_indptr(room.numel() + 1, total - capacity, gen))
    else:
        share = torch.rand(room.shape, generator=gen, dtype=torch.float64) * room
        lengths = torch.minimum((share * (total / max(float(share.sum()), 1e-300))).floor().long(), room)
        rest = total - int(lengths.sum())
        for b in torch.randperm(room.numel(), generator=gen).tolist():
            if rest == 0:
                break
            add = min(rest, int(room[b] - lengths[b]))
            lengths[b] += add
            rest -= add
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])


def _random_tensor(definition, name: str, shape: tuple, spec, axis_values: dict, gen: torch.Generator,
                   values: dict) -> torch.Tensor:
    dtype = spec.dtype.to_torch()
    domain = definition.resolve_value_domain(name, axis_values)
    if domain is not None and domain["kind"] == "indptr":
        n = shape[0] if shape else 1
        if domain["within"] is not None:
            return _indptr_within(int(domain["total"]), values[domain["within"]], domain["page_size"], gen).to(dtype)
        return _indptr(n, int(domain["total"]), gen).to(dtype)
    if domain is not None and domain["kind"] == "log_uniform":
        return _log_uniform(shape, dtype, float(domain["low"]), float(domain["high"]), gen)
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
    if spec.dtype.is_fp4:
        # Uniform bytes: all 16 E2M1 codes in both nibbles (zero, -0, every sign and exponent).
        raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
        return raw.view(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -128), min(info.max, 127) + 1, shape, generator=gen).to(dtype)


def _random_scalar(definition, name: str, spec, axis_values: dict, gen: torch.Generator):
    """A Python scalar of the input's dtype: within its declared range if any; an integer that
    names an axis (``k`` beside a ``k`` axis, see inferred_domains.scalar_axis) is that axis's
    value; other integers small and positive, bools either way, floats standard normal."""
    domain = definition.resolve_value_domain(name, axis_values)
    if spec.dtype is DType.BOOL:
        return bool(torch.randint(0, 2, (), generator=gen))
    if spec.dtype.is_int:
        if domain is not None and domain["kind"] == "range":
            return int(torch.randint(int(domain["low"]), int(domain["high"]), (), generator=gen))
        axis = scalar_axis(definition, name)
        return int(axis_values[axis]) if axis is not None else int(torch.randint(1, 9, (), generator=gen))
    if domain is not None and domain["kind"] == "range":
        return float(domain["low"] + torch.rand((), generator=gen, dtype=torch.float64) * (domain["high"] - domain["low"]))
    return float(torch.randn((), generator=gen))


def _derived_tensor(definition, name: str, domain: DerivedDomain, source, shape: tuple, spec) -> torch.Tensor:
    if not isinstance(source, torch.Tensor):
        raise ValueError(f"{definition.name}: input {name} is derived from {domain.source}, which is not a tensor")
    value = TRANSFORMS[domain.transform](source)
    want = tuple(shape)
    if tuple(value.shape) != want or value.dtype != spec.dtype.to_torch():
        raise ValueError(f"{definition.name}: input {name}: {domain.transform} of {domain.source} "
                         f"{tuple(source.shape)} is {tuple(value.shape)} {value.dtype}; the Definition "
                         f"declares {want} {spec.dtype.value}")
    return value


def generate_inputs(definition, workload, *, seed: int | None = None, device: str = "cpu",
                    trace_set=None) -> list:
    """The workload's inputs in the Definition's order. ``seed`` defaults to the workload's own
    (then 0); values are drawn on the CPU and moved, so they do not depend on the device.
    Derived inputs are made last, from their source's final value."""
    definition = with_inferred_domains(definition)  # structure for Definitions that declare none
    axis_values = definition.full_axis_values(workload.axes)
    shapes = definition.resolve_shapes(workload.axes)
    seed = seed if seed is not None else (workload.seed if workload.seed is not None else 0)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    values: dict = {}
    derived, paired = [], []
    for name, spec in definition.inputs.items():
        source = workload.inputs.get(name)
        if isinstance(source, ScalarInput):
            values[name] = source.value
        elif isinstance(source, SafetensorsInput):
            if trace_set is None:
                raise ValueError(f"{definition.name}: input {name} is a safetensors blob; pass the TraceSet")
            values[name] = trace_set.load_input_tensor(definition.name, workload, name, device=device)
        elif (isinstance(source, RandomInput) or source is None) and spec.shape is None:
            values[name] = _random_scalar(definition, name, spec, axis_values, gen)
        elif isinstance(definition.value_domains.get(name), DerivedDomain):
            derived.append(name)
        elif getattr(definition.value_domains.get(name), "within", None) is not None:
            paired.append(name)  # drawn once the indptr it fits is known
        elif isinstance(source, RandomInput) or source is None:
            value = _random_tensor(definition, name, shapes[name] or (), spec, axis_values, gen, values)
            if is_probability_input(definition, name):
                value = as_probabilities(value)
            values[name] = value.to(device)
        else:
            raise ValueError(f"{definition.name}: input {name}: unsupported source {source!r}")
    for name in paired:
        spec = definition.inputs[name]
        values[name] = _random_tensor(definition, name, shapes[name] or (), spec, axis_values, gen, values).to(device)
    for name in derived:
        domain = definition.value_domains[name]
        values[name] = _derived_tensor(definition, name, domain, values[domain.source], shapes[name] or (),
                                       definition.inputs[name])
    for name, order in definition.storage_orders.items():
        values[name] = stored_in_order(values[name], order)
    return [values[name] for name in definition.inputs]


def stored_in_order(t: torch.Tensor, order) -> torch.Tensor:
    """The values of ``t`` in memory laid out with dimension ``order[0]`` outermost and
    ``order[-1]`` innermost (a Definition's ``storage_orders``), same shape."""
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return t.permute(*order).contiguous().permute(*inverse)
