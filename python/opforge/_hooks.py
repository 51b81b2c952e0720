"""The one switch every built-in op reads per call, so tracing and apply cost nothing while off.

``active`` is a plain module attribute: while it is False an op call pays one attribute load and
a branch. The forge (opforge.intercept) turns it on while tracing or apply is enabled and sets
``handler``; the op layer never imports the forge.

``handler(op_name, op, args, kwargs)`` returns what the op returns, or ``PROCEED`` to let the op
run on as if no handler were set (the cheap path: recording a call, or routing it to opforge's
own kernel). ``op`` is the op itself with the hook bypassed (calling it does not re-enter the
handler, and runs every check); ``args`` / ``kwargs`` are the call's arguments as the user
passed them (``skip_check`` aside), and the handler must not change them.
"""

from __future__ import annotations

from typing import Callable, Optional

active: bool = False
handler: Optional[Callable] = None
#: What a handler returns to let the op run on by itself.
PROCEED = object()


def install(fn: Optional[Callable]) -> None:
    """Route every built-in op call through ``fn`` (None: back to the direct path)."""
    global active, handler
    handler = fn
    active = fn is not None
