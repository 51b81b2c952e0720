"""Backend and compute-capability requirements for ops: ``@supported_compute_capability`` and
``@backend_requirement``.

An op decorated with ``backend_requirement`` gets

* a ``skip_check=False`` keyword: ``True`` skips every Python-level check (the compiled
  bindings still validate everything that could crash);
* ``backend="auto"`` resolution: ``heuristic_func(backends, *args, **kwargs)`` orders the
  candidates for this call and the first one whose check passes runs; the op receives the
  chosen name in ``backend``;
* ``op.is_backend_supported(name, cc=None)``, ``op.is_compute_capability_supported(cc)``,
  ``op.has_backend(name)``, ``op.has_backend_choices()`` and ``op.backends``;
* its first parameter accepted by keyword in any order (``op(eps=..., weight=w, input=x)``): it
  is moved to the front, so checks and heuristics always find it in ``args[0]``.

Checks take the op's arguments, return True or raise ValueError / TypeError / RuntimeError with
what is wrong; the decorator prefixes the op's name. Compute capabilities are integers
(80 for 8.0, 90 for 9.0, 100 for 10.0).

Compute-capability queries: a check without a ``@supported_compute_capability`` mark places no
restriction, so ``is_backend_supported(name, cc)`` is True unless the backend's mark or the
common check's mark excludes ``cc``. ``is_compute_capability_supported(cc)`` asks whether the op
has code for a GPU of that compute capability: backends without marks (CPU code, plain-PyTorch
formulas) do not count, so it is True when a marked backend supports ``cc`` (and the common
check allows it); an op with no marked backend answers from the common check's mark (True
without one).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Iterable

import torch

from . import _hooks
from ._ext import compute_capability

_CHECK_ERRORS = (ValueError, TypeError, RuntimeError)
_is_compiling = torch.compiler.is_compiling


class BackendError(ValueError):
    """No backend can run a call, or an unknown backend was named."""


def supported_compute_capability(ccs: Iterable[int] | Callable[[int], bool]):
    """Mark a check function with the compute capabilities its backend supports.

    ``ccs``: integers, enforced before the check runs on a call with CUDA tensors; or a function
    ``cc -> bool`` for support known only at run time (which archs a build holds), which answers
    the queries while the check itself refuses a GPU it cannot run on (it can say why).
    """
    supported = ccs if callable(ccs) else frozenset(int(c) for c in ccs)

    def mark(check: Callable) -> Callable:
        check._opforge_ccs = supported
        return check

    return mark


def _ccs_of(check: Callable | None) -> frozenset | Callable[[int], bool] | None:
    return getattr(check, "_opforge_ccs", None) if check is not None else None


def _supports(mark: frozenset | Callable[[int], bool], cc: int) -> bool:
    return bool(mark(cc)) if callable(mark) else cc in mark


def _call_cc(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(device index, compute capability) of the first CUDA tensor argument, if any."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_cuda:
            index = value.get_device()
            return index, compute_capability(index)
    return None


def _cc_text(cc: int) -> str:
    return f"{cc // 10}.{cc % 10}"


def _with_prefix(exc: Exception, prefix: str) -> Exception:
    try:
        return type(exc)(f"{prefix}{exc}")
    except Exception:  # an exception type with another constructor: keep it as it is
        return exc


def backend_requirement(
    backend_checks: dict[str, Callable],
    common_check: Callable | None = None,
    heuristic_func: Callable | None = None,
    traced: Callable | None = None,
    auto_by_device: bool = False,
):
    """Enforce per-backend requirements and resolve ``backend="auto"`` (see the module doc).

    ``auto_by_device``: the heuristic and the checks of the backends it returns depend only on
    the device of the first argument (a tensor), so the ``auto`` choice is made once per device
    and reused; explicit backends are still checked on every call.

    ``traced``: what runs instead while torch.compile traces the call (no Python checks there;
    it should call a registered torch.library op, whose fake implementation validates shapes).
    """
    checks = dict(backend_checks)
    names = tuple(checks)

    def decorate(fn: Callable) -> Callable:
        op = f"opforge.{fn.__name__}"
        params = inspect.signature(fn).parameters
        takes_backend = "backend" in params
        if checks and not takes_backend:
            raise TypeError(f"{op}: backend_checks given but the function has no 'backend' parameter")
        default_backend = params["backend"].default if takes_backend else None
        if default_backend == "auto" and heuristic_func is None and len(names) > 1:
            raise TypeError(f"{op}: backend='auto' needs a heuristic_func to order {names}")
        backend_pos = None
        if takes_backend and params["backend"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            backend_pos = list(params).index("backend")
        first = next(iter(params.values()), None)
        first_name = first.name if first is not None and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None

        # Read once here: the call path below runs on every op call and must stay lean. Only
        # integer marks are enforced on calls (see supported_compute_capability).
        ccs_of = {}
        for check in (*checks.values(), common_check):
            if check is not None:
                mark = _ccs_of(check)
                ccs_of[check] = mark if isinstance(mark, frozenset) else None

        def run_check(check: Callable, label: str, args: tuple, kwargs: dict) -> None:
            ccs = ccs_of[check]
            if ccs is not None:
                found = _call_cc(args, kwargs)
                if found is not None and found[1] not in ccs:
                    index, cc = found
                    listed = ", ".join(_cc_text(c) for c in sorted(ccs))
                    raise BackendError(
                        f"{op}: {label}supports compute capability {listed}; this GPU (cuda:{index}) is {_cc_text(cc)}"
                    )
            try:
                ok = check(*args, **kwargs)
            except _CHECK_ERRORS as exc:
                raise _with_prefix(exc, f"{op}: {label}") from None
            if ok is False:
                raise BackendError(f"{op}: {label}cannot run this call")

        def resolve(requested, args: tuple, kwargs: dict, run_checks: bool) -> str:
            if requested != "auto":
                if requested not in checks:
                    raise BackendError(f"{op}: unknown backend {requested!r}; accepted: 'auto', " + ", ".join(map(repr, names)))
                if run_checks:
                    run_check(checks[requested], f"backend {requested!r} ", args, kwargs)
                return requested
            try:
                order = heuristic_func(names, *args, **kwargs) if heuristic_func is not None else names
            except _CHECK_ERRORS as exc:
                raise _with_prefix(exc, f"{op}: ") from None
            if not order:
                raise BackendError(f"{op}: no backend is suitable for this call")
            if not run_checks:
                return order[0]
            failures = []
            for name in order:
                try:
                    run_check(checks[name], f"backend {name!r} ", args, kwargs)
                    return name
                except _CHECK_ERRORS as exc:
                    failures.append(exc)
            if len(failures) == 1:
                raise failures[0]
            raise BackendError(f"{op}: no backend can run this call: " + "; ".join(str(e) for e in failures))

        common_plain = common_check is not None and ccs_of[common_check] is None
        auto_choice: dict[int, str] = {}  # device index (-1: CPU) -> backend auto chose there

        op_name = fn.__name__

        def unhooked(*args, **kwargs):
            return wrapper(*args, _hooked=True, **kwargs)

        @functools.wraps(fn)
        def wrapper(*args, skip_check=False, _hooked=False, **kwargs):
            # This runs on every call of an op: keep it flat (each Python call costs ~0.1 us).
            if not args and first_name in kwargs:
                args = (kwargs.pop(first_name),)
            if traced is not None and _is_compiling():
                return traced(*args, **kwargs)
            if _hooks.active and not _hooked:
                # Tracing or apply is on (opforge.intercept): the handler records the call and/or
                # routes it; PROCEED lets the op itself run on, as it does most of the time.
                result = _hooks.handler(op_name, unhooked, args, kwargs)
                if result is not _hooks.PROCEED:
                    return result
            if not skip_check and common_check is not None:
                if common_plain:
                    try:
                        common_check(*args, **kwargs)
                    except _CHECK_ERRORS as exc:
                        raise _with_prefix(exc, f"{op}: ") from None
                else:
                    run_check(common_check, "", args, kwargs)
            if not checks:
                return fn(*args, **kwargs)
            if backend_pos is not None and len(args) > backend_pos:
                args = list(args)
                args[backend_pos] = resolve(args[backend_pos], args, kwargs, not skip_check)
                return fn(*args, **kwargs)
            requested = kwargs.get("backend", default_backend)
            if requested == "auto" and auto_by_device and args:
                first = args[0]
                device = None  # only CPU (-1) and CUDA (index) choices are remembered
                if isinstance(first, torch.Tensor) and (first.is_cuda or first.is_cpu):
                    device = first.get_device()
                chosen = auto_choice.get(device)
                if chosen is None:
                    chosen = resolve(requested, args, kwargs, not skip_check)
                    if device is not None and not skip_check:  # remember only checked choices
                        auto_choice[device] = chosen
                kwargs["backend"] = chosen
                return fn(*args, **kwargs)
            kwargs["backend"] = resolve(requested, args, kwargs, not skip_check)
            return fn(*args, **kwargs)

        def is_backend_supported(backend: str, cc: int | None = None) -> bool:
            if backend not in checks:
                return False
            if cc is None:
                return True
            ccs, common = _ccs_of(checks[backend]), _ccs_of(common_check)
            return (ccs is None or _supports(ccs, cc)) and (common is None or _supports(common, cc))

        def is_compute_capability_supported(cc: int) -> bool:
            common = _ccs_of(common_check)
            if common is not None and not _supports(common, cc):
                return False
            marked = [mark for mark in map(_ccs_of, checks.values()) if mark is not None]
            return not marked or any(_supports(mark, cc) for mark in marked)

        # Device index (-1: CPU) -> the backend "auto" chose there after its checks passed: an op's
        # fast entry (fast_entry) serves calls on such a device without the wrapper.
        wrapper.auto_choice = auto_choice
        wrapper.is_backend_supported = is_backend_supported
        wrapper.is_compute_capability_supported = is_compute_capability_supported
        wrapper.has_backend = lambda backend: backend in checks
        wrapper.has_backend_choices = lambda: len(names) > 1
        wrapper.backends = names
        return wrapper

    return decorate


def fast_entry(slow: Callable, fast: Callable) -> Callable:
    """The public function of an op whose plain calls must cost little on the host: ``fast`` has
    the op's signature plus ``skip_check``, serves the common call in one Python frame (backend
    "auto", no tracing or apply hook, not under torch.compile, arguments of the plain types)
    and hands every other call to ``slow``, the op decorated with backend_requirement, which
    checks and explains. The compiled binding validates every tensor on both paths (types,
    dtypes, shapes, devices, strides, storages, aliasing, grad), with the same messages, picks
    the kernel for the tensors' device (C++ on CPU, CUDA on a GPU, whose current stream it asks
    torch for) and names the archs to rebuild for when the build has no code for the GPU, so
    skipping the Python-level checks loses nothing. ``fast`` gets ``slow``'s name,
    documentation and query methods.
    """
    functools.update_wrapper(fast, slow)
    fast.__wrapped__ = slow
    return fast
