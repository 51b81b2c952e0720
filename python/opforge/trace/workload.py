"""Workloads: concrete values for a Definition's variable axes plus where each input comes from.

JSON (FlashInfer-Trace)::

    {"axes": {"batch_size": 32},
     "inputs": {"hidden_states": {"type": "random"},
                "eps": {"type": "scalar", "value": 1e-06},
                "weight": {"type": "safetensors", "path": "blob/workloads/...", "tensor_key": "weight"}},
     "uuid": "6120f144-b973-4bd9-b884-77ecb132914e"}

opforge adds ``"seed"`` (an int, written only when set): the random source that makes
``random`` inputs reproducible. A safetensors ``path`` is relative to the dataset root and must
stay inside it: absolute paths and '..' are refused. Axis values and the seed are non-negative
and fit in int64, as do integer scalar values; the uuid must be usable in a file name (the
blob of a captured workload is named after it).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from ._base import INT64_MAX, INT64_MIN, Size, TraceModel, int64_message
from ._paths import name_problem, relative_path_problem
from .errors import SchemaError

NonEmptyStr = Annotated[str, Field(min_length=1)]

#: The suffix of a captured workload's blob file, ``<definition>_<uuid>.safetensors``.
BLOB_SUFFIX = ".safetensors"


class RandomInput(TraceModel):
    """Random data generated for the input (see the Definition's value_domains)."""

    type: Literal["random"] = "random"


class ScalarInput(TraceModel):
    """A Python scalar passed as the input (int, float or bool)."""

    type: Literal["scalar"] = "scalar"
    value: Union[StrictBool, StrictInt, StrictFloat]

    @field_validator("value", mode="before")
    @classmethod
    def _int64(cls, value):
        # Checked before the union: an int too large for int64 would otherwise pass as a float.
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            raise SchemaError("", int64_message(value))
        return value


class SafetensorsInput(TraceModel):
    """A tensor stored under ``tensor_key`` in a safetensors file at ``path``."""

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyStr
    tensor_key: NonEmptyStr

    @model_validator(mode="after")
    def _check(self) -> "SafetensorsInput":
        problem = relative_path_problem(self.path)
        if problem:
            raise SchemaError("path", f"{problem} (safetensors paths are relative to the dataset root)")
        return self


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")]


class Workload(TraceModel):
    """Values of the variable axes (``axes``) and a data source for every input (``inputs``)."""

    _omit_when_empty = ("seed",)

    axes: dict[str, Size]
    inputs: dict[str, InputSpec]
    uuid: NonEmptyStr
    seed: Optional[Size] = None

    @model_validator(mode="after")
    def _check(self) -> "Workload":
        problem = name_problem(self.uuid, "uuid", BLOB_SUFFIX)
        if problem:
            raise SchemaError("uuid", problem)
        for name in self.axes:
            if not name:
                raise SchemaError("axes", "axis names must be non-empty")
        for name in self.inputs:
            if not name:
                raise SchemaError("inputs", "input names must be non-empty")
        return self
