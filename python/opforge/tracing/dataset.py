"""The dataset folder tracing writes into, in the FlashInfer-Trace layout the runner reads:

    definitions/<op_type>/<definition>.json
    solutions/opforge/<op_type>/<definition>/<definition>_builtin.json   (built-in ops only)
    workloads/<op_type>/<definition>.jsonl
    blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors

Nothing already on disk is overwritten. A Definition file of the same name is used as it is
when it describes the same axes and inputs as the calls (its workloads fit it), and otherwise
left alone with that Definition not traced: replacing a file someone wrote would silently
change what their workloads and traces mean. Definitions and solutions are found by file name
(``<name>.json`` anywhere under definitions/ or solutions/, as FlashInfer-Trace names them).

Several processes may trace into one folder (a launcher's workers, say): appends take an
advisory lock on the file (flock), blob names carry the workload's uuid, and whole files are
written under a temporary name and renamed.

Crash safety: a blob is written to a temporary name, fsynced and renamed (trace.blob), and the
workload line that refers to it is appended only afterwards, so every line on disk has its
blob. Lines are appended a batch at a time with one write and an fsync. A last line torn by a
kill in the middle of a write (no final newline, not JSON) is cut off before the next append,
so what was complete stays loadable with ``TraceSet.from_path(strict=True)``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one process per folder there
    fcntl = None

from ..trace._base import dumps
from ..trace._io import fsync_folder, read_model, write_text
from ..trace._paths import dataset_files, dataset_path
from ..trace.blob import save_safetensors_blob, workload_blob_relpath
from ..trace.errors import LoadError
from ..trace.schema import Definition

# Tracings nested into one folder append from their own writer threads: one line batch at a time.
_APPEND_LOCK = threading.Lock()
_TAIL_CHUNK = 1 << 16


def _interface(d: Definition) -> tuple:
    """What a workload must fit: the axes (kinds, constant values) and the inputs' shapes and
    dtypes. Two Definitions with the same interface accept the same workload lines and blobs."""
    axes = tuple((n, a.type, getattr(a, "value", None)) for n, a in d.axes.items())
    inputs = tuple((n, None if s.shape is None else tuple(s.shape), s.dtype.value) for n, s in d.inputs.items())
    return d.op_type, axes, inputs


class DatasetFolder:
    """Writes definitions, solutions, blobs and workload lines under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._definitions: dict[str, str] = {}  # file stem -> path relative to root
        self._solutions: dict[str, str] = {}

    def prepare(self) -> None:
        """Create the folder and check that files can be written there (OSError if not), then
        index the definition and solution files it already holds."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".opforge-", suffix=".tmp", dir=self.root)
        os.close(fd)
        os.unlink(probe)
        for folder, index in (("definitions", self._definitions), ("solutions", self._solutions)):
            for relative, problem in dataset_files(self.root, folder, ".json"):
                if problem is None:
                    index.setdefault(Path(relative).stem, relative)

    def lookup_definition(self, name: str) -> Optional[Definition]:
        """The Definition the folder holds under ``name`` (None if none, or unreadable)."""
        relative = self._definitions.get(name)
        if relative is None:
            return None
        try:
            found = read_model(Definition, dataset_path(self.root, relative), relative)
        except (LoadError, OSError, ValueError):
            return None
        return found if found.name == name else None

    def use_definition(self, ours: Definition) -> tuple[Optional[Definition], Optional[str]]:
        """The Definition to record ``ours``'s workloads against, and a note to say once.

        Writes ``ours`` when the folder has no file of that name; returns the file's Definition
        when it has the same interface; returns None (with why) when it differs or cannot be
        read, leaving the file as it is."""
        relative = self._definitions.get(ours.name)
        if relative is None:
            relative = f"definitions/{ours.op_type}/{ours.name}.json"
            path = dataset_path(self.root, relative)
            self._definitions[ours.name] = relative
            if not path.exists():  # (another process tracing here may have written it meanwhile)
                write_text(path, dumps(ours.to_dict()))
                return ours, None
        try:
            existing = read_model(Definition, dataset_path(self.root, relative), relative)
        except (LoadError, OSError, ValueError) as exc:
            return None, f"{relative} cannot be used ({exc}); it is left as it is and {ours.name} is not traced"
        if existing == ours:
            return existing, None
        if existing.name != ours.name or _interface(existing) != _interface(ours):
            return None, (f"{relative} holds a different Definition than opforge makes for these calls of "
                          f"{ours.name} (its name, op_type, axes or inputs differ); it is left as it is and "
                          f"{ours.name} is not traced")
        if existing.content_hash() != ours.content_hash():
            return existing, (f"{relative} differs from the Definition opforge makes for {ours.name} (reference, "
                              "constraints or extensions) but takes the same inputs; it is kept as it is and the "
                              "workloads are recorded against it")
        return existing, None

    def add_solution(self, solution, op_type: str) -> None:
        """Write ``solution`` unless a solution file of its name exists."""
        if solution.name in self._solutions:
            return
        relative = f"solutions/{solution.author}/{op_type}/{solution.definition}/{solution.name}.json"
        path = dataset_path(self.root, relative)
        if not path.exists():
            write_text(path, dumps(solution.to_dict()))
        self._solutions[solution.name] = relative

    # --- from the writer thread --------------------------------------------------------------

    def save_blob(self, op_type: str, definition: str, uuid: str, tensors: dict) -> None:
        save_safetensors_blob(self.root, workload_blob_relpath(op_type, definition, uuid), tensors)

    def append_lines(self, relative: str, lines: list[str]) -> Optional[str]:
        """Append JSONL lines to ``root/relative`` with one write and an fsync. Returns a note
        when a torn last line had to be cut off first."""
        path = dataset_path(self.root, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        with _APPEND_LOCK:
            new = not path.exists()
            with open(path, "a+b") as handle:
                if fcntl is not None:  # other processes tracing into the folder append too
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                note = _mend_tail(handle, relative)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        if new:
            fsync_folder(path.parent)
        return note


def _mend_tail(handle, relative: str) -> Optional[str]:
    """Make the file end with a newline before appending: a last line without one is completed
    when it is whole JSON (a file written by hand) and cut off when it is not (a write torn by
    a kill)."""
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return None
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return None
    start = size
    tail = b""
    while start > 0:  # back to the last newline, a chunk at a time
        step = min(_TAIL_CHUNK, start)
        start -= step
        handle.seek(start)
        chunk = handle.read(step)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            start += cut + 1
            tail = chunk[cut + 1:] + tail
            break
        tail = chunk + tail
    try:
        json.loads(tail.decode("utf-8"))
    except ValueError:
        handle.truncate(start)
        handle.flush()
        return f"{relative}: cut off a torn last line ({len(tail)} bytes, left by an interrupted write)"
    handle.write(b"\n")
    return None
