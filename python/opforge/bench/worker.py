"""The worker process: the only place solution code is imported and run.

Started by the runner as ``python -m opforge.bench.worker FD DEVICE [SPILL_DIR]`` with
one end of a socket pair on FD and its stdout/stderr going to a log file, under a supervisor
(supervisor.py) that kills whatever it leaves behind. It answers one request at a time (dicts,
see ``Worker.handle``; the format is _wire's, which carries only plain data and tensors);
requests carry inputs, never reference outputs, and replies carry what each call did
(``CallRecord``) for the runner to judge. A segfault or an illegal memory access kills only this
process: the runner sees the socket close, reads the log and starts another.

The runner gives every solution a worker of its own, so what a solution does to this process
(patching torch, the timer, this module) reaches no other solution's results. Its own timing
is checked against the runner's clock (runner.py); the handlers and timer are also bound here
before any solution code is imported, so replacing ``time_cuda`` or a handler on this module
or class later changes nothing.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Optional

import torch

from . import _wire
from .evaluator import run_call
from .timing import calibrate_copy, time_cpu, time_cuda


def environment(device: torch.device) -> dict:
    """What the Trace's Environment records about this device and its software."""
    import platform

    import opforge

    info = opforge.build_info()
    libs = {"torch": torch.__version__, "opforge": info["version"], "python": platform.python_version()}
    if info.get("commit"):
        libs["opforge_commit"] = info["commit"]
    for name in ("triton", "tvm_ffi"):
        try:
            libs[name] = __import__(name).__version__
        except Exception:
            pass
    hardware_info = {"device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hardware = props.name
        libs["cuda"] = str(torch.version.cuda)
        driver = _driver_version()
        if driver:
            libs["driver"] = driver
        hardware_info.update(sm_count=props.multi_processor_count, compute_capability=f"{props.major}.{props.minor}",
                             memory_gib=round(props.total_memory / 2**30, 1),
                             l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        hardware_info.update(_clocks(_physical_index(device.index or 0)))
    else:
        hardware = cpu_name()
        hardware_info["threads"] = torch.get_num_threads()
    return {"hardware": hardware, "libs": libs, "hardware_info": hardware_info}


def _driver_version() -> str:
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except Exception:
        return ""


def _physical_index(index: int) -> int:
    """nvidia-smi's index of the GPU torch calls cuda:``index`` (they differ under
    CUDA_VISIBLE_DEVICES, which a cluster sets for each of its GPU workers)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[index]) if index < len(visible) and visible[index].isdigit() else index


def _clocks(index: int) -> dict:
    """SM and memory clocks now and at most, from nvidia-smi when it is there."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return {}
    fields = ["clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "driver_version"]
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), f"--query-gpu={','.join(fields)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        values = [v.strip() for v in out.strip().split(",")]
        keys = ["sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "max_mem_clock_mhz", "driver"]
        return {k: (int(v) if v.isdigit() else v) for k, v in zip(keys, values) if v and "N/A" not in v}
    except Exception:
        return {}


def cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class Worker:
    def __init__(self, device: str):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.empty(1, device=self.device)  # the CUDA context, made before the runner needs it
        self.loaded_modules: set[str] = set()
        self.runnables = {}
        self.key, self.sets = None, []  # the loaded workload's input sets (CPU)
        # Bound now, before any solution code runs (see the module doc).
        self._timer = time_cuda if self.device.type == "cuda" else time_cpu
        self._handlers = {name[len("_op_"):]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}

    # --- requests ---------------------------------------------------------------------------

    def handle(self, request: dict) -> dict:
        op = request["op"]
        return self._handlers[op](**{k: v for k, v in request.items() if k != "op"})

    def _op_hello(self, calibrate: bool = False) -> dict:
        reply = {"environment": environment(self.device)}
        if calibrate:
            reply["calibration"] = calibrate_copy(self.device)
        return reply

    def _load_modules(self, modules: list[str]) -> None:
        from ..registry import load_solution_modules

        for module in modules:
            if module not in self.loaded_modules:
                load_solution_modules([module])
                self.loaded_modules.add(module)

    def _op_discover(self, modules: list[str]) -> dict:
        """The Solutions that the modules register (their code stays in this process). A module
        that fails to load is said in one line (the traceback goes to the log)."""
        from ..registry import BACKENDS

        try:
            self._load_modules(modules)
        except Exception as exc:
            traceback.print_exc()
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"}
        return {"solutions": [s.to_dict() for s in BACKENDS]}

    def _op_build(self, solution: dict, definition: dict, modules: list[str]) -> dict:
        """Build ``solution`` (after importing the modules that register it, if any)."""
        from ..registry import BACKENDS, BuildError, build
        from ..trace import Definition, Solution

        self._load_modules(modules)
        solution, definition = Solution.from_dict(solution), Definition.from_dict(definition)
        fn = None
        if solution.name in BACKENDS and BACKENDS.get(solution.name).content_hash() == solution.content_hash():
            fn = BACKENDS.function(solution.name)
        try:
            runnable = build(solution, definition, self.device, fn=fn)
        except BuildError as exc:
            return {"ok": False, "kind": exc.kind, "log": str(exc)}
        except Exception as exc:  # a builder or the solution's module failing in a way nobody named
            return {"ok": False, "kind": "COMPILE_ERROR",
                    "log": f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exc(limit=-4))}"}
        self.runnables[solution.name] = runnable
        return {"ok": True, "destination_passing": runnable.destination_passing_style}

    def _to_device(self, inputs: list) -> list:
        # Always a copy (also on the CPU): what one call does to its inputs must not reach the next.
        return [v.to(self.device, copy=True) if isinstance(v, torch.Tensor) else v for v in inputs]

    def _call_and_args(self, runnable, inputs: list):
        if runnable.destination_passing_style:
            return runnable.call_into, inputs + runnable.allocate_outputs(*inputs)
        return runnable, inputs

    def _op_load(self, key: str, input_sets: list) -> dict:
        """Keep a workload's input sets (on the CPU; device copies are made per call) for the
        checks and timings that follow."""
        self.key, self.sets = key, input_sets
        return {"ok": True}

    def _op_check(self, solution: str, input_sets: Optional[list] = None) -> dict:
        """Call the solution once on each input set (the loaded ones by default), each time on
        fresh device copies."""
        runnable = self.runnables[solution]
        records = []
        for cpu_inputs in (self.sets if input_sets is None else input_sets):
            inputs = self._to_device(cpu_inputs)
            call, args = self._call_and_args(runnable, inputs)
            record = run_call(call, runnable.definition, inputs, outputs=args[len(inputs):] or None)
            records.append(record.to_wire())
            if record.error is not None:
                return {"records": records, "healthy": self._healthy()}
        return {"records": records, "healthy": True}

    def _op_time(self, solution: str, settings: dict) -> dict:
        runnable = self.runnables[solution]
        arg_sets = []
        for cpu_inputs in self.sets:
            call, args = self._call_and_args(runnable, self._to_device(cpu_inputs))
            arg_sets.append(args)
        keys = ("warmup", "iterations", "max_time_s", "flush_l2", "cuda_graph", "host_timing")
        try:
            timing = self._timer(call, arg_sets, **{k: settings[k] for k in keys})
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exc(limit=-4))}",
                    "healthy": self._healthy()}
        return {"timing": timing, "healthy": True}

    def _healthy(self) -> bool:
        """False when the CUDA context is gone (an illegal access): the runner restarts us."""
        if self.device.type != "cuda":
            return True
        try:
            torch.cuda.synchronize()
            return float(torch.ones(1, device=self.device).sum().item()) == 1.0
        except Exception:
            return False


def serve(conn: Connection, worker: Worker, spill=None) -> None:
    while True:
        try:
            request = _wire.loads(conn.recv_bytes(), spill)
        except EOFError:
            return
        if request.get("op") == "exit":
            return
        try:
            reply = worker.handle(request)
        except Exception as exc:  # a request the worker itself could not serve
            reply = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-6)}", "healthy": False}
        try:
            message = _wire.dumps(reply, spill)
        except TypeError as exc:  # what the solution returned cannot be sent: its failure, said plainly
            message = _wire.dumps({"error": f"the result cannot be sent to the runner: {exc}", "healthy": False})
        conn.send_bytes(message)
        sys.stdout.flush()
        sys.stderr.flush()
        if reply.get("healthy") is False:
            return


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fd, device = int(argv[0]), argv[1]
    spill = argv[2] if len(argv) > 2 and argv[2] else None
    faulthandler.enable(all_threads=True)  # a segfault leaves its Python stack in the log
    conn = Connection(fd)
    with torch.no_grad():
        worker = Worker(device)
        conn.send_bytes(_wire.dumps({"ready": True}))  # no solution code has run yet
        serve(conn, worker, spill)
    return 0


_served = False


def _end_here() -> None:
    """An exit handler registered before any solution code runs: once the worker has served
    as asked, the process ends here, after the exit handlers registered since (the solutions')
    and with its output flushed, without the interpreter's teardown of every object torch's
    import made and of torch's libraries (a fifth of a second of CPU per worker, while the
    runner waits for its end; more in a forked worker, where each object freed copies its page).
    Whatever the worker started is its supervisor's to kill."""
    if _served:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)


if __name__ == "__main__":
    atexit.register(_end_here)
    main()
    _served = True
    sys.exit(0)
