"""What a dataset's names mean here: this device's hardware name (as the benchmark runner
records it in traces), and which of the dataset's Definitions are the ones opforge's own ops
bind their calls to.

A built-in op call is named after what it fixes (trace.calls: hidden size, dtype, the public
eps). A dataset may hold a Definition of the same name that says something else (another eps
baked into its reference, other inputs); its solutions must never receive built-in calls, so a
Definition serves them only when its content equals what the op's template makes.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..registry.checks import DeviceInfo, device_info
from ..trace import Definition
from ..trace.templates import definition_for_name


def resolve_device(device=None) -> DeviceInfo:
    """The device apply builds and runs solutions on (default: current CUDA device, else CPU)."""
    return device_info(device)


def hardware_name(device: Optional[DeviceInfo] = None) -> str:
    """The ``environment.hardware`` the benchmark runner writes for traces measured on
    ``device`` (default: the device apply would use): the GPU's name, or the CPU's model name."""
    device = device if device is not None else resolve_device()
    if device.kind == "cuda":
        return torch.cuda.get_device_name(device.index)
    # The runner's own naming, so that traces it wrote on this CPU match.
    from ..bench.worker import cpu_name

    return cpu_name()


def builtin_mismatch(definition: Definition) -> Optional[str]:
    """Why ``definition`` must not receive built-in op calls although it has one of their names
    (None: it is exactly the op's Definition, or no op call carries its name)."""
    expected = definition_for_name(definition.name)
    if expected is None or expected.content_hash() == definition.content_hash():
        return None
    diffs = []
    for field in ("axes", "inputs", "outputs"):
        ours, theirs = getattr(expected, field), getattr(definition, field)
        if list(ours) != list(theirs):
            diffs.append(f"{field} {list(theirs)} instead of {list(ours)}")
        else:
            changed = [k for k in ours if ours[k].model_dump(exclude={"description"})
                       != theirs[k].model_dump(exclude={"description"})]
            if changed:
                diffs.append(f"{field} {', '.join(changed)} differ")
    if not diffs:
        diffs.append("its reference, constraints or extensions differ (e.g. another eps baked in)")
    return "; ".join(diffs)
