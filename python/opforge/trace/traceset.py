"""TraceSet: Definitions, Solutions, Workloads and Traces, in memory and on disk.

A dataset folder has the FlashInfer-Trace layout::

    definitions/<op_type>/<definition>.json
    workloads/<op_type>/<definition>.jsonl                 (workload traces, one per line)
    solutions/<author>/<op_type>/<definition>/<solution>.json
    traces/<author>/<op_type>/<definition>.jsonl           (evaluated traces, one per line)
    blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors

Adding is in memory (``persist=True`` on add_workload / add_trace appends the line to its file
right away); ``save`` writes. Objects loaded from a file go back to it, new ones where the
layout says; files whose objects did not change are left as they are (see _saving.py).
``save("x.json")`` writes everything to one JSON file instead: ``{"definitions": {name: ...},
"solutions": {definition: [...]}, "workloads": {definition: [...]}, "traces": {definition:
[...]}}`` (FlashInfer-Bench's TraceSet.to_dict, whose ``"workload"`` key is read too).

Loading reports every bad file or line as a LoadError (file, line, field, message), logs a
warning, and loads the rest (``load_errors`` lists them); ``strict=True`` raises the first.
Objects that depend on a bad one (the solutions of a definition that failed) are reported too.

A dataset stays inside its folder. Symbolic links below the root are never followed, even
ones that point inside it: when loading, a linked file or folder is reported once and skipped;
appending or saving through one, or to a blob path that leads out of the folder, raises
DatasetPathError (BlobError for blobs) before anything is written. A JSON file or JSONL line
larger than ``opforge.trace._io.MAX_RECORD_BYTES`` is reported without being read; blobs are
checked from their headers. Files are written whole and fsynced, appended lines fsynced.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Optional, Union

from ._base import dumps
from ._io import write_text
from ._loading import LoadingMixin
from ._saving import SavingMixin
from .blob import check_safetensors_input, load_safetensors_input
from .errors import DuplicateError, LoadError, NotFoundError, UnknownDefinitionError, UnknownSolutionError
from .own_op import AdapterError, is_legacy, upgrade_legacy
from .schema import Definition
from .solution import Solution
from .trace import Trace
from .workload import SafetensorsInput, Workload

PathLike = Union[str, Path]


def _close(name: str, names: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(names), n=3)
    return f" (did you mean {', '.join(map(repr, match))}?)" if match else ""


class TraceSet(LoadingMixin, SavingMixin):
    """Definitions by name; solutions, workloads and traces by definition name."""

    def __init__(self, root: Optional[PathLike] = None, definitions=None, solutions=None, workloads=None, traces=None):
        self.root: Optional[Path] = Path(root) if root is not None else None
        self.definitions: dict[str, Definition] = {}
        self.solutions: dict[str, list[Solution]] = {}
        self.workloads: dict[str, list[Trace]] = {}
        self.traces: dict[str, list[Trace]] = {}
        self.load_errors: list[LoadError] = []
        #: (definition, workload uuid, why) for workloads loaded whose safetensors inputs are missing.
        self.missing_blobs: list[tuple[str, str, str]] = []
        self._solution_by_name: dict[str, Solution] = {}
        self._lines: list[Trace] = []  # workload and evaluated traces in the order added
        self._failed: dict[str, str] = {}  # definition/solution name -> file that failed to load
        self._file_counts: dict[str, int] = {}  # file under root -> objects loaded from / written to it
        self._known_files: dict[str, set[str]] = {}  # folder -> files this TraceSet wrote there
        self._json_file: Optional[Path] = None  # the single JSON file it was loaded from
        self._origin: dict[int, str] = {}  # id(object) -> file under root it came from
        self._snapshot: dict[int, str] = {}  # id(object) -> its JSON text when loaded or saved
        for d in (definitions.values() if isinstance(definitions, dict) else definitions or ()):
            self.add_definition(d)
        for group in (solutions.values() if isinstance(solutions, dict) else [solutions or ()]):
            for s in group:
                self.add_solution(s)
        for group in (workloads.values() if isinstance(workloads, dict) else [workloads or ()]):
            for w in group:
                self.add_workload(w.definition, w)
        for group in (traces.values() if isinstance(traces, dict) else [traces or ()]):
            for t in group:
                self.add_trace(t)

    def __repr__(self) -> str:
        count = lambda d: sum(len(v) for v in d.values())  # noqa: E731
        return (f"TraceSet(root={str(self.root) if self.root else None!r}, definitions={len(self.definitions)}, "
                f"solutions={count(self.solutions)}, workloads={count(self.workloads)}, traces={count(self.traces)})")

    @property
    def single_file(self) -> Optional[Path]:
        """The .json file this TraceSet was loaded from (None for a dataset folder or one made in
        memory)."""
        return self._json_file

    # --- adding ------------------------------------------------------------------------

    def add_definition(self, definition: Definition) -> Definition:
        if not isinstance(definition, Definition):
            raise TypeError(f"add_definition takes a Definition, not {type(definition).__name__}")
        if definition.name in self.definitions:
            first = self.definitions[definition.name]
            raise DuplicateError(f"definition {definition.name!r} already exists{self._from(first)}")
        self.definitions[definition.name] = definition
        self.solutions.setdefault(definition.name, [])
        self.workloads.setdefault(definition.name, [])
        self.traces.setdefault(definition.name, [])
        return definition

    def add_solution(self, solution: Solution) -> Solution:
        """Add ``solution`` and return what was added: a legacy ``builtin`` record of opforge's
        own op is turned into its python form (own_op.py), so saving writes that; one that
        cannot be is kept as it is (building it says why)."""
        if not isinstance(solution, Solution):
            raise TypeError(f"add_solution takes a Solution, not {type(solution).__name__}")
        definition = self._require_definition(solution.definition, f"solution {solution.name!r}")
        if is_legacy(solution):
            try:
                solution = upgrade_legacy(solution, definition)
            except AdapterError:
                pass
        if solution.name in self._solution_by_name:
            first = self._solution_by_name[solution.name]
            raise DuplicateError(f"solution {solution.name!r} already exists{self._from(first)}")
        self._solution_by_name[solution.name] = solution
        self.solutions[solution.definition].append(solution)
        return solution

    def add_workload(self, definition_name: str, workload: Union[Workload, Trace], *, persist: bool = False) -> Trace:
        """Add a workload (or a workload trace) of a Definition after checking it fits
        (Definition.check_workload). ``persist`` also appends it to its file under ``root``."""
        if isinstance(workload, Trace):
            if not workload.is_workload_trace():
                raise ValueError(f"trace of solution {workload.solution!r} is not a workload; use add_trace")
            if workload.definition != definition_name:
                raise ValueError(f"workload trace is for {workload.definition!r}, not {definition_name!r}")
            trace = workload
        elif isinstance(workload, Workload):
            trace = Trace(definition=definition_name, workload=workload)
        else:
            raise TypeError(f"add_workload takes a Workload or a Trace, not {type(workload).__name__}")
        definition = self._require_definition(definition_name, f"workload {trace.workload.uuid}")
        definition.check_workload(trace.workload)
        if any(t.workload.uuid == trace.workload.uuid for t in self.workloads[definition_name]):
            raise DuplicateError(f"{definition_name}: workload uuid {trace.workload.uuid!r} already exists")
        if persist:  # first, so that a refused or failed write leaves the set as it was
            self._append(trace)
        self.workloads[definition_name].append(trace)
        self._lines.append(trace)
        return trace

    def add_trace(self, trace: Trace, *, persist: bool = False) -> Trace:
        """Add an evaluated trace (its definition and solution must be known; a workload
        trace goes to add_workload). ``persist`` also appends it to its file under ``root``."""
        if not isinstance(trace, Trace):
            raise TypeError(f"add_trace takes a Trace, not {type(trace).__name__}")
        if trace.is_workload_trace():
            return self.add_workload(trace.definition, trace, persist=persist)
        definition = self._require_definition(trace.definition, f"trace of solution {trace.solution!r}")
        solution = self._solution_by_name.get(trace.solution)
        if solution is None or solution.definition != trace.definition:
            why = "is unknown" if solution is None else f"solves {solution.definition!r}"
            raise UnknownSolutionError(f"trace for {trace.definition!r}: solution {trace.solution!r} {why}"
                                         f"{self._failed_hint(trace.solution)}")
        definition.check_workload(trace.workload)
        if persist:  # first, so that a refused or failed write leaves the set as it was
            self._append(trace)
        self.traces[trace.definition].append(trace)
        self._lines.append(trace)
        return trace

    def _require_definition(self, name: str, what: str) -> Definition:
        if name not in self.definitions:
            raise UnknownDefinitionError(f"{what} is for definition {name!r}, which this TraceSet does not hold"
                                         f"{self._failed_hint(name) or _close(name, self.definitions)}")
        return self.definitions[name]

    def _failed_hint(self, name: Optional[str]) -> str:
        return f" ({name!r} failed to load from {self._failed[name]})" if name in self._failed else ""

    def _from(self, obj) -> str:
        return f" (from {self._origin[id(obj)]})" if id(obj) in self._origin else ""

    # --- lookup ------------------------------------------------------------------------

    def get_definition(self, name: str) -> Definition:
        if name not in self.definitions:
            raise NotFoundError(f"no definition {name!r}{_close(name, self.definitions)}")
        return self.definitions[name]

    def get_solution(self, name: str) -> Solution:
        if name not in self._solution_by_name:
            raise NotFoundError(f"no solution {name!r}{_close(name, self._solution_by_name)}")
        return self._solution_by_name[name]

    def get_solutions(self, definition: str) -> list[Solution]:
        return list(self.solutions[self.get_definition(definition).name])

    def get_workloads(self, definition: str) -> list[Trace]:
        return list(self.workloads[self.get_definition(definition).name])

    def get_traces(self, definition: str) -> list[Trace]:
        return list(self.traces[self.get_definition(definition).name])

    def get_traces_for_solution(self, solution: str) -> list[Trace]:
        s = self.get_solution(solution)
        return [t for t in self.traces[s.definition] if t.solution == s.name]

    def load_input_tensor(self, definition: str, workload: Workload, input_name: str, device: str = "cpu"):
        """The tensor of a safetensors input of a workload, checked against the Definition."""
        d = self.get_definition(definition)
        spec = workload.inputs[input_name]
        if not isinstance(spec, SafetensorsInput):
            raise ValueError(f"{definition}: workload {workload.uuid}: input {input_name!r} is {spec.type}, "
                             "not safetensors")
        shape = d.input_shapes(workload.axes)[input_name]
        where = f"{definition}: workload {workload.uuid}: inputs.{input_name}"
        return load_safetensors_input(self.root, spec, shape, d.inputs[input_name].dtype, where=where, device=device)

    def check_blobs(self, trace: Trace) -> None:
        """BlobError unless every safetensors input of the trace's workload is present with the
        Definition's shape and dtype (read from file headers, without torch)."""
        d = self.definitions[trace.definition]
        shapes = d.input_shapes(trace.workload.axes)
        for name, spec in trace.workload.inputs.items():
            if isinstance(spec, SafetensorsInput):
                check_safetensors_input(self.root, spec, shapes[name], d.inputs[name].dtype, where=f"inputs.{name}")

    # --- saving ------------------------------------------------------------------------

    def save(self, path: Optional[PathLike] = None, overwrite: bool = False) -> Path:
        """Save to one JSON file when ``path`` ends in .json, else as a dataset folder (see
        save_dataset). Without a path: back to the JSON file it was loaded from, else to
        ``root``. Returns the path written."""
        if path is None:
            if self.root is None and self._json_file is None:
                raise ValueError("save() needs a path: this TraceSet has no root folder")
            path = self._json_file or self.root
        path = Path(path)
        if path.suffix == ".json":
            write_text(path, dumps(self.to_dict()))
            return path
        return self.save_dataset(path, overwrite=overwrite)

    def to_dict(self) -> dict:
        """Everything as one JSON object (the single-file form; see the module docstring)."""
        return {
            "definitions": {n: d.to_dict() for n, d in self.definitions.items()},
            "solutions": {n: [s.to_dict() for s in v] for n, v in self.solutions.items() if v},
            "workloads": {n: [t.to_dict() for t in v] for n, v in self.workloads.items() if v},
            "traces": {n: [t.to_dict() for t in v] for n, v in self.traces.items() if v},
        }

    # --- loading -----------------------------------------------------------------------

    @classmethod
    def load(cls, path: PathLike, strict: bool = False, check_blobs: bool = True) -> "TraceSet":
        """Load a dataset folder or a single .json file (see the module docstring). Bad files
        and lines are reported in ``load_errors`` (and logged as warnings) and skipped;
        ``strict=True`` raises the first as a LoadError. With ``check_blobs`` a workload whose
        safetensors inputs are of the wrong shape or dtype counts as bad; one whose files are
        missing is kept and listed in ``missing_blobs`` (one warning says how many), since only
        running it needs them."""
        path = Path(path)
        if path.is_file():
            ts = cls(path.parent)
            ts._json_file = path
            ts._load_file(path, strict, check_blobs)
        elif path.is_dir():
            ts = cls(path)
            ts._load_folder(strict, check_blobs)
        else:
            raise FileNotFoundError(f"no dataset folder or TraceSet .json file at {path}")
        ts._summarize_missing_blobs()
        return ts

    @classmethod
    def from_path(cls, path: PathLike, strict: bool = False, check_blobs: bool = True) -> "TraceSet":
        """The same as ``load`` (FlashInfer-Bench's name): a dataset folder or a .json file."""
        return cls.load(path, strict=strict, check_blobs=check_blobs)
