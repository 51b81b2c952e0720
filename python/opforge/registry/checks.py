"""What is checked before a solution runs: target hardware, dependencies, entry point, and the
entry callable's signature against the Definition. Each failure is a BuildError naming the
solution, what it asks for and what is here.

target_hardware entries (case-insensitive; a solution runs if any entry matches):

* ``any``, ``local``, ``*``: anywhere;
* ``cpu``: on CPU tensors;
* ``cuda``, ``gpu``: on any CUDA device;
* ``sm_90``, ``sm90``, ``sm_90a`` (that compute capability), ``sm_80+`` (that or newer);
* a GPU model: ``H100``, ``NVIDIA_H100``, ``B200``, ... matched as a word of the device's name.

Triton solutions under ``TRITON_INTERPRET=1`` run on CPU tensors in triton's interpreter, which
emulates any GPU: there they skip the hardware check.

dependencies entries are requirement strings (``torch>=2.4``, ``triton >= 2.3``) checked
against the installed distributions; an entry without a version also passes when a module of
that name is importable. ``cuda`` means torch's CUDA (``CUDA >= 12.0``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from ..trace.solution import source_path_problem
from .. import config
from .errors import ENTRY_POINT_ERROR, SIGNATURE_ERROR, UNSUPPORTED, BuildError

# --- device and target hardware -------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    """Where a solution is about to run: ``kind`` "cpu" or "cuda", and for CUDA the index,
    compute capability (major * 10 + minor) and name."""

    kind: str
    index: Optional[int] = None
    cc: Optional[int] = None
    name: str = ""

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu"
        return f"cuda:{self.index} ({self.name}, sm_{self.cc})"


def device_info(device=None) -> DeviceInfo:
    """Describe ``device`` ("cpu", "cuda", "cuda:1", torch.device); None: the current CUDA
    device when one is visible, else the CPU. Queries the GPU only for a CUDA device; ValueError
    naming why for a CUDA device this process cannot use."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cpu":
        return DeviceInfo("cpu")
    if device.type != "cuda":
        raise ValueError(f"device {device}: accepted: cpu, cuda, cuda:<index>")
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
               else "no CUDA device is visible here")
        raise ValueError(f"device {device}: {why}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    major, minor = torch.cuda.get_device_capability(index)
    return DeviceInfo("cuda", index, major * 10 + minor, torch.cuda.get_device_name(index))


_SM = re.compile(r"^sm_?(\d+)([af]?)(\+?)$")
_ANYWHERE = {"any", "local", "*"}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def hardware_matches(entry: str, device: DeviceInfo) -> bool:
    """Whether one target_hardware entry covers ``device`` (see the module doc)."""
    token = entry.strip().lower()
    if token in _ANYWHERE:
        return True
    if token == "cpu":
        return device.kind == "cpu"
    if device.kind != "cuda":
        return False
    if token in ("cuda", "gpu"):
        return True
    sm = _SM.match(token)
    if sm:
        target, newer = int(sm.group(1)), sm.group(3) == "+"
        return device.cc >= target if newer else device.cc == target
    model = re.sub(r"^nvidia[_\s-]*", "", token)
    words = _words(device.name)
    return bool(model) and all(part in words for part in _words(model))


def triton_interpreted() -> bool:
    """Whether triton kernels run in triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return config.triton_interpreted()


def check_hardware(solution, device: DeviceInfo) -> None:
    targets = list(solution.spec.target_hardware or [])
    language = _language(solution)
    if language == "triton" and triton_interpreted():
        return
    if not targets or any(hardware_matches(t, device) for t in targets):
        return
    hint = ""
    if language == "triton" and device.kind == "cpu":
        hint = "; set TRITON_INTERPRET=1 to run triton solutions on CPU in triton's interpreter"
    raise BuildError(
        UNSUPPORTED, solution.name, f"targets {', '.join(targets)}; this device is {device}{hint}"
    )


# --- dependencies ---------------------------------------------------------------------------


def _installed_version(name: str) -> Optional[str]:
    if name.lower() == "cuda":
        return torch.version.cuda
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def dependency_problem(entry: str) -> Optional[str]:
    """Why the requirement ``entry`` is not met here, or None when it is."""
    try:
        req = Requirement(entry)
    except InvalidRequirement as exc:
        return f"dependency {entry!r} is not a requirement string such as 'torch>=2.4' ({exc})"
    if req.marker is not None and not req.marker.evaluate():
        return None
    version = _installed_version(req.name)
    if version is None:
        if not req.specifier and req.name.lower() != "cuda" and importlib.util.find_spec(req.name) is not None:
            return None
        what = "this torch build has no CUDA" if req.name.lower() == "cuda" else "it is not installed"
        return f"needs {entry.strip()}; {what}"
    if req.specifier:
        try:
            ok = req.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            return f"needs {entry.strip()}; installed: {req.name} {version}"
    return None


def check_dependencies(solution) -> None:
    problems = [p for p in map(dependency_problem, solution.spec.dependencies or []) if p]
    if problems:
        raise BuildError(UNSUPPORTED, solution.name, "; ".join(problems))


# --- entry point ----------------------------------------------------------------------------


def _language(solution) -> str:
    language = solution.spec.language
    return str(getattr(language, "value", language)).lower()


def split_entry_point(solution) -> tuple[str, str]:
    """``"file.py::run"`` -> ("file.py", "run"); a BuildError for any other form."""
    entry = solution.spec.entry_point or ""
    file, sep, symbol = entry.partition("::")
    if not sep or not file or not symbol:
        raise BuildError(
            ENTRY_POINT_ERROR, solution.name, f"entry_point {entry!r} is not of the form 'file::symbol'"
        )
    return file, symbol


def check_sources(solution, entry_file: Optional[str]) -> None:
    """Source paths stay inside the solution's folder; ``entry_file`` (if given) is one of them.
    (The schema checks both when a Solution is made; this covers one changed afterwards.)"""
    paths = [s.path for s in solution.sources]
    for path in paths:
        problem = source_path_problem(path)
        if problem:
            raise BuildError(ENTRY_POINT_ERROR, solution.name, f"source {problem}")
    if entry_file is not None and entry_file not in paths:
        listed = ", ".join(paths) or "none"
        raise BuildError(
            ENTRY_POINT_ERROR,
            solution.name,
            f"entry point file {entry_file!r} is not among the sources (sources: {listed})",
        )


# --- signature ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """What a callable's signature says: positional parameter names, how many are required,
    whether it takes ``*args``, its required keyword-only parameters, and whether it is a
    compiled function known only from its docstring (which may take no keywords at all)."""

    names: list[str]
    required: int
    var: bool = False
    keyword_only: tuple[str, ...] = ()
    compiled: bool = False


def _doc_params(fn: Callable) -> Optional[list[str]]:
    """Parameter names from a docstring's first line: ``run(x: Tensor, y: float) -> Tensor``
    (pybind11) or ``run(x, w)`` (a C function's own)."""
    doc = (getattr(fn, "__doc__", None) or "").lstrip()
    name = getattr(fn, "__name__", "")
    if not name or not doc.startswith(name + "("):
        return None
    first = doc.splitlines()[0]
    if "Overloaded function" in doc or "*args" in first:
        return None
    depth, start, params = 0, len(name) + 1, []
    for i in range(start, len(first)):
        ch = first[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                params.append(first[start:i])
                break
            depth -= 1
        elif ch == "," and depth == 0:
            params.append(first[start:i])
            start = i + 1
    return [p.split(":")[0].split("=")[0].strip() for p in params if p.strip()]


def signature_of(fn: Callable) -> Optional[Params]:
    """The callable's Params, or None when nothing says (a compiled function without a
    signature or a docstring naming its parameters)."""
    schema = getattr(getattr(fn, "default", None), "_schema", None)  # a torch.ops op
    if schema is not None:
        positional = [a for a in schema.arguments if not a.kwarg_only]
        return Params([a.name for a in positional], sum(a.default_value is None for a in positional))
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        names = _doc_params(fn)
        return None if names is None else Params(names, len(names), compiled=True)
    names, required, var, keyword_only = [], 0, False, []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
            required += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            var = True
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            keyword_only.append(p.name)
    return Params(names, required, var, tuple(keyword_only))


#: How a Runnable calls its entry (check_signature's answer).
POSITIONAL = "positional"  # entry(*values), the Definition's order
BY_NAME = "by_name"  # entry(**{name: value}): its parameters carry the Definition's names
TUPLE = "tuple"  # entry(values): one tuple (see check_signature)


def check_signature(solution, fn: Callable, inputs: list[str], outputs: list[str], dps: bool) -> str:
    """Fit the entry callable to the Definition: its inputs, then its outputs for
    destination-passing style. Names may differ; the count must fit. Returns how calls go
    (POSITIONAL, BY_NAME or TUPLE):

    * BY_NAME when the parameters carry every name the Definition passes, in any order (for a
      compiled function, only when the order differs: it may take no keywords);
    * TUPLE when the entry has exactly one positional parameter (any name, any annotation:
      ``def kernel(data: input_t) -> output_t``) and the call passes more than one value: the
      values go in as one tuple, inputs then outputs for destination-passing style;
    * POSITIONAL otherwise, and when nothing says what the callable takes.

    With exactly one value to pass (a value-returning Definition with one input), one parameter
    takes that value itself: a one-tuple and a one-tensor parameter look the same, and the
    plain call is what such entries have always received.
    """
    params = signature_of(fn)
    if params is None:
        return POSITIONAL
    names = params.names
    expected = inputs + outputs if dps else inputs
    n = len(expected)
    if n > 1 and len(names) == 1 and not params.var and not params.keyword_only:
        return TUPLE
    if params.required <= n and (len(names) >= n or params.var) and not params.keyword_only:
        by_name = set(expected) <= set(names) and set(names[:params.required]) <= set(expected)
        return BY_NAME if by_name and not (params.compiled and names[:n] == expected) else POSITIONAL
    style = "destination-passing call passes inputs then outputs" if dps else "value-returning call passes"
    if params.keyword_only:
        problem = f"entry has required keyword-only parameter(s) {', '.join(params.keyword_only)}"
    else:
        problem = "entry takes (" + ", ".join(names + (["*args"] if params.var else [])) + ")"
    problem += f"; the Definition's {style} {n}: ({', '.join(expected)}), as separate arguments or as one tuple"
    if not dps and outputs and len(names) == len(inputs) + len(outputs):
        problem += "; it looks destination-passing: set destination_passing_style"
    elif dps and len(names) == len(inputs):
        problem += "; it looks value-returning: unset destination_passing_style"
    raise BuildError(SIGNATURE_ERROR, solution.name, problem)
