"""Tracing across a whole process: switched on from the environment (opforge's and
FlashInfer-Bench's variable names), and stopped by SIGTERM, SIGINT or SIGKILL in the middle of a
run with a backlog of workloads still to write. Nothing accepted may be lost on a signal the
process can catch, and what a SIGKILL leaves on disk must load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from traced_loop import NAME, inputs  # noqa: E402
from tracing_helpers import clean_env, kinds, load, run_python, summary  # noqa: E402

LOOP = Path(__file__).resolve().parent / "traced_loop.py"

MODEL = """
import torch, opforge
gen = torch.Generator().manual_seed({seed})
w = torch.randn(96, generator=gen)
for rows in (3, 5, 3):
    opforge.rmsnorm(torch.randn(rows, 96, generator=gen), w)
opforge.silu_and_mul(torch.randn(4, 192, generator=gen))
print("done")
"""


@pytest.mark.parametrize("switch,folder_var", [
    ("OPFORGE_ENABLE_TRACING", "OPFORGE_DATASET_PATH"),
    ("FIB_ENABLE_TRACING", "FIB_DATASET_PATH"),
    ("FLASHINFER_BENCH_ENABLE_TRACING", "FLASHINFER_BENCH_DATASET_PATH"),
    ("OPFORGE_ENABLE_TRACING", None),  # the default folder, ./opforge-trace
])
def test_the_environment_traces_a_whole_script(tmp_path, switch, folder_var):
    env = {switch: "1"}
    if folder_var:
        env[folder_var] = str(tmp_path / "mine")
    done = run_python(MODEL.format(seed=os.getpid() % 1000), cwd=tmp_path, **env)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    root = tmp_path / ("mine" if folder_var else "opforge-trace")
    ts = load(root)
    # The default TracingConfig: one workload per shape, float tensors recorded as random.
    assert [t.workload.axes["batch_size"] for t in ts.get_workloads("rmsnorm_h96_f32")] == [3, 5]
    assert [kinds(t.workload) for t in ts.get_workloads("silu_and_mul_d96_f32")] == [{"input": "random"}]
    assert summary(done.stderr) == {
        "rmsnorm_h96_f32": {"calls": 3, "kept": 2, "dumped": 0, "dropped": 0},
        "silu_and_mul_d96_f32": {"calls": 1, "kept": 1, "dumped": 0, "dropped": 0}}


def test_a_bad_switch_value_leaves_tracing_off(tmp_path):
    done = run_python(MODEL.format(seed=1), cwd=tmp_path, OPFORGE_ENABLE_TRACING="maybe")
    assert done.returncode == 0 and "expected 1 or 0" in done.stderr
    assert not (tmp_path / "opforge-trace").exists()


def test_an_unwritable_folder_from_the_environment_warns_and_the_script_runs(tmp_path):
    (tmp_path / "a-file").write_text("")
    done = run_python(MODEL.format(seed=1), cwd=tmp_path, OPFORGE_ENABLE_TRACING="1",
                      OPFORGE_DATASET_PATH=str(tmp_path / "a-file" / "ds"))
    assert done.returncode == 0 and "done" in done.stdout
    assert "cannot write to the dataset folder" in done.stderr and "tracing is off" in done.stderr


def _start(tmp_path, handler="none") -> tuple[subprocess.Popen, int]:
    seed = int.from_bytes(os.urandom(2), "little")
    child = subprocess.Popen([sys.executable, str(LOOP), str(tmp_path / "ds"), str(seed), handler],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()
    return child, seed


def _check_prefix(root: Path, seed: int) -> int:
    """Every line on disk loads with its blob, holds the inputs of one call as they were before
    the in-place op, and the calls on disk are the first ones, none missing. Returns how many."""
    ts = load(root)
    saved = [t.workload for t in ts.get_workloads(NAME)]
    expected = inputs(seed)
    for i, workload in enumerate(saved):
        x, r, w = next(expected)
        got = ts.load_input_tensor(NAME, workload, "hidden_states")
        assert int(got[0, 0]) == i, f"line {i} holds call {int(got[0, 0])}"
        assert torch.equal(got, x) and torch.equal(ts.load_input_tensor(NAME, workload, "residual"), r)
        assert torch.equal(ts.load_input_tensor(NAME, workload, "weight"), w)
    return len(saved)


@pytest.mark.parametrize("signum,handler,status", [
    (signal.SIGTERM, "none", -signal.SIGTERM),  # the default action still ends the process
    (signal.SIGTERM, "mine", 3),  # the program's own handler still runs
    (signal.SIGINT, "none", -signal.SIGINT),  # KeyboardInterrupt, then Python's exit by SIGINT
])
def test_a_signal_mid_run_loses_nothing_accepted(tmp_path, signum, handler, status):
    child, seed = _start(tmp_path, handler)
    child.send_signal(signum)
    out, err = child.communicate(timeout=60)
    assert child.returncode == status, err
    if handler == "mine":
        assert "my handler ran" in out
    counts = summary(err)[NAME]
    assert counts["dropped"] == 0 and counts["kept"] == counts["dumped"]
    assert counts["calls"] - 1 <= counts["kept"] <= counts["calls"]  # at most the interrupted call is not kept
    assert _check_prefix(tmp_path / "ds", seed) == counts["kept"] > 150


def test_a_kill_leaves_what_is_on_disk_loadable(tmp_path):
    child, seed = _start(tmp_path)
    time.sleep(0.05)
    child.kill()
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    written = _check_prefix(tmp_path / "ds", seed)
    # What was still queued is lost with the process, but the folder takes more tracing.
    done = run_python(MODEL.format(seed=2), cwd=tmp_path, OPFORGE_ENABLE_TRACING="1",
                      OPFORGE_DATASET_PATH=str(tmp_path / "ds"))
    assert done.returncode == 0, done.stderr
    assert _check_prefix(tmp_path / "ds", seed) == written
    assert len(load(tmp_path / "ds").get_workloads("rmsnorm_h96_f32")) == 2
