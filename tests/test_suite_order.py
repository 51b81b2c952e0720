"""The order in which pytest-xdist hands test files to its workers (tests/conftest.py): the
longest files first, so none starts last and runs alone while the other workers idle."""

from __future__ import annotations

import random
import types
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_the_longest_files_exist():
    """A renamed or removed file would silently drop out of the head of the schedule."""
    missing = [p for p in conftest.LONGEST_FILES_FIRST if not (ROOT / p).is_file()]
    assert not missing, f"LONGEST_FILES_FIRST names files that do not exist: {missing}"
    assert len(set(conftest.LONGEST_FILES_FIRST)) == len(conftest.LONGEST_FILES_FIRST)


def fake_items(counts: dict) -> list:
    return [types.SimpleNamespace(nodeid=f"{path}::test_{i}") for path, n in counts.items() for i in range(n)]


def test_longest_files_first_then_by_number_of_tests():
    first, second = conftest.LONGEST_FILES_FIRST[:2]
    counts = {"tests/test_few.py": 2, second: 1, "tests/test_many.py": 9, first: 3, "tests/test_some.py": 5}
    paths = list(counts)
    random.Random(0).shuffle(paths)
    items = fake_items({p: counts[p] for p in paths})
    conftest.longest_files_first(items)
    order = [item.nodeid for item in items]
    files = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in order))
    assert files == [first, second, "tests/test_many.py", "tests/test_some.py", "tests/test_few.py"]
    for path, n in counts.items():  # each file's tests contiguous and in their own order
        mine = [nodeid for nodeid in order if nodeid.startswith(path + "::")]
        assert mine == [f"{path}::test_{i}" for i in range(n)]
        start = order.index(mine[0])
        assert order[start:start + n] == mine


def test_the_xdist_controller_keeps_the_workers_order(pytestconfig):
    """Under xdist (CI's -n auto --dist loadfile) the controller must not reorder the files by
    their number of tests; without xdist there is no such option."""
    option = getattr(pytestconfig.option, "loadscopereorder", None)
    assert option in (None, False)
