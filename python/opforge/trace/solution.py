"""Solutions: an implementation of a Definition as source files plus how to build and call it.

JSON (FlashInfer-Trace)::

    {"name": "rmsnorm_triton_v1", "definition": "rmsnorm_h4096", "author": "alice",
     "spec": {"language": "triton", "target_hardware": ["cuda"], "entry_point": "main.py::run",
              "dependencies": [], "destination_passing_style": false, "binding": null},
     "sources": [{"path": "main.py", "content": "..."}],
     "description": null}

``destination_passing_style`` defaults to **true** as in FlashInfer-Trace: ``run`` receives
preallocated outputs after the inputs. Value-returning solutions must say ``false``.
``target_hardware`` may be left out when constructing in Python: it is then filled in from the
language (``["cuda"]`` for GPU languages, ``["cpu", "cuda"]`` for python / pytorch / builtin,
``["cpu"]`` for cpp) so written files always carry it (FlashInfer-Trace requires it).
"""

from __future__ import annotations

import ast
import hashlib
from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import Field, field_serializer, model_validator

from ._base import TraceModel, canonical_hash_text
from ._paths import name_problem
from ._paths import relative_path_problem as source_path_problem  # the name registry.checks imports
from .errors import SchemaError
from .schema import NAME_SUFFIX


class SupportedLanguages(str, Enum):
    """Languages of solutions. ``pytorch`` and ``builtin`` are opforge additions, read but not
    written: ``pytorch`` is written as ``python`` (BuildSpec), and opforge's own compiled ops are
    python solutions of a generated form (own_op.py) where older files said ``builtin``. The
    others are FlashInfer-Trace's."""

    PYTHON = "python"
    PYTORCH = "pytorch"
    TRITON = "triton"
    TILELANG = "tilelang"
    CUTEDSL = "cutedsl"
    CUDA = "cuda"
    CPP = "cpp"
    BUILTIN = "builtin"

    def __str__(self) -> str:
        return self.value


class SupportedBindings(str, Enum):
    """How compiled C++/CUDA sources are called from Python."""

    TVM_FFI = "tvm-ffi"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value


_DEFAULT_HARDWARE = {
    SupportedLanguages.PYTHON: ["cpu", "cuda"],
    SupportedLanguages.PYTORCH: ["cpu", "cuda"],
    SupportedLanguages.BUILTIN: ["cpu", "cuda"],
    SupportedLanguages.CPP: ["cpu"],
}


class SourceFile(TraceModel):
    """One source file: a relative ``path`` (no '..', not absolute) and its text."""

    path: str
    content: str

    @model_validator(mode="after")
    def _check(self) -> "SourceFile":
        problem = source_path_problem(self.path)
        if problem:
            raise SchemaError("path", problem)
        return self


class BuildSpec(TraceModel):
    """How to build and call a solution (see the module docstring for defaults)."""

    language: SupportedLanguages
    #: Filled in from the language when left out (see the module docstring).
    target_hardware: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = None  # type: ignore
    entry_point: str
    dependencies: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Optional[SupportedBindings] = None

    @model_validator(mode="before")
    @classmethod
    def _fill_hardware(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("target_hardware") is None and "language" in data:
            try:
                language = SupportedLanguages(data["language"])
            except ValueError:
                return data
            data = {**data, "target_hardware": list(_DEFAULT_HARDWARE.get(language, ["cuda"]))}
        return data

    @field_serializer("language", when_used="json")
    def _written_language(self, language: SupportedLanguages) -> str:
        # "pytorch" is written as "python" (the same build: a module imported): FlashInfer-Bench's
        # language list has no "pytorch". In memory it stays as registered, for the tables.
        return SupportedLanguages.PYTHON.value if language is SupportedLanguages.PYTORCH else language.value

    @model_validator(mode="after")
    def _check(self) -> "BuildSpec":
        if self.entry_point.count("::") != 1:
            raise SchemaError("entry_point",
                              f"{self.entry_point!r} is not of the form 'file::symbol' (e.g. 'main.py::run')")
        path, symbol = self.entry_point.split("::")
        problem = source_path_problem(path)
        if problem:
            raise SchemaError("entry_point", problem)
        if not all(part.isidentifier() for part in symbol.split(".")):
            raise SchemaError("entry_point", f"{symbol!r} is not a valid symbol name")
        return self

    @property
    def entry_path(self) -> str:
        return self.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        return self.entry_point.split("::")[1]


def _python_defines(source: str, symbol: str) -> bool:
    """Whether Python source binds ``symbol`` at top level (True when undecidable)."""
    module = ast.parse(source)
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == symbol:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == symbol for t in targets for n in ast.walk(t)):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == symbol:
                    return True
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            return True  # conditional definitions: leave the check to the builder
    return False


class Solution(TraceModel):
    """An implementation of the Definition named ``definition``."""

    name: str
    definition: str
    author: str
    spec: BuildSpec
    sources: Annotated[list[SourceFile], Field(min_length=1)]
    description: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "Solution":
        # A solution is saved as solutions/<author>/<op_type>/<definition>/<name>.json.
        for field, suffix in (("name", ".json"), ("definition", NAME_SUFFIX), ("author", "")):
            problem = name_problem(getattr(self, field), field, suffix)
            if problem:
                raise SchemaError(field, problem)
        seen: dict[str, int] = {}
        for i, source in enumerate(self.sources):
            if source.path in seen:
                raise SchemaError(f"sources[{i}].path",
                                  f"{source.path!r} appears twice (also sources[{seen[source.path]}])")
            seen[source.path] = i
        entry = self.spec.entry_path
        if entry not in seen:
            raise SchemaError("spec.entry_point", f"entry file {entry!r} is not among the sources ({', '.join(seen)})")
        source = self.sources[seen[entry]]
        if entry.endswith(".py"):
            try:
                defined = _python_defines(source.content, self.spec.entry_symbol.split(".")[0])
            except SyntaxError as exc:
                raise SchemaError(f"sources[{seen[entry]}].content",
                                  f"{entry}: invalid Python: {exc.msg} (line {exc.lineno})") from None
            if not defined:
                raise SchemaError("spec.entry_point", f"{entry} defines no top-level {self.spec.entry_symbol!r}")
        return self

    def get_entry_source(self) -> SourceFile:
        """The source file holding the entry point."""
        return next(s for s in self.sources if s.path == self.spec.entry_path)

    def content_hash(self) -> str:
        """SHA-256 of the build spec and the sources (paths and contents): equal hashes build
        to the same thing, so builds are cached under it. Name, author and description are
        not part of it."""
        data = {"spec": self.spec.hash_form(), "sources": [s.hash_form() for s in self.sources]}
        return hashlib.sha256(canonical_hash_text(data).encode()).hexdigest()
