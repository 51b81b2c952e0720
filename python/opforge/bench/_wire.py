"""Messages between the runner and its worker processes: pickle, with tensors sent as their bytes
(CPU, contiguous) so nothing depends on torch's shared-memory handles, which a crashed worker
would leave behind and which need the two processes to be related by multiprocessing.

Large tensors (an input set of a big workload is hundreds of MB) do not go through the socket:
with a ``spill`` folder (in /dev/shm where there is one) they are written to a file there and
the receiver maps it, which is several times faster than pickling the bytes. The receiver
removes the file once mapped; the runner removes the folder at the end of a run, so files of a
worker that died in between do not stay behind.
"""

from __future__ import annotations

import io
import os
import pickle
import uuid
from pathlib import Path
from typing import Optional

import torch

#: Tensors of at least this many bytes are spilled to a file when a spill folder is given.
SPILL_BYTES = 1 << 20


def _rebuild(dtype_name: str, shape: tuple, data: bytes) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _rebuild_from_file(dtype_name: str, shape: tuple, path: str, nbytes: int) -> torch.Tensor:
    flat = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)  # a mapping, no copy
    os.unlink(path)  # the mapping keeps the pages
    return flat.view(getattr(torch, dtype_name)).reshape(shape)


class _Pickler(pickle.Pickler):
    def __init__(self, file, spill: Optional[Path]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.spill = spill

    def reducer_override(self, obj):
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        t = obj.detach().to("cpu").contiguous()
        dtype_name = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else None
        if self.spill is not None and nbytes >= SPILL_BYTES:
            path = self.spill / f"{uuid.uuid4().hex}.bin"
            raw.tofile(path)
            return _rebuild_from_file, (dtype_name, tuple(t.shape), str(path), nbytes)
        return _rebuild, (dtype_name, tuple(t.shape), raw.tobytes() if raw is not None else b"")


def dumps(obj, spill: Optional[Path] = None) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, Path(spill) if spill is not None else None).dump(obj)
    return buffer.getvalue()


def loads(data: bytes):
    return pickle.loads(data)
