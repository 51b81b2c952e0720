"""The solution registry: named Solutions, each for one Definition, some bound to a live
Python function.

``BACKENDS`` is the process-wide default registry, and the only module-level state here. It
starts empty; modules of solutions fill it when imported (``BACKENDS.register(...)`` or the
``@register_solution`` decorator), and ``load_solution_modules`` imports such modules and
reads Solution JSON files. Create another ``Registry()`` wherever a separate set is wanted
(tests, one task's kernels: ``Registry(definition="nvfp4_gemv_m128_k7168")`` makes
``definition`` the default of every registration).

One task's kernels, registered with the seed-style call ``register(name, kernel_fn,
description, language)`` alone, need their Definition and calling convention from somewhere:
a task module says them once and the kernel modules import its registry::

    # task.py
    from opforge.registry import BACKENDS as ALL
    BACKENDS = ALL.with_defaults(definition="nvfp4_gemv_m128_k7168", destination_passing_style=True)

    # my_kernel.py
    from task import BACKENDS
    def kernel(data):                       # data = (a, b, ..., c): inputs, then the output
        a, b, *_, c = data
        ...                                 # fill c
        return c
    BACKENDS.register("triton", kernel, "my Triton kernel", "triton")

``with_defaults`` shares the solutions of the registry it is called on, so what the kernel
modules register is what ``opforge smoke`` and ``opforge run`` (which read ``BACKENDS``) see.
A function with exactly one parameter is called with one tuple (runnable.py says which).

A name can be registered once; registering it again is refused unless the Solution is the
same content (a module imported a second time), which then rebinds its function.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

from ..trace import Solution
from ..trace.errors import DuplicateError
from .builders import build
from .runnable import Runnable
from .solutions import callable_solution


@dataclass
class _Entry:
    solution: Solution
    fn: Optional[Callable] = None


def _solution_from(value) -> Solution:
    if isinstance(value, Solution):
        return value
    if isinstance(value, dict):
        return Solution.from_dict(value)
    if isinstance(value, (str, Path)):
        path = Path(value)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the solution file: {exc.strerror}") from None
        try:
            return Solution.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    raise TypeError(f"register: expected a Solution, its JSON dict or a path to it; got {type(value).__name__}")


class Registry:
    """Named Solutions (see the module doc)."""

    def __init__(self, definition=None, *, destination_passing_style: bool = False):
        #: Defaults of function registrations: the Definition (or its name) they solve, and
        #: whether their functions write into given outputs.
        self.definition = definition
        self.destination_passing_style = destination_passing_style
        self._entries: dict[str, _Entry] = {}

    def with_defaults(self, definition=None, *, destination_passing_style: Optional[bool] = None) -> "Registry":
        """A Registry holding the same solutions (a registration in either is in both) whose
        function registrations default to ``definition`` and ``destination_passing_style``
        (each left None: this registry's)."""
        view = Registry(definition if definition is not None else self.definition,
                        destination_passing_style=self.destination_passing_style if destination_passing_style is None
                        else destination_passing_style)
        view._entries = self._entries
        return view

    # --- registering ----------------------------------------------------------------------

    def register(self, name, kernel_fn: Optional[Callable] = None, description: Optional[str] = None,
                 language: str = "python", definition=None, **options) -> Solution:
        """Register a solution; returns it.

        ``register(solution)``: a Solution, its JSON dict, or a path to its JSON file.
        ``register(name, kernel_fn, description, language, definition=None, **options)``: a
        live Python function taking the Definition's inputs and returning its outputs, or with
        destination_passing_style taking the inputs then the outputs and filling those; either
        as separate arguments or, for a function of one parameter, as one tuple (options:
        author, target_hardware, dependencies, destination_passing_style). ``definition`` (a
        Definition or its name) and destination_passing_style default to the registry's.
        """
        if kernel_fn is None:
            if description is not None or definition is not None or options:
                raise TypeError("register: a Solution carries its own description and definition; "
                                "to register a function, pass it as kernel_fn")
            return self._add(_Entry(_solution_from(name)))
        definition = definition if definition is not None else self.definition
        if definition is None:
            raise ValueError(f"register {name!r}: which Definition does it solve? pass definition= "
                             f"(or create the registry with Registry(definition=...))")
        options.setdefault("destination_passing_style", self.destination_passing_style)
        solution = callable_solution(kernel_fn, name, definition, description=description, language=language,
                                     **options)
        return self._add(_Entry(solution, kernel_fn))

    def _add(self, entry: _Entry) -> Solution:
        name = entry.solution.name
        old = self._entries.get(name)
        if old is not None and old.solution.content_hash() != entry.solution.content_hash():
            raise DuplicateError(f"solution {name!r} is already registered (for {old.solution.definition}); "
                                 f"choose another name or unregister it first")
        self._entries[name] = entry
        return entry.solution

    def unregister(self, name: str) -> None:
        self._lookup(name)
        del self._entries[name]

    # --- looking up -----------------------------------------------------------------------

    def _lookup(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self._entries) or "none"
            raise KeyError(f"no solution named {name!r} is registered (registered: {known})") from None

    def get(self, name: str) -> Solution:
        return self._lookup(name).solution

    def function(self, name: str) -> Optional[Callable]:
        """The live function a solution was registered with (None for one given as sources)."""
        return self._lookup(name).fn

    def solutions_for(self, definition_name: str) -> list[Solution]:
        """Solutions of one Definition, in registration order."""
        return [e.solution for e in self._entries.values() if e.solution.definition == definition_name]

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Solution]:
        return iter([e.solution for e in self._entries.values()])

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Registry of {len(self)} solution(s)>"

    # --- building -------------------------------------------------------------------------

    def build(self, solution: Union[str, Solution], definition, device=None) -> Runnable:
        """build() a registered solution (by name or object); a function-backed one runs its
        function."""
        name = solution if isinstance(solution, str) else solution.name
        entry = self._lookup(name)
        return build(entry.solution, definition, device, fn=entry.fn)


#: The process-wide default registry (see the module doc).
BACKENDS = Registry()


def register_solution(definition=None, *, name: Optional[str] = None, language: str = "python",
                      author: Optional[str] = None, description: Optional[str] = None,
                      destination_passing_style: Optional[bool] = None,
                      target_hardware: Optional[Iterable[str]] = None, dependencies: Iterable[str] = (),
                      registry: Optional[Registry] = None):
    """Decorator: register the function as a solution of ``definition`` (name: the function's,
    registry: BACKENDS; definition and destination_passing_style: the registry's defaults
    when left out) and return it unchanged.

    >>> @register_solution("rmsnorm_h4096", language="triton")
    ... def rmsnorm_triton(hidden_states, weight): ...
    """
    def decorate(fn: Callable) -> Callable:
        target = registry if registry is not None else BACKENDS
        target.register(
            name or fn.__name__, fn, description or (fn.__doc__ or "").strip().split("\n")[0] or None, language,
            definition, author=author, target_hardware=target_hardware, dependencies=dependencies,
            destination_passing_style=target.destination_passing_style if destination_passing_style is None
            else destination_passing_style)
        return fn

    return decorate


def _import_file(path: Path):
    """Import a .py file as a module named after it (and its folder, to keep names unique)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"opforge_solutions_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_solution_modules(items: Iterable[Union[str, Path]], registry: Optional[Registry] = None) -> list[str]:
    """Import modules of solutions (which register themselves on import) and register Solution
    JSON files; returns the names newly registered in ``registry`` (default BACKENDS).

    Each item is a module name (``my_kernels``, imported through sys.path), a ``.py`` file, a
    ``.json`` Solution file, or a folder (every .py and .json below it, in path order).
    A module imported before is not imported again.
    """
    registry = registry if registry is not None else BACKENDS
    before = set(registry.names())
    for item in ([items] if isinstance(items, (str, Path)) else items):
        path = Path(item)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".py", ".json") and p.is_file())
        elif path.suffix in (".py", ".json") or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"load_solution_modules: {path} does not exist")
            files = [path]
        else:
            try:
                importlib.import_module(str(item))
            except ModuleNotFoundError as exc:
                raise ModuleNotFoundError(f"load_solution_modules: cannot import {item!r}: {exc}") from exc
            continue
        for file in files:
            if file.suffix == ".json":
                registry.register(file)
            else:
                _import_file(file)
    return [n for n in registry.names() if n not in before]
