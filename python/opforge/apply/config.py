"""ApplyConfig: how apply picks a solution from a dataset's traces.

Defaults follow the brief of apply: same-hardware traces only, the nearest power-of-two bucket
for sizes never measured, then the Definition's overall best, then the fallback (opforge's own
op for the built-in ops), solutions built the first time they serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Optional

#: A key function: the variable axes of a call (name -> value) -> its bucket. Calls whose axis
#: values were never measured use the solutions measured on workloads of the same bucket. None
#: means "no bucket": such calls go straight to the Definition's overall best.
BucketFn = Callable[[Mapping[str, int]], Optional[Hashable]]


def power_of_two_bucket(axes: Mapping[str, int]) -> tuple:
    """Each variable axis rounded up to a power of two (0 stays 0): batch 33..64 share 64.

    Rounding up matches how serving engines pad batches (CUDA-graph batch sizes are powers of
    two or close to them), so a bucket's solutions were measured on sizes at least as large.
    """
    return tuple(0 if v <= 0 else 1 << max(int(v) - 1, 0).bit_length() for v in axes.values())


def bucket_distance(a: tuple, b: tuple) -> Optional[float]:
    """How far apart two numeric buckets are, in powers of two summed over the axes; None when
    either is not a tuple of positive numbers of the same length (no notion of "near")."""
    if len(a) != len(b):
        return None
    total = 0.0
    for x, y in zip(a, b):
        if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) \
                or not isinstance(y, (int, float)) or x <= 0 or y <= 0:
            return None
        total += abs(math.log2(x) - math.log2(y))
    return total


@dataclass(frozen=True)
class ApplyConfig:
    """Options of ``opforge.enable_apply``.

    hardware: the ``environment.hardware`` name whose traces count (default: this device's name,
        as the benchmark runner records it: the GPU's name, or the CPU's model name).
    hardware_fallback: for a Definition with no usable trace from this hardware, use the traces
        of one other hardware (the one with the most usable traces for that Definition; latencies
        from different machines are never mixed). Same-hardware traces always win.
    device: where solutions are built and run ("cuda", "cuda:1", "cpu"; default: the current
        CUDA device if there is one, else the CPU). Calls on another kind of device run the
        fallback.
    buckets: per Definition name, a key function for axis values never measured (see BucketFn);
        default_bucket for the others (power_of_two_bucket).
    nearest_bucket: when a call's bucket was never measured either, use the nearest measured
        bucket (numeric buckets only; distance in powers of two). False: go to the Definition's
        overall best.
    use_definition_best: after the workload's and the bucket's solutions, try the Definition's
        overall best (the solution passing on the most workloads, fastest relative to each
        workload's best among equals) before the fallback.
    ahead_of_time: build every solution a call could be routed to when apply is enabled, instead
        of on first use. Needed before CUDA-graph capture: during capture nothing is built, and a
        solution not built yet is passed over.
    route_builtin_ops: opforge's own ops (rmsnorm, silu_and_mul, ...) consult apply too. False:
        only ``@apply`` functions and ``apply(...)`` calls are routed.
    """

    hardware: Optional[str] = None
    hardware_fallback: bool = False
    device: Optional[str] = None
    buckets: Mapping[str, BucketFn] = field(default_factory=dict)
    default_bucket: BucketFn = power_of_two_bucket
    nearest_bucket: bool = True
    use_definition_best: bool = True
    ahead_of_time: bool = False
    route_builtin_ops: bool = True

    def __post_init__(self):
        if self.hardware is not None and (not isinstance(self.hardware, str) or not self.hardware.strip()):
            raise ValueError(f"ApplyConfig.hardware: expected a non-empty device name or None, got {self.hardware!r}")
        if not isinstance(self.buckets, Mapping):
            raise TypeError(f"ApplyConfig.buckets: expected a mapping of Definition name -> key function, "
                            f"got {type(self.buckets).__name__}")
        for name, fn in self.buckets.items():
            if not callable(fn):
                raise TypeError(f"ApplyConfig.buckets[{name!r}]: expected a function of the axis values, "
                                f"got {type(fn).__name__}")
        if not callable(self.default_bucket):
            raise TypeError(f"ApplyConfig.default_bucket: expected a function of the axis values, "
                            f"got {type(self.default_bucket).__name__}")
        for name in ("hardware_fallback", "nearest_bucket", "use_definition_best", "ahead_of_time",
                     "route_builtin_ops"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ApplyConfig.{name}: expected True or False, got {getattr(self, name)!r}")

    def bucket_fn(self, definition: str) -> BucketFn:
        return self.buckets.get(definition, self.default_bucket)
