"""build(): turn a Solution into a Runnable for its Definition.

Before anything of the solution runs: the Definition is the one it names, its dependencies are
installed, its target_hardware covers the device, its entry point exists; after loading, the
entry callable's signature fits the Definition. Every failure is a BuildError (errors.py).

=====================  =================================================================
language               how it is built
=====================  =================================================================
python, pytorch,       sources written to the build cache, entry file imported from there
triton, tilelang,      (python.py)
cutedsl
cpp, cuda              compiled: binding "tvm-ffi" (also when unset) or "torch" (native.py)
builtin                records older opforge wrote for its own ops (read, not written)
=====================  =================================================================

opforge's own ops are python solutions of a generated form (opforge.trace.own_op). A solution
that is exactly that form, and a legacy ``builtin`` record, are run by calling the op directly,
without importing anything of the solution (builtin.py); every other python solution is
imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..checks import (check_dependencies, check_hardware, check_signature, check_sources, device_info,
                      split_entry_point)
from ..errors import UNSUPPORTED, BuildError
from ..runnable import Runnable


@dataclass
class Loaded:
    """What a language's loader hands back: the entry callable and where it came from.
    ``calling`` None lets the signature check decide how the Runnable calls it."""

    fn: Callable
    cache_hit: Optional[bool] = None
    build_dir: Optional[Path] = None
    artifact: Optional[Path] = None
    calling: Optional[str] = None


IMPORTED = ("python", "pytorch", "triton", "tilelang", "cutedsl")
COMPILED = ("cpp", "cuda")
LANGUAGES = IMPORTED + COMPILED + ("builtin",)
BINDINGS = ("torch", "tvm-ffi")

#: Languages whose modules need a package that a plain torch install lacks.
_LANGUAGE_PACKAGES = {"triton": "triton", "tilelang": "tilelang", "cutedsl": "cutlass"}


def language_of(solution) -> str:
    language = solution.spec.language
    return str(getattr(language, "value", language)).lower()


def binding_of(solution) -> str:
    """"tvm-ffi" (also spelled "tvm_ffi"; also when unset, as FlashInfer-Bench reads a missing
    binding, so its CUDA solutions build unchanged) or "torch"."""
    binding = getattr(solution.spec, "binding", None)
    binding = str(getattr(binding, "value", binding) or "tvm-ffi").lower().replace("_", "-")
    if binding not in BINDINGS:
        raise BuildError(UNSUPPORTED, solution.name, f"binding {binding!r} is not one of {', '.join(BINDINGS)}")
    return binding


def _load(solution, definition, language: str, device, own) -> Loaded:
    if own is not None:
        from . import builtin

        check_sources(solution, None)
        return builtin.load(solution, own)
    entry_file, symbol = split_entry_point(solution)
    check_sources(solution, entry_file)
    if language in IMPORTED:
        from . import python

        return python.load(solution, language, entry_file, symbol)
    from . import native

    if binding_of(solution) == "tvm-ffi":
        return native.load_tvm_ffi(solution, language, entry_file, symbol, device)
    return native.load_torch(solution, language, entry_file, symbol, device)


def build(solution, definition, device=None, *, fn: Optional[Callable] = None) -> Runnable:
    """A Runnable of ``solution`` for ``definition`` on ``device`` ("cpu", "cuda", "cuda:1";
    default: the current CUDA device if there is one, else the CPU).

    ``fn``: the entry callable itself, for a solution registered from a live Python function
    (its sources are then not imported). Raises BuildError (see errors.py), or ValueError when
    the solution is for another Definition.
    """
    if solution.definition != definition.name:
        raise ValueError(f"solution {solution.name!r} solves {solution.definition!r}, not {definition.name!r}")
    language = language_of(solution)
    if language not in LANGUAGES:
        raise BuildError(UNSUPPORTED, solution.name, f"language {language!r} is not one of {', '.join(LANGUAGES)}")
    package = _LANGUAGE_PACKAGES.get(language)
    if fn is None and package and importlib.util.find_spec(package) is None:
        raise BuildError(UNSUPPORTED, solution.name, f"language {language} needs the {package} package; it is not installed")
    check_dependencies(solution)
    try:
        device = device_info(device)
    except ValueError as exc:  # e.g. device cuda with a CPU-only torch: the solution cannot be built here
        raise BuildError(UNSUPPORTED, solution.name, str(exc)) from None
    check_hardware(solution, device)
    own = None
    if fn is None and language in ("python", "builtin"):
        from .builtin import check_device, own_op_of

        own = own_op_of(solution, definition)
        if own is not None:
            check_device(solution, device)
    loaded = Loaded(fn) if fn is not None else _load(solution, definition, language, device, own)
    dps = bool(solution.spec.destination_passing_style)
    calling = loaded.calling
    if calling is None:
        calling = check_signature(solution, loaded.fn, list(definition.inputs), list(definition.outputs), dps)
    return Runnable(loaded.fn, solution, definition, dps=dps, calling=calling, cache_hit=loaded.cache_hit,
                    build_dir=loaded.build_dir, artifact=loaded.artifact)
