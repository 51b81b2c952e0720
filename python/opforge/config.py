"""Every environment variable opforge reads, in one place.

OPFORGE_LOGLEVEL   0 (default): no logging, and the API decorator adds no code to a call.
                   1: op names; 3: plus argument shapes, dtypes, devices; 5: plus value
                   statistics (min / max / mean / NaN count; synchronizes the GPU).
                   Read when the ops are defined (first ``import opforge``), so that level 0
                   costs nothing per call: set it before starting Python.
OPFORGE_LOGDEST    where log lines go: "stderr" (default), "stdout", or a file path
                   ("%i" in it becomes the process id). Read at each logged call.
"""

from __future__ import annotations

import os

LOGLEVEL_VAR = "OPFORGE_LOGLEVEL"
LOGDEST_VAR = "OPFORGE_LOGDEST"


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
