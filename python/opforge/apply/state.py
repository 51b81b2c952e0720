"""The one piece of process state apply keeps: which router is active.

Enabling pushes a router, closing its handle removes it (the one enabled before it is active
again), ``disable_apply`` clears them all. Functions decorated with ``@apply`` read ``active``
on every call, so it is a plain module attribute.
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional

from .. import intercept

active = None  # the Router of the innermost enabled handle, or None
_stack: list = []
_lock = threading.Lock()
#: Every live @apply function (its _Applied), to check their signatures when a dataset arrives.
applied: "weakref.WeakSet" = weakref.WeakSet()


def _install(router) -> None:
    global active
    active = router
    intercept.set_router(router if router is not None and router.config.route_builtin_ops else None)
    for fn in list(applied):
        fn.forget_plans()


def push(router) -> None:
    with _lock:
        _stack.append(router)
        _install(router)


def remove(router) -> bool:
    """Take ``router`` off the stack; False when it was not on it (closed already)."""
    with _lock:
        if router not in _stack:
            return False
        _stack.remove(router)
        _install(_stack[-1] if _stack else None)
        return True


def clear() -> None:
    with _lock:
        _stack.clear()
        _install(None)


def current() -> Optional[object]:
    return active
