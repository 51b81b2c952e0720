"""A model loop under tracing, for the tests that stop it with a signal (test_process.py).

    python traced_loop.py DATASET SEED HANDLER

Calls fused_add_rmsnorm in place on fresh random rows, forever, every call kept with all its
tensors (keep_all, dump_all); hidden_states[0, 0] of call i is i, so the parent can tell which
calls reached the disk, and it regenerates every input from SEED to compare. The writer is slowed
down so that a backlog is waiting when the signal comes. Prints "ready" after READY calls.
HANDLER "mine" installs a SIGTERM handler first (it prints and exits with status 3), to check
that tracing chains to it.
"""

import faulthandler
import signal
import sys
import time

import torch

import opforge
from opforge.tracing import TracingConfig, enable_tracing
from opforge.tracing import dataset

READY = 150
H = 96
NAME = f"fused_add_rmsnorm_h{H}_f32"


def inputs(seed: int):
    """The loop's inputs, call after call (the parent draws the same ones)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(H, generator=gen)
    i = 0
    while True:
        x, r = torch.randn(2, H, generator=gen), torch.randn(2, H, generator=gen)
        x[0, 0] = i
        yield x, r, w
        i += 1


def main() -> None:
    folder, seed, handler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    faulthandler.dump_traceback_later(40, exit=True)  # a hang shows where, instead of timing out blind
    # Python's own SIGINT handling, as a program started from a terminal has it: a parent started
    # in the background without job control passes SIGINT on ignored, which the tracing (rightly)
    # keeps.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    save = dataset.DatasetFolder.save_blob

    def slow_save(self, *args):
        time.sleep(0.002)
        return save(self, *args)

    dataset.DatasetFolder.save_blob = slow_save
    if handler == "mine":
        def mine(signum, frame):
            print("my handler ran", flush=True)
            sys.exit(3)

        signal.signal(signal.SIGTERM, mine)
    enable_tracing(dataset_dir=folder, tracing_configs={NAME: TracingConfig("dump_all", "keep_all")},
                   max_pending_workloads=1 << 20, max_pending_bytes=1 << 30)
    for i, (x, r, w) in enumerate(inputs(seed)):
        opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
        if i == READY:
            print("ready", flush=True)
        if i >= READY:
            time.sleep(0.001)  # calls go on, but the backlog stays small enough to flush quickly


if __name__ == "__main__":
    main()
