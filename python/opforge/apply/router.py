"""The Router: routing tables made once at enable time, and serving each call from them.

A route is the ordered choices for one kind of call (a built-in op call's key, or the shapes
of an applied function's call): its workload's solutions, its bucket's, the Definition's
overall best, and finally the fallback (for built-in ops, opforge's own op). The hot path is
one dict lookup; routes for keys never seen are made on the first such call and kept.

Failures: a solution that fails to build, raises, or returns outputs of the wrong shape, dtype
or device is passed over for the next choice. It is blamed (a warning, once, and never tried
again) only when a later choice then serves the call; when everything down to the fallback
fails the call itself was bad, and the fallback's error reaches the caller as it would without
apply. During CUDA-graph capture nothing is built; solutions not built yet are passed over.
"""

from __future__ import annotations

import threading
import warnings
from typing import Optional

import torch

from .._hooks import PROCEED
from ..registry import BACKENDS, build
from ..registry.checks import DeviceInfo
from ..trace import NotFoundError, TraceSet
from ..trace.builtin import builtin_solution_for
from ..trace.templates import definition_for_name
from .config import ApplyConfig
from .functions import Plan, known_definition, order_plan
from .layout import InputLayout
from .matching import builtin_mismatch
from .tables import Ranking, rank_trace_set

_Tensor = torch.Tensor
#: Routes kept for keys that no trace measured; past this many, such routes are made per call.
MEMO_LIMIT = 1 << 16


class ApplyWarning(RuntimeWarning):
    """A solution apply chose could not serve (it is passed over from then on), or a dataset
    holds something apply cannot use."""


class _Choice:
    """One solution of one Definition, built on first use and shared by every route."""

    __slots__ = ("name", "solution", "definition", "direct", "runnable", "broken", "is_own_op")

    def __init__(self, name: str, solution=None, definition=None, direct: bool = False):
        self.name = name
        self.solution = solution
        self.definition = definition
        self.direct = direct
        self.runnable = None
        self.broken = False
        self.is_own_op = None  # whether it is opforge's own op for its Definition (known when asked)


#: opforge's own op, called as the user called it.
_OP = _Choice("opforge's own op", direct=True)


class _Route:
    """The choices for one kind of call. ``checked``: the choice whose outputs were verified on
    it (shapes and dtypes follow from the input shapes, which a route fixes: once is enough)."""

    __slots__ = ("choices", "direct", "outputs", "layout", "checked")

    def __init__(self, choices: tuple, outputs: tuple, layout: Optional[InputLayout] = None):
        self.choices = choices
        self.direct = bool(choices) and choices[0].direct
        self.outputs = outputs  # ((shape or None, torch dtype), ...) each result must have
        self.layout = layout  # checks a built-in call's other arguments against the Definition
        self.checked = None


_OP_ROUTE = _Route((_OP,), ())


class _Serving(threading.local):
    active = False  # this thread is inside a solution serving a built-in op call


class _FunctionTable:
    __slots__ = ("ranking", "layout", "routes")

    def __init__(self, ranking: Ranking, layout: InputLayout):
        self.ranking = ranking
        self.layout = layout
        self.routes: dict[tuple, _Route] = {}  # variable axis values -> route


class Router:
    """Routes calls to the fastest measured solutions of ``trace_set`` on ``device``."""

    def __init__(self, trace_set: TraceSet, config: ApplyConfig, device: DeviceInfo, hardware: str):
        self.trace_set = trace_set
        self.config = config
        self.device = device
        self.hardware = hardware
        self._device_arg = "cpu" if device.kind == "cpu" else f"cuda:{device.index}"
        self._on_cuda = device.kind == "cuda"
        self.rankings, self.counts = rank_trace_set(trace_set, hardware, config)
        self.mismatched: dict[str, str] = {}
        self._builtin: dict[str, Ranking] = {}
        for name, definition in trace_set.definitions.items():
            if definition_for_name(name) is None:
                continue
            why = builtin_mismatch(definition)
            if why is not None:
                self.mismatched[name] = why
            elif name in self.rankings:
                self._builtin[name] = self.rankings[name]
        self._choices: dict[tuple, _Choice] = {}
        self._builtin_hashes: dict[str, Optional[str]] = {}
        self._functions: dict[str, Optional[_FunctionTable]] = {}
        self._order_plans: dict[str, Optional[Plan]] = {}
        self._lock = threading.RLock()
        self._serving = _Serving()
        self._layouts = {name: InputLayout(r.definition, self._on_cuda) for name, r in self.rankings.items()}
        self._builtin_routes: dict[tuple, _Route] = {}
        for name, ranking in self._builtin.items():
            for values in ranking.exact:
                self._builtin_routes[(name, *values)] = self._op_route(ranking, values)

    # --- choices and building -----------------------------------------------------------------

    def _choice(self, definition, name: str) -> Optional[_Choice]:
        key = (definition.name, name)
        choice = self._choices.get(key)
        if choice is None:
            try:
                solution = self.trace_set.get_solution(name)
            except NotFoundError:
                return None
            if solution.definition != definition.name:
                return None
            choice = self._choices[key] = _Choice(name, solution, definition)
        return choice

    def _is_builtin(self, choice: _Choice) -> bool:
        """Whether the solution is exactly what builtin_solution_for makes: opforge's own op for
        the Definition (another mapping onto an op, or an edited copy of the file, is a solution
        like any other)."""
        if choice.is_own_op is None:
            name = choice.definition.name
            if name not in self._builtin_hashes:
                ours = builtin_solution_for(choice.definition)
                self._builtin_hashes[name] = ours.content_hash() if ours is not None else None
            choice.is_own_op = choice.solution.content_hash() == self._builtin_hashes[name]
        return choice.is_own_op

    def _expected_outputs(self, definition, values: tuple) -> tuple:
        shapes = definition.output_shapes(dict(zip(definition.var_axes, values)))
        return tuple((shapes[n], spec.dtype.to_torch()) for n, spec in definition.outputs.items())

    def _capturing(self) -> bool:
        return self._on_cuda and torch.cuda.is_current_stream_capturing()

    def _runnable(self, choice: _Choice):
        """The built solution, building it now if needed (None: broken, or not now)."""
        if choice.runnable is not None:
            return choice.runnable
        if choice.broken or self._capturing():  # building may sync or allocate: not in a graph
            return None
        return self._build_now(choice)

    def _build_now(self, choice: _Choice):
        with self._lock:
            if choice.runnable is None and not choice.broken:
                try:
                    choice.runnable = self._build(choice)
                except Exception as exc:
                    self._break(choice, f"failed to build: {type(exc).__name__}: {exc}")
        return choice.runnable

    def _build(self, choice: _Choice):
        name, definition = choice.name, choice.definition
        # A solution registered from a live function (same content) runs that function itself.
        if name in BACKENDS and BACKENDS.get(name).content_hash() == choice.solution.content_hash():
            return BACKENDS.build(name, definition, device=self._device_arg)
        return build(choice.solution, definition, device=self._device_arg)

    def _break(self, choice: _Choice, why: str) -> None:
        with self._lock:
            if choice.broken:
                return
            choice.broken = True
            choice.runnable = None
        warnings.warn(f"opforge.apply: solution {choice.name!r} of {choice.definition.name} {why}; the next choice "
                      f"serves its calls from now on", ApplyWarning, stacklevel=4)

    def _blame(self, failed: list) -> None:
        for choice, exc in failed:
            self._break(choice, f"raised {type(exc).__name__}: {exc}")

    def build_ahead(self) -> None:
        """Build every solution some route may choose (ApplyConfig.ahead_of_time)."""
        for ranking in self.rankings.values():
            for solution in sorted(ranking.solution_names()):
                choice = self._choice(ranking.definition, solution)
                if choice is not None:
                    self._build_now(choice)

    def _check(self, result, route: _Route, choice: _Choice) -> tuple:
        """The solution's outputs as a tuple, after checking them against the route's expected
        shapes, dtypes and device kind the first time this choice serves the route."""
        values = result if isinstance(result, tuple) else (result,)
        if route.checked is choice:
            return values
        outputs = route.outputs
        if len(values) != len(outputs):
            raise ValueError(f"returned {len(values)} output(s); the Definition has {len(outputs)}")
        for value, (shape, dtype) in zip(values, outputs):
            if shape is None:
                continue
            if not isinstance(value, _Tensor) or value.shape != shape or value.dtype != dtype \
                    or value.is_cuda is not self._on_cuda:
                got = (f"{tuple(value.shape)} {value.dtype} on {value.device}" if isinstance(value, _Tensor)
                       else type(value).__name__)
                raise ValueError(f"returned {got}; expected {shape} {dtype} on {self.device.kind}")
        route.checked = choice
        return values

    # --- built-in op calls (intercept's router protocol) --------------------------------------

    def _op_route(self, ranking: Ranking, values: tuple) -> _Route:
        choices = []
        for name in ranking.choices(values, self.config):
            choice = self._choice(ranking.definition, name)
            if choice is None:
                continue
            if self._is_builtin(choice):  # the op itself: nothing after it is ever needed
                break
            choices.append(choice)
        choices.append(_OP)
        return _Route(tuple(choices), self._expected_outputs(ranking.definition, values),
                      self._layouts[ranking.definition.name])

    def _op_route_for(self, call) -> _Route:
        ranking = self._builtin.get(call.definition)
        route = _OP_ROUTE if ranking is None else self._op_route(ranking, call.key[1:])
        if len(self._builtin_routes) < MEMO_LIMIT:
            self._builtin_routes[call.key] = route
        return route

    def run_builtin(self, call, op, args: tuple, kwargs: dict):
        """What ``op(*args, **kwargs)`` returns, computed by the call's chosen solution."""
        route = self._builtin_routes.get(call.key)
        if route is None:
            route = self._op_route_for(call)
        if route.direct:
            return PROCEED  # opforge's own op is the choice: it runs on without a second entry
        return self._serve_op(route, call, op, args, kwargs)

    def _serve_op(self, route: _Route, call, op, args: tuple, kwargs: dict):
        # An explicit backend is the caller's choice of opforge's own code, and op calls made by a
        # serving solution itself run the op as written.
        serving = self._serving
        if serving.active or kwargs.get("backend", "auto") != "auto":
            return op(*args, **kwargs)
        # The call's name fixes its first tensor's dtype and width; the other tensors (weight,
        # residual) must fit the Definition too. Tensors on another device kind than the traces'
        # run the op.
        named = call.inputs
        if route.layout.read_named(named) is None:
            prepared = route.layout.prepare(tuple(named.values()))
            if prepared is None:
                return op(*args, **kwargs)
            inputs = prepared[1]
        else:
            inputs = named.values()
        failed = None
        for choice in route.choices:
            if choice.direct:
                break
            runnable = choice.runnable or self._runnable(choice)
            if runnable is None:
                continue
            serving.active = True
            try:
                results = runnable(*inputs)
                if route.checked is not choice:
                    self._check(results, route, choice)
            except Exception as exc:
                failed = failed or []
                failed.append((choice, exc))
                continue
            finally:
                serving.active = False
            if failed:
                self._blame(failed)
            return call.finish(results if results.__class__ is tuple else (results,))
        out = op(*args, **kwargs)
        if failed:
            self._blame(failed)
        return out

    # --- applied functions ----------------------------------------------------------------------

    def order_plan(self, name: str) -> Optional[Plan]:
        plan = self._order_plans.get(name, False)
        if plan is False:
            definition = known_definition(name, self)
            plan = self._order_plans[name] = None if definition is None else order_plan(definition)
        return plan

    def _function_table(self, name: str) -> Optional[_FunctionTable]:
        table = self._functions.get(name, False)
        if table is False:
            ranking = self.rankings.get(name)
            table = self._functions[name] = None if ranking is None else _FunctionTable(ranking, self._layouts[name])
        return table

    def _function_route(self, table: _FunctionTable, values: tuple) -> _Route:
        ranking = table.ranking
        choices = tuple(c for c in (self._choice(ranking.definition, n) for n in ranking.choices(values, self.config))
                        if c is not None)
        route = _Route(choices, self._expected_outputs(ranking.definition, values))
        if len(table.routes) < MEMO_LIMIT:
            table.routes[values] = route
        return route

    def run_function(self, plan: Plan, inputs, outputs, fallback, args: tuple, kwargs: dict):
        """An applied function's call: ``inputs`` (and ``outputs`` for a destination-passing call)
        in the Definition's order; ``fallback(*args, **kwargs)`` when no solution serves."""
        table = self._functions.get(plan.name, False)
        if table is False:
            table = self._function_table(plan.name)
        # The Definition the call was bound to must be the one ranked (a resolver may name one
        # the dataset lacks; the built-in template's then binds it, for tracing only).
        if table is None or table.ranking.definition is not plan.definition:
            return self._fallback(plan, fallback, args, kwargs, None)
        layout = table.layout
        values = layout.read(inputs)
        if values is None:
            prepared = layout.prepare(inputs)
            if prepared is None:
                return self._fallback(plan, fallback, args, kwargs, None)
            values, inputs = prepared
        route = table.routes.get(values) or self._function_route(table, values)
        failed = None
        for choice in route.choices:
            runnable = choice.runnable or self._runnable(choice)
            if runnable is None:
                continue
            try:
                if outputs is None:
                    result = runnable(*inputs)
                    if route.checked is not choice:
                        self._check(result, route, choice)
                elif runnable.destination_passing_style and all(o.is_contiguous() for o in outputs):
                    result = runnable.call_into(*inputs, *outputs)
                else:
                    for dest, value in zip(outputs, self._check(runnable(*inputs), route, choice)):
                        dest.copy_(value)
                    result = None
            except Exception as exc:
                failed = failed or []
                failed.append((choice, exc))
                continue
            if failed:
                self._blame(failed)
            return result
        return self._fallback(plan, fallback, args, kwargs, failed)

    def _fallback(self, plan: Plan, fallback, args: tuple, kwargs: dict, failed):
        if fallback is None:
            tried = "; ".join(f"{c.name}: {type(e).__name__}: {e}" for c, e in failed or ())
            raise RuntimeError(f"opforge.apply: no solution of {plan.name} served this call and no fallback was "
                               f"given{' (' + tried + ')' if tried else ''}")
        out = fallback(*args, **kwargs)
        if failed:
            self._blame(failed)
        return out

    # --- introspection --------------------------------------------------------------------------

    def choices(self, definition: str, axes: dict) -> list[str]:
        """The solution names a call of ``definition`` with these variable axis values would try,
        in order (broken ones left out; opforge's own op on built-in calls by its builtin
        solution's name, ``<definition>_builtin``, measured or not)."""
        ranking = self.rankings.get(definition)
        if ranking is None:
            return []
        values = tuple(axes[a] for a in ranking.definition.var_axes)
        if definition in self._builtin:
            route = self._op_route(ranking, values)
            own = builtin_solution_for(ranking.definition).name
            return [(own if c.direct else c.name) for c in route.choices if not c.broken]
        return [n for n in ranking.choices(values, self.config)
                if (c := self._choice(ranking.definition, n)) is not None and not c.broken]

    def runnable(self, definition: str, solution: str):
        """The built Runnable of a solution (None until it has served or was built ahead)."""
        found = self._choices.get((definition, solution))
        return None if found is None else found.runnable
