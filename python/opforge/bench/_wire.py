"""Messages between the runner and its worker processes: pickle, with tensors sent as their bytes
(CPU, contiguous) so nothing depends on torch's shared-memory handles, which a crashed worker
would leave behind and which need the two processes to be related by multiprocessing."""

from __future__ import annotations

import io
import pickle

import torch


def _rebuild(dtype_name: str, shape: tuple, data: bytes) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return _rebuild, (str(t.dtype).removeprefix("torch."), tuple(t.shape), data)
        return NotImplemented


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes):
    return pickle.loads(data)
