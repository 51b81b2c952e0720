"""The Tracer: what ``enable_tracing`` returns and what the op hook calls for every op call.

``record(call)`` runs before the op (an in-place op would otherwise overwrite what is saved).
Its common case, a call whose workload is already kept, is a dict lookup, a counter and a set
lookup; everything else (the first call of a Definition, a kept call) takes a lock and the slow
path. ``record`` never raises into the model: a failure is counted, said once, and the call
runs untraced.

A kept call becomes a Workload: the call's variable axes, its scalars by value, its tensors as
``random`` or, where the TracingConfig says so, as a safetensors blob. Dedup runs before any
copy; a workload the writer has no room for is dropped and counted, and a dropped call does not
count as seen, so a later call of the same shape can still be kept.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import uuid as uuid_lib
import warnings
from pathlib import Path
from typing import Callable, Optional

from ..trace.blob import workload_blob_relpath
from ..trace.errors import SchemaError, WorkloadError
from ..trace.templates import definition_for_name
from ..trace.workload import RandomInput, SafetensorsInput, ScalarInput, Workload
from .capture import Snapshots, capturing
from .dataset import DatasetFolder
from .deferral import Recording
from .policy import DEFAULT_CONFIG, TracingConfig
from .writer import Item, Writer

PREFIX = "opforge tracing: "
_RANDOM = RandomInput()
_NO_KEYS: frozenset = frozenset()


def say(message: str) -> None:
    """One line on stderr (where a log collects it); never raises."""
    try:
        sys.stderr.write(PREFIX + message + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def warn(message: str) -> None:
    """A RuntimeWarning, or a stderr line where warnings are turned into errors: tracing never
    raises into the model."""
    try:
        warnings.warn(PREFIX + message, RuntimeWarning, stacklevel=3)
    except Exception:
        say(message)


class DefinitionStats:
    """Counters of one Definition, and how its calls are deduplicated."""

    __slots__ = ("name", "config", "definition", "op_type", "closed", "seen", "keys", "calls", "accepted", "kept",
                 "dropped", "unfit", "written", "dumped", "write_errors", "tensor_specs")

    def __init__(self, name: str, config: Optional[TracingConfig]):
        self.name = name
        self.config = config
        self.definition = None
        self.op_type = ""
        # closed: no further call is kept (untraced, failed, or keep_first_k done); seen: the
        # keys already kept under shape_only, checked on the fast path.
        self.closed = config is None
        self.seen = set() if config is not None and config.dedup_policy == "shape_only" else _NO_KEYS
        self.keys: set = set()  # keys of a callable dedup policy
        # accepted: handed to the writer (the model's threads count it, for keep_first_k); kept:
        # taken up by the writer, counted by its thread, so that after a flush it is exactly
        # what reached the disk (written) or failed (write_errors), even when a signal
        # interrupted a call in the middle of being handed over.
        self.calls = self.accepted = self.kept = self.dropped = self.unfit = 0
        self.written = self.dumped = self.write_errors = 0
        self.tensor_specs: dict = {}  # tensor input -> torch dtype

    def as_dict(self) -> dict:
        return {"calls": self.calls, "kept": self.kept, "dumped": self.dumped, "dropped": self.dropped,
                "written": self.written, "unfit": self.unfit, "write_errors": self.write_errors}


class Tracer:
    """Records op calls as workloads into a dataset folder (see the package docstring)."""

    def __init__(self, root: Path, configs: Optional[dict], max_pending_workloads: int, max_pending_bytes: int,
                 release: Callable[["Tracer"], None]):
        self.dataset_dir = Path(root)
        self._configs = configs
        self._limits = (max_pending_workloads, max_pending_bytes)
        self._release = release
        self._stats: dict[str, DefinitionStats] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # Workload uuids from a generator seeded by the OS: uuid4() reads os.urandom per call.
        self._random = random.Random()
        self._dataset = DatasetFolder(self.dataset_dir)
        self._snapshots = Snapshots()
        self._writer: Optional[Writer] = None
        self._failures = 0
        self._first_failure: Optional[str] = None
        self._closed = True
        self._summarized = False

    def start(self) -> bool:
        """Prepare the folder and start the writer; False (after a warning) when the folder
        cannot be written, in which case nothing is traced."""
        try:
            self._dataset.prepare()
        except OSError as exc:
            warn(f"cannot write to the dataset folder {self.dataset_dir} ({exc.strerror or exc}); tracing is off")
            return False
        if self._configs:
            for name, config in self._configs.items():
                definition = self._dataset.lookup_definition(name) or definition_for_name(name)
                if definition is not None:
                    config.check_definition(definition)
        self._writer = Writer(self._dataset, *self._limits, say)
        self._closed = False
        return True

    @property
    def active(self) -> bool:
        return not self._closed

    # --- the hot path -----------------------------------------------------------------------

    def record(self, call) -> None:
        """Record one call (see the module docstring). Never raises, but for what a signal's
        handler raises: a signal that arrives during the slow path is raised again after it
        (deferral.py), outside the net that keeps recording failures from the model."""
        try:
            stats = self._stats.get(call.definition)
            if stats is not None:
                stats.calls += 1
                if stats.closed or call.key in stats.seen:
                    return
        except Exception as exc:
            self._fail(call, exc)
            return
        with Recording():
            try:
                self._record_slow(call, stats)
            except Exception as exc:
                self._fail(call, exc)

    # --- the slow path ----------------------------------------------------------------------

    def _record_slow(self, call, stats: Optional[DefinitionStats]) -> None:
        if os.getpid() != self._pid:
            return  # a forked child: the writer thread lives in the parent only
        with self._lock:
            if self._closed:
                return
            if stats is None:
                stats = self._stats.get(call.definition)
                if stats is None:
                    stats = self._first_call(call)
                stats.calls += 1
                if stats.closed:
                    return
            config = stats.config
            policy = config.dedup_policy
            if policy == "shape_only":
                if call.key in stats.seen:
                    return
            elif policy == "keep_first_k":
                if stats.accepted >= config.k:
                    stats.closed = True
                    return
            self._keep(call, stats, config, policy)

    def _first_call(self, call) -> DefinitionStats:
        """The stats of a Definition seen for the first time: its config, its Definition file."""
        name = call.definition
        configs = self._configs
        config = DEFAULT_CONFIG if configs is None else configs.get(name)
        stats = self._stats[name] = DefinitionStats(name, config)
        if config is None:
            return stats
        stats.closed = True  # until everything below succeeded
        ours = call.make_definition()
        if ours is None or ours.name != name:
            raise ValueError(f"the call's Definition is {getattr(ours, 'name', None)!r}, not {name!r}")
        try:
            config.check_definition(ours)
        except ValueError as exc:
            warn(f"{exc}; {name} is not traced")
            return stats
        definition, note = self._dataset.use_definition(ours)
        if note:
            (say if definition is not None else warn)(note)
        if definition is None:
            return stats
        if definition == ours:
            self._add_builtin_solution(definition)
        stats.definition = definition
        stats.op_type = definition.op_type
        stats.tensor_specs = {n: s.dtype.to_torch() for n, s in definition.inputs.items()
                              if s.shape is not None}
        stats.closed = False
        return stats

    def _add_builtin_solution(self, definition) -> None:
        # Built-in ops get their builtin Solution beside the Definition, so that `opforge run`
        # benchmarks opforge's own op on the traced workloads without further setup.
        from ..trace.builtin import builtin_solution_for

        solution = builtin_solution_for(definition)
        if solution is not None:
            self._dataset.add_solution(solution, definition.op_type)

    def _keep(self, call, stats: DefinitionStats, config: TracingConfig, policy) -> None:
        definition = stats.definition
        axes = dict(call.axes)
        values = call.inputs
        workload_id = str(uuid_lib.UUID(int=self._random.getrandbits(128), version=4))
        try:
            shapes = definition.input_shapes(axes)
        except ValueError:
            stats.unfit += 1
            return
        tensors = [values[n] for n in stats.tensor_specs if n in values]
        shapes_only = capturing(tensors)
        inputs: dict = {}
        dumped: dict = {}
        for name, spec in definition.inputs.items():
            if name not in values:
                stats.unfit += 1
                return
            value = values[name]
            if spec.shape is None:
                if hasattr(value, "item") and not shapes_only:
                    value = value.item()  # a 0-d tensor for a scalar input
                try:
                    inputs[name] = ScalarInput(value=value)
                except SchemaError:  # not a number, or an integer beyond int64
                    stats.unfit += 1
                    return
                continue
            if not _fits(value, shapes[name], stats.tensor_specs[name]):
                stats.unfit += 1  # the op refuses such a call itself
                return
            if not shapes_only and config.dumps(name, value):
                dumped[name] = value
                path = workload_blob_relpath(stats.op_type, stats.name, workload_id)
                inputs[name] = SafetensorsInput(path=path, tensor_key=name)
            else:
                inputs[name] = _RANDOM
        if callable(policy):
            key = policy(Workload(uuid=workload_id, axes=axes, inputs={
                n: (_RANDOM if n in dumped else s) for n, s in inputs.items()}))
            if key in stats.keys:
                return
        workload = Workload(uuid=workload_id, axes=axes, inputs=inputs)
        try:
            definition.check_workload(workload)  # what is written must load with strict=True
        except WorkloadError:
            stats.unfit += 1
            return
        nbytes = sum(t.numel() * t.element_size() for t in dumped.values())
        writer = self._writer
        if not writer.reserve(nbytes):
            stats.dropped += 1
            return
        try:
            copies, events = self._snapshots.take(dumped) if dumped else (None, [])
        except BaseException:
            writer.release(nbytes)
            raise
        if policy == "shape_only":
            stats.seen.add(call.key)
        elif callable(policy):
            stats.keys.add(key)
        stats.accepted += 1
        if policy == "keep_first_k" and stats.accepted >= config.k:
            stats.closed = True
        writer.put(Item(stats, stats.op_type, stats.name, workload, copies, events, nbytes))

    def _fail(self, call, exc: Exception) -> None:
        self._failures += 1
        if self._first_failure is None:
            name = getattr(call, "definition", "?")
            self._first_failure = f"{name}: {type(exc).__name__}: {exc}"
            warn(f"recording a call of {self._first_failure}; the call runs untraced (later failures are "
                 "counted and reported at exit)")

    # --- lifecycle ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every kept workload is on disk."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Stop tracing: uninstall, write everything kept, print the summary. Idempotent."""
        self._release(self)
        # Calls already inside the slow path on other threads finish first (bounded wait: a
        # thread stuck elsewhere must not hang the exit).
        locked = self._lock.acquire(timeout=10)
        try:
            was_open, self._closed = not self._closed, True
        finally:
            if locked:
                self._lock.release()
        if self._writer is not None:
            self._writer.close()
        if was_open:
            self.print_summary()

    def __enter__(self) -> "Tracer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, dict]:
        """Counters per traced Definition: calls, kept, dumped, dropped, written, unfit,
        write_errors."""
        return {name: s.as_dict() for name, s in self._stats.items() if s.config is not None}

    def print_summary(self) -> None:
        """The summary on stderr, once: one line per Definition, then drops and failures."""
        if self._summarized or self._writer is None:
            return
        self._summarized = True
        traced = [s for s in self._stats.values() if s.config is not None]
        say(f"{self.dataset_dir}: {len(traced)} definition{'s' if len(traced) != 1 else ''} traced")
        for name in sorted(set(self._configs or ()) - set(self._stats)):
            say(f"  {name}: no calls seen")
        for s in sorted(traced, key=lambda s: s.name):
            extra = "".join(f", {n} {what}" for n, what in ((s.unfit, "not fitting the Definition"),
                                                           (s.write_errors, "not written (errors)")) if n)
            say(f"  {s.name}: {s.calls} calls, {s.kept} workloads kept, {s.dumped} payloads dumped, "
                f"{s.dropped} dropped{extra}")
        dropped = sum(s.dropped for s in traced)
        if dropped:
            items, nbytes = self._limits
            say(f"{dropped} workloads dropped: the write queue was full (at most {items} workloads and "
                f"{_size(nbytes)} pending); enable_tracing(max_pending_workloads=..., max_pending_bytes=...) "
                "raises the limits")
        if self._failures:
            say(f"{self._failures} calls could not be recorded (first: {self._first_failure})")
        untraced = sorted((s for s in self._stats.values() if s.config is None), key=lambda s: s.name)
        if untraced:
            shown = ", ".join(f"{s.name} ({s.calls} calls)" for s in untraced[:8])
            more = f" and {len(untraced) - 8} more" if len(untraced) > 8 else ""
            say(f"not traced (no TracingConfig given for them): {shown}{more}")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"


def _fits(value, shape, torch_dtype) -> bool:
    """Whether a tensor has the Definition's shape and dtype (FP4: the declared shape is the torch shape)."""
    if not hasattr(value, "shape") or value.dtype != torch_dtype:
        return False
    return tuple(value.shape) == tuple(shape)
