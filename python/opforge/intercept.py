"""Where built-in op calls meet the forge while tracing or apply is on.

The op layer reads one flag per call (opforge._hooks); while a tracer or a router is set here,
every op call comes to ``_handle``: the call is bound to its Definition (trace.calls), the
tracer records it *before* the op runs (an in-place op would otherwise overwrite the inputs it
recorded), then the router runs the chosen solution, or the op itself runs. With neither set,
the hook is uninstalled and ops pay nothing.

Tracer protocol (opforge.tracing): ``record(call)``, where ``call`` has ``definition`` (name),
``key`` (hashable: name and variable axis values), ``axes``, ``inputs`` (by Definition name)
and ``make_definition()``. It must never raise into the model.
Router protocol (opforge.apply): ``run_builtin(call, op, args, kwargs)`` returns what ``op``
would, or ``PROCEED`` (opforge._hooks) when the op itself is the choice.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _hooks
from ._hooks import PROCEED
from .trace.calls import bind_call

_tracer: Optional[Any] = None
_router: Optional[Any] = None


def tracer():
    return _tracer


def router():
    return _router


def set_tracer(value) -> None:
    global _tracer
    _tracer = value
    _refresh()


def set_router(value) -> None:
    global _router
    _router = value
    _refresh()


def _refresh() -> None:
    _hooks.install(_handle if _tracer is not None or _router is not None else None)


def _handle(op_name: str, op, args: tuple, kwargs: dict):
    call = bind_call(op_name, args, kwargs)
    if call is None:
        return PROCEED
    tracer_, router_ = _tracer, _router
    if tracer_ is not None:
        tracer_.record(call)
    if router_ is not None:
        return router_.run_builtin(call, op, args, kwargs)
    return PROCEED


def enable_from_environment() -> None:
    """OPFORGE_ENABLE_TRACING / OPFORGE_ENABLE_APPLY (opforge.config): switch on what they ask,
    at ``import opforge``. Called only when one of them is set, so a plain import loads none of
    the forge."""
    from . import config

    if config.apply_enabled():
        from .apply import enable_apply_from_environment

        enable_apply_from_environment()
    if config.tracing_enabled():
        from .tracing import enable_tracing_from_environment

        enable_tracing_from_environment()
