"""Import-based languages: python, pytorch, triton, tilelang.

The sources are written to the build cache and the entry file is imported from there as a
module of a package named after the solution's content hash (``opforge_sol_<hash>``), so two
solutions never share module names and triton can read its kernels' source from real files.

Sibling sources are importable both ways: relatively (``from .helpers import f``) and by bare
name (``import helpers``). Bare names resolve in the solution's folder while the entry module
imports; they are then taken out of ``sys.modules`` so that two solutions with a ``helpers.py``
each never see each other's. (A bare-name import run later, inside a function, is not covered:
use a relative import there.) ``sys.path`` is restored after the import.
"""

from __future__ import annotations

import importlib
import sys
import threading
import traceback
import types
from pathlib import Path

from ..cache import cached_build, solution_key
from ..errors import ENTRY_POINT_ERROR, IMPORT_ERROR, BuildError
from . import Loaded

# sys.path and sys.modules are process-wide: one import at a time.
_IMPORT_LOCK = threading.Lock()


def _module_name(entry_file: str) -> str:
    return entry_file[: -len(".py")].replace("/", ".")


def _user_frames(exc: BaseException, folder: Path) -> str:
    """The exception with the traceback cut down to frames in the solution's own files."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(folder))]
    text = "".join(traceback.format_list(frames)).replace(str(folder) + "/", "")
    return text + "".join(traceback.format_exception_only(type(exc), exc)).strip()


def import_entry(solution, folder: Path, entry_file: str, package: str):
    """Import ``entry_file`` from ``folder`` as ``<package>.<module>`` (see the module doc)."""
    with _IMPORT_LOCK:
        if package not in sys.modules:
            pkg = types.ModuleType(package)
            pkg.__path__ = [str(folder)]
            pkg.__file__ = None
            sys.modules[package] = pkg
        before = set(sys.modules)
        sys.path.insert(0, str(folder))
        try:
            return importlib.import_module(f"{package}.{_module_name(entry_file)}")
        except (Exception, SystemExit) as exc:
            raise BuildError(
                IMPORT_ERROR, solution.name, f"importing {entry_file} failed:\n{_user_frames(exc, folder)}"
            ) from None
        finally:
            sys.path.remove(str(folder))
            for name in set(sys.modules) - before:
                module = sys.modules.get(name)
                file = getattr(module, "__file__", None) or ""
                if not name.startswith(package + ".") and file.startswith(str(folder)):
                    del sys.modules[name]


def resolve_symbol(solution, module, entry_file: str, symbol: str):
    obj = module
    for part in symbol.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise BuildError(
                ENTRY_POINT_ERROR,
                solution.name,
                f"{entry_file} defines no {symbol!r} (callables there: {', '.join(defined) or 'none'})",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise BuildError(ENTRY_POINT_ERROR, solution.name, f"{entry_file}::{symbol} is not callable")
    return obj


def load(solution, language: str, entry_file: str, symbol: str) -> Loaded:
    if not entry_file.endswith(".py"):
        raise BuildError(
            ENTRY_POINT_ERROR, solution.name, f"a {language} entry point names a .py file; got {entry_file!r}"
        )
    key = solution_key(solution)
    entry = cached_build(language, solution, key, lambda folder: {"entry": entry_file})
    module = import_entry(solution, entry.path, entry_file, f"opforge_sol_{key[:16]}")
    fn = resolve_symbol(solution, module, entry_file, symbol)
    return Loaded(fn, cache_hit=entry.hit, build_dir=entry.path)
