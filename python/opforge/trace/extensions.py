"""opforge's optional Definition fields (FlashInfer-Trace readers ignore them).

``tolerances``: per output, ``{"atol": 1e-2, "rtol": 1e-2}``: the bound a solution's output
must meet against the reference (``|got - ref| <= atol + rtol * |ref|``).

``value_domains``: per input, which values ``random`` workload inputs may take when arbitrary
data would be invalid (indices, offsets, positive scales). Two kinds:

* ``{"kind": "range", "low": 0, "high": "num_pages", "unique": true}`` (``kind`` may be left
  out): uniform values in ``[low, high)``; integers for integer tensors. ``low`` / ``high`` are
  numbers or expressions over axis names. ``unique`` (integers only) asks for distinct values.
* ``{"kind": "indptr", "total": "num_kv_indices"}``: offsets of a ragged batch for a 1-D
  integer tensor: non-decreasing, first element 0, last element ``total`` (a number or an
  expression over axis names).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Discriminator, Field, StrictBool, StrictFloat, StrictInt, Tag

from ._base import TraceModel

Bound = Union[StrictInt, StrictFloat, str]


class Tolerance(TraceModel):
    """Allowed error of one output: ``|got - ref| <= atol + rtol * |ref|``."""

    atol: Annotated[float, Field(ge=0)]
    rtol: Annotated[float, Field(ge=0)]


class RangeDomain(TraceModel):
    """Uniform values in ``[low, high)``; bounds are numbers or axis expressions."""

    _omit_when_empty = ("unique",)

    kind: Literal["range"] = "range"
    low: Bound
    high: Bound
    unique: Optional[StrictBool] = None


class IndptrDomain(TraceModel):
    """Ragged-batch offsets: non-decreasing from 0 to ``total`` (a number or axis expression)."""

    kind: Literal["indptr"] = "indptr"
    total: Union[StrictInt, str]


def _domain_kind(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("kind", "range")
    return getattr(value, "kind", None)


ValueDomain = Annotated[
    Union[Annotated[RangeDomain, Tag("range")], Annotated[IndptrDomain, Tag("indptr")]],
    Discriminator(_domain_kind, custom_error_type="invalid_domain_kind",
                  custom_error_message="kind must be 'range' or 'indptr'"),
]
