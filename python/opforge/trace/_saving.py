"""Writing a TraceSet as a dataset folder (the mixin behind TraceSet.save_dataset).

Each object goes back to the file it was loaded from, new ones to their place in the
FlashInfer-Trace layout. A file whose objects are all unchanged since they were loaded is left
alone (or copied byte for byte when saving elsewhere), so saving never reformats files nobody
edited. A file that is rewritten holds what this TraceSet has: lines that failed to load from it
are not kept. Existing files this TraceSet neither loaded nor wrote are not overwritten unless
asked. Every file is written whole (see _io.write_atomic) and only inside the dataset folder:
every destination is checked with _paths.dataset_path before anything is written, so a save
that would go through a symbolic link or out of the folder writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ._base import TraceModel, dumps
from ._io import append_line, copy_file, write_text
from ._paths import dataset_path
from .blob import blob_path
from .workload import SafetensorsInput


def snapshot(obj: TraceModel) -> str:
    return dumps(obj.to_dict(), indent=None)


class SavingMixin:
    """Placement of objects in the folder layout, and writing it."""

    # Where each object was loaded from (relative to root) and its compact JSON text then, by
    # id(): the objects are held by this TraceSet, and another set holding the same objects
    # keeps its own record.

    def _definition_path(self, d) -> str:
        return self._origin.get(id(d)) or f"definitions/{d.op_type}/{d.name}.json"

    def _solution_path(self, s) -> str:
        op_type = self.definitions[s.definition].op_type
        return self._origin.get(id(s)) or f"solutions/{s.author}/{op_type}/{s.definition}/{s.name}.json"

    def _line_path(self, t) -> str:
        if id(t) in self._origin:
            return self._origin[id(t)]
        d = self.definitions[t.definition]
        if t.is_workload_trace():
            return f"workloads/{d.op_type}/{d.name}.jsonl"
        return f"traces/{self._solution_by_name[t.solution].author}/{d.op_type}/{d.name}.jsonl"

    def _mark_loaded(self, obj: TraceModel, relative: str, as_read: Optional[TraceModel] = None) -> None:
        self._origin[id(obj)] = relative
        self._snapshot[id(obj)] = snapshot(as_read if as_read is not None else obj)
        self._file_counts[relative] = self._file_counts.get(relative, 0) + 1

    def _append(self, trace) -> None:
        if self.root is None:
            raise ValueError("persist=True needs a TraceSet with a root folder")
        relative = self._line_path(trace)
        path = dataset_path(self.root, relative)
        known = relative in self._file_counts or not path.exists()
        append_line(path, dumps(trace.to_dict(), indent=None))
        if known:
            self._mark_loaded(trace, relative)
        else:
            self._origin[id(trace)] = relative

    def _plan(self) -> dict[str, list]:
        """Destination file -> the objects written to it, in order."""
        files: dict[str, list] = {}
        for d in self.definitions.values():
            files.setdefault(self._definition_path(d), []).append(d)
        for s in self._solution_by_name.values():
            files.setdefault(self._solution_path(s), []).append(s)
        for relative, members in files.items():
            if len(members) > 1:
                raise ValueError(f"{relative}: {members[0].name!r} and {members[1].name!r} "
                                 "would be written to the same file")
        for t in self._lines:
            files.setdefault(self._line_path(t), []).append(t)
        return files

    def _unchanged(self, relative: str, members: list) -> bool:
        return (self._file_counts.get(relative) == len(members)
                and all(self._origin.get(id(m)) == relative and self._snapshot.get(id(m)) == snapshot(m)
                        for m in members))

    def save_dataset(self, path, overwrite: bool = False) -> Path:
        """Write the folder layout under ``path`` (see the module docstring). Refuses, with
        the list of files, to replace existing files this TraceSet did not load or write
        unless ``overwrite``. Safetensors blobs the workloads refer to are copied when saving
        to another folder."""
        out = Path(path)
        same = self.root is not None and self.root.resolve() == out.resolve()
        plan = self._plan()
        targets = {relative: dataset_path(out, relative) for relative in plan}
        blobs = self._blobs_to_copy(out) if self.root is not None and not same else []
        known = self._known_files.get(str(out.resolve()), set())
        clobbered = [r for r, target in targets.items()
                     if target.exists() and r not in known and not (same and r in self._file_counts)]
        if clobbered and not overwrite:
            raise FileExistsError(f"{out}: would replace files this TraceSet did not load: "
                                  f"{', '.join(sorted(clobbered))} (load the folder first, or pass overwrite=True)")
        for relative, members in plan.items():
            if self._unchanged(relative, members) and self.root is not None:
                source = dataset_path(self.root, relative)
                if source.is_file():
                    if not same:
                        copy_file(source, targets[relative])
                    continue
            if relative.endswith(".jsonl"):
                text = "".join(dumps(m.to_dict(), indent=None) + "\n" for m in members)
            else:
                text = dumps(members[0].to_dict())
            write_text(targets[relative], text)
        for src, dst in blobs:
            copy_file(src, dst)
        self._known_files.setdefault(str(out.resolve()), set()).update(plan)
        if same or self.root is None:
            self.root = out
            self._file_counts, self._snapshot = {}, {}
            for relative, members in plan.items():
                for m in members:
                    self._mark_loaded(m, relative)
        return out

    def _blobs_to_copy(self, out: Path) -> list[tuple[Path, Path]]:
        """(source, destination) of the blobs the workloads refer to that ``out`` lacks; BlobError
        for one whose path leads out of either folder."""
        pairs = []
        for t in self._lines:
            for spec in t.workload.inputs.values():
                if isinstance(spec, SafetensorsInput):
                    src, dst = blob_path(self.root, spec.path), blob_path(out, spec.path)
                    if src.is_file() and not dst.exists() and (src, dst) not in pairs:
                        pairs.append((src, dst))
        return pairs
