"""The background thread that writes kept workloads, and the bounded queue that feeds it.

The model's thread never writes a workload: it reserves room (``reserve``), copies the tensors
and hands the item over (``put``). Room is bounded twice, by items and by the bytes of the
tensor copies they hold, so memory stays bounded however fast calls come and however slow the
disk is. A reservation that does not fit is refused and the caller drops the workload (and
counts it). One workload larger than the whole byte budget is accepted while nothing else holds
bytes, so a big tensor can still be saved; memory then peaks at that one copy.

Per batch the writer saves each blob (temporary file, fsync, rename), then appends the batch's
lines per file with one write and an fsync (dataset.py), so a line is never on disk before its
blob. ``flush`` returns once everything handed over before it is on disk; ``close`` flushes
and stops the thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Optional

from ..trace._base import dumps
from ..trace.trace import Trace
from .capture import wait

BATCH = 256


class Item:
    """One kept workload on its way to disk."""

    __slots__ = ("stats", "op_type", "definition", "workload", "tensors", "events", "nbytes")

    def __init__(self, stats, op_type: str, definition: str, workload, tensors: Optional[dict], events: list,
                 nbytes: int):
        self.stats = stats
        self.op_type = op_type
        self.definition = definition
        self.workload = workload
        self.tensors = tensors
        self.events = events
        self.nbytes = nbytes


class Writer:
    """A daemon thread writing Items into a DatasetFolder (see the module docstring)."""

    def __init__(self, dataset, max_items: int, max_bytes: int, say: Callable[[str], None]):
        self.dataset = dataset
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._say = say
        # Re-entrant: a signal handler flushing from the main thread may interrupt that thread
        # while it holds the lock in reserve() or put().
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque = deque()
        self._items = 0  # reserved, queued or being written
        self._bytes = 0
        self._busy = False
        self._stopping = False
        self.failures = 0
        self.first_failure: Optional[str] = None
        self._thread = threading.Thread(target=self._run, name="opforge-tracing-writer", daemon=True)
        self._thread.start()

    # --- from the model's threads ---------------------------------------------------------------

    def reserve(self, nbytes: int) -> bool:
        """Room for one item holding ``nbytes`` of tensor copies; False when the queue is full."""
        with self._cond:
            if self._stopping or self._items >= self.max_items:
                return False
            if self._bytes and self._bytes + nbytes > self.max_bytes:
                return False
            self._items += 1
            self._bytes += nbytes
            return True

    def release(self, nbytes: int) -> None:
        """Give back a reservation that will not be used."""
        with self._cond:
            self._items -= 1
            self._bytes -= nbytes
            self._cond.notify_all()

    def put(self, item: Item) -> None:
        """Hand over an item whose room was reserved."""
        with self._cond:
            self._queue.append(item)
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every item handed over so far is on disk (or failed and was counted)."""
        with self._cond:
            while (self._queue or self._busy) and self._thread.is_alive():
                self._cond.wait(0.5)

    def close(self) -> None:
        """Flush, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.flush()
        self._thread.join()

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                for item in batch:
                    item.stats.kept += 1
                self._busy = True
            try:
                self._write(batch)
            finally:
                with self._cond:
                    self._items -= len(batch)
                    self._bytes -= sum(item.nbytes for item in batch)
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, batch: list) -> None:
        lines: dict[str, list] = {}  # jsonl file -> [(item, line)]
        for item in batch:
            try:
                if item.tensors:
                    wait(item.events)
                    self.dataset.save_blob(item.op_type, item.definition, item.workload.uuid, item.tensors)
                    item.tensors = None  # the copies can go now
                line = dumps(Trace(definition=item.definition, workload=item.workload).to_dict(), indent=None)
            except Exception as exc:  # a full disk, a path refused: counted, the rest goes on
                self._failed(item, exc)
                continue
            lines.setdefault(f"workloads/{item.op_type}/{item.definition}.jsonl", []).append((item, line))
        for relative, entries in lines.items():
            try:
                note = self.dataset.append_lines(relative, [line for _, line in entries])
            except Exception as exc:
                for item, _ in entries:
                    self._failed(item, exc)
                continue
            if note:
                self._say(note)
            for item, _ in entries:
                item.stats.written += 1
                if _has_blob(item.workload):
                    item.stats.dumped += 1

    def _failed(self, item: Item, exc: Exception) -> None:
        self.failures += 1
        item.stats.write_errors += 1
        if self.first_failure is None:
            self.first_failure = f"{item.definition}: {type(exc).__name__}: {exc}"
            self._say(f"writing a workload of {self.first_failure} failed; it is not saved (later failures "
                      "are counted and reported at exit)")


def _has_blob(workload) -> bool:
    return any(spec.type == "safetensors" for spec in workload.inputs.values())
