"""Op templates: how a public op's arguments map onto a Definition, so one template generates
the Definition for any concrete constant sizes (``rmsnorm_h4096``), reads the axis values of a
live call, and describes that call as a Workload.

    rmsnorm_template = TraceTemplate(
        op_type="rmsnorm", name_prefix="rmsnorm", op=opforge.rmsnorm,
        axes={"batch_size": Var(), "hidden_size": Const(abbrev="h")},
        inputs={"hidden_states": Tensor(["batch_size", "hidden_size"], param="input"),
                "weight": Tensor(["hidden_size"])},
        outputs={"output": Tensor(["batch_size", "hidden_size"], dtype_from="hidden_states")},
        reference=...,   # callable(const_values) -> Python source defining run(...)
    )
    rmsnorm_template.definition(hidden_size=4096, dtype="bfloat16")   # -> Definition rmsnorm_h4096

Naming follows FlashInfer-Trace: the prefix, then each constant axis with a non-empty abbrev
as ``<abbrev><value>``, joined by underscores. Leading dimensions of a call that the template
folds into one axis (``[batch, seq, hidden]`` -> ``batch_size``) are multiplied together.
"""

from __future__ import annotations

import inspect
import uuid as uuid_lib
from dataclasses import dataclass, field
from typing import Callable, Optional

from .dtypes import DType
from .schema import AxisConst, AxisVar, Definition, TensorSpec
from .workload import RandomInput, ScalarInput, Workload

DEFAULT_DTYPE = "bfloat16"
#: What a Definition's name says about its dtype.
DTYPE_SUFFIX = {"bfloat16": "", "float16": "_f16", "float32": "_f32"}


@dataclass(frozen=True)
class Var:
    """An axis whose value varies per call (left out of the Definition's name)."""

    description: Optional[str] = None


@dataclass(frozen=True)
class Const:
    """An axis fixed per Definition; ``abbrev`` names it in the Definition's name ("h" -> h4096;
    "" leaves it out of the name)."""

    abbrev: str = ""
    description: Optional[str] = None


@dataclass(frozen=True)
class Tensor:
    """A tensor of the Definition bound to an op parameter.

    shape: axis names; the first one may absorb extra leading dimensions of a call (``fold``).
    param: the op's parameter name (default: the Definition's key). dtype: a fixed dtype, or
    dtype_from: the key of an input whose dtype it shares (default: the template's dtype).
    """

    shape: Optional[list] = None
    param: Optional[str] = None
    dtype: Optional[str] = None
    dtype_from: Optional[str] = None
    description: Optional[str] = None
    fold_leading: bool = True


@dataclass(frozen=True)
class Scalar:
    """A scalar input of the Definition bound to an op parameter (e.g. eps)."""

    param: Optional[str] = None
    dtype: str = "float32"
    description: Optional[str] = None


@dataclass
class TraceTemplate:
    op_type: str
    name_prefix: str
    op: Callable
    axes: dict
    inputs: dict
    outputs: dict
    reference: Callable[[dict], str]
    description: Callable[[dict], str] | str = ""
    tags: list = field(default_factory=list)
    #: Keys of ``inputs`` / ``outputs`` the generated Definition leaves out for these constant
    #: values (for names that already exist publicly in a narrower form, e.g. eps baked in).
    omit: Callable[[dict], tuple] = lambda consts: ()
    #: Axes that follow from others (e.g. a gated width of 2 * intermediate_size and back).
    derive: Callable[[dict], dict] = lambda consts: {}
    #: Extra Definition fields (constraints, tolerances, aliases, bytes, flops) for these constant
    #: values (bytes default to each tensor read or written once: Definition.io_bytes).
    extras: Callable[[dict], dict] = lambda consts: {}
    #: Boolean options that select a form of the Definition beside the constant axes (e.g. the
    #: norms' ``eps_input``: eps as an input where the public name bakes it in), and the name
    #: suffix a set of options gives.
    options: tuple = ()
    option_suffix: Callable[[dict], str] = lambda consts: ""

    # --- naming ------------------------------------------------------------------------

    @property
    def const_axes(self) -> list[str]:
        return [a for a, kind in self.axes.items() if isinstance(kind, Const)]

    def name(self, dtype: str = DEFAULT_DTYPE, **consts) -> str:
        """``<prefix>_<abbrev><value>...``, then the options' suffix, then ``_f16`` / ``_f32`` for
        a dtype other than bfloat16 (FlashInfer-Trace's names leave bfloat16 unsaid)."""
        consts = {**self.derive(consts), **consts}
        parts = [self.name_prefix]
        for axis in self.const_axes:
            if axis not in consts:
                raise ValueError(f"{self.name_prefix}: constant axis {axis!r} needs a value")
            abbrev = self.axes[axis].abbrev
            if abbrev:
                parts.append(f"{abbrev}{int(consts[axis])}")
        if dtype not in DTYPE_SUFFIX:
            raise ValueError(f"{self.name_prefix}: dtype {dtype!r} is not one of {', '.join(DTYPE_SUFFIX)}")
        return "_".join(parts) + self.option_suffix(consts) + DTYPE_SUFFIX[dtype]

    # --- Definitions -------------------------------------------------------------------

    def definition(self, dtype: str = DEFAULT_DTYPE, **consts) -> Definition:
        consts = {**self.derive(consts), **consts}
        unknown = set(consts) - set(self.const_axes) - set(self.options)
        if unknown:
            raise ValueError(f"{self.name_prefix}: {sorted(unknown)} are not constant axes or options of this template")
        axes = {}
        for axis, kind in self.axes.items():
            if isinstance(kind, Const):
                axes[axis] = AxisConst(value=int(consts[axis]), description=kind.description)
            else:
                axes[axis] = AxisVar(description=kind.description)
        omitted = set(self.omit(consts))
        inputs = {key: self._spec(spec, dtype, {}) for key, spec in self.inputs.items() if key not in omitted}
        outputs = {key: self._spec(spec, dtype, inputs) for key, spec in self.outputs.items() if key not in omitted}
        description = self.description(consts) if callable(self.description) else self.description
        return Definition(
            name=self.name(dtype, **consts),
            op_type=self.op_type,
            description=description or None,
            axes=axes,
            inputs=inputs,
            outputs=outputs,
            reference=self.reference(consts),
            tags=list(self.tags),
            **self.extras(consts),
        )

    def _spec(self, spec, dtype: str, inputs: dict) -> TensorSpec:
        if isinstance(spec, Scalar):
            return TensorSpec(shape=None, dtype=DType(spec.dtype), description=spec.description)
        if spec.dtype is not None:
            dt = DType(spec.dtype)
        elif spec.dtype_from is not None:
            dt = inputs[spec.dtype_from].dtype if spec.dtype_from in inputs else DType(dtype)
        else:
            dt = DType(dtype)
        return TensorSpec(shape=list(spec.shape) if spec.shape is not None else None, dtype=dt,
                          description=spec.description)

    # --- live calls --------------------------------------------------------------------

    def param_of(self, key: str) -> str:
        spec = self.inputs.get(key) or self.outputs[key]
        return spec.param or key

    def bind(self, *args, **kwargs) -> dict:
        """The op's arguments of a call by parameter name (defaults filled in)."""
        signature = inspect.signature(self.op)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def axis_values(self, *args, **kwargs) -> dict[str, int]:
        """Every axis's value in a call of the op (constant and variable)."""
        params = self.bind(*args, **kwargs)
        values: dict[str, int] = {}
        for key, spec in self.inputs.items():
            if not isinstance(spec, Tensor) or spec.shape is None:
                continue
            tensor = params.get(spec.param or key)
            if tensor is None:
                continue
            shape = list(tensor.shape)
            dims = spec.shape
            if len(shape) < len(dims):
                raise ValueError(f"{self.name_prefix}: {key} has shape {tuple(shape)}; expected dimensions {dims}")
            if len(shape) > len(dims):
                if not spec.fold_leading:
                    raise ValueError(f"{self.name_prefix}: {key} has shape {tuple(shape)}; expected dimensions {dims}")
                lead = 1
                for d in shape[: len(shape) - len(dims) + 1]:
                    lead *= int(d)
                shape = [lead] + shape[len(shape) - len(dims) + 1:]
            for axis, size in zip(dims, shape):
                if axis in values and values[axis] != int(size):
                    raise ValueError(f"{self.name_prefix}: axis {axis!r} is {values[axis]} in one tensor and {size} in {key}")
                values[axis] = int(size)
        values = {**self.derive(values), **values}
        missing = set(self.axes) - set(values)
        if missing:
            raise ValueError(f"{self.name_prefix}: the call does not determine axes {sorted(missing)}")
        return values

    def definition_for_call(self, *args, **kwargs) -> Definition:
        values = self.axis_values(*args, **kwargs)
        params = self.bind(*args, **kwargs)
        first = next(params[s.param or k] for k, s in self.inputs.items() if isinstance(s, Tensor))
        dtype = str(first.dtype).removeprefix("torch.")
        return self.definition(dtype=dtype, **{a: values[a] for a in self.const_axes if a in values})

    def workload_for_call(self, *args, seed: Optional[int] = None, **kwargs) -> Workload:
        """The call as a Workload: variable axis values, random tensors, scalars by value."""
        definition = self.definition_for_call(*args, **kwargs)
        values = self.axis_values(*args, **kwargs)
        params = self.bind(*args, **kwargs)
        inputs = {}
        for key in definition.inputs:
            spec = self.inputs[key]
            if isinstance(spec, Scalar):
                inputs[key] = ScalarInput(value=float(params[spec.param or key]))
            else:
                inputs[key] = RandomInput()
        var_axes = {a: v for a, v in values.items() if isinstance(self.axes[a], Var)}
        return Workload(uuid=str(uuid_lib.uuid4()), axes=var_axes, inputs=inputs, seed=seed)
