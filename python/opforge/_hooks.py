"""The one switch every built-in op reads per call, so tracing and apply cost nothing while off.

``active`` is a plain module attribute: while it is False an op call pays one attribute load and
a branch. The forge (opforge.intercept) turns it on while tracing or apply is enabled and sets
``handler``; the op layer never imports the forge.

``handler(op_name, op, args, kwargs)`` must return what the op returns. ``op`` is the op itself
with the hook bypassed (calling it does not re-enter the handler); ``args`` / ``kwargs`` are the
call's arguments as the user passed them, ``skip_check`` included when given.
"""

from __future__ import annotations

from typing import Callable, Optional

active: bool = False
handler: Optional[Callable] = None


def install(fn: Optional[Callable]) -> None:
    """Route every built-in op call through ``fn`` (None: back to the direct path)."""
    global active, handler
    handler = fn
    active = fn is not None
