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

Variables of other tools that opforge honours: TRITON_INTERPRET=1 (Triton solutions run on the
CPU through Triton's interpreter).
"""

from __future__ import annotations

import os
from pathlib import Path

LOGLEVEL_VAR = "OPFORGE_LOGLEVEL"
LOGDEST_VAR = "OPFORGE_LOGDEST"
CACHE_DIR_VAR = "OPFORGE_CACHE_DIR"


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
