"""Errors of the trace schema and storage.

Every error says where the problem is: the file (when there is one), the field inside the
object (a dotted path such as ``inputs.weight.dtype``) and what is wrong with it.
"""

from __future__ import annotations

from typing import Optional


class SchemaError(ValueError):
    """An object that does not satisfy the schema.

    ``errors`` is a list of ``(field, message)`` pairs; ``field`` is a dotted path inside the
    object ("" for the object as a whole). ``model`` names the kind of object.
    """

    def __init__(self, field: str, message: str, *, model: Optional[str] = None,
                 errors: Optional[list[tuple[str, str]]] = None):
        self.field = field
        self.message = message
        self.model = model
        self.errors = errors if errors is not None else [(field, message)]
        super().__init__(self._render())

    def __reduce__(self):
        return (_rebuild_schema_error, (self.field, self.message, self.model, self.errors))

    def _render(self) -> str:
        lines = [f"{field}: {message}" if field else message for field, message in self.errors]
        head = f"invalid {self.model}: " if self.model else ""
        if len(lines) == 1:
            return head + lines[0]
        return head + f"{len(lines)} problems\n  " + "\n  ".join(lines)


class LoadError(ValueError):
    """A file (or one line of a JSONL file) that could not be loaded.

    ``path`` is the file as shown to the user (relative to the dataset root when there is one),
    ``line`` the 1-based line of a JSONL file, ``field`` the dotted path inside the object (None
    when the problem is the file itself, e.g. malformed JSON) and ``message`` what is wrong.
    """

    def __init__(self, path: str, field: Optional[str], message: str, line: Optional[int] = None):
        self.path = str(path)
        self.field = field
        self.message = message
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    def __reduce__(self):
        return (LoadError, (self.path, self.field, self.message, self.line))

    def __repr__(self) -> str:
        return f"LoadError(path={self.path!r}, field={self.field!r}, message={self.message!r}, line={self.line!r})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, LoadError):
            return NotImplemented
        return (self.path, self.field, self.message, self.line) == (other.path, other.field, other.message, other.line)

    __hash__ = ValueError.__hash__


class ExpressionError(ValueError):
    """An axis expression (constraint, bytes or flops formula) that is malformed, unsafe or
    refers to an unknown name."""


class ConstraintError(ValueError):
    """A constraint of a Definition that does not hold (or cannot be evaluated) for given axis
    values. ``definition`` and ``constraint`` name it."""

    def __init__(self, definition: str, constraint: str, message: str):
        self.definition = definition
        self.constraint = constraint
        self.reason = message
        super().__init__(f"{definition}: constraint {constraint!r} {message}")

    def __reduce__(self):
        return (ConstraintError, (self.definition, self.constraint, self.reason))


class WorkloadError(ValueError):
    """A Workload that does not fit its Definition; ``field`` is the path inside the workload
    (e.g. ``axes.batch_size`` or ``inputs.weight``)."""

    def __init__(self, definition: str, uuid: str, field: str, message: str):
        self.definition = definition
        self.uuid = uuid
        self.field = field
        self.message = message
        super().__init__(f"{definition}: workload {uuid}: {field}: {message}")

    def __reduce__(self):
        return (WorkloadError, (self.definition, self.uuid, self.field, self.message))


class BlobError(ValueError):
    """A safetensors blob of a workload that is missing, unreadable, of the wrong shape/dtype, or
    outside the dataset folder."""


class MissingBlobError(BlobError):
    """A safetensors blob a workload refers to is not there (e.g. kept outside git and not fetched)."""


class DatasetPathError(ValueError):
    """A path that would take a read or write out of a dataset folder: absolute, with '..', or
    through a symbolic link below the dataset root."""


class DuplicateError(ValueError):
    """An object whose name is already taken in a TraceSet."""


class UnknownDefinitionError(ValueError):
    """A solution, workload or trace that refers to a Definition the TraceSet does not hold."""


class UnknownSolutionError(ValueError):
    """A trace that refers to a Solution the TraceSet does not hold."""


class NotFoundError(KeyError):
    """A name that a TraceSet does not hold (a KeyError whose message reads plainly)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _rebuild_schema_error(field, message, model, errors):
    return SchemaError(field, message, model=model, errors=errors)
