"""``@opforge_api``: levelled logging of public op calls, controlled by OPFORGE_LOGLEVEL.

At level 0 (the default) the decorator returns the function itself, so a call pays nothing.
Levels (as in opforge.config): 1 names each call, 3 adds each argument's shape, dtype, device
and strides, 5 adds value statistics of tensors (which synchronizes the GPU).
"""

from __future__ import annotations

import functools
import logging
import sys
import time

import torch

from . import config

_LOGGER_NAME = "opforge.api"
_is_compiling = torch.compiler.is_compiling


class _StdStreamHandler(logging.StreamHandler):
    """Writes to sys.stdout / sys.stderr as they are at each record, so redirections made after
    the first logged call (pytest's capture, contextlib.redirect_stdout) are honoured."""

    def __init__(self, name: str):
        super().__init__(getattr(sys, name))
        self._name = name

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self._name)
        super().emit(record)

_handlers: dict[str, logging.Handler] = {}


def _logger() -> logging.Logger:
    """The API logger, pointed at the destination OPFORGE_LOGDEST names right now."""
    dest = config.log_destination()
    logger = logging.getLogger(_LOGGER_NAME)
    handler = _handlers.get(dest)
    if handler is None:
        handler = _StdStreamHandler(dest) if dest in ("stderr", "stdout") else logging.FileHandler(dest)
        handler.setFormatter(logging.Formatter("[opforge %(asctime)s] %(message)s"))
        _handlers[dest] = handler
    for h in list(logger.handlers):
        if h is not handler:
            logger.removeHandler(h)
    if handler not in logger.handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


#: Packed dtypes torch cannot convert to fp32: their values are not summarised.
_NO_STATISTICS = frozenset(getattr(torch, name) for name in ("float4_e2m1fn_x2",) if hasattr(torch, name))


def _has_values(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s elements is safe: a dense tensor with data (not meta) whose storage
    holds every element it views. Logging runs before the op's own checks, and reading a tensor
    whose storage was freed or shrunk would crash instead of letting the op refuse it."""
    if t.layout != torch.strided or t.is_meta or t.is_quantized or t.is_nested:
        return False
    if t.numel() == 0:
        return True
    if any(st < 0 for st in t.stride()):
        return False
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size() <= t.untyped_storage().nbytes()


def describe(value, level: int) -> str:
    """One argument as a log line fragment."""
    if isinstance(value, torch.Tensor):
        layout = f"stride={value.stride()}" if value.layout == torch.strided else f"layout={value.layout}"
        text = (
            f"Tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')}, "
            f"device={value.device}, {layout})"
        )
        if level >= 5 and value.numel() and value.dtype not in _NO_STATISTICS \
                and (value.is_floating_point() or value.is_complex()) and _has_values(value):
            v = value.detach().float()
            nan = int(torch.isnan(v).sum())
            finite = v[torch.isfinite(v)]
            if finite.numel():
                text += f" min={finite.min().item():.6g} max={finite.max().item():.6g} mean={finite.mean().item():.6g}"
            text += f" nan={nan}"
        return text
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v, level) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def opforge_api(fn=None, *, level: int | None = None):
    """Decorate a public op. ``level`` overrides OPFORGE_LOGLEVEL (used by tests)."""
    if fn is None:
        return functools.partial(opforge_api, level=level)
    lvl = config.log_level() if level is None else level
    if lvl <= 0:
        return fn
    name = f"opforge.{fn.__name__}"

    @functools.wraps(fn)
    def logged(*args, **kwargs):
        # Nothing to log while torch.compile traces the call (the compiled graph runs without
        # Python), and logging's file and process calls cannot be traced into a graph.
        if _is_compiling():
            return fn(*args, **kwargs)
        log = _logger()
        if lvl >= 3:
            parts = [describe(a, lvl) for a in args] + [f"{k}={describe(v, lvl)}" for k, v in kwargs.items()]
            log.info("%s(%s)", name, ", ".join(parts))
        else:
            log.info("%s", name)
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            log.info("%s raised %s: %s", name, type(exc).__name__, exc)
            raise
        if lvl >= 3:
            ms = (time.perf_counter() - start) * 1e3
            log.info("%s -> %s (host %.3f ms)", name, describe(result, lvl), ms)
        return result

    return logged
