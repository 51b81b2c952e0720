"""Reading and writing schema objects as files, with errors that name the file and field.

Reads are bounded: a JSON file or a JSONL line larger than ``MAX_RECORD_BYTES`` is reported
without being held in memory (a JSON file from its size alone), so a huge or sparse file
cannot exhaust memory. Whole files
are written to a temporary file in the same folder, fsynced and renamed over the target, and
the folder is fsynced: a reader sees the old file or the new one, never a part, and a failed
write leaves nothing behind. Appended lines are fsynced too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from ._base import DuplicateKeyError, loads
from .errors import LoadError, SchemaError

#: The largest JSON file, JSONL line or safetensors header that is read, in bytes. Read at each
#: use, so it can be raised for a dataset that needs it.
MAX_RECORD_BYTES = 32 * 1024 * 1024


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


def _too_large(display: str, size: int, what: str, line: Optional[int] = None) -> LoadError:
    return LoadError(display, None, f"{what} is {size} bytes, more than the {MAX_RECORD_BYTES} read "
                                    "(opforge.trace._io.MAX_RECORD_BYTES)", line)


def read_json(path: Path, display: str) -> Any:
    """Parse a JSON file; LoadError for an unreadable, oversized or malformed one."""
    limit = MAX_RECORD_BYTES
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise _too_large(display, size, "the file")
            raw = handle.read(limit + 1)  # bounded even if the file grows meanwhile
    except OSError as exc:
        raise LoadError(display, None, f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise _too_large(display, len(raw), "the file")
    try:
        return loads(raw.decode("utf-8"))
    except (ValueError, DuplicateKeyError) as exc:  # UnicodeDecodeError is a ValueError
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


def _lines(handle, display: str) -> Iterator[tuple[int, Union[bytes, LoadError]]]:
    """(line number, raw line or LoadError) of a binary file, each line read with bounded
    memory: an oversized line is reported and skipped by reading through it in chunks."""
    limit = MAX_RECORD_BYTES
    number = 0
    while True:
        raw = handle.readline(limit + 1)
        if not raw:
            return
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            size = len(raw)
            while not raw.endswith(b"\n"):
                raw = handle.readline(1 << 20)
                if not raw:
                    break
                size += len(raw)
            yield number, _too_large(display, size, "the line", number)
            continue
        yield number, raw


def iter_jsonl(model_cls, path: Path, display: str) -> Iterator[tuple[int, Union[Any, LoadError]]]:
    """(line number, object or LoadError) for every non-blank line of a JSONL file. A file
    that cannot be read at all yields one LoadError with line 0."""
    try:
        handle = open(path, "rb")
    except OSError as exc:
        yield 0, LoadError(display, None, f"cannot be read: {exc.strerror or exc}")
        return
    with handle:
        try:
            for number, raw in _lines(handle, display):
                if isinstance(raw, LoadError):
                    yield number, raw
                elif raw.strip():
                    yield number, _parse_line(model_cls, raw, display, number)
        except OSError as exc:
            yield 0, LoadError(display, None, f"cannot be read: {exc.strerror or exc}")


def _parse_line(model_cls, raw: bytes, display: str, number: int) -> Union[Any, LoadError]:
    try:
        data = loads(raw.decode("utf-8"))
    except (ValueError, DuplicateKeyError) as exc:
        return _decode_error(display, exc, number)
    if not isinstance(data, dict):
        return LoadError(display, None, f"expected a JSON object, found {type(data).__name__}", number)
    try:
        return model_cls.from_dict(data)
    except SchemaError as exc:
        return schema_to_load_error(display, exc, line=number)


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable (where folders can be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the file itself is already synced
    finally:
        os.close(fd)


def write_atomic(path: Path, fill: Callable[[Path], None]) -> None:
    """Replace ``path`` as a whole: ``fill`` writes a temporary file in the same folder, which
    is fsynced and renamed over ``path``; then the folder is fsynced. On any failure the
    temporary file is removed and ``path`` is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short fixed prefix: the target's own name may already be as long as a name can be.
    fd, name = tempfile.mkstemp(prefix=".opforge-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        fill(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, (path.stat().st_mode & 0o777) if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def _holds(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return os.fstat(handle.fileno()).st_size == len(data) and handle.read() == data
    except OSError:
        return False


def _same_content(a: Path, b: Path) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            if os.fstat(fa.fileno()).st_size != os.fstat(fb.fileno()).st_size:
                return False
            while True:
                chunk = fa.read(1 << 20)
                if chunk != fb.read(1 << 20):
                    return False
                if not chunk:
                    return True
    except OSError:
        return False


def copy_file(source: Path, target: Path) -> bool:
    """Copy ``source`` to ``target`` with write_atomic (streamed, not read into memory),
    skipping a target that already holds the same bytes. True if written."""
    if _same_content(source, target):
        return False
    write_atomic(target, partial(shutil.copyfile, source))
    return True


def write_text(path: Path, text: str) -> bool:
    """Write text (UTF-8, '\\n' line ends) with write_atomic, skipping a file that already holds
    it. True if written."""
    raw = text.encode("utf-8")
    if _holds(path, raw):
        return False
    write_atomic(path, lambda tmp: tmp.write_bytes(raw))
    return True


def append_line(path: Path, line: str) -> None:
    """Append one JSONL line (adding a newline first if the file lacks a final one), fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a+b") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        handle.write(line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    if new:
        fsync_folder(path.parent)
