"""opforge's optional Definition fields (FlashInfer-Trace readers ignore them).

``tolerances``: per output, ``{"atol": 1e-2, "rtol": 1e-2}``: the bound a solution's output
must meet against the reference (``|got - ref| <= atol + rtol * |ref|``).

``value_domains``: per input, which values ``random`` workload inputs may take when arbitrary
data would be invalid or would hide bugs (indices, offsets, positive scales, one quantity in two
layouts). Four kinds:

* ``{"kind": "range", "low": 0, "high": "num_pages", "unique": true}`` (``kind`` may be left
  out): uniform values in ``[low, high)``; integers for integer tensors. ``low`` / ``high`` are
  numbers or expressions over axis names. ``unique`` (integers only) asks for distinct values.
* ``{"kind": "indptr", "total": "num_kv_indices"}``: offsets of a ragged batch for a 1-D
  integer tensor: non-decreasing, first element 0, last element ``total`` (a number or an
  expression over axis names). ``"within": "kv_indptr"`` pairs it with another indptr input of
  the same length: each segment is no longer than that input's segment of the same request, so
  a prefill request never has more query tokens than keys (a causal mask would leave its first
  queries none). With ``"page_size": "page_size"`` (a number or axis expression) the other
  input counts pages: p pages hold at least ``(p - 1) * page_size + 1`` tokens (the last page
  may be partly filled). Should ``total`` exceed what the segments can hold, each is filled to
  its bound and the rest spread over the requests anyway.
* ``{"kind": "log_uniform", "low": 0.001953125, "high": "sqrt(65504 / (36 * K))"}``: positive
  values of a float8 / float16 / bfloat16 input spread evenly over the binades: a power of two
  is drawn uniformly among those holding representable values in ``[low, high]`` (bounds
  included), then one of its representable values uniformly. Block scales drawn this way
  exercise every exponent, subnormals included, where uniform values would leave the small
  binades nearly empty.
* ``{"kind": "derived", "source": "scale_a", "transform": "blocked_128x4"}``: not random at
  all: the values of input ``source`` (same dtype) rearranged by ``transform``
  (DERIVED_TRANSFORMS), so two inputs that hold one quantity in two layouts always agree. The
  generator makes the source first (from its own data source), then derives; a workload that
  records the derived input itself (safetensors) is used as recorded.

Input generation draws tensors without a domain as standard normal floats, uniform bools, and
for FP4 E2M1 uniform bytes (both nibbles over all 16 codes, -0 included).

``storage_orders``: per input, how its elements lie in memory when that is not the shape's row
major order: the dimensions from outermost to innermost (``[2, 0, 1]``: a [M, K/2, L] tensor
stored as [L, M, K/2], K contiguous, as seed 003's GEMV task hands its operands over). Inputs
are generated (or loaded) with that layout and reach every solution with it, so a kernel is
measured on the memory layout its callers have; without an entry, inputs are contiguous.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Discriminator, Field, StrictBool, StrictFloat, StrictInt, Tag

from ._base import TraceModel

Bound = Union[StrictInt, StrictFloat, str]

#: What a ``derived`` domain's ``transform`` may name: the 128x4-tile blocked layout of block
#: scales that cuBLAS block-scaled GEMMs read, [rows, K/16, L] -> [32, 4, ceil(rows/128), 4,
#: ceil(K/64), L] zero padded (opforge.ops.nvfp4_format.to_blocked).
DERIVED_TRANSFORMS = {"blocked_128x4": {"source_rank": 3, "rank": 6}}
#: The dtypes a ``log_uniform`` domain may draw (their encodings are enumerated).
LOG_UNIFORM_DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


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
    """Ragged-batch offsets: non-decreasing from 0 to ``total`` (a number or axis expression),
    optionally segment by segment within another indptr input (see the module doc)."""

    _omit_when_empty = ("within", "page_size")

    kind: Literal["indptr"] = "indptr"
    total: Union[StrictInt, str]
    within: Optional[Annotated[str, Field(min_length=1)]] = None
    page_size: Optional[Union[StrictInt, str]] = None


class LogUniformDomain(TraceModel):
    """Positive values spread evenly over binades within ``[low, high]`` (see the module doc)."""

    kind: Literal["log_uniform"] = "log_uniform"
    low: Bound
    high: Bound


class DerivedDomain(TraceModel):
    """The values of input ``source`` rearranged by ``transform`` (see the module doc)."""

    kind: Literal["derived"] = "derived"
    source: Annotated[str, Field(min_length=1)]
    transform: Literal[tuple(DERIVED_TRANSFORMS)]


def _domain_kind(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("kind", "range")
    return getattr(value, "kind", None)


ValueDomain = Annotated[
    Union[Annotated[RangeDomain, Tag("range")], Annotated[IndptrDomain, Tag("indptr")],
          Annotated[LogUniformDomain, Tag("log_uniform")], Annotated[DerivedDomain, Tag("derived")]],
    Discriminator(_domain_kind, custom_error_type="invalid_domain_kind",
                  custom_error_message="kind must be 'range', 'indptr', 'log_uniform' or 'derived'"),
]
