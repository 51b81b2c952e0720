"""Definitions: the FlashInfer-Trace description of one kernel (axes, tensors, reference).

JSON (FlashInfer-Trace; field order as written)::

    {"name": "rmsnorm_h4096", "op_type": "rmsnorm",
     "axes": {"batch_size": {"type": "var", "description": null},
              "hidden_size": {"type": "const", "value": 4096, "description": null}},
     "inputs": {"hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16",
                                  "description": null}, ...},
     "outputs": {"output": {...}},
     "reference": "import torch\\n\\ndef run(hidden_states, weight): ...",
     "tags": [...], "description": "...", "constraints": [...]}

``shape: null`` is a Python scalar, ``shape: []`` a 0-d tensor. Files using the early key
``"type"`` for ``op_type`` are read too. opforge's optional fields (written only when set):
``tolerances``, ``aliases``, ``value_domains``, ``storage_orders`` (see extensions.py), and ``bytes`` / ``flops``:
expressions over axis names giving the bytes a call moves and its floating-point operations,
for roofline numbers. Besides axis names they may use ``dtype_size`` (bytes per element of the
first tensor input), ``<tensor>_itemsize`` for every tensor, the dtype names (``bfloat16`` is 2,
``float4_e2m1`` is 1: a byte of two values) and the functions in expr.FUNCTIONS.

Constraints are expressions over axis names that must hold for every workload
(``"len_indptr == batch_size + 1"``). Ones that also read input tensors
(``"num_kv_indices == kv_indptr[-1]"``) are checked only when tensors are given.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
from typing import Annotated, Any, Callable, Literal, Mapping, Optional, Union

from pydantic import AliasChoices, Field, StrictInt, field_validator, model_validator

from . import expr as _expr
from ._base import INT64_MAX, TraceModel, canonical_hash_text
from ._paths import name_problem
from .dtypes import DType
from .errors import ConstraintError, ExpressionError, SchemaError, WorkloadError
from .extensions import (DERIVED_TRANSFORMS, LOG_UNIFORM_DTYPES, DerivedDomain, IndptrDomain, LogUniformDomain,
                         RangeDomain, Tolerance, ValueDomain)
from .workload import ScalarInput, Workload


#: The longer suffix a Definition's name gets as a file name: ``<name>.json`` (the definition),
#: ``<name>.jsonl`` (its workloads and traces).
NAME_SUFFIX = ".jsonl"


class AxisConst(TraceModel):
    """An axis with one fixed value per Definition (JSON ``{"type": "const", "value": 4096}``)."""

    type: Literal["const"] = "const"
    value: Annotated[int, Field(strict=True, gt=0, le=INT64_MAX)]
    description: Optional[str] = None


class AxisVar(TraceModel):
    """An axis whose value each workload gives (JSON ``{"type": "var"}``)."""

    type: Literal["var"] = "var"
    description: Optional[str] = None


AxisSpec = Annotated[Union[AxisConst, AxisVar], Field(discriminator="type")]


class TensorSpec(TraceModel):
    """An input or output: ``shape`` lists axis names (None: a Python scalar), ``dtype``."""

    shape: Optional[list[Annotated[str, Field(min_length=1)]]]
    dtype: DType
    description: Optional[str] = None


class Definition(TraceModel):
    """One kernel: its axes, inputs, outputs and reference implementation (see module doc)."""

    _omit_when_empty = ("tolerances", "aliases", "value_domains", "storage_orders", "bytes", "flops")

    name: str
    op_type: str = Field(validation_alias=AliasChoices("op_type", "type"))
    axes: dict[str, AxisSpec]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str
    tags: list[str] = Field(default_factory=list)
    description: Optional[str] = None
    constraints: list[str] = Field(default_factory=list)
    tolerances: dict[str, Tolerance] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict)
    value_domains: dict[str, ValueDomain] = Field(default_factory=dict)
    storage_orders: dict[str, list[StrictInt]] = Field(default_factory=dict)
    bytes: Optional[str] = None
    flops: Optional[str] = None

    @field_validator("tags", "constraints", mode="before")
    @classmethod
    def _null_is_empty(cls, value):
        return [] if value is None else value

    @model_validator(mode="after")
    def _validate(self) -> "Definition":
        for field, suffix in (("name", NAME_SUFFIX), ("op_type", "")):
            problem = name_problem(getattr(self, field), field, suffix)
            if problem:
                raise SchemaError(field, problem)
        for i, tag in enumerate(self.tags):
            if not tag.strip():
                raise SchemaError(f"tags[{i}]", "tags must be non-empty strings")
        declared = ", ".join(self.axes) or "none"
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tname, spec in tensors.items():
                if not tname:
                    raise SchemaError(kind, "tensor names must be non-empty")
                for i, axis in enumerate(spec.shape or ()):
                    if axis not in self.axes:
                        raise SchemaError(f"{kind}.{tname}.shape[{i}]",
                                          f"axis {axis!r} is not declared in axes (declared: {declared})")
        for oname in self.outputs:
            if oname in self.inputs:
                raise SchemaError(f"outputs.{oname}", f"{oname!r} is also the name of an input")
        self._validate_reference()
        for i, constraint in enumerate(self.constraints):
            self._validate_expr(f"constraints[{i}]", constraint, set(self.axes) | set(self.inputs))
        for oname in self.tolerances:
            if oname not in self.outputs:
                raise SchemaError(f"tolerances.{oname}",
                                  f"{oname!r} is not an output (outputs: {', '.join(self.outputs)})")
        for oname, iname in self.aliases.items():
            self._validate_alias(oname, iname)
        for iname, domain in self.value_domains.items():
            self._validate_domain(iname, domain)
        for iname, order in self.storage_orders.items():
            self._validate_storage_order(iname, order)
        for field in ("bytes", "flops"):
            if getattr(self, field) is not None:
                self._validate_expr(field, getattr(self, field), set(self._expr_constants()) | set(self.axes))
        return self

    def _validate_reference(self) -> None:
        try:
            module = ast.parse(self.reference)
        except SyntaxError as exc:
            raise SchemaError("reference", f"invalid Python: {exc.msg} (line {exc.lineno})") from None
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "run" for n in module.body):
            raise SchemaError("reference", "defines no top-level function 'run'")

    def _validate_expr(self, field: str, text: str, allowed: set) -> None:
        try:
            _expr.check_names(text, allowed)
        except ExpressionError as exc:
            raise SchemaError(field, str(exc)) from None

    def _validate_alias(self, oname: str, iname: str) -> None:
        if oname not in self.outputs:
            raise SchemaError(f"aliases.{oname}", f"{oname!r} is not an output (outputs: {', '.join(self.outputs)})")
        if iname not in self.inputs:
            raise SchemaError(f"aliases.{oname}", f"{iname!r} is not an input (inputs: {', '.join(self.inputs)})")
        out, inp = self.outputs[oname], self.inputs[iname]
        if out.shape != inp.shape or out.dtype != inp.dtype:
            raise SchemaError(f"aliases.{oname}",
                              f"output {oname!r} ({out.shape}, {out.dtype.value}) cannot be written into input "
                              f"{iname!r} ({inp.shape}, {inp.dtype.value}): shapes and dtypes differ")

    def _validate_domain(self, iname: str, domain) -> None:
        field = f"value_domains.{iname}"
        if iname not in self.inputs:
            raise SchemaError(field, f"{iname!r} is not an input (inputs: {', '.join(self.inputs)})")
        spec = self.inputs[iname]
        if isinstance(domain, DerivedDomain):
            self._validate_derived(iname, domain)
            return
        if isinstance(domain, IndptrDomain):
            bounds = [("total", domain.total), ("page_size", domain.page_size)]
        else:
            bounds = [("low", domain.low), ("high", domain.high)]
        for key, bound in bounds:
            if isinstance(bound, str):
                self._validate_expr(f"{field}.{key}", bound, set(self.axes))
        one_d_int = spec.dtype.is_int and spec.shape is not None and len(spec.shape) == 1
        if isinstance(domain, IndptrDomain) and not one_d_int:
            raise SchemaError(field, f"an indptr domain needs a 1-D integer input; "
                                     f"{iname!r} is {spec.shape} {spec.dtype.value}")
        if isinstance(domain, IndptrDomain):
            self._validate_within(iname, domain)
        if isinstance(domain, (RangeDomain, LogUniformDomain)):
            if _expr.is_number(domain.low) and _expr.is_number(domain.high) and not domain.low < domain.high:
                raise SchemaError(field, f"low ({domain.low}) must be below high ({domain.high})")
        if isinstance(domain, RangeDomain) and domain.unique and not spec.dtype.is_int:
            raise SchemaError(f"{field}.unique", f"unique values need an integer input; {iname!r} is {spec.dtype.value}")
        if isinstance(domain, LogUniformDomain):
            if _expr.is_number(domain.low) and not domain.low > 0:
                raise SchemaError(field, f"a log_uniform domain needs low > 0; got {domain.low}")
            if spec.dtype.value not in LOG_UNIFORM_DTYPES or spec.shape is None:
                raise SchemaError(field, f"a log_uniform domain needs a tensor of {', '.join(LOG_UNIFORM_DTYPES)}; "
                                         f"{iname!r} is {spec.dtype.value}")

    def _validate_storage_order(self, iname: str, order: list) -> None:
        field = f"storage_orders.{iname}"
        spec = self.inputs.get(iname)
        if spec is None or spec.shape is None:
            raise SchemaError(field, f"{iname!r} is not a tensor input (inputs: {', '.join(self.inputs)})")
        if sorted(order) != list(range(len(spec.shape))):
            raise SchemaError(field, f"expected the {len(spec.shape)} dimensions of {iname!r} {spec.shape}, "
                                     f"outermost first, each once; got {order}")

    def _validate_within(self, iname: str, domain: IndptrDomain) -> None:
        field = f"value_domains.{iname}.within"
        if domain.within is None:
            if domain.page_size is not None:
                raise SchemaError(f"value_domains.{iname}.page_size", "page_size needs within (the indptr it counts)")
            return
        other = self.inputs.get(domain.within)
        if other is None or domain.within == iname:
            raise SchemaError(field, f"{domain.within!r} is not another input (inputs: {', '.join(self.inputs)})")
        spec = self.inputs[iname]
        if not other.dtype.is_int or other.shape is None or list(other.shape) != list(spec.shape or ()):
            raise SchemaError(field, f"{domain.within!r} ({other.shape} {other.dtype.value}) is not an integer "
                                     f"input of {iname!r}'s shape {spec.shape}")
        paired = self.value_domains.get(domain.within)
        if paired is not None and (not isinstance(paired, IndptrDomain) or paired.within is not None):
            raise SchemaError(field, f"{domain.within!r} must be an indptr drawn on its own (an indptr domain "
                                     f"without within, or none)")

    def _validate_derived(self, iname: str, domain: DerivedDomain) -> None:
        field = f"value_domains.{iname}.source"
        source = self.inputs.get(domain.source)
        if source is None or domain.source == iname:
            raise SchemaError(field, f"{domain.source!r} is not another input (inputs: {', '.join(self.inputs)})")
        if isinstance(self.value_domains.get(domain.source), DerivedDomain):
            raise SchemaError(field, f"{domain.source!r} is derived itself; derive from the input it comes from")
        spec, ranks = self.inputs[iname], DERIVED_TRANSFORMS[domain.transform]
        if source.dtype != spec.dtype:
            raise SchemaError(field, f"{domain.transform} keeps the dtype: {iname!r} is {spec.dtype.value}, "
                                     f"{domain.source!r} is {source.dtype.value}")
        if len(source.shape or ()) != ranks["source_rank"] or len(spec.shape or ()) != ranks["rank"]:
            raise SchemaError(field, f"{domain.transform} makes a {ranks['rank']}-D tensor of a "
                                     f"{ranks['source_rank']}-D one; {iname!r} is {spec.shape}, "
                                     f"{domain.source!r} is {source.shape}")

    # --- axes and shapes -----------------------------------------------------------------

    @property
    def const_axes(self) -> dict[str, int]:
        """Constant axes and their values."""
        return {n: a.value for n, a in self.axes.items() if isinstance(a, AxisConst)}

    @property
    def var_axes(self) -> list[str]:
        """Names of the variable axes."""
        return [n for n, a in self.axes.items() if isinstance(a, AxisVar)]

    def workload_label(self, axis_values: Mapping[str, int]) -> str:
        """``batch_size=64``: the variable axes of a workload, in the Definition's order
        (``-`` when it has none)."""
        return ",".join(f"{a}={axis_values[a]}" for a in self.var_axes if a in axis_values) or "-"

    def full_axis_values(self, axis_values: Mapping[str, int]) -> dict[str, int]:
        """Every axis's value: the constants plus ``axis_values`` (which must give every variable
        axis; a constant axis it repeats must match)."""
        unknown = [k for k in axis_values if k not in self.axes]
        if unknown:
            raise ValueError(f"{self.name}: unknown axis {', '.join(map(repr, unknown))} "
                             f"(axes: {', '.join(self.axes)})")
        out = dict(self.const_axes)
        for name, value in axis_values.items():
            if name in out and out[name] != value:
                raise ValueError(f"{self.name}: axis {name!r} is constant {out[name]}, not {value}")
            out[name] = value
        missing = [a for a in self.var_axes if a not in out]
        if missing:
            raise ValueError(f"{self.name}: no value for variable axis {', '.join(map(repr, missing))}")
        return {n: out[n] for n in self.axes}

    def _shapes(self, tensors, axis_values) -> dict[str, Optional[tuple]]:
        values = self.full_axis_values(axis_values)
        return {n: None if s.shape is None else tuple(values[a] for a in s.shape) for n, s in tensors.items()}

    def input_shapes(self, axis_values: Mapping[str, int]) -> dict[str, Optional[tuple]]:
        return self._shapes(self.inputs, axis_values)

    def output_shapes(self, axis_values: Mapping[str, int]) -> dict[str, Optional[tuple]]:
        return self._shapes(self.outputs, axis_values)

    def resolve_shapes(self, axis_values: Mapping[str, int]) -> dict[str, Optional[tuple]]:
        """Concrete shapes of every input and output (None for scalars), inputs first."""
        return self._shapes({**self.inputs, **self.outputs}, axis_values)

    # --- expressions and constraints -----------------------------------------------------

    def _expr_constants(self) -> dict[str, float]:
        env: dict[str, float] = {d.value: d.itemsize for d in DType}
        for name, spec in {**self.inputs, **self.outputs}.items():
            env[f"{name}_itemsize"] = spec.dtype.itemsize
        first = next((s for s in self.inputs.values() if s.shape is not None), None)
        first = first or next(iter({**self.inputs, **self.outputs}.values()), None)
        if first is not None:
            env["dtype_size"] = first.dtype.itemsize
        return env

    def eval_expr(self, text: str, axis_values: Mapping[str, int]) -> Any:
        """Evaluate an expression over axis values (constants filled in), dtype sizes and the
        math functions; ExpressionError if it is malformed, unsafe or reads an unknown name."""
        env = self._expr_constants()
        env.update(self.const_axes)
        env.update(axis_values)
        return _expr.evaluate(text, env)

    def check_constraints(self, axis_values: Mapping[str, int], tensors: Optional[Mapping[str, Any]] = None) -> None:
        """Raise ConstraintError unless every constraint holds. Constraints that read input
        tensors are skipped unless ``tensors`` (input name -> tensor) is given."""
        values = self.full_axis_values(axis_values)
        for constraint in self.constraints:
            reads = _expr.names(constraint)
            if reads & set(self.inputs) and not (tensors and reads & set(self.inputs) <= set(tensors)):
                continue
            env = dict(values)
            if tensors:
                env.update({k: v for k, v in tensors.items() if k in self.inputs})
            try:
                ok = bool(_expr.evaluate(constraint, env))
            except ExpressionError as exc:
                raise ConstraintError(self.name, constraint, f"cannot be evaluated: {exc}") from None
            if not ok:
                shown = ", ".join(f"{a}={values[a]}" for a in self.axes if a in reads) or "these values"
                raise ConstraintError(self.name, constraint, f"does not hold for {shown}")

    def io_bytes(self, axis_values: Mapping[str, int]) -> float:
        """Bytes of every tensor input and output (each read or written once)."""
        total = 0.0
        for name, shape in self.resolve_shapes(axis_values).items():
            if shape is not None:
                n = 1
                for d in shape:
                    n *= d
                total += n * {**self.inputs, **self.outputs}[name].dtype.itemsize
        return total

    def bytes_moved(self, axis_values: Mapping[str, int]) -> float:
        """The ``bytes`` formula's value, or io_bytes when there is none."""
        return float(self.eval_expr(self.bytes, axis_values)) if self.bytes else self.io_bytes(axis_values)

    def flop_count(self, axis_values: Mapping[str, int]) -> Optional[float]:
        """The ``flops`` formula's value (None when there is none)."""
        return float(self.eval_expr(self.flops, axis_values)) if self.flops else None

    def resolve_value_domain(self, input_name: str, axis_values: Mapping[str, int]) -> Optional[dict]:
        """The input's value domain with expressions evaluated, e.g. ``{"kind": "range",
        "low": 0, "high": 37, "unique": False}`` (extensions.py lists the kinds); None when it
        has none."""
        domain = self.value_domains.get(input_name)
        if domain is None:
            return None
        value = lambda b: self.eval_expr(b, axis_values) if isinstance(b, str) else b  # noqa: E731
        if isinstance(domain, IndptrDomain):
            page_size = None if domain.page_size is None else int(value(domain.page_size))
            return {"kind": "indptr", "total": int(value(domain.total)), "within": domain.within, "page_size": page_size}
        if isinstance(domain, DerivedDomain):
            return {"kind": "derived", "source": domain.source, "transform": domain.transform}
        if isinstance(domain, LogUniformDomain):
            return {"kind": "log_uniform", "low": value(domain.low), "high": value(domain.high)}
        return {"kind": "range", "low": value(domain.low), "high": value(domain.high), "unique": bool(domain.unique)}

    # --- workloads -----------------------------------------------------------------------

    def check_workload(self, workload: Workload) -> None:
        """Raise WorkloadError unless the workload fits: every variable axis given, no unknown
        axis, constants (if repeated) equal, constraints hold, every input covered by a data
        source of a fitting kind."""
        def fail(field: str, message: str):
            raise WorkloadError(self.name, workload.uuid, field, message)
        for name, value in workload.axes.items():
            if name not in self.axes:
                fail(f"axes.{name}", f"{self.name} has no axis {name!r} (axes: {', '.join(self.axes)})")
            if name in self.const_axes and self.const_axes[name] != value:
                fail(f"axes.{name}", f"axis {name!r} is constant {self.const_axes[name]} in {self.name}, not {value}")
        missing = [a for a in self.var_axes if a not in workload.axes]
        if missing:
            fail("axes", f"no value for variable axis {', '.join(map(repr, missing))}")
        for name, spec in workload.inputs.items():
            if name not in self.inputs:
                fail(f"inputs.{name}", f"{self.name} has no input {name!r} (inputs: {', '.join(self.inputs)})")
            self._check_input(name, spec, fail)
        uncovered = [n for n in self.inputs if n not in workload.inputs]
        if uncovered:
            fail("inputs", f"no data source for input {', '.join(map(repr, uncovered))}")
        try:
            self.check_constraints(workload.axes)
        except ConstraintError as exc:
            fail("axes", f"constraint {exc.constraint!r} {exc.reason}")

    def _check_input(self, name: str, source, fail: Callable) -> None:
        spec = self.inputs[name]
        if isinstance(source, ScalarInput):
            if spec.shape is not None:
                fail(f"inputs.{name}", f"a scalar value for tensor input {name!r} (shape {spec.shape})")
            value = source.value
            if spec.dtype == DType.BOOL and not isinstance(value, bool):
                fail(f"inputs.{name}.value", f"{value!r} is not a bool ({name!r} is bool)")
            if spec.dtype.is_int and (isinstance(value, bool) or not isinstance(value, int)):
                fail(f"inputs.{name}.value", f"{value!r} is not an integer ({name!r} is {spec.dtype.value})")
            if spec.dtype.is_float and isinstance(value, bool):
                fail(f"inputs.{name}.value", f"{value!r} is not a number ({name!r} is {spec.dtype.value})")
        elif spec.shape is None:
            fail(f"inputs.{name}", f"{name!r} is a scalar and needs {{\"type\": \"scalar\", \"value\": ...}}, "
                                   f"not {source.type!r}")

    # --- reference and identity ----------------------------------------------------------

    def reference_fn(self) -> Callable:
        """Run the reference source (imports included) and return its ``run`` function."""
        namespace: dict[str, Any] = {"__name__": f"opforge_reference_{self.name}"}
        try:
            exec(compile(self.reference, f"<reference of {self.name}>", "exec"), namespace)  # noqa: S102
        except Exception as exc:
            raise RuntimeError(f"{self.name}: reference failed to load: {type(exc).__name__}: {exc}") from exc
        run = namespace.get("run")
        if not callable(run):
            raise ValueError(f"{self.name}: reference defines no callable 'run'")
        return self._in_input_order(run)

    def _in_input_order(self, run: Callable) -> Callable:
        """``run`` taking its values in the inputs' order. A reference whose parameters carry
        the inputs' names in another order (some public files list ``sm_scale`` last in one and
        not the other) gets them by name, as solutions with named parameters do; the
        positional call would hand each value to the wrong parameter."""
        try:
            params = list(inspect.signature(run).parameters.values())
        except (TypeError, ValueError):
            return run
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        inputs = list(self.inputs)
        if names == inputs or sorted(names) != sorted(inputs) or len(names) != len(params):
            return run
        if any(p.kind is p.POSITIONAL_ONLY for p in params):
            return run

        @functools.wraps(run)
        def by_name(*values):
            return run(**dict(zip(inputs, values)))
        return by_name

    def tolerance(self, output: str) -> Optional[Tolerance]:
        return self.tolerances.get(output)

    def content_hash(self) -> str:
        """SHA-256 of what the Definition means: name, op_type, axes, tensors (shapes and
        dtypes), reference, constraints and opforge's semantic extensions, but not descriptions
        or tags. Recorded in traces to tell which version of a Definition they measured."""
        data = self.hash_form()
        for key in ("description", "tags"):
            data.pop(key, None)
        for group in ("axes", "inputs", "outputs"):
            for item in data.get(group, {}).values():
                item.pop("description", None)
        return hashlib.sha256(canonical_hash_text(data).encode()).hexdigest()
