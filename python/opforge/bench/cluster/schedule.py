"""Which device worker evaluates what, and what happens to the pairs of one that dies.

Plain Python (no Ray here), shared by the driver's threads, one per device worker. Work comes
in tasks: one workload of a Definition with the solutions still to evaluate on it (the baseline
first), for one GPU model (``group``: the hardware name the workers measured), since every
model measures every pair: a Trace says which hardware it measured, and apply and the report
read them per model. A worker takes tasks of its own model only, preferring the Definition it is
on (its solution workers and builds are warm there), then one no other worker is on, then any.

When a worker dies (its process, or its whole node), the first pair of its task it had not
reported was in flight: that pair is retried once, elsewhere (on another node when the model
has a live worker on one), and when it is lost a second time it is given up, for the driver to
record as RUNTIME_ERROR with both reasons; the solution's pairs still queued for that model are
given up with it (a solution that takes its worker down twice would take down one more for each
of its workloads, as a solution that does not build is not built again for each). The task's
other pairs had not started: they go back to the queue as they were. ``take`` waits while the model's queue is empty and tasks are still
out, since a loss may put work back; it returns None once the model's work is done (or the run
stops). Tasks of a model none of whose workers is alive any more are ``stranded``: not run, so
a later ``--resume`` runs them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any, Optional

#: Evaluations of a pair cut short by a dying worker before it is given up.
MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Task:
    """A workload's pairs for one GPU model. ``workload`` and ``solutions`` are the driver's
    objects (a workload trace; Solutions, whose ``name`` is all this module reads)."""

    group: str
    definition: str
    workload: Any
    solutions: tuple
    attempt: int = 0  # losses so far (a retried task holds one pair)
    avoid: frozenset = frozenset()  # nodes it was lost on
    losses: tuple = ()  # (worker, reason) of each loss, for the log of a pair given up


@dataclass(eq=False)
class Slot:
    """A device worker as the scheduler sees it: its node, its GPU model, the Definition it is
    on, and whether it is alive."""

    name: str
    node: str
    group: str
    alive: bool = True
    definition: Optional[str] = None
    busy: bool = False


@dataclass
class GivenUp:
    """A pair lost MAX_ATTEMPTS times (the task it was in, every (worker, reason)), or, with
    ``after``, a pair of the same solution given up with it without running: ``after`` is the
    GivenUp that took it along."""

    task: Task
    solution: Any
    losses: tuple = field(default_factory=tuple)
    after: Optional["GivenUp"] = None


class Scheduler:
    def __init__(self):
        self._cond = threading.Condition()
        self._queues: dict[str, list[Task]] = {}
        self._out: dict[str, int] = {}  # group -> tasks taken and not yet done or lost
        self._slots: list[Slot] = []
        self._stopped = False

    # --- filling ----------------------------------------------------------------------------

    def join(self, slot: Slot, tasks: Optional[list[Task]] = None) -> None:
        """A worker is ready; ``tasks``: its model's work, when it is the model's first worker."""
        with self._cond:
            self._slots.append(slot)
            self._queues.setdefault(slot.group, []).extend(tasks or ())
            self._out.setdefault(slot.group, 0)
            self._cond.notify_all()

    def stop(self) -> None:
        """No task is handed out after this; waiting workers are released."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # --- handing out ------------------------------------------------------------------------

    def take(self, slot: Slot) -> Optional[Task]:
        """The slot's next task, waiting while others of its model may still put work back;
        None when its model's work is done or the run stops."""
        with self._cond:
            while not self._stopped and slot.alive:
                task = self._pick(slot)
                if task is not None:
                    self._out[slot.group] += 1
                    slot.definition, slot.busy = task.definition, True
                    return task
                if not self._queues[slot.group] and self._out[slot.group] == 0:
                    return None
                self._cond.wait()
            return None

    def _pick(self, slot: Slot) -> Optional[Task]:
        queue = self._queues[slot.group]
        eligible = [i for i, t in enumerate(queue) if slot.node not in t.avoid or not self._elsewhere(t)]
        if not eligible:
            return None
        same = [i for i in eligible if queue[i].definition == slot.definition]
        if not same:
            taken = {s.definition for s in self._slots if s.alive and s.busy and s is not slot and s.group == slot.group}
            same = [i for i in eligible if queue[i].definition not in taken]
        return queue.pop((same or eligible)[0])

    def _elsewhere(self, task: Task) -> bool:
        """Whether a live worker of the task's model is on a node the task has not been lost on."""
        return any(s.alive and s.group == task.group and s.node not in task.avoid for s in self._slots)

    # --- results ----------------------------------------------------------------------------

    def done(self, slot: Slot, task: Task) -> None:
        with self._cond:
            self._out[task.group] -= 1
            slot.busy = False
            self._cond.notify_all()

    def lost(self, slot: Slot, task: Task, reported: set, reason: str) -> list[GivenUp]:
        """The slot died on ``task`` after reporting the pairs of the solutions named in
        ``reported``: it is dead from now on, its unreported pairs go back (see the module
        doc), and the pairs given up are returned."""
        given_up = []
        with self._cond:
            slot.alive, slot.busy = False, False
            self._out[task.group] -= 1
            remaining = [s for s in task.solutions if s.name not in reported]
            queue = self._queues[task.group]
            if remaining:
                losses = task.losses + ((slot.name, reason),)
                if task.attempt + 1 >= MAX_ATTEMPTS:
                    given_up.append(GivenUp(task, remaining[0], losses))
                    given_up += self._take_along(given_up[0])
                else:  # first in line, so that a retry does not wait behind the whole queue
                    queue.insert(0, replace(task, solutions=(remaining[0],), attempt=task.attempt + 1,
                                            avoid=task.avoid | {slot.node}, losses=losses))
                if len(remaining) > 1:  # not started: back as they were, behind the retry
                    queue.insert(0 if given_up else 1, replace(task, solutions=tuple(remaining[1:])))
            self._cond.notify_all()
        return given_up

    def _take_along(self, first: GivenUp) -> list[GivenUp]:
        """Remove the given-up solution's pairs from its model's queue (see the module doc)."""
        name, queue, along = first.solution.name, self._queues[first.task.group], []
        for i, task in enumerate(queue):
            if any(s.name == name for s in task.solutions):
                along += [GivenUp(task, s, after=first) for s in task.solutions if s.name == name]
                queue[i] = replace(task, solutions=tuple(s for s in task.solutions if s.name != name))
        queue[:] = [t for t in queue if t.solutions]
        return along

    def leave(self, slot: Slot) -> None:
        """The slot is gone without a task of its own (it failed, or was let go)."""
        with self._cond:
            slot.alive, slot.busy = False, False
            self._cond.notify_all()

    def stranded(self) -> list[Task]:
        """Tasks still queued for a model with no live worker (call once every worker is done)."""
        with self._cond:
            live = {s.group for s in self._slots if s.alive}
            return [t for group, queue in self._queues.items() if group not in live for t in queue]

    def queued(self) -> int:
        """Tasks waiting in any model's queue."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def slots(self) -> list[Slot]:
        with self._cond:
            return list(self._slots)
