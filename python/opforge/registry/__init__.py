"""The solution registry and builders: "bring your own kernel".

Register implementations of a Definition, then build them into callables that take the
Definition's inputs and return its outputs::

    from opforge.registry import BACKENDS, register_solution, build, reference_solution

    BACKENDS.register("rmsnorm_torch", my_fn, "plain PyTorch", "pytorch", definition="rmsnorm_h4096")

    @register_solution("rmsnorm_h4096", language="triton")
    def rmsnorm_triton(hidden_states, weight): ...

    BACKENDS.register(solution)                   # a Solution with sources (or its JSON / path)
    run = BACKENDS.build("rmsnorm_triton", definition, device="cuda")
    out = run(hidden_states, weight)

    ref = build(reference_solution(definition), definition)   # the reference, built the same way

    def kernel(data):                             # one parameter: the values come as one tuple,
        hidden_states, weight, output = data      # inputs then outputs (destination-passing)
        ...                                       # fill output
        return output
    BACKENDS.register("rmsnorm_tuple", kernel, "one tuple in", "triton", definition="rmsnorm_h4096",
                      destination_passing_style=True)

Modules: registry.py (Registry, BACKENDS, the decorator, loading modules and JSON files),
builders/ (one loader per language), checks.py (hardware, dependencies, entry point,
signature), cache.py (the build cache, $OPFORGE_CACHE_DIR), runnable.py (calling
conventions: separate arguments, keywords, one tuple), errors.py (BuildError and its kinds), solutions.py (reference, builtin and
function-backed Solutions).
"""

from .builders import build
from .cache import CACHE_DIR_VAR, cache_root
from .checks import DeviceInfo, device_info, hardware_matches
from .errors import (COMPILE_ERROR, ENTRY_POINT_ERROR, IMPORT_ERROR, SIGNATURE_ERROR, UNSUPPORTED, BuildError)
from .registry import BACKENDS, Registry, load_solution_modules, register_solution
from .runnable import Runnable
from .solutions import builtin_solution, callable_solution, reference_solution

__all__ = [
    "BACKENDS",
    "BuildError",
    "CACHE_DIR_VAR",
    "COMPILE_ERROR",
    "DeviceInfo",
    "ENTRY_POINT_ERROR",
    "IMPORT_ERROR",
    "Registry",
    "Runnable",
    "SIGNATURE_ERROR",
    "UNSUPPORTED",
    "build",
    "builtin_solution",
    "cache_root",
    "callable_solution",
    "device_info",
    "hardware_matches",
    "load_solution_modules",
    "reference_solution",
    "register_solution",
]
