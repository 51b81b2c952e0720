"""Language builtin: one of opforge's own ahead-of-time compiled ops.

The entry point is ``<adapter>.json::<op>``, e.g. ``builtin.json::rmsnorm``: the op is a public
function of ``opforge`` (``rmsnorm``, ``fused_add_rmsnorm``, ...) and the adapter a JSON source
of the solution saying how the Definition's names meet the op's parameters. Every key is
optional (``{}`` takes the defaults)::

    {
      "inputs":    {"hidden_states": "input",    Definition input -> op parameter
                    "scale_a_permuted": null},   (default: the same name, else DEFAULT_ALIASES);
                                                 null: an input the op does not take, left out
                                                 of the call (a second layout of the same data
                                                 that other solutions read instead)
      "constants": {"eps": 1e-5},                further keyword arguments of every call
      "outputs":   ["output", null]              what the op returns, in order: a Definition
                                                 output's name, or null for a value the
                                                 Definition does not have (default: the
                                                 Definition's outputs in its order)
    }

``builtin_solution()`` (opforge.registry) writes such Solutions. They are value-returning and
run wherever this opforge build runs: CPU, and the GPUs its CUDA_ARCH_LIST covers (checked
before anything runs).
"""

from __future__ import annotations

import inspect
import json

from ..checks import POSITIONAL
from ..errors import ENTRY_POINT_ERROR, SIGNATURE_ERROR, UNSUPPORTED, BuildError
from . import Loaded

#: Definition input names that opforge's ops spell differently (FlashInfer-Trace names first).
DEFAULT_ALIASES = {"hidden_states": "input"}

_KEYS = {"inputs", "constants", "outputs"}


def _adapter(solution, entry_file: str) -> dict:
    source = next((s for s in solution.sources if s.path == entry_file), None)
    if source is None:
        return {}
    try:
        adapter = json.loads(source.content or "{}")
    except ValueError as exc:
        raise BuildError(ENTRY_POINT_ERROR, solution.name, f"{entry_file} is not valid JSON: {exc}") from None
    if not isinstance(adapter, dict) or set(adapter) - _KEYS:
        extra = sorted(set(adapter) - _KEYS) if isinstance(adapter, dict) else "not an object"
        raise BuildError(ENTRY_POINT_ERROR, solution.name,
                         f"{entry_file}: unknown key(s) {extra}; accepted: {', '.join(sorted(_KEYS))}")
    return adapter


def _op(solution, name: str):
    from ... import ops

    if name not in ops.__all__:
        raise BuildError(ENTRY_POINT_ERROR, solution.name, f"opforge has no op {name!r} (ops: {', '.join(ops.__all__)})")
    return getattr(ops, name)


def check_device(solution, device) -> None:
    """A builtin op runs on CPU always, on a GPU only when this build has code for it."""
    if device.kind != "cuda":
        return
    from ... import _ext

    problem = _ext.arch_problem(device.index)
    if problem is not None:
        raise BuildError(UNSUPPORTED, solution.name, f"opforge's own ops cannot run here: {problem}")


def load(solution, definition, entry_file: str, symbol: str) -> Loaded:
    if solution.spec.destination_passing_style:
        raise BuildError(SIGNATURE_ERROR, solution.name, "builtin solutions are value-returning; "
                         "unset destination_passing_style")
    adapter = _adapter(solution, entry_file)
    op = _op(solution, symbol)
    params = inspect.signature(op).parameters
    mapping = dict(adapter.get("inputs", {}))
    for name in definition.inputs:
        if name not in mapping:
            mapping[name] = name if name in params else DEFAULT_ALIASES.get(name, name)
    constants = dict(adapter.get("constants", {}))
    unknown = [f"{k} -> {v}" for k, v in mapping.items() if v is not None and v not in params]
    unknown += [k for k in constants if k not in params]
    if unknown or set(mapping) - set(definition.inputs):
        problem = (f"parameter(s) {', '.join(unknown)} not in opforge.{symbol}({', '.join(params)}); "
                   f"map each input to a parameter under \"inputs\" in {entry_file}, or to null to leave it out"
                   if unknown
                   else f"adapter maps unknown input(s) {', '.join(sorted(set(mapping) - set(definition.inputs)))}")
        raise BuildError(SIGNATURE_ERROR, solution.name, problem)
    passed = [v for v in mapping.values() if v is not None]
    twice = sorted({p for p in passed if passed.count(p) > 1} | (set(passed) & set(constants)))
    if twice:
        raise BuildError(SIGNATURE_ERROR, solution.name,
                         f"opforge.{symbol} parameter(s) {', '.join(twice)} would be given more than once "
                         f"(map one Definition input to each, null for inputs the op does not take)")
    given = set(passed) | set(constants)
    missing = [p.name for p in params.values() if p.default is p.empty and p.name not in given
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise BuildError(SIGNATURE_ERROR, solution.name,
                         f"opforge.{symbol} needs {', '.join(missing)}, which no Definition input maps to "
                         f"(map it under \"inputs\" or set it under \"constants\" in {entry_file})")
    outputs = list(adapter.get("outputs", definition.outputs))
    if sorted(o for o in outputs if o is not None) != sorted(definition.outputs):
        raise BuildError(SIGNATURE_ERROR, solution.name,
                         f"adapter outputs {outputs} do not name each of the Definition's outputs "
                         f"{list(definition.outputs)} once (null marks a returned value to drop)")
    # (op parameter, position among the Definition's inputs) of each input the op takes.
    taken = [(mapping[n], i) for i, n in enumerate(definition.inputs) if mapping[n] is not None]
    order = [outputs.index(n) for n in definition.outputs]

    def call(*args):
        kwargs = {param: args[i] for param, i in taken}
        result = op(**kwargs, **constants)
        values = result if isinstance(result, tuple) else (result,)
        if len(values) != len(outputs):
            raise ValueError(f"solution {solution.name!r}: opforge.{symbol} returned {len(values)} value(s); "
                             f"its adapter lists {len(outputs)}: {outputs}")
        picked = tuple(values[i] for i in order)
        return picked[0] if len(picked) == 1 else picked

    call.__name__ = f"builtin_{symbol}"
    return Loaded(call, calling=POSITIONAL)
