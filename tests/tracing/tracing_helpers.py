"""Helpers of the tracing tests: reading a traced folder back, a Definition that no op template
makes (with an integer input), calls of it as apply builds them, and running Python in a child
process with a clean environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import opforge
from opforge.config import APPLY_VARS, DATASET_VARS, TRACING_VARS
from opforge.trace import AxisConst, AxisVar, Definition, TensorSpec, TraceSet

def load(root) -> TraceSet:
    """The folder as the runner reads it: every file and blob must load."""
    return TraceSet.from_path(root, strict=True)


def workloads(root, definition: str) -> list:
    """The Workloads of a Definition in the order they were written."""
    return [t.workload for t in load(root).get_workloads(definition)]


def blob(ts: TraceSet, definition: str, workload, name: str) -> torch.Tensor:
    return ts.load_input_tensor(definition, workload, name)


def kinds(workload) -> dict:
    return {name: spec.type for name, spec in workload.inputs.items()}


GATHER = Definition(
    name="gather_rows_h8",
    op_type="gather",
    axes={"batch_size": AxisVar(), "rows": AxisVar(), "hidden": AxisConst(value=8)},
    inputs={"table": TensorSpec(shape=["rows", "hidden"], dtype="float32"),
            "index": TensorSpec(shape=["batch_size"], dtype="int32"),
            "scale": TensorSpec(shape=None, dtype="float32")},
    outputs={"out": TensorSpec(shape=["batch_size", "hidden"], dtype="float32")},
    reference="import torch\n\ndef run(table, index, scale):\n    return table[index.long()] * scale\n",
)


class GatherCall:
    """A call of a Definition from outside the op templates, with the attributes the tracer reads
    (what opforge.apply hands to opforge.tracing.record)."""

    def __init__(self, table: torch.Tensor, index: torch.Tensor, scale: float, definition: Definition = GATHER):
        self.definition = definition.name
        self.axes = {"batch_size": index.shape[0], "rows": table.shape[0]}
        self.key = (self.definition, index.shape[0], table.shape[0])
        self.inputs = {"table": table, "index": index, "scale": scale}
        self._definition = definition

    def make_definition(self) -> Definition:
        return self._definition


def clean_env(**extra) -> dict:
    """os.environ without any of opforge's tracing / apply / dataset switches, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in (*TRACING_VARS, *APPLY_VARS, *DATASET_VARS)}
    # The opforge this process imported (an editable checkout or an installed wheel), first.
    here = str(Path(opforge.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_python(code: str, cwd, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=clean_env(**env), capture_output=True,
                          text=True, timeout=timeout)


_SUMMARY = re.compile(r"opforge tracing:\s+(\S+): (\d+) calls, (\d+) workloads kept, (\d+) payloads dumped, "
                      r"(\d+) dropped")


def summary(stderr: str) -> dict[str, dict]:
    """The per-Definition lines of the summaries in ``stderr``."""
    out = {}
    for name, calls, kept, dumped, dropped in _SUMMARY.findall(stderr):
        out[name] = {"calls": int(calls), "kept": int(kept), "dumped": int(dumped), "dropped": int(dropped)}
    return out
