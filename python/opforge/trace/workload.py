"""Workloads: concrete values for a Definition's variable axes plus where each input comes from.

JSON (FlashInfer-Trace)::

    {"axes": {"batch_size": 32},
     "inputs": {"hidden_states": {"type": "random"},
                "eps": {"type": "scalar", "value": 1e-06},
                "weight": {"type": "safetensors", "path": "blob/workloads/...", "tensor_key": "weight"}},
     "uuid": "6120f144-b973-4bd9-b884-77ecb132914e"}

opforge adds ``"seed"`` (an int, written only when set): the random source that makes
``random`` inputs reproducible. A safetensors ``path`` is relative to the dataset root (an
absolute path is used as it is).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from ._base import TraceModel
from .errors import SchemaError

NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class RandomInput(TraceModel):
    """Random data generated for the input (see the Definition's value_domains)."""

    type: Literal["random"] = "random"


class ScalarInput(TraceModel):
    """A Python scalar passed as the input (int, float or bool)."""

    type: Literal["scalar"] = "scalar"
    value: Union[StrictBool, StrictInt, StrictFloat]


class SafetensorsInput(TraceModel):
    """A tensor stored under ``tensor_key`` in a safetensors file at ``path``."""

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyStr
    tensor_key: NonEmptyStr


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")]


class Workload(TraceModel):
    """Values of the variable axes (``axes``) and a data source for every input (``inputs``)."""

    _omit_when_empty = ("seed",)

    axes: dict[str, NonNegativeInt]
    inputs: dict[str, InputSpec]
    uuid: NonEmptyStr
    seed: Optional[NonNegativeInt] = None

    @model_validator(mode="after")
    def _check(self) -> "Workload":
        for name in self.axes:
            if not name:
                raise SchemaError("axes", "axis names must be non-empty")
        for name in self.inputs:
            if not name:
                raise SchemaError("inputs", "input names must be non-empty")
        return self
