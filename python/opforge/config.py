"""Every environment variable opforge reads, in one place.

OPFORGE_LOGLEVEL   0 (default): no logging, and the API decorator adds no code to a call.
                   1: op names; 3: plus argument shapes, dtypes, devices; 5: plus value
                   statistics (min / max / mean / NaN count; synchronizes the GPU).
                   Read when the ops are defined (first ``import opforge``), so that level 0
                   costs nothing per call: set it before starting Python.
OPFORGE_LOGDEST    where log lines go: "stderr" (default), "stdout", or a file path
                   ("%i" in it becomes the process id). Read at each logged call.
OPFORGE_CACHE_DIR  where built solutions are cached (default ~/.cache/opforge/builds).
                   Read at each build.
OPFORGE_ENABLE_TRACING  1: trace every call of an op with a Definition into the dataset below,
                   from ``import opforge`` until the process exits (opforge.tracing).
OPFORGE_ENABLE_APPLY    1: route op calls to the fastest measured solution of the dataset below
                   (opforge.apply), from ``import opforge`` on.
OPFORGE_DATASET_PATH    the dataset both read and write (default ./opforge-trace).
                   The two switches and the path are read once, at ``import opforge``.
OPFORGE_WORKER_FORK     1 (default): the benchmark runner forks its CPU workers from a fork
                   server that has imported torch (opforge.bench.forkserver); 0: every
                   worker starts a fresh interpreter. Read at each worker start.

Variables of other tools that opforge honours: TRITON_INTERPRET=1 (Triton solutions run on the
CPU through Triton's interpreter); FlashInfer-Bench's names for the three above
(FIB_ENABLE_TRACING, FLASHINFER_BENCH_ENABLE_TRACING, FIB_ENABLE_APPLY,
FLASHINFER_BENCH_ENABLE_APPLY, FIB_DATASET_PATH, FLASHINFER_BENCH_DATASET_PATH), where opforge's
own name is unset.
"""

from __future__ import annotations

import os
from pathlib import Path

LOGLEVEL_VAR = "OPFORGE_LOGLEVEL"
LOGDEST_VAR = "OPFORGE_LOGDEST"
CACHE_DIR_VAR = "OPFORGE_CACHE_DIR"
WORKER_FORK_VAR = "OPFORGE_WORKER_FORK"
#: Each switch by opforge's name first, then FlashInfer-Bench's.
TRACING_VARS = ("OPFORGE_ENABLE_TRACING", "FIB_ENABLE_TRACING", "FLASHINFER_BENCH_ENABLE_TRACING")
APPLY_VARS = ("OPFORGE_ENABLE_APPLY", "FIB_ENABLE_APPLY", "FLASHINFER_BENCH_ENABLE_APPLY")
DATASET_VARS = ("OPFORGE_DATASET_PATH", "FIB_DATASET_PATH", "FLASHINFER_BENCH_DATASET_PATH")
DEFAULT_DATASET = "./opforge-trace"
#: opforge's variables that ``import opforge`` reads (the others are read when used).
READ_AT_IMPORT = (LOGLEVEL_VAR, *TRACING_VARS, *APPLY_VARS, *DATASET_VARS)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _first_set(names: tuple) -> tuple[str, str] | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            return name, value.strip()
    return None


def _switch(names: tuple) -> bool:
    found = _first_set(names)
    if found is None:
        return False
    name, value = found
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected 1 or 0 (also true/false, yes/no, on/off)")


def tracing_enabled() -> bool:
    return _switch(TRACING_VARS)


def apply_enabled() -> bool:
    return _switch(APPLY_VARS)


def worker_fork_enabled() -> bool:
    """OPFORGE_WORKER_FORK, on when unset (ValueError for a value that is not a switch)."""
    return _switch((WORKER_FORK_VAR,)) if WORKER_FORK_VAR in os.environ else True


def dataset_path() -> Path:
    found = _first_set(DATASET_VARS)
    return Path(found[1] if found and found[1] else DEFAULT_DATASET).expanduser()


def log_level() -> int:
    raw = os.environ.get(LOGLEVEL_VAR, "0").strip() or "0"
    try:
        level = int(raw)
    except ValueError:
        raise ValueError(f"{LOGLEVEL_VAR}={raw!r}: expected an integer 0..5") from None
    if not 0 <= level <= 5:
        raise ValueError(f"{LOGLEVEL_VAR}={level}: expected an integer 0..5")
    return level


def log_destination() -> str:
    dest = os.environ.get(LOGDEST_VAR, "stderr").strip() or "stderr"
    return dest.replace("%i", str(os.getpid()))


def cache_dir() -> Path:
    env = os.environ.get(CACHE_DIR_VAR, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "opforge" / "builds"


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip() == "1"
