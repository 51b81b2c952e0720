"""The public entry points: apply, enable_apply, disable_apply, enable_apply_from_environment."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Callable, Optional, Union

from .. import config as env
from ..trace import TraceSet
from . import state
from .config import ApplyConfig
from .functions import call, decorate, function_plan
from .matching import hardware_name, resolve_device
from .router import ApplyWarning, Router

logger = logging.getLogger("opforge.apply")


def apply(target: Union[str, Callable[..., str]], args=None, kwargs: Optional[dict] = None,
          fallback: Optional[Callable] = None):
    """Route a call to the fastest solution the enabled dataset measured for its Definition.

    ``target`` is the Definition's name, or a resolver called with the call's arguments that
    returns it. One name, two forms, told apart by the arguments:

    * ``@apply(target)`` (only ``target`` given): decorates a function whose body is the
      fallback, run when apply is off or no solution serves the call::

          @opforge.apply("fused_add_rmsnorm_h4096")
          def fused_add_rmsnorm(hidden_states, residual, weight):
              ...

      Its parameters must take the Definition's inputs by name (further ones need defaults);
      parameters named after the Definition's outputs make calls that pass them
      destination-passing (routed calls then write them and return None). TypeError at
      decoration when the Definition is known then (apply enabled with it, or one of opforge's
      own op names), else when ``enable_apply`` brings it; for a resolver, at the first call
      naming each Definition.

    * ``apply(target, args, kwargs=None, fallback=None)`` (any of args / kwargs / fallback
      given): calls now. ``args`` are the Definition's inputs in its order, then its outputs for
      a destination-passing call (which returns None); ``kwargs`` name them.
      ``fallback(*args, **kwargs)`` runs when no solution serves; without one that is a
      RuntimeError.

    Under torch.compile the fallback runs (it is what gets compiled).
    """
    if args is None and kwargs is None and fallback is None:
        if not (isinstance(target, str) or callable(target)):
            raise TypeError(f"opforge.apply: expected a Definition name or a resolver function, "
                            f"got {type(target).__name__}")
        return decorate(target)
    if not (isinstance(target, str) or callable(target)):
        raise TypeError(f"opforge.apply: expected a Definition name or a resolver function, got {type(target).__name__}")
    if args is not None and not isinstance(args, (tuple, list)):
        raise TypeError(f"opforge.apply({target!r}, args=...): args must be a tuple of the inputs, "
                        f"got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"opforge.apply({target!r}, kwargs=...): kwargs must be a dict, got {type(kwargs).__name__}")
    if fallback is not None and not callable(fallback):
        raise TypeError(f"opforge.apply({target!r}, fallback=...): fallback must be callable, "
                        f"got {type(fallback).__name__}")
    return call(target, tuple(args) if args is not None else (), kwargs if kwargs is not None else {}, fallback)


class ApplyHandle:
    """An enabled dataset. ``close()`` (or leaving its ``with`` block) turns it off again, and the
    one enabled before it, if any, is active again."""

    def __init__(self, router: Router):
        self.router = router

    @property
    def config(self) -> ApplyConfig:
        return self.router.config

    @property
    def hardware(self) -> str:
        """The hardware name whose traces are used."""
        return self.router.hardware

    @property
    def counts(self):
        """What the traces contributed (tables.TraceCounts)."""
        return self.router.counts

    @property
    def mismatched(self) -> dict[str, str]:
        """Definitions named like a built-in op's that say something else, and how they differ:
        built-in calls never go to their solutions."""
        return dict(self.router.mismatched)

    @property
    def active(self) -> bool:
        return state.active is self.router

    def choices(self, definition: str, **axes: int) -> list[str]:
        """The solutions a call with these variable axis values tries, in order."""
        return self.router.choices(definition, axes)

    def runnable(self, definition: str, solution: str):
        """The built Runnable of a solution (None until it has served or was built ahead)."""
        return self.router.runnable(definition, solution)

    def close(self) -> None:
        state.remove(self.router)

    def __enter__(self) -> "ApplyHandle":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        state_ = "active" if self.active else ("enabled" if self.router in state._stack else "closed")
        return (f"<ApplyHandle {state_}: {len(self.router.rankings)} Definition(s) routed on {self.hardware!r}, "
                f"{self.counts.used} trace(s) used>")


def load_dataset(dataset) -> TraceSet:
    """A TraceSet, a dataset folder or a single .json TraceSet file, as a TraceSet with at least
    one Definition; FileNotFoundError / ValueError naming the path otherwise."""
    if isinstance(dataset, TraceSet):
        trace_set = dataset
        where = f"TraceSet {trace_set.root}" if trace_set.root else "the TraceSet given"
    elif isinstance(dataset, (str, Path)):
        path = Path(dataset).expanduser()
        where = str(path)
        if not path.exists():
            raise FileNotFoundError(f"opforge.enable_apply: no dataset at {path} (expected a FlashInfer-Trace "
                                    f"dataset folder or a TraceSet .json file)")
        trace_set = TraceSet.from_path(path) if path.is_dir() else TraceSet.load(path)
    else:
        raise TypeError(f"opforge.enable_apply: expected a dataset path or a TraceSet, got {type(dataset).__name__}")
    if not trace_set.definitions:
        problems = "; ".join(str(e) for e in trace_set.load_errors[:3])
        raise ValueError(f"opforge.enable_apply: {where} holds no Definition (expected definitions/<op_type>/"
                         f"<name>.json and traces/...){': ' + problems if problems else ''}")
    return trace_set


def _check_applied(router: Router) -> None:
    """Fallbacks decorated before their Definition was known meet it now."""
    for applied in list(state.applied):
        definition = router.trace_set.definitions.get(applied.target) if isinstance(applied.target, str) else None
        if definition is not None:
            function_plan(definition, applied.fn, applied.label)


def _announce(router: Router) -> None:
    counts = router.counts
    where = str(router.trace_set.root) if router.trace_set.root else "the TraceSet given"
    if counts.unknown_solution:
        warnings.warn(f"opforge.enable_apply: {counts.unknown_solution} trace(s) in {where} name solutions the "
                      f"dataset does not hold; they were skipped", ApplyWarning, stacklevel=3)
    for name, why in router.mismatched.items():
        warnings.warn(f"opforge.enable_apply: the dataset's Definition {name!r} is not what opforge's own op calls "
                      f"of that name compute ({why}); built-in calls are not routed to its solutions",
                      ApplyWarning, stacklevel=3)
    logger.info("apply: %d Definition(s) routed (%d for opforge's own ops) from traces on %r; traces: %d used, "
                "%d failed, %d suspect, %d superseded, %d from other hardware, %d naming unknown solutions",
                len(router.rankings), len(router._builtin), router.hardware, counts.used, counts.failed,
                counts.suspect, counts.superseded, counts.other_hardware, counts.unknown_solution)


def enable_apply(dataset=None, config: Optional[ApplyConfig] = None) -> ApplyHandle:
    """Route calls to the fastest solutions measured in ``dataset`` (a dataset folder, a TraceSet
    .json file, or a TraceSet; default: $OPFORGE_DATASET_PATH, else ./opforge-trace).

    Tables are made now, from the PASSED traces measured on this hardware (see ApplyConfig).
    Returns an ApplyHandle: use it as a context manager, or ``close()`` it; enabling again
    while enabled nests (closing the inner one makes the outer one active again).
    """
    config = config if config is not None else ApplyConfig()
    if not isinstance(config, ApplyConfig):
        raise TypeError(f"opforge.enable_apply: config must be an ApplyConfig, got {type(config).__name__}")
    trace_set = load_dataset(dataset if dataset is not None else env.dataset_path())
    device = resolve_device(config.device)
    router = Router(trace_set, config, device, config.hardware or hardware_name(device))
    _check_applied(router)
    _announce(router)
    if config.ahead_of_time:
        router.build_ahead()
    state.push(router)
    return ApplyHandle(router)


def disable_apply() -> None:
    """Turn apply off: every enabled dataset, nested ones included. Built-in ops are called
    directly again (their hook is uninstalled unless tracing is on)."""
    state.clear()


def enable_apply_from_environment() -> Optional[ApplyHandle]:
    """OPFORGE_ENABLE_APPLY=1 at ``import opforge``: enable the dataset at $OPFORGE_DATASET_PATH
    with the default ApplyConfig. A missing or unreadable dataset is a warning, not an error:
    an environment variable must not make ``import opforge`` fail; apply then stays off."""
    try:
        return enable_apply(env.dataset_path())
    except (OSError, ValueError) as exc:
        warnings.warn(f"opforge: {env.APPLY_VARS[0]} is set but apply stays off: {exc}", RuntimeWarning, stacklevel=2)
        return None
