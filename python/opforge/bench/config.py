"""Benchmark settings: defaults, per-op-type and per-Definition overrides from a config file, and
the command line on top.

A config file is TOML (or JSON with the same shape)::

    seed = 1234                  # inputs of every workload derive from it (default: random)
    baseline = "builtin"         # speedups are also given against this solution
    devices = ["cuda:0", "cuda:1"]

    [defaults]
    iterations = 100
    timeout_s = 120

    [op_type.rmsnorm]
    iterations = 200

    [definition.silu_and_mul_d11008]
    atol = 0.02
    rtol = 0.02

Later layers win: defaults < op_type < definition < command line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: On a CPU, workloads with a larger tensor than this are skipped unless asked (max_elements).
CPU_MAX_ELEMENTS = 1 << 22


class Settings(BaseModel):
    """How one Definition's workloads are checked and timed."""

    model_config = ConfigDict(extra="forbid")

    input_sets: int = Field(3, ge=3, description="fresh input sets checked before timing")
    warmup: int = Field(10, ge=0)
    iterations: int = Field(100, ge=1, description="timed calls (fewer when max_time_s runs out)")
    max_time_s: float = Field(2.0, gt=0, description="time budget of the timed calls of one pair")
    timeout_s: float = Field(120.0, gt=0, description="one request to a worker: check, time or re-check")
    build_timeout_s: float = Field(900.0, gt=0, description="building one solution")
    atol: Optional[float] = Field(None, ge=0, description="overrides every output's tolerance")
    rtol: Optional[float] = Field(None, ge=0)
    flush_l2: bool = Field(True, description="make L2 cold before every timed call (CUDA)")
    cuda_graph: bool = Field(True, description="also time replays of a captured CUDA graph")
    host_timing: bool = Field(True, description="also time the host side of a call (no synchronize)")
    suspect_percent_of_peak: float = Field(110.0, gt=0, description="faster than this % of the copy "
                                           "calibration is flagged as suspect")
    suspect_spread: float = Field(3.0, gt=1, description="a p90/p10 ratio of the timed calls above this is "
                                  "flagged as suspect (a busy machine)")

    @model_validator(mode="after")
    def _tolerance_pair(self) -> "Settings":
        if (self.atol is None) != (self.rtol is None):
            raise ValueError("atol and rtol override the tolerance together; give both")
        return self

    @property
    def tolerance(self) -> Optional[tuple[float, float]]:
        return None if self.atol is None else (self.atol, self.rtol)


class BenchmarkConfig(BaseModel):
    """What to run and how (see the module doc)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    defaults: Settings = Field(default_factory=Settings)
    op_types: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="op_type")
    definition_settings: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="definition")
    overrides: dict[str, Any] = Field(default_factory=dict, description="command-line settings, applied last")

    definitions: Optional[list[str]] = None
    solutions: Optional[list[str]] = None
    devices: Optional[list[str]] = None
    modules: list[str] = Field(default_factory=list, description="modules registering solutions")
    seed: Optional[int] = Field(None, ge=0)
    baseline: Optional[str] = Field("builtin", description='a solution name, "builtin" for the '
                                    "Definition's builtin solution, or null")
    resume: bool = False
    isolate: bool = Field(False, description="a fresh worker process for every evaluation (every solution "
                          "always has worker processes of its own)")
    time_reference: bool = Field(True, description="time the reference for speedup_factor")
    max_elements: Optional[int] = Field(None, ge=1, description="skip workloads with a larger tensor "
                                        f"(default on a CPU: {CPU_MAX_ELEMENTS})")
    log_dir: Optional[str] = None

    @model_validator(mode="after")
    def _check_layers(self) -> "BenchmarkConfig":
        for where, layer in [("overrides", self.overrides)] + \
                [(f"op_type.{k}", v) for k, v in self.op_types.items()] + \
                [(f"definition.{k}", v) for k, v in self.definition_settings.items()]:
            try:
                Settings.model_validate({**self.defaults.model_dump(), **layer})
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"[{where}] {field + ': ' if field else ''}{first['msg']}") from None
        return self

    def settings_for(self, definition) -> Settings:
        layers = [self.defaults.model_dump(), self.op_types.get(definition.op_type, {}),
                  self.definition_settings.get(definition.name, {}), self.overrides]
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(layer)
        return Settings.model_validate(merged)

    def baseline_for(self, definition) -> Optional[str]:
        if self.baseline is None:
            return None
        return f"{definition.name}_builtin" if self.baseline == "builtin" else self.baseline

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BenchmarkConfig":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the config file: {exc.strerror}") from None
        try:
            if path.suffix == ".json":
                data = json.loads(text)
            else:
                try:
                    import tomllib
                except ImportError:  # Python 3.10
                    raise ValueError(f"{path}: TOML needs Python 3.11; write the config as .json") from None
                data = tomllib.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path}: {where}: {first['msg']}") from None
