"""Messages between the runner and its worker processes, in a format that cannot run code.

A worker runs solution code, so anything it sends is hostile until proven otherwise. pickle would
let a returned object's ``__reduce__`` run in the trusted parent; this format carries only plain
data (None, bool, int, float, str, list, dict with str keys, tuple, bytes) and tensors, and the
decoder rebuilds nothing else. A message is::

    MAGIC | u64 header length | JSON header | (u64 length | raw bytes) per buffer

Tuples, bytes and tensors appear in the JSON as objects with the key ``"~"`` (a plain dict
holding that key is refused when encoding). A tensor is its dtype (from a fixed list), shape and
raw bytes on the CPU, so nothing depends on torch's shared-memory handles, which a crashed worker
would leave behind. A dense tensor whose dimensions lie in memory in another order than its
shape's (a permuted contiguous tensor) keeps that layout: its bytes go in memory order with the
order of its dimensions (``order``, outermost first); anything else arrives contiguous.

Large tensors (an input set of a big workload is hundreds of MB) do not go through the socket:
with a ``spill`` folder (in /dev/shm where there is one) their bytes are written to a file
there and the receiver maps it, which is several times faster. The receiver only opens plain
files named like the sender's, in its own spill folder, without following links, checks their
size, and removes them once mapped; the runner removes the folder at the end of a run.

Every malformed message raises ``WireError``: the runner turns it into the sender's failure.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Optional

import torch

#: Tensors of at least this many bytes are spilled to a file when a spill folder is given.
SPILL_BYTES = 1 << 20
#: The largest message a receiver accepts through the socket (large tensors are spilled).
MAX_MESSAGE_BYTES = 1 << 30
MAGIC = b"OPFW1\n"
_TAG = "~"
_SPILL_NAME = re.compile(r"[0-9a-f]{32}\.bin")
#: The dtypes a tensor may have on the wire (names of torch attributes).
DTYPES = {name: getattr(torch, name) for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2") if isinstance(getattr(torch, name, None), torch.dtype)}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_MAX_DEPTH = 64


class WireError(ValueError):
    """A message that is not one this module wrote, or asks for what it may not."""


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little")


class _Encoder:
    def __init__(self, spill: Optional[Path]):
        self.spill = spill
        self.buffers: list[bytes] = []

    def encode(self, obj, depth: int = 0):
        if depth > _MAX_DEPTH:
            raise TypeError("nested too deeply to send")
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            # JSON has no NaN/inf: they travel as tagged strings.
            return obj if math.isfinite(obj) else {_TAG: "float", "value": repr(obj)}
        if isinstance(obj, list):
            return [self.encode(v, depth + 1) for v in obj]
        if isinstance(obj, tuple):
            return {_TAG: "tuple", "items": [self.encode(v, depth + 1) for v in obj]}
        if isinstance(obj, dict):
            if _TAG in obj or not all(isinstance(k, str) for k in obj):
                raise TypeError(f"cannot send a dict with keys {list(obj)[:5]!r}")
            return {k: self.encode(v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, (bytes, bytearray)):
            self.buffers.append(bytes(obj))
            return {_TAG: "bytes", "buffer": len(self.buffers) - 1}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        raise TypeError(f"cannot send a {type(obj).__module__}.{type(obj).__qualname__}")

    def _tensor(self, obj: torch.Tensor) -> dict:
        if obj.dtype not in _DTYPE_NAMES:
            raise TypeError(f"cannot send a tensor of dtype {obj.dtype}")
        t = obj.detach().to("cpu")
        head = {_TAG: "tensor", "dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape)}
        order = _memory_order(t)
        if order is not None:
            head["order"] = order
            t = t.permute(*order)
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        raw = t.reshape(-1).view(torch.uint8).numpy() if nbytes else None
        if self.spill is not None and nbytes >= SPILL_BYTES:
            name = f"{uuid.uuid4().hex}.bin"
            raw.tofile(self.spill / name)
            return dict(head, file=name)
        self.buffers.append(raw.tobytes() if raw is not None else b"")
        return dict(head, buffer=len(self.buffers) - 1)


def _memory_order(t: torch.Tensor) -> Optional[list]:
    """The order of ``t``'s dimensions in memory, outermost first, when ``t`` is a permutation of
    a contiguous tensor in another order than its own; None otherwise (contiguous, or not dense)."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    # Larger strides outside; a size-1 dimension goes where its shape position puts it.
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d) if t.shape[d] > 1 else 0, d))
    if order == list(range(t.dim())) or not t.permute(*order).is_contiguous():
        return None
    return order


def dumps(obj, spill: Optional[Path] = None) -> bytes:
    """Encode ``obj`` (see the module doc); TypeError names what cannot be sent."""
    encoder = _Encoder(Path(spill) if spill is not None else None)
    header = json.dumps(encoder.encode(obj), separators=(",", ":"), allow_nan=False).encode()
    parts = [MAGIC, _u64(len(header)), header]
    for buffer in encoder.buffers:
        parts += [_u64(len(buffer)), buffer]
    return b"".join(parts)


class _Decoder:
    def __init__(self, buffers: list[memoryview], spill: Optional[Path]):
        self.buffers = buffers
        self.spill = spill

    def decode(self, obj, depth: int = 0):
        if depth > _MAX_DEPTH:
            raise WireError("nested too deeply")
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, list):
            return [self.decode(v, depth + 1) for v in obj]
        if not isinstance(obj, dict):
            raise WireError(f"unexpected JSON value {type(obj).__name__}")
        if _TAG not in obj:
            return {k: self.decode(v, depth + 1) for k, v in obj.items()}
        kind = obj[_TAG]
        if kind == "tuple" and isinstance(obj.get("items"), list):
            return tuple(self.decode(v, depth + 1) for v in obj["items"])
        if kind == "float" and obj.get("value") in ("nan", "inf", "-inf"):
            return float(obj["value"])
        if kind == "bytes":
            return bytes(self._buffer(obj.get("buffer")))
        if kind == "tensor":
            return self._tensor(obj)
        raise WireError(f"unknown tagged value {str(kind)[:40]!r}")

    def _buffer(self, index) -> memoryview:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.buffers):
            raise WireError(f"bad buffer index {index!r}")
        return self.buffers[index]

    def _tensor(self, obj: dict) -> torch.Tensor:
        dtype = DTYPES.get(obj.get("dtype")) if isinstance(obj.get("dtype"), str) else None
        shape = obj.get("shape")
        if dtype is None:
            raise WireError(f"tensor dtype {str(obj.get('dtype'))[:40]!r} is not accepted")
        if not isinstance(shape, list) or len(shape) > 32 or \
                not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**48 for n in shape):
            raise WireError(f"bad tensor shape {str(shape)[:80]}")
        nbytes = math.prod(shape) * dtype.itemsize
        if "file" in obj:
            flat = self._spilled(obj["file"], nbytes)
        else:
            raw = self._buffer(obj.get("buffer"))
            if len(raw) != nbytes:
                raise WireError(f"tensor of shape {shape} and dtype {obj['dtype']} needs {nbytes} bytes, got {len(raw)}")
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        order = obj.get("order")
        if order is None:
            return flat.view(dtype).reshape(shape)
        if not isinstance(order, list) or sorted(order) != list(range(len(shape))) or \
                not all(isinstance(d, int) and not isinstance(d, bool) for d in order):
            raise WireError(f"bad tensor dimension order {str(order)[:80]} for shape {shape}")
        inverse = [0] * len(order)
        for position, dim in enumerate(order):
            inverse[dim] = position
        return flat.view(dtype).reshape([shape[d] for d in order]).permute(*inverse)

    def _spilled(self, name, nbytes: int) -> torch.Tensor:
        if self.spill is None or not isinstance(name, str) or not _SPILL_NAME.fullmatch(name):
            raise WireError(f"bad spill file {str(name)[:80]!r}")
        path = self.spill / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise WireError(f"spill file {name}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != nbytes:
                raise WireError(f"spill file {name}: {info.st_size} bytes, expected a file of {nbytes}")
            mapped = mmap.mmap(fd, nbytes) if nbytes else None  # a mapping, no copy
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping keeps the pages
        return torch.frombuffer(mapped, dtype=torch.uint8) if mapped is not None else torch.empty(0, dtype=torch.uint8)


def loads(data: bytes, spill: Optional[Path] = None):
    """Decode a message from ``dumps``; WireError for anything else (see the module doc)."""
    view = memoryview(data)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise WireError("not an opforge message")
    pos = len(MAGIC)

    def take() -> memoryview:
        nonlocal pos
        if pos + 8 > len(view):
            raise WireError("truncated message")
        n = int.from_bytes(view[pos:pos + 8], "little")
        if n > len(view) - pos - 8:
            raise WireError("truncated message")
        chunk = view[pos + 8:pos + 8 + n]
        pos += 8 + n
        return chunk

    try:
        header = json.loads(bytes(take()))
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise WireError(f"bad header: {exc}") from None
    buffers = []
    while pos < len(view):
        buffers.append(take())
    return _Decoder(buffers, Path(spill) if spill is not None else None).decode(header)
