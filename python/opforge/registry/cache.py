"""The build cache: one folder per (language, solution content), shared by processes.

Location: ``$OPFORGE_CACHE_DIR`` if set (read at each build), else ``~/.cache/opforge/builds``.
Layout::

    <root>/<kind>/<solution name>-<key[:16]>/            sources as the solution lists them,
                                                          build outputs next to them
    <root>/<kind>/<solution name>-<key[:16]>.lock         file lock held while building
    .../opforge-build.json                                written last: a folder without it is
                                                          an unfinished build and is redone

``kind`` is the language (``cpp-tvm-ffi`` / ``cuda-tvm-ffi`` for that binding). The key
hashes the solution's spec and sources (not its name, author or description) and, for
compiled languages, what else changes the binary: torch, Python and compiler versions. A build
runs under the folder's file lock; a process that finds the marker with the same key loads what
is there without building (a cache hit).

The marker records the size and sha256 of every file a later load reads: the sources as written
and the build's artifact. A hit checks them first, because loading a truncated library kills
the process (SIGBUS) and an emptied one fails to load at every later build: an entry whose
files differ (truncated, emptied, replaced, deleted) is discarded and rebuilt under the lock,
with a warning on the ``opforge.registry`` logger.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from filelock import FileLock

from .. import config
from ..config import CACHE_DIR_VAR  # noqa: F401 (re-exported by opforge.registry)

MARKER = "opforge-build.json"
#: The key of ``produce``'s result naming the build output that gets loaded (relative path).
ARTIFACT = "artifact"
_HASH_CHUNK = 1 << 20

logger = logging.getLogger("opforge.registry")


def cache_root() -> Path:
    """The cache's root folder (``$OPFORGE_CACHE_DIR`` or ``~/.cache/opforge/builds``)."""
    return config.cache_dir()


def solution_key(solution, extra: Iterable[str] = ()) -> str:
    """sha256 (hex) of the solution's content hash (spec and sources) and ``extra`` strings
    (the toolchain, for compiled languages)."""
    text = "\n".join([solution.content_hash(), *extra])
    return hashlib.sha256(text.encode()).hexdigest()


def toolchain_identity(cuda: bool, device=None) -> list[str]:
    """What besides the sources changes a compiled binary: Python ABI, torch, the compilers and,
    for CUDA, the architectures compiled for (the arch-list variables, else the device's)."""
    import torch

    ident = [sys.implementation.cache_tag, f"torch {torch.__version__}", _compiler_version("c++")]
    if cuda:
        ident.append(_compiler_version("nvcc"))
        ident += [f"{var}={os.environ.get(var, '')}" for var in ("TORCH_CUDA_ARCH_LIST", "TVM_FFI_CUDA_ARCH_LIST")]
        ident.append(f"device sm_{getattr(device, 'cc', None)}")
    return ident


def _compiler_version(compiler: str) -> str:
    import subprocess

    path = shutil.which(compiler)
    if path is None:
        return f"{compiler}: not found"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return f"{compiler}: unknown"
    lines = [line for line in out.splitlines() if line.strip()]
    return f"{path}: {lines[-1] if 'nvcc' in compiler and lines else (lines[0] if lines else '')}"


@dataclass
class CacheEntry:
    """A finished build: its folder, the marker's contents, and whether it was found built."""

    path: Path
    info: dict
    hit: bool


def entry_folder(language: str, solution, key: str) -> Path:
    """The folder of ``solution``'s build under ``key`` (built or not)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", solution.name)[:64] or "solution"
    return cache_root() / language / f"{safe}-{key[:16]}"


def _read_marker(folder: Path, key: str) -> dict | None:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("key") == key else None


def _file_record(path: Path) -> dict:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def _loaded_files(solution, info: dict) -> list[str]:
    return [s.path for s in solution.sources] + ([info[ARTIFACT]] if ARTIFACT in info else [])


def _damage(folder: Path, info: dict) -> str | None:
    """What differs between the files in ``folder`` and the marker's record of them; None if
    nothing does. The size is compared first: it finds truncation without reading the file."""
    files = info.get("files")
    if not isinstance(files, dict) or not files:
        return "the marker records no file hashes"
    for rel, want in sorted(files.items()):
        path = folder / rel
        try:
            size = path.stat().st_size
            if size != want.get("size"):
                return f"{rel}: size {size} instead of {want.get('size')}"
            if _file_record(path)["sha256"] != want.get("sha256"):
                return f"{rel}: sha256 differs from the recorded one"
        except FileNotFoundError:
            return f"{rel}: missing"
        except OSError as exc:
            return f"{rel}: unreadable ({exc.strerror})"
    return None


def write_sources(folder: Path, sources) -> list[Path]:
    """Write each SourceFile under ``folder`` (refusing paths that leave it); their paths."""
    written = []
    root = folder.resolve()
    for source in sources:
        target = (folder / source.path).resolve()
        if root not in target.parents:
            raise ValueError(f"source path {source.path!r} leaves the solution's folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.content)
        written.append(target)
    return written


def cached_build(language: str, solution, key: str, produce: Callable[[Path], dict]) -> CacheEntry:
    """The finished build of ``solution`` under ``key``, made by ``produce(folder)`` if needed.

    ``produce`` gets an empty folder holding the solution's sources, builds there and returns
    what loading needs (JSON-ready dict); a compiled language names the library it loads under
    :data:`ARTIFACT`, so that the library is verified with the sources at every hit. It raises
    to fail the build, which removes the folder so the next attempt starts clean.
    """
    folder = entry_folder(language, solution, key)
    info = _read_marker(folder, key)
    if info is not None and _damage(folder, info) is None:
        return CacheEntry(folder, info, hit=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        info = _read_marker(folder, key)
        if info is not None:
            damage = _damage(folder, info)
            if damage is None:  # another process finished or repaired it while this one waited
                return CacheEntry(folder, info, hit=True)
            logger.warning("build cache entry %s is damaged (%s): discarding it and rebuilding", folder, damage)
        if folder.exists():  # damaged, or an unfinished build (killed process): start over
            shutil.rmtree(folder)
        folder.mkdir()
        try:
            write_sources(folder, solution.sources)
            info = dict(produce(folder))
            info["files"] = {rel: _file_record(folder / rel) for rel in _loaded_files(solution, info)}
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        info["key"] = key
        tmp = folder / (MARKER + ".tmp")
        tmp.write_text(json.dumps(info, indent=1, sort_keys=True))
        os.replace(tmp, folder / MARKER)
    return CacheEntry(folder, info, hit=False)
