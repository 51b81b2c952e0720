"""TracingConfig: which inputs of a traced call are saved, and which calls are kept at all.

FlashInfer-Bench's policies, by the same names:

tensor_dump_policy  "dump_all"        every tensor input is saved (safetensors blob)
                    "dump_none"       no tensor is saved: the workload says "random" for them
                    "dump_non_float"  integer and bool tensors (indptrs, indices, masks) are saved,
                                      floating-point ones are not (the default)
                    [names]           the named inputs are saved
dedup_policy        "keep_all"        every call becomes a workload
                    "shape_only"      the first call of each shape (variable axis values) is kept
                                      (the default)
                    "keep_first_k"    the first ``k`` calls of the Definition are kept
                    callable          ``fn(workload) -> key``: a call is kept when its key is new

Scalar inputs are always recorded by value. The default (``TracingConfig()``) keeps one workload
per shape and saves only non-float tensors: the values that decide what a kernel does (index
arrays, lengths) are kept, the bulk activations that random data stands in for are not, so a
dataset stays small and ``opforge run`` can still benchmark every shape a model used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

DUMP_POLICIES = ("dump_all", "dump_none", "dump_non_float")
DEDUP_POLICIES = ("keep_all", "shape_only", "keep_first_k")


def _names(values) -> str:
    return ", ".join(values)


@dataclass(frozen=True)
class TracingConfig:
    """How one Definition is traced (see the module docstring for the policies).

    >>> TracingConfig(tensor_dump_policy="dump_all", dedup_policy="keep_first_k", k=3)
    >>> TracingConfig(tensor_dump_policy=["kv_indptr"], dedup_policy=lambda w: w.axes["batch_size"] // 64)

    A callable dedup policy sees the call as a Workload whose tensors are all ``random`` (no
    tensor is copied before a call is kept) and whose scalars carry their values; its key must be
    hashable. ``k`` is given only with ``"keep_first_k"`` (default 1).
    """

    tensor_dump_policy: Union[str, tuple, list] = "dump_non_float"
    dedup_policy: Union[str, Callable[[Any], Any]] = "shape_only"
    k: Optional[int] = None

    def __post_init__(self) -> None:
        dump = self.tensor_dump_policy
        if isinstance(dump, str):
            if dump not in DUMP_POLICIES:
                raise ValueError(f"TracingConfig: tensor_dump_policy {dump!r} is not one of {_names(DUMP_POLICIES)} "
                                 "or a list of input names")
        elif isinstance(dump, (list, tuple)):
            for name in dump:
                if not isinstance(name, str) or not name:
                    raise TypeError(f"TracingConfig: tensor_dump_policy lists {name!r}; input names are non-empty "
                                    "strings")
            if len(set(dump)) != len(dump):
                raise ValueError(f"TracingConfig: tensor_dump_policy names an input twice: {list(dump)}")
            object.__setattr__(self, "tensor_dump_policy", tuple(dump))  # frozen, hashable, unshared
        else:
            raise TypeError(f"TracingConfig: tensor_dump_policy must be one of {_names(DUMP_POLICIES)} or a list of "
                            f"input names, not {type(dump).__name__}")
        dedup = self.dedup_policy
        if isinstance(dedup, str):
            if dedup not in DEDUP_POLICIES:
                raise ValueError(f"TracingConfig: dedup_policy {dedup!r} is not one of {_names(DEDUP_POLICIES)} or a "
                                 "callable workload -> key")
        elif not callable(dedup):
            raise TypeError(f"TracingConfig: dedup_policy must be one of {_names(DEDUP_POLICIES)} or a callable "
                            f"workload -> key, not {type(dedup).__name__}")
        if dedup == "keep_first_k":
            k = 1 if self.k is None else self.k
            if isinstance(k, bool) or not isinstance(k, int):
                raise TypeError(f"TracingConfig: k must be an integer, not {type(k).__name__}")
            if k < 1:
                raise ValueError(f"TracingConfig: k={k}; keep_first_k keeps at least one call (k >= 1)")
            object.__setattr__(self, "k", k)
        elif self.k is not None:
            shown = dedup if isinstance(dedup, str) else "a callable"
            raise ValueError(f"TracingConfig: k={self.k!r} is used only with dedup_policy='keep_first_k', "
                             f"not with {shown}")

    def check_definition(self, definition) -> None:
        """ValueError when a list of input names names inputs the Definition lacks."""
        if not isinstance(self.tensor_dump_policy, tuple):
            return
        unknown = [n for n in self.tensor_dump_policy if n not in definition.inputs]
        if unknown:
            raise ValueError(f"TracingConfig for {definition.name}: tensor_dump_policy names "
                             f"{_names(map(repr, unknown))}, which {'is not an input' if len(unknown) == 1 else 'are not inputs'} "
                             f"(inputs: {_names(definition.inputs)})")

    def dumps(self, name: str, tensor) -> bool:
        """Whether the tensor input ``name`` is saved."""
        policy = self.tensor_dump_policy
        if policy == "dump_non_float":
            return not (tensor.is_floating_point() or tensor.is_complex())
        if policy == "dump_all":
            return True
        if policy == "dump_none":
            return False
        return name in policy


DEFAULT_CONFIG = TracingConfig()
