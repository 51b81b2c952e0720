"""Loading a TraceSet from a dataset folder or a single JSON file (the mixin behind
TraceSet.from_path and TraceSet.load). Every problem becomes a LoadError naming the file, the
line of a JSONL file, and the field."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from ._io import iter_jsonl, read_json, read_model, schema_to_load_error
from ._paths import dataset_files
from .errors import (BlobError, DuplicateError, LoadError, MissingBlobError, SchemaError, UnknownDefinitionError,
                     UnknownSolutionError, WorkloadError)
from .schema import Definition
from .solution import Solution
from .trace import Trace

logger = logging.getLogger("opforge.trace")
SECTIONS = ("definitions", "solutions", "workloads", "workload", "traces")


class LoadingMixin:
    """Reading files into a TraceSet, reporting what could not be read."""

    def _report(self, error: LoadError, strict: bool) -> None:
        if strict:
            raise error
        self.load_errors.append(error)
        logger.warning("%s", error)

    def _load_folder(self, strict: bool, check_blobs: bool) -> None:
        for folder, suffix in (("definitions", ".json"), ("solutions", ".json"), ("workloads", ".jsonl"),
                               ("traces", ".jsonl")):
            for relative, problem in dataset_files(self.root, folder, suffix):
                if problem:
                    self._report(LoadError(relative, None, f"{problem} (skipped)"), strict)
                elif folder == "definitions":
                    self._load_object(Definition, relative, self.add_definition, strict)
                elif folder == "solutions":
                    self._load_object(Solution, relative, self.add_solution, strict)
                else:
                    self._load_lines(relative, folder == "workloads", strict, check_blobs)

    def _summarize_missing_blobs(self) -> None:
        """One warning for every workload whose safetensors inputs are not there."""
        if not self.missing_blobs:
            return
        definition, uuid, why = self.missing_blobs[0]
        workloads = len({(d, u) for d, u, _ in self.missing_blobs})
        where = self._json_file or self.root
        logger.warning("%d workload(s) of %s refer to safetensors files that are not there; they are kept "
                       "(saving and copying the dataset keep them) but cannot run until the files are "
                       "fetched (for a git dataset: `git lfs pull` in %s). First: %s workload %s: %s",
                       workloads, where, where, definition, uuid, why)

    def _load_object(self, model_cls, display: str, add, strict: bool) -> None:
        file = self.root / display
        try:
            obj = read_model(model_cls, file, display)
        except LoadError as error:
            self._note_failed(file, display)
            return self._report(error, strict)
        try:
            added = add(obj)
        except (DuplicateError, UnknownDefinitionError) as exc:
            field = "name" if isinstance(exc, DuplicateError) else "definition"
            return self._report(LoadError(display, field, str(exc)), strict)
        # What was added may differ from what was read (a legacy solution in its new form): the
        # snapshot is of what the file holds, so that saving rewrites the file.
        self._mark_loaded(added, display, as_read=obj)

    def _note_failed(self, file: Path, display: str) -> None:
        """Remember the name in a file that failed, so what refers to it can say why."""
        try:
            data = read_json(file, display)
        except LoadError:
            return
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            self._failed.setdefault(data["name"], display)

    def _load_lines(self, display: str, workloads: bool, strict: bool, check_blobs: bool) -> None:
        for number, item in iter_jsonl(Trace, self.root / display, display):
            if isinstance(item, LoadError):
                self._report(item, strict)
                continue
            if self._add_line(item, workloads, display, number, strict, check_blobs):
                self._mark_loaded(item, display)

    def _add_line(self, trace: Trace, workloads: bool, display: str, number: Optional[int], strict: bool,
                  check_blobs: bool, prefix: str = "") -> bool:
        def report(field: str, message: str) -> bool:
            self._report(LoadError(display, ".".join(p for p in (prefix, field) if p), message, number), strict)
            return False

        if workloads and not trace.is_workload_trace():
            return report("solution", "workload files hold workload traces only (solution and evaluation null)")
        if not workloads and trace.is_workload_trace():
            return report("solution", "trace files hold evaluated traces; this line has no solution or evaluation")
        try:
            if check_blobs and trace.definition in self.definitions:
                self.definitions[trace.definition].check_workload(trace.workload)
                try:
                    self.check_blobs(trace)
                except MissingBlobError as exc:
                    # Kept (saving and copying keep the record); only running it needs the file.
                    self.missing_blobs.append((trace.definition, trace.workload.uuid, str(exc)))
            if workloads:
                self.add_workload(trace.definition, trace)
            else:
                self.add_trace(trace)
        except BlobError as exc:
            field, _, message = str(exc).partition(": ")
            return report(f"workload.{field}", message)
        except WorkloadError as exc:
            return report(f"workload.{exc.field}", exc.message)
        except UnknownDefinitionError as exc:
            return report("definition", str(exc))
        except UnknownSolutionError as exc:
            return report("solution", str(exc))
        except DuplicateError as exc:
            return report("workload.uuid", str(exc))
        return True

    def _load_file(self, file: Path, strict: bool, check_blobs: bool) -> None:
        display = str(file)
        data = read_json(file, display)
        if not isinstance(data, dict) or not set(data) <= set(SECTIONS):
            raise LoadError(display, None, "expected an object with keys definitions, solutions, workloads, traces")
        for name, raw in entries(data.get("definitions")):
            self._add_raw(Definition, raw, self.add_definition, display, f"definitions.{name}", strict)
        for name, raw in entries(data.get("solutions"), nested=True):
            self._add_raw(Solution, raw, self.add_solution, display, f"solutions.{name}", strict)
        for section, workloads in (("workloads", True), ("workload", True), ("traces", False)):
            for name, raw in entries(data.get(section), nested=True):
                try:
                    trace = Trace.from_dict(raw)
                except SchemaError as exc:
                    self._report(schema_to_load_error(display, exc, f"{section}.{name}"), strict)
                    continue
                self._add_line(trace, workloads, display, None, strict, check_blobs, prefix=f"{section}.{name}")

    def _add_raw(self, model_cls, raw, add, display: str, prefix: str, strict: bool) -> None:
        try:
            add(model_cls.from_dict(raw))
        except SchemaError as exc:
            self._report(schema_to_load_error(display, exc, prefix), strict)
        except (DuplicateError, UnknownDefinitionError) as exc:
            self._report(LoadError(display, prefix, str(exc)), strict)


def entries(section, nested: bool = False):
    """(label, raw object) pairs of a single-file section: a dict keyed by name (of lists when
    nested) or a plain list."""
    if section is None:
        return []
    if isinstance(section, list):
        return [(f"[{i}]", raw) for i, raw in enumerate(section)]
    if not isinstance(section, dict):
        return [("", section)]
    out = []
    for key, value in section.items():
        if nested and isinstance(value, list):
            out.extend((f"{key}[{i}]", raw) for i, raw in enumerate(value))
        else:
            out.append((key, value))
    return out
