"""Calls of ``@apply`` functions and of imperative ``apply(...)``: binding their arguments to a
Definition's inputs (and outputs, for destination-passing calls), reading the axis values, and
what the tracer records.

Binding is planned once per (function, Definition) and is plain tuple and dict work per call.
A fallback decorated with ``@apply(name)`` must take the Definition's inputs by name (any order;
further parameters need defaults); parameters named like the Definition's outputs make it a
destination-passing function. A fallback taking ``*args`` takes the Definition's inputs, then
its outputs, positionally, as the imperative form does. A call that passes a parameter the
Definition does not describe runs the fallback: no solution knows what it means.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch

from .. import intercept
from ..trace import Definition
from . import state
from .layout import InputLayout
from ..trace.templates import definition_for_name

_is_compiling = torch.compiler.is_compiling
_MISSING = object()


class Plan:
    """How the arguments of one function's calls become a Definition's inputs and outputs."""

    def __init__(self, definition: Definition, positional: list[str], defaults: dict):
        self.definition = definition
        self.name = definition.name
        self.layout = InputLayout(definition)
        self.inputs = list(definition.inputs)
        self.outputs = list(definition.outputs)
        self.positional = positional
        self.defaults = defaults
        n_in, n_out = len(self.inputs), len(self.outputs)
        self.n_in, self.n_out = n_in, n_out
        self.inputs_in_order = positional[:n_in] == self.inputs
        self.outputs_in_order = self.inputs_in_order and positional[n_in:n_in + n_out] == self.outputs

    def bind(self, args: tuple, kwargs: dict):
        """(inputs, outputs or None) in the Definition's order, or None: the call cannot be
        routed (the fallback then runs, raising its own error for a call it refuses)."""
        if not kwargs:
            if len(args) == self.n_in and self.inputs_in_order:
                return args, None
            if len(args) == self.n_in + self.n_out and self.outputs_in_order:
                return args[:self.n_in], args[self.n_in:]
        if len(args) > len(self.positional):
            return None
        bound = dict(zip(self.positional, args))
        for key, value in kwargs.items():
            if key in bound:
                return None
            bound[key] = value
        inputs = []
        for name in self.inputs:
            value = bound.pop(name, _MISSING)
            if value is _MISSING:
                value = self.defaults.get(name, _MISSING)
                if value is _MISSING:
                    return None
            inputs.append(value)
        outputs = [bound.pop(name, None) for name in self.outputs]
        if bound:  # arguments the Definition does not describe
            return None
        given = sum(o is not None for o in outputs)
        if given == 0:
            return inputs, None
        return (inputs, outputs) if given == len(outputs) else None


def order_plan(definition: Definition) -> Plan:
    """Arguments in the Definition's order: inputs, then outputs (the imperative form, and
    fallbacks taking ``*args``)."""
    names = [*definition.inputs, *definition.outputs]
    return Plan(definition, names, {})


def function_plan(definition: Definition, fn: Callable, label: str) -> Plan:
    """The Plan of ``fn``'s calls; TypeError when its parameters cannot take the Definition's
    inputs (see the module doc)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: take the Definition's order
        return order_plan(definition)
    kinds = {p.kind for p in params.values()}
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return order_plan(definition)
    described = set(definition.inputs) | set(definition.outputs)
    missing = [n for n in definition.inputs if n not in params]
    if inspect.Parameter.VAR_KEYWORD in kinds:
        missing = []
    unfilled = [p.name for p in params.values() if p.default is p.empty and p.name not in described
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing or unfilled:
        problems = []
        if missing:
            problems.append(f"no parameter for input(s) {', '.join(missing)}")
        if unfilled:
            problems.append(f"parameter(s) {', '.join(unfilled)} are no input or output of it and have no default")
        raise TypeError(f"{label}: {getattr(fn, '__qualname__', fn)}{inspect.signature(fn)} does not fit "
                        f"Definition {definition.name!r} (inputs: {', '.join(definition.inputs)}; outputs: "
                        f"{', '.join(definition.outputs)}): {'; '.join(problems)}")
    positional = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    defaults = {p.name: p.default for p in params.values() if p.default is not p.empty}
    return Plan(definition, positional, defaults)


def known_definition(name: str, router) -> Optional[Definition]:
    """The Definition a call names: the enabled dataset's, else the built-in op's of that name."""
    if router is not None:
        definition = router.trace_set.definitions.get(name)
        if definition is not None:
            return definition
    return definition_for_name(name)


class FunctionCall:
    """One call of an applied function as the tracer sees it (intercept's tracer protocol)."""

    __slots__ = ("definition", "key", "axes", "inputs", "_definition")

    def __init__(self, plan: Plan, values: tuple, inputs):
        self.definition = plan.name
        self.key = (plan.name, *values)
        self.axes = dict(zip(plan.layout.var_axes, values))
        self.inputs = dict(zip(plan.inputs, inputs))
        self._definition = plan.definition

    def make_definition(self) -> Definition:
        return self._definition

    def __repr__(self) -> str:
        return f"FunctionCall({self.definition}, axes={self.axes})"


def _record(tracer, plan: Plan, inputs) -> None:
    values = plan.layout.values(inputs)
    if values is not None:  # a call that does not fit the Definition is no workload of it
        tracer.record(FunctionCall(plan, values, inputs))


def dispatch(plan: Optional[Plan], router, args: tuple, kwargs: dict, fallback: Optional[Callable]):
    """Record the call for the tracer, then route it (or run the fallback)."""
    if plan is None:
        return _fallback(None, fallback, args, kwargs)
    bound = plan.bind(args, kwargs)
    if bound is None:
        return _fallback(plan.name, fallback, args, kwargs)
    inputs, outputs = bound
    tracer = intercept.tracer()
    if tracer is not None:
        _record(tracer, plan, inputs)
    if router is None:
        return _fallback(plan.name, fallback, args, kwargs)
    return router.run_function(plan, inputs, outputs, fallback, args, kwargs)


def _fallback(name: Optional[str], fallback: Optional[Callable], args: tuple, kwargs: dict):
    if fallback is None:
        raise RuntimeError(f"opforge.apply: no solution serves this call of {name or 'an unknown Definition'} "
                           f"and no fallback was given")
    return fallback(*args, **kwargs)


def _resolved(resolver: Callable, args: tuple, kwargs: dict) -> str:
    name = resolver(*args, **kwargs)
    if not isinstance(name, str):
        raise TypeError(f"opforge.apply: the resolver returned {name!r}; expected a Definition name (str)")
    return name


class Applied:
    """What ``@apply(name_or_resolver)`` keeps for one fallback: its Plans per Definition name,
    made when the Definition becomes known and dropped when the enabled dataset changes."""

    def __init__(self, target, fn: Callable):
        self.target = target
        self.fn = fn
        self.label = f"opforge.apply({target!r})" if isinstance(target, str) else "opforge.apply(<resolver>)"
        self.plans: dict[str, Optional[Plan]] = {}

    def forget_plans(self) -> None:
        self.plans = {}

    def plan(self, name: str, router) -> Optional[Plan]:
        plans = self.plans
        if name in plans:
            return plans[name]
        definition = known_definition(name, router)
        plan = plans[name] = None if definition is None else function_plan(definition, self.fn, self.label)
        return plan

    def __call__(self, router, args: tuple, kwargs: dict):
        # dispatch() written out: this runs on every call of an applied function while apply or
        # tracing is on, and each Python frame costs about a tenth of the routing budget.
        target = self.target
        name = target if target.__class__ is str else _resolved(target, args, kwargs)
        plan = self.plans.get(name) or self.plan(name, router)
        if plan is None:
            return self.fn(*args, **kwargs)
        bound = plan.bind(args, kwargs)
        if bound is None:
            return self.fn(*args, **kwargs)
        tracer = intercept.tracer()
        if tracer is not None:
            _record(tracer, plan, bound[0])
        if router is None:
            return self.fn(*args, **kwargs)
        return router.run_function(plan, bound[0], bound[1], self.fn, args, kwargs)


def decorate(target) -> Callable[[Callable], Callable]:
    """``@apply(name_or_resolver)``: the decorated function is the fallback; calls route to the
    fastest measured solution while apply is enabled (see opforge.apply)."""
    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"opforge.apply({target!r}) decorates a function; got {type(fn).__name__}")
        applied = Applied(target, fn)
        if isinstance(target, str):
            applied.plan(target, state.active)  # TypeError now when the Definition is known
        # Weakly held: the wrapper's closure keeps it alive exactly as long as the function.
        state.applied.add(applied)

        @functools.wraps(fn)
        def routed(*args, **kwargs):
            router = state.active
            if router is None and intercept.tracer() is None:
                return fn(*args, **kwargs)
            if _is_compiling():  # the fallback is what torch.compile traces (see opforge.apply)
                return fn(*args, **kwargs)
            return applied(router, args, kwargs)

        routed.__wrapped__ = fn
        return routed

    return decorator


def call(target, args: tuple, kwargs: dict, fallback: Optional[Callable]):
    """Imperative ``apply(name_or_resolver, args, kwargs, fallback)``."""
    router = state.active
    if router is None and intercept.tracer() is None or _is_compiling():
        return _fallback(target if isinstance(target, str) else None, fallback, args, kwargs)
    name = target if isinstance(target, str) else _resolved(target, args, kwargs)
    plan = router.order_plan(name) if router is not None else _template_order_plan(name)
    return dispatch(plan, router, args, kwargs, fallback)


@functools.lru_cache(maxsize=None)
def _template_order_plan(name: str) -> Optional[Plan]:
    definition = definition_for_name(name)
    return None if definition is None else order_plan(definition)
