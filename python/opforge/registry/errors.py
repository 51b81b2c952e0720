"""BuildError: why a solution could not be turned into something runnable.

``kind`` says which step failed, so a benchmark runner can map it to a trace status without
parsing messages:

==================  =======================================================================
COMPILE_ERROR       the compiler rejected the sources (``log`` holds its full output; the
                    message keeps the relevant lines)
IMPORT_ERROR        a module of the solution (or the compiled library) failed to import / load,
                    or cannot be loaded in this process (its torch op namespace is taken)
ENTRY_POINT_ERROR   the entry point's file is not among the sources, or its symbol is missing
SIGNATURE_ERROR     the entry callable's parameters do not fit the Definition's inputs/outputs
UNSUPPORTED         the solution cannot run here: target hardware, a missing or too old
                    dependency, a binding whose package is not installed
==================  =======================================================================
"""

from __future__ import annotations

import re
from typing import Optional

COMPILE_ERROR = "COMPILE_ERROR"
IMPORT_ERROR = "IMPORT_ERROR"
ENTRY_POINT_ERROR = "ENTRY_POINT_ERROR"
SIGNATURE_ERROR = "SIGNATURE_ERROR"
UNSUPPORTED = "UNSUPPORTED"

KINDS = (COMPILE_ERROR, IMPORT_ERROR, ENTRY_POINT_ERROR, SIGNATURE_ERROR, UNSUPPORTED)


class BuildError(RuntimeError):
    """A solution failed to build; ``kind`` is one of :data:`KINDS`, ``solution`` its name,
    ``log`` the full tool output where there is one."""

    def __init__(self, kind: str, solution: str, message: str, log: Optional[str] = None):
        if kind not in KINDS:
            raise ValueError(f"BuildError: unknown kind {kind!r}; accepted: {', '.join(KINDS)}")
        self.kind = kind
        self.solution = solution
        self.message = message
        self.log = log
        super().__init__(f"solution {solution!r}: {message}")


# Compiler output: lines worth showing, and the noise around them.
_ERROR_LINE = re.compile(r"\b(error|undefined reference|undefined symbol|cannot find)\b|\bld: ", re.IGNORECASE)
_NOISE = re.compile(r"^\s*(\[\d+/\d+\]|FAILED:|ninja: |Error building extension|c\+\+ |g\+\+ |/usr/\S*(c\+\+|g\+\+|nvcc) |\S*nvcc )")
_MAX_LINES = 40


def trim_compiler_output(output: str, build_dir: Optional[str] = None) -> str:
    """The lines of ``output`` that say what is wrong: each error line with the two lines after
    it (gcc's source line and caret), paths made relative to ``build_dir``; the tail of the
    output when no line looks like an error."""
    if build_dir:
        output = output.replace(str(build_dir).rstrip("/") + "/", "")
    lines = [line for line in output.splitlines() if line.strip() and not _NOISE.match(line)]
    keep: list[int] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            keep.extend(j for j in range(i, min(i + 3, len(lines))) if not keep or j > keep[-1])
    if not keep:
        return "\n".join(lines[-_MAX_LINES:])
    shown = [lines[i] for i in keep[:_MAX_LINES]]
    if len(keep) > _MAX_LINES:
        shown.append(f"... ({len(keep) - _MAX_LINES} more lines; see BuildError.log)")
    return "\n".join(shown)
