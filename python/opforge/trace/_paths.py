"""Names and paths inside a dataset folder, and the one check that keeps every read and write
of a dataset inside its root.

A dataset's files are found by walking its folders and by joining the root with relative paths
(a workload's safetensors ``path``, an object's place in the layout). Both go through here:

* ``name_problem`` says whether a string can be one file or folder name: what a Definition,
  Solution, op_type, author or workload uuid becomes on disk;
* ``relative_path_problem`` says whether a string is a plain relative path (no '..', not
  absolute, every part a valid name);
* ``dataset_path`` joins a root and such a path and refuses it if any existing part below the
  root is a symbolic link; ``dataset_files`` walks a folder the same way.

Symbolic links below the dataset root are never followed, not even ones that point inside
it: a linked file or folder is reported and skipped when loading, and refused when writing.
That keeps each object in one place (no file read twice under two names, no loops) and makes
"inside the dataset" a property of the path alone. The root itself may be a link.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import Iterator, Optional

from .errors import DatasetPathError

#: Longest file or folder name, in bytes, that common file systems accept (ext4, xfs, btrfs).
NAME_MAX = 255


def name_problem(value: object, what: str, suffix: str = "") -> Optional[str]:
    """Why ``value`` followed by ``suffix`` cannot be one file or folder name (None when it can)."""
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty string"
    if value != value.strip():
        return f"{what} {value!r} has leading or trailing whitespace"
    if value in (".", "..") or any(c in value for c in "/\\") or any(ord(c) < 32 for c in value):
        return f"{what} {value!r} cannot be used as a file name (no '/', '\\\\', control characters, '.' or '..')"
    size = len((value + suffix).encode("utf-8", "surrogatepass"))
    if size > NAME_MAX:
        with_suffix = f" with the suffix {suffix!r}" if suffix else ""
        return (f"{what} is too long for a file name: {size} bytes in UTF-8{with_suffix}, "
                f"at most {NAME_MAX} (the name itself at most {NAME_MAX - len(suffix.encode())})")
    return None


def _plain(path: str) -> str:
    # FlashInfer-Bench writes blob paths as "./blob/...": the same path, relative to the root.
    while path.startswith("./"):
        path = path[2:]
    return path


def relative_path_problem(path: object) -> Optional[str]:
    """Why ``path`` is not a plain relative path inside a folder (None when it is): '/'
    separators, not absolute, no '..', normalized, every part a name a file system accepts."""
    if not isinstance(path, str) or not path:
        return "path must be a non-empty string"
    path = _plain(path)
    if "\\" in path:
        return f"path {path!r} must use '/' separators"
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        return f"path {path!r} must be relative, not absolute"
    parts = path.split("/")
    if ".." in parts:
        return f"path {path!r} must not contain '..'"
    if any(p in ("", ".") for p in parts) or posixpath.normpath(path) != path:
        return f"path {path!r} is not normalized"
    if "\0" in path:
        return f"path {path!r} contains a NUL character"
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            return f"path {path!r} has a part longer than {NAME_MAX} bytes: {part[:40]!r}..."
    return None


def _link_problem(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"is a symbolic link (to {target}); links inside a dataset are not followed"


def dataset_path(root: Path, relative: str) -> Path:
    """``root / relative`` for reading or writing a dataset's file, after checking that it stays
    inside ``root``: ``relative`` is a plain relative path and no existing part of it is a
    symbolic link. DatasetPathError (naming the path and the part) otherwise."""
    problem = relative_path_problem(relative)
    if problem:
        raise DatasetPathError(problem)
    relative = _plain(relative)
    path = Path(root)
    for part in relative.split("/"):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # nothing below a missing part exists, so nothing below can be a link
        if stat.S_ISLNK(mode):
            shown = path.relative_to(root).as_posix()
            where = "" if shown == relative else f" (in {relative})"
            raise DatasetPathError(f"{shown}{where} {_link_problem(path)}")
    return Path(root) / relative


def dataset_files(root: Path, folder: str, suffix: str) -> Iterator[tuple[str, Optional[str]]]:
    """``(path relative to root, problem)`` for every file named ``*suffix`` under
    ``root/folder``, in sorted order, without following links. ``problem`` is None for a
    regular file to read; otherwise it says why the entry is skipped: a symbolic link (to a
    file named ``*suffix`` or to a folder, reported once and not entered), something that is
    not a regular file, or a folder that cannot be listed."""
    stack = [folder]
    while stack:
        relative = stack.pop()
        path = root / relative
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            yield relative, f"cannot be read: {exc.strerror or exc}"
            continue
        if stat.S_ISLNK(mode):
            if relative.endswith(suffix) or path.is_dir():
                yield relative, _link_problem(path)
        elif stat.S_ISDIR(mode):
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                yield relative, f"folder cannot be listed: {exc.strerror or exc}"
                continue
            stack.extend(f"{relative}/{name}" for name in reversed(names))
        elif relative.endswith(suffix):
            yield relative, None if stat.S_ISREG(mode) else "is not a regular file"
