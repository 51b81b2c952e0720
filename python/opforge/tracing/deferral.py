"""Signals that arrive while the main thread records a call are handled once the recording is done.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread is:
during a recording, often inside pydantic's validation of the workload, or in a finalizer, where
an exception raised under C code is discarded ("Exception ignored in ..."). SIGINT's
KeyboardInterrupt or a user handler's SystemExit raised there would be lost and the model would
run on. So while the main thread is inside a recording, the tracing's handler only notes the
signal (``defer``), and the recording raises it again on its way out (``Recording.__exit__``),
where whatever handler is installed then runs and its exception leaves the op call as from any
other line. Other threads never run signal handlers and are not affected.
"""

from __future__ import annotations

import signal
import threading

_depth = 0  # nesting of recordings on the main thread
_pending: list = []  # signal numbers noted while _depth > 0, in order of arrival


def defer(signum: int) -> bool:
    """From a signal handler: note `signum` for the end of the recording the main thread is in and
    return True; False when it is in none (handle it now)."""
    if _depth == 0:
        return False
    _pending.append(signum)
    return True


class Recording:
    """``with Recording():`` around the slow path of a recording (re-entrant; any thread)."""

    __slots__ = ("_main",)

    def __enter__(self) -> None:
        global _depth
        self._main = threading.current_thread() is threading.main_thread()  # as control.py asks it
        if self._main:
            _depth += 1

    def __exit__(self, *exc) -> bool:
        global _depth
        if self._main:
            _depth -= 1
            if _depth == 0 and _pending:
                noted = _pending[:]
                _pending.clear()
                # Raised again, not handled here: the handler installed now runs (the tracing's,
                # or the one it gave back if the tracing ended meanwhile). Every noted signal is
                # raised, in order of arrival, even when a handler raises; then the first
                # exception leaves.
                first = None
                for signum in noted:
                    try:
                        signal.raise_signal(signum)  # runs the Python handler before it returns
                    except BaseException as exc:  # noqa: B902 - KeyboardInterrupt and SystemExit too
                        first = exc if first is None else first
                if first is not None:
                    raise first
        return False
