"""Reading and writing schema objects as files, with errors that name the file and field."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from ._base import DuplicateKeyError, loads
from .errors import LoadError, SchemaError


def _decode_error(display: str, exc: Exception, line: Optional[int] = None) -> LoadError:
    if isinstance(exc, DuplicateKeyError):
        return LoadError(display, exc.key, "appears twice in the same object (duplicate name)", line)
    if isinstance(exc, json.JSONDecodeError):
        where = f"column {exc.colno}" if line is not None else f"line {exc.lineno}, column {exc.colno}"
        return LoadError(display, None, f"malformed JSON: {exc.msg} ({where})", line)
    if isinstance(exc, UnicodeDecodeError):
        return LoadError(display, None, f"not UTF-8 text: {exc}", line)
    return LoadError(display, None, f"{type(exc).__name__}: {exc}", line)


def schema_to_load_error(display: str, exc: SchemaError, prefix: str = "", line: Optional[int] = None) -> LoadError:
    """A LoadError for the first problem of a SchemaError (the others listed in the message)."""
    field, message = exc.errors[0] if exc.errors else (exc.field, exc.message)
    if len(exc.errors) > 1:
        more = "; ".join(f"{f}: {m}" if f else m for f, m in exc.errors[1:])
        message = f"{message} (also: {more})"
    full = ".".join(p for p in (prefix, field) if p)
    return LoadError(display, full or None, message, line)


def read_json(path: Path, display: str) -> Any:
    """Parse a JSON file; LoadError for unreadable or malformed text."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoadError(display, None, f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _decode_error(display, exc) from None
    try:
        return loads(text)
    except (ValueError, DuplicateKeyError) as exc:
        raise _decode_error(display, exc) from None


def read_model(model_cls, path: Path, display: str):
    """Load one object from a JSON file; LoadError naming file and field on failure."""
    data = read_json(path, display)
    if not isinstance(data, dict):
        raise LoadError(display, None, f"expected a JSON object, found {type(data).__name__}")
    try:
        return model_cls.from_dict(data)
    except SchemaError as exc:
        raise schema_to_load_error(display, exc) from None


def iter_jsonl(model_cls, path: Path, display: str) -> Iterator[tuple[int, Union[Any, LoadError]]]:
    """(line number, object or LoadError) for every non-blank line of a JSONL file. A file
    that cannot be read at all yields one LoadError with line 0."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        yield 0, (LoadError(display, None, f"cannot be read: {exc}") if isinstance(exc, OSError)
                  else _decode_error(display, exc))
        return
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            data = loads(raw)
        except (ValueError, DuplicateKeyError) as exc:
            yield number, _decode_error(display, exc, number)
            continue
        if not isinstance(data, dict):
            yield number, LoadError(display, None, f"expected a JSON object, found {type(data).__name__}", number)
            continue
        try:
            yield number, model_cls.from_dict(data)
        except SchemaError as exc:
            yield number, schema_to_load_error(display, exc, line=number)


def write_text(path: Path, text: str) -> bool:
    """Write atomically (temporary file + rename); skip an identical file. True if written."""
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, (path.stat().st_mode & 0o777) if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def append_line(path: Path, line: str) -> None:
    """Append one JSONL line (adding a newline first if the file lacks a final one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        handle.write(line.encode("utf-8") + b"\n")
