"""Solutions that opforge writes itself: a Definition's reference, a built-in op, and the
Solution describing a live Python function registered with ``BACKENDS.register``."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..trace import BuildSpec, Solution, SourceFile, SupportedLanguages
from ..trace.own_op import own_op_solution, resolve_own_op

REFERENCE_FILE = "reference.py"


def _definition_name(definition) -> str:
    return definition if isinstance(definition, str) else definition.name


def reference_solution(definition) -> Solution:
    """The Definition's reference as a Solution (python, value-returning, ``reference.py::run``),
    so it builds and runs like any other solution."""
    return Solution(
        name=f"{definition.name}_reference",
        definition=definition.name,
        author="reference",
        description=f"The reference implementation of {definition.name}.",
        spec=BuildSpec(language=SupportedLanguages.PYTHON, target_hardware=["cpu", "cuda"],
                       entry_point=f"{REFERENCE_FILE}::run", destination_passing_style=False),
        sources=[SourceFile(path=REFERENCE_FILE, content=definition.reference)],
    )


def builtin_solution(definition, op: str, *, inputs: Optional[dict] = None, constants: Optional[dict] = None,
                     outputs: Optional[list] = None, name: Optional[str] = None, author: str = "opforge",
                     description: Optional[str] = None) -> Solution:
    """A Solution running ``opforge.<op>`` for ``definition``: a FlashInfer-Trace python
    solution (``main.py::run``) that imports opforge and calls the op, which opforge recognises
    and runs directly (see opforge.trace.own_op for the file and how it is recognised).

    inputs: Definition input -> op parameter where they differ (``{"hidden_states": "input"}``
    is the default alias anyway), or None for an input the op does not take
    (``{"scale_a_permuted": None}``: it is left out of the call); constants: keyword arguments of every call
    (``{"eps": 1e-5}``); outputs: what the op returns, in order, as Definition output names
    (None for a returned value the Definition lacks, e.g. ``["output", None]``). A mapping that
    cannot call the op raises AdapterError (a ValueError) naming the problem.
    """
    own = resolve_own_op(definition, op, inputs, constants, outputs)
    return own_op_solution(definition.name, own, name=name or f"{definition.name}_builtin", author=author,
                           description=description)


def _callable_source(fn: Callable) -> tuple[str, str, str]:
    """(file name, source text, entry symbol) describing ``fn``: its module's source when fn is
    defined at its top level, else fn's own definition (decorators left out), else a note that
    the source is not available (a lambda, a function made at run time)."""
    qualname = getattr(fn, "__qualname__", None) or ""
    name = getattr(fn, "__name__", "")
    if qualname and "<" not in qualname:
        try:
            path = inspect.getsourcefile(inspect.getmodule(fn))
            text = inspect.getsource(inspect.getmodule(fn))
            if path and path.endswith(".py") and text:
                return Path(path).name, text, qualname
        except (TypeError, OSError):
            pass
    if name.isidentifier():
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            node = tree.body[0] if len(tree.body) == 1 else None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                node.decorator_list = []
                return "kernel.py", ast.unparse(tree) + "\n", name
        except (TypeError, OSError, SyntaxError):
            pass
    note = "registered from a live Python function whose source is not available"
    return "kernel.py", f"# {note}\nrun = None\n", "run"


def callable_solution(fn: Callable, name: str, definition, *, description: Optional[str] = None,
                      language: str = "python", author: Optional[str] = None,
                      target_hardware: Optional[Iterable[str]] = None, dependencies: Iterable[str] = (),
                      destination_passing_style: bool = False) -> Solution:
    """The Solution describing a live Python function. Its sources are the function's module
    (or the function alone), so the Solution can be saved and shared; the registry runs the
    function object itself. A language opforge does not know ("cutlass"), or "builtin" (a live
    function is never one of opforge's compiled ops, and FlashInfer-Bench reads no such
    language), is recorded in the description and the Solution is python."""
    if not callable(fn):
        raise TypeError(f"solution {name!r}: kernel_fn must be callable; got {type(fn).__name__}")
    label = str(language).lower()
    try:
        lang = SupportedLanguages(label)
    except ValueError:
        lang = None
    if lang is None or lang is SupportedLanguages.BUILTIN:
        lang = SupportedLanguages.PYTHON
        description = f"{description or ''} (language: {language})".strip()
    file, content, symbol = _callable_source(fn)
    return Solution(
        name=name,
        definition=_definition_name(definition),
        author=author or getattr(fn, "__module__", None) or "unknown",
        description=description or None,
        spec=BuildSpec(language=lang, target_hardware=list(target_hardware) if target_hardware else None,
                       entry_point=f"{file}::{symbol}", dependencies=list(dependencies),
                       destination_passing_style=destination_passing_style),
        sources=[SourceFile(path=file, content=content)],
    )
