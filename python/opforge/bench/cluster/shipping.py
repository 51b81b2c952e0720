"""What a cluster run sends from the driver to its nodes besides the work itself: the files of
``--module`` (a node does not have the driver's files) and a workload's recorded inputs (the
dataset stays with the driver).

Both travel from the driver to trusted device workers only; solution workers on the node load
the modules from the node's copy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

from ..device import SetupError

#: The most bytes of module files one run ships to every node.
MAX_MODULE_BYTES = 64 << 20
_MODULE_SUFFIXES = (".py", ".json")


def pack_modules(modules: list[str]) -> list[dict]:
    """Each ``--module`` item as the nodes receive it: a .py or .json file or a folder (its .py
    and .json files) with its contents, or a module name, which every node must be able to
    import itself. SetupError past MAX_MODULE_BYTES."""
    packed, total = [], 0
    for item in modules:
        path = Path(item)
        if path.is_dir():
            files = {p.relative_to(path).as_posix(): p.read_bytes()
                     for p in sorted(path.rglob("*")) if p.suffix in _MODULE_SUFFIXES and p.is_file()}
            packed.append({"item": item, "kind": "folder", "name": path.resolve().name, "files": files})
        elif path.is_file():
            packed.append({"item": item, "kind": "file", "name": path.name, "files": {path.name: path.read_bytes()}})
        else:
            packed.append({"item": item, "kind": "module", "name": item, "files": {}})
        total += sum(len(b) for b in packed[-1]["files"].values())
        if total > MAX_MODULE_BYTES:
            raise SetupError(f"--module {item}: the modules' files add up to more than {MAX_MODULE_BYTES >> 20} MiB, "
                             "too much to send to every node; install them there as a package and name the module")
    return packed


def unpack_modules(packed: list[dict], where: Optional[Path] = None) -> dict[str, str]:
    """Write the packed files under ``where`` (a new temporary folder by default); returns each
    original item -> what a worker on this node loads for it."""
    where = Path(where) if where is not None else Path(tempfile.mkdtemp(prefix="opforge-modules-"))
    local = {}
    for index, entry in enumerate(packed):
        if entry["kind"] == "module":
            local[entry["item"]] = entry["item"]
            continue
        base = where / str(index)
        for relative, data in entry["files"].items():
            target = (base / entry["name"] / relative) if entry["kind"] == "folder" else base / relative
            if base.resolve() not in target.resolve().parents:
                raise SetupError(f"--module {entry['item']}: file {relative!r} would land outside its folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        local[entry["item"]] = str(base / entry["name"])
    return local


class ShippedInputs:
    """A workload's recorded (safetensors) inputs, read by the driver and sent with its task:
    what PairEvaluator asks the TraceSet for on a single host. ``error``: why the driver could
    not read them, raised where the TraceSet would have raised it."""

    def __init__(self, tensors: dict, error: Optional[Exception] = None):
        self.tensors, self.error = tensors, error

    @classmethod
    def read(cls, trace_set, definition, workload) -> Optional["ShippedInputs"]:
        """The workload's recorded inputs from the driver's dataset (None when it has none)."""
        from ...trace import SafetensorsInput

        names = [n for n, spec in workload.inputs.items() if isinstance(spec, SafetensorsInput)]
        if not names:
            return None
        try:
            return cls({n: trace_set.load_input_tensor(definition.name, workload, n) for n in names})
        except Exception as exc:  # the same failure a single-host run reports for the workload
            return cls({}, exc)

    def load_input_tensor(self, definition: str, workload, input_name: str, device: str = "cpu"):
        if self.error is not None:
            raise self.error
        return self.tensors[input_name].to(device)
