"""Turning tracing on and off, and making sure that what was kept reaches the disk.

Tracings nest: ``enable_tracing`` while one is on flushes it and takes over the op hook; when the
inner one closes (its ``with`` block ends, or ``close()``), the outer one records again.
``disable_tracing()`` closes every tracing that is on, innermost first.

Everything a tracing accepted is written before the process ends normally (atexit), on SIGTERM
and on SIGINT. The signal handlers are installed while a tracing is on (main thread only) and
chain to the handlers they replaced: after flushing, a Python handler is called (SIGINT's
default raises KeyboardInterrupt as before); where the previous disposition was the default
one, the summary is printed and the signal is raised again with the default disposition, so a
SIGTERM still terminates the process, with the status it would have had. An ignored signal
stays ignored. Handlers installed from C (which Python cannot call) are left in place, and
then that signal does not flush. A signal that arrives while the main thread is recording a call
is handled as soon as that recording is done (deferral.py).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from pathlib import Path
from typing import Optional, Union

from .. import config, intercept
from . import deferral
from .policy import TracingConfig
from .tracer import Tracer, say, warn

DEFAULT_MAX_PENDING_WORKLOADS = 1024
DEFAULT_MAX_PENDING_BYTES = 512 << 20
_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = threading.RLock()
_stack: list[Tracer] = []
_previous: dict = {}  # signal -> the handler ours replaced
_atexit_registered = False


def enable_tracing(*, tracing_configs: Optional[dict] = None, dataset_dir: Union[str, os.PathLike, None] = None,
                   dataset_path: Union[str, os.PathLike, None] = None,
                   max_pending_workloads: int = DEFAULT_MAX_PENDING_WORKLOADS,
                   max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> Tracer:
    """Trace op calls into a dataset folder until the returned Tracer is closed.

    tracing_configs: Definition name -> TracingConfig; only those Definitions are traced.
        None traces every Definition with ``TracingConfig()`` (one workload per shape, non-float
        tensors saved).
    dataset_dir: the folder (``dataset_path`` is accepted as FlashInfer-Bench's name for it);
        default OPFORGE_DATASET_PATH, else ./opforge-trace. A folder that cannot be written gives
        a warning and a Tracer that traces nothing (``active`` False); the model runs as usual.
    max_pending_workloads / max_pending_bytes: bounds on what waits for the writer thread
        (workloads, and bytes of tensor copies); a workload that does not fit is dropped and
        counted.

    Use it as a context manager (``with enable_tracing(...):``) or call ``close()`` /
    ``disable_tracing()``. Raises ValueError / TypeError for bad arguments, including a
    TracingConfig listing inputs that a Definition known at this point lacks.
    """
    configs = _checked_configs(tracing_configs)
    if dataset_dir is not None and dataset_path is not None:
        raise TypeError("enable_tracing: give dataset_dir or dataset_path, not both")
    folder = dataset_dir if dataset_dir is not None else dataset_path
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"enable_tracing: dataset_dir must be a path, not {type(folder).__name__}")
    for name, value in (("max_pending_workloads", max_pending_workloads), ("max_pending_bytes", max_pending_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"enable_tracing: {name} must be an integer, not {type(value).__name__}")
        if value < 1:
            raise ValueError(f"enable_tracing: {name}={value}; it must be at least 1")
    root = Path(folder).expanduser() if folder is not None else config.dataset_path()
    tracer = Tracer(root, configs, max_pending_workloads, max_pending_bytes, _release)
    if not tracer.start():
        return tracer
    with _lock:
        if _stack:
            _stack[-1].flush()
        _stack.append(tracer)
        intercept.set_tracer(tracer)
        _install_exit_hooks()
    return tracer


def disable_tracing() -> None:
    """Close every tracing that is on (innermost first): write what they kept, print their
    summaries. Does nothing when none is on."""
    while True:
        with _lock:
            if not _stack:
                return
            tracer = _stack[-1]
        tracer.close()


def current_tracer() -> Optional[Tracer]:
    """The tracing that records calls now (None when tracing is off)."""
    with _lock:
        return _stack[-1] if _stack else None


def enable_tracing_from_environment() -> Optional[Tracer]:
    """OPFORGE_ENABLE_TRACING=1 (or FlashInfer-Bench's names): trace every Definition with the
    default TracingConfig into OPFORGE_DATASET_PATH (default ./opforge-trace) until the process
    exits. Called at ``import opforge``; never raises (a problem is a warning, tracing off)."""
    try:
        return enable_tracing(dataset_dir=config.dataset_path())
    except Exception as exc:
        warn(f"tracing from the environment could not start: {type(exc).__name__}: {exc}; tracing is off")
        return None


def _checked_configs(configs) -> Optional[dict]:
    if configs is None:
        return None
    if not isinstance(configs, dict):
        raise TypeError(f"enable_tracing: tracing_configs must be a dict of Definition name -> TracingConfig, "
                        f"not {type(configs).__name__}")
    for name, value in configs.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"enable_tracing: tracing_configs keys are Definition names, not {name!r}")
        if not isinstance(value, TracingConfig):
            raise TypeError(f"enable_tracing: tracing_configs[{name!r}] must be a TracingConfig, not "
                            f"{type(value).__name__}")
    return dict(configs)


def _release(tracer: Tracer) -> None:
    """Take a closing tracer off the hook; the one it nested in (if any) records again."""
    with _lock:
        if tracer in _stack:
            _stack.remove(tracer)
            intercept.set_tracer(_stack[-1] if _stack else None)
        if not _stack:
            _restore_signal_handlers()


# --- process exit and signals ------------------------------------------------------------------


def _install_exit_hooks() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(disable_tracing)
        _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can be set from the main thread only
    for signum in _SIGNALS:
        if signum in _previous:
            continue
        previous = signal.getsignal(signum)
        if previous is None:
            continue  # a handler installed from C: leave it
        signal.signal(signum, _on_signal)
        _previous[signum] = previous


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)
        del _previous[signum]


def _on_signal(signum, frame) -> None:
    # Runs in the main thread between two bytecodes. Inside a recording the signal is raised again
    # when the recording is done (deferral.py says why); else it is handled now, possibly inside
    # record()'s fast path: no tracer lock is taken here, only the writers' re-entrant ones.
    if deferral.defer(signum):
        return
    with _lock:
        tracers = list(reversed(_stack))
    for tracer in tracers:
        tracer.flush()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    for tracer in tracers:
        tracer.print_summary()
    say(f"received {signal.Signals(signum).name}: every kept workload is written")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
