"""Report rows as plain JSON values, for scripts."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence


def _plain(value: Any) -> Any:
    # Strict JSON has no NaN or Infinity; a missing number reads as null like any other.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def rows_to_json(rows: Sequence) -> list[dict]:
    """SummaryRow / BestRow objects as dicts of JSON values (``json.dumps(..., allow_nan=False)`` safe)."""
    return [_plain(dataclasses.asdict(row)) for row in rows]
