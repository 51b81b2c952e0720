"""How a cluster run shares out its pairs and what a dying device worker costs (the scheduler
alone: plain Python, no Ray needed)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from opforge.bench.cluster.schedule import MAX_ATTEMPTS, Scheduler, Slot, Task

H100, H200 = "NVIDIA H100", "NVIDIA H200"


def solutions(*names):
    return tuple(SimpleNamespace(name=n) for n in names)


def task(definition="d1", workload="w1", *names, group=H100):
    return Task(group, definition, workload, solutions(*(names or ("base", "a", "b"))))


def names(t: Task) -> list[str]:
    return [s.name for s in t.solutions]


def test_each_gpu_model_gets_its_own_work_and_a_finished_model_releases_its_workers():
    sched = Scheduler()
    h100, h200 = Slot("n1/gpu0", "n1", H100), Slot("n2/gpu0", "n2", H200)
    sched.join(h100, [task("d1", "w1")])
    sched.join(h200, [task("d1", "w1", group=H200)])
    got = sched.take(h200)
    assert got.group == H200
    sched.done(h200, got)
    assert sched.take(h200) is None  # its model is done, whatever H100 still has
    got = sched.take(h100)
    assert got.group == H100
    sched.done(h100, got)
    assert sched.take(h100) is None


def test_a_worker_stays_on_its_definition_and_others_start_on_another():
    sched = Scheduler()
    first, second = Slot("n1/0", "n1", H100), Slot("n1/1", "n1", H100)
    sched.join(first, [task("d1", "w1"), task("d1", "w2"), task("d2", "w1"), task("d2", "w2")])
    sched.join(second)
    a = sched.take(first)
    b = sched.take(second)
    assert (a.definition, b.definition) == ("d1", "d2")  # not both on d1's solutions
    sched.done(first, a)
    assert sched.take(first).definition == "d1"  # its solution workers are warm there


def test_a_dead_worker_costs_its_pair_in_flight_one_retry_elsewhere_and_the_rest_go_back():
    sched = Scheduler()
    n1, n2 = Slot("n1/0", "n1", H100), Slot("n2/0", "n2", H100)
    sched.join(n1, [task("d1", "w1", "base", "a", "b")])
    sched.join(n2)
    t = sched.take(n1)
    # "base" was reported; "a" was in flight when n1 died; "b" had not started.
    assert sched.lost(n1, t, {"base"}, "node n1 died") == []
    assert not n1.alive
    retry = sched.take(n2)
    assert names(retry) == ["a"] and retry.attempt == 1 and retry.avoid == {"n1"}
    assert retry.losses == (("n1/0", "node n1 died"),)
    rest = sched.take(n2)
    assert names(rest) == ["b"] and rest.attempt == 0  # not charged: it never ran


def test_a_pair_lost_twice_is_given_up_with_both_reasons_and_takes_its_solution_along():
    sched = Scheduler()
    n1, n2, n3 = (Slot(f"n{i}/0", f"n{i}", H100) for i in (1, 2, 3))
    sched.join(n1, [task("d1", "w1", "base", "killer"), task("d1", "w2", "base", "killer", "c")])
    sched.join(n2)
    sched.join(n3)
    t = sched.take(n1)
    assert sched.lost(n1, t, {"base"}, "first") == []
    retry = sched.take(n2)
    assert names(retry) == ["killer"]
    given_up = sched.lost(n2, retry, set(), "second")
    assert MAX_ATTEMPTS == 2
    assert [(g.task.workload, g.solution.name) for g in given_up] == [("w1", "killer"), ("w2", "killer")]
    assert given_up[0].losses == (("n1/0", "first"), ("n2/0", "second")) and given_up[0].after is None
    assert given_up[1].after is given_up[0]  # not run: given up with the first
    left = sched.take(n3)
    assert (left.workload, names(left)) == ("w2", ["base", "c"])


def test_a_retry_waits_for_a_worker_on_another_node_but_takes_the_same_node_when_none_is_left():
    sched = Scheduler()
    a0, a1, b0 = Slot("a/0", "a", H100), Slot("a/1", "a", H100), Slot("b/0", "b", H100)
    sched.join(a0, [task("d1", "w1", "x"), task("d1", "w2", "y")])
    sched.join(a1)
    sched.join(b0)
    t = sched.take(a0)
    busy = sched.take(b0)  # node b is busy with w2
    sched.lost(a0, t, set(), "actor died")
    got = []
    waiter = threading.Thread(target=lambda: got.append(sched.take(a1)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # a1 is on node a, where x died, and b may still take it
    sched.lost(b0, busy, {"y"}, "node b died")  # nothing in flight there; node a is all that is left
    waiter.join(5)
    assert names(got[0]) == ["x"] and got[0].attempt == 1


def test_work_of_a_model_with_no_live_worker_is_stranded_not_failed():
    sched = Scheduler()
    only = Slot("a/0", "a", H200)
    sched.join(only, [task("d1", "w1", "p", group=H200), task("d1", "w2", "q", group=H200)])
    t = sched.take(only)
    sched.lost(only, t, set(), "node a died")
    assert sched.take(only) is None
    assert sorted(names(t)[0] for t in sched.stranded()) == ["p", "q"]


def test_stop_releases_a_waiting_worker():
    sched = Scheduler()
    a, b = Slot("a/0", "a", H100), Slot("b/0", "b", H100)
    sched.join(a, [task()])
    sched.join(b)
    sched.take(a)
    got = []
    waiter = threading.Thread(target=lambda: got.append(sched.take(b)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # a's task may still come back
    sched.stop()
    waiter.join(5)
    assert got == [None]


@pytest.mark.parametrize("reported", [set(), {"base", "a", "b"}])
def test_nothing_in_flight_means_nothing_retried(reported):
    sched = Scheduler()
    a, b = Slot("a/0", "a", H100), Slot("b/0", "b", H100)
    sched.join(a, [task()])
    sched.join(b)
    t = sched.take(a)
    sched.lost(a, t, reported, "gone")
    left = sched.take(b) if not reported else None
    if reported:
        assert sched.queued() == 0
    else:
        assert names(left) == ["base"] and left.attempt == 1  # the first unreported was in flight
        assert names(sched.take(b)) == ["a", "b"]
