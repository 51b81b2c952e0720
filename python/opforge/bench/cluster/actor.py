"""The device worker: a Ray actor holding one GPU of the cluster (``num_gpus=1``).

It is a trusted process, the cluster's counterpart of the single-host runner's device thread,
and runs the same code (pairs.py on a device.py Device): it draws each workload's inputs from
the recorded seed, runs the reference, and judges what the solutions did, while solution code
runs only in the worker processes it starts beside it on its node (worker.py, under
supervisor.py, replies decoded by _wire.py). So outputs, however large, go from a solution's
worker to the checker over the node's own memory, never over the network; what leaves the node
is the verdict, a Trace. When this actor dies (the node fails, or it is killed), its
supervisors see their lifeline close and kill every process its solutions started.

Ray makes this class an actor in the driver (``ray.remote(DeviceWorker)``); nothing here runs
on import, so the module imports without Ray.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, Optional

from ...trace import Definition, Solution, Workload
from ..config import BenchmarkConfig
from ..device import Device, SetupError, make_spill_folder
from ..pairs import PairEvaluator, Skipped
from .shipping import unpack_modules


class DeviceWorker:
    """One GPU slot of a cluster run. ``setup``: the run's config (``config``), ``seed``,
    ``run_id``, ``device`` ("cuda", or "cpu" to evaluate on the node's CPU), ``log_dir``
    (None: a folder in the node's temp folder) and ``modules_of`` (solution -> the --module
    items registering it); ``modules``: those items' files (shipping.pack_modules)."""

    def __init__(self, setup: dict, modules: list):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        gpus = [str(g) for g in ray.get_gpu_ids()]
        on_cpu = setup["device"] == "cpu"
        # Ray shows the actor its GPU alone (CUDA_VISIBLE_DEVICES): torch's cuda:0; the
        # Traces name it by its index on the node.
        self.label = "cpu" if on_cpu else f"cuda:{gpus[0] if gpus else 0}"
        self.config = BenchmarkConfig.model_validate(setup["config"])
        self.stopping = threading.Event()
        # The spill folder goes with this process (its supervisors remove it when it dies), and
        # the modules' files with it.
        self.spill = make_spill_folder()
        local = unpack_modules(modules, self.spill / "modules")
        modules_of = {name: [local[m] for m in items] for name, items in setup["modules_of"].items()}
        log_dir = Path(setup["log_dir"]) if setup.get("log_dir") else \
            Path(tempfile.gettempdir()) / "opforge" / "cluster-logs" / setup["run_id"]
        self.dev = Device("cpu" if on_cpu else "cuda:0", modules_of, log_dir, self.spill,
                          isolate=self.config.isolate, label=self.label)
        self.pairs = PairEvaluator(self.dev, self.config, setup["seed"], None, self.stopping)
        self._definitions: dict[str, Definition] = {}
        self._solutions: dict[str, Solution] = {}
        self._current: Optional[str] = None

    def hello(self) -> dict:
        """Calibrate and describe the device (in a worker that loads no solution code); the
        node is added to what every Trace records about it."""
        import ray
        import torch

        if self.dev.device != "cpu" and not torch.cuda.is_available():
            raise SetupError(f"the device worker on {socket.gethostname()} was given GPU {self.label} but torch "
                             f"{torch.__version__} sees no CUDA device there")
        # Ray gives an actor without CPUs of its own one thread; inputs and references are made on
        # the host, so each GPU's workers get their share of the node's cores (set before any
        # worker starts: they inherit it).
        node = next((n for n in ray.nodes() if n.get("NodeID") == self.node_id), {})
        threads = max(1, (os.cpu_count() or 1) // max(1, int(node.get("Resources", {}).get("GPU", 1))))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        self.dev.hello()
        self.dev.environment.hardware_info.update(node=socket.gethostname(), node_ip=ray.util.get_node_ip_address(),
                                                  ray_node_id=self.node_id)
        return {"node_id": self.node_id, "host": socket.gethostname(), "label": self.label,
                "environment": self.dev.environment.to_dict()}

    def run(self, task: dict, inputs) -> Iterator[tuple]:
        """Evaluate one workload's pairs (pairs.PairEvaluator.run_workload), yielding each
        result as it is made: ("trace", Trace dict) or ("skipped", Skipped fields)."""
        import ray

        name, ref = task["definition"]
        if name not in self._definitions:
            self._definitions[name] = Definition.from_dict(ray.get(ref))
        for solution, ref in task["solutions"]:
            if solution not in self._solutions:
                self._solutions[solution] = Solution.from_dict(ray.get(ref))
        if name != self._current:  # the last Definition's solution workers go
            self.dev.finish_definition()
            self._current = name
        self.pairs.inputs_source = inputs
        items = self.pairs.run_workload(self._definitions[name], Workload.from_dict(task["workload"]),
                                        [self._solutions[s] for s, _ in task["solutions"]], missing=task["missing"],
                                        earlier_baseline=tuple(task["earlier_baseline"]))
        for item in items:
            yield ("skipped", asdict(item)) if isinstance(item, Skipped) else ("trace", item.to_dict())

    def stop(self) -> None:
        """Stop between two solutions. (The driver ends a worker by killing it: its supervisors
        then kill every solution process and remove the spill folder.)"""
        self.stopping.set()
