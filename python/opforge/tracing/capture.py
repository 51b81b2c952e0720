"""Copies of the input tensors a kept workload saves, taken before the op runs and without
making the host wait for the device.

CPU tensors are cloned on the spot. A CUDA tensor is first copied on the device, on the current
stream: that copy is ordered before the op and before any later kernel, so neither an in-place
op nor anything after it can change what is saved, and the stream only pays a device-to-device
copy (microseconds), never a wait for the PCIe transfer. A side stream, made to wait on the
current one, then copies the snapshot into pinned host memory; the writer thread waits on the
event recorded after it. The snapshot's memory is handed back to the caching allocator only
after the side stream is done with it (record_stream).

While a CUDA graph is being captured nothing may be copied (the copies would become part of the
graph): callers record shapes only (``capturing``).
"""

from __future__ import annotations

from typing import Optional

import torch


def capturing(tensors) -> bool:
    """Whether a CUDA graph is being captured on the current stream of these tensors' device."""
    for t in tensors:
        if t.is_cuda:
            return torch.cuda.is_current_stream_capturing()
    return False


class Snapshots:
    """Takes host copies of tensors; one side stream per CUDA device, made on first use."""

    def __init__(self):
        self._streams: dict[int, torch.cuda.Stream] = {}

    def _side_stream(self, device: torch.device) -> "torch.cuda.Stream":
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = torch.cuda.Stream(device=index)
        return stream

    def take(self, tensors: dict) -> tuple[dict, list]:
        """``(host copies by name, CUDA events to wait on before reading them)``."""
        copies: dict = {}
        sides: dict = {}  # device index -> side stream used
        for name, t in tensors.items():
            t = t.detach()
            if t.is_cuda:
                copies[name] = self._copy_cuda(t, sides)
            elif t.device.type == "cpu":
                copies[name] = t.clone(memory_format=torch.contiguous_format)
            else:  # another accelerator: a plain synchronous copy
                copies[name] = t.to("cpu", copy=True).contiguous()
        events = []
        for side in sides.values():
            event = torch.cuda.Event()
            event.record(side)
            events.append(event)
        return copies, events

    def _copy_cuda(self, t: torch.Tensor, sides: dict) -> torch.Tensor:
        current = torch.cuda.current_stream(t.device)
        side = self._side_stream(t.device)
        sides[side.device_index] = side
        snapshot = t.clone(memory_format=torch.contiguous_format)  # on the current stream, before the op
        host = torch.empty(snapshot.shape, dtype=snapshot.dtype, pin_memory=True)
        side.wait_stream(current)  # after the clone was queued: the transfer reads a finished snapshot
        with torch.cuda.stream(side):
            host.copy_(snapshot, non_blocking=True)
        snapshot.record_stream(side)
        return host


def wait(events: Optional[list]) -> None:
    """Block (the writer thread) until the copies behind ``events`` are done."""
    for event in events or ():
        event.synchronize()
