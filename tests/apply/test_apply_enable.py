"""Enabling apply: datasets on disk, bad datasets, traces naming unknown solutions, the
environment switch, the configuration's checks, and ``opforge.apply`` as one name."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opforge
from apply_helpers import HW, builtin, dataset, isolated, measured, tagging, template_definition  # noqa: F401
from opforge import _hooks
from opforge.apply import ApplyConfig, ApplyWarning, enable_apply
from opforge.registry import CACHE_DIR_VAR
from opforge.trace._base import dumps

NORM = template_definition("rmsnorm", hidden_size=64)


def norm_traces():
    return dataset([NORM], [tagging("A", NORM, 1.0), builtin(NORM)],
                   [measured(NORM, "A", {"batch_size": 8}, 1.0), measured(NORM, builtin(NORM).name, {"batch_size": 8}, 2.0)])


def tag_of(rng, batch=8):
    y = opforge.rmsnorm(rng.randn(batch, 64), rng.randn(64), 1e-6)
    return float(y[0, 0]) if torch.all(y == y[0, 0]) else None


def test_a_dataset_folder_and_a_single_json_file_both_enable(tmp_path, rng):
    norm_traces().save_dataset(tmp_path / "ds")
    with enable_apply(tmp_path / "ds"):
        assert tag_of(rng) == 1.0
    norm_traces().save(tmp_path / "one.json")
    with enable_apply(str(tmp_path / "one.json")):
        assert tag_of(rng) == 1.0
    assert not _hooks.active


def test_bad_datasets_fail_at_enable_naming_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        enable_apply(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        enable_apply(broken)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds no Definition"):
        enable_apply(tmp_path / "empty")
    bad_definition = tmp_path / "bad" / "definitions" / "rmsnorm"
    bad_definition.mkdir(parents=True)
    (bad_definition / "x.json").write_text('{"name": "x"}')
    with pytest.raises(ValueError, match=r"holds no Definition.*x\.json"):
        enable_apply(tmp_path / "bad")
    with pytest.raises(TypeError, match="dataset path or a TraceSet"):
        enable_apply(42)
    with pytest.raises(TypeError, match="ApplyConfig"):
        enable_apply(norm_traces(), {"hardware_fallback": True})
    assert not _hooks.active


def test_config_is_checked():
    with pytest.raises(TypeError, match="hardware_fallback"):
        ApplyConfig(hardware_fallback="yes")
    with pytest.raises(TypeError, match=r"buckets\['rmsnorm_h64_f32'\]"):
        ApplyConfig(buckets={"rmsnorm_h64_f32": 8})
    with pytest.raises(ValueError, match="hardware"):
        ApplyConfig(hardware="")
    with pytest.raises(ValueError, match="bucket function of rmsnorm_h64_f32 fails"):
        enable_apply(norm_traces(), ApplyConfig(buckets={NORM.name: lambda axes: axes["no such axis"]}))


def test_traces_naming_unknown_solutions_are_skipped_counted_and_said_once(tmp_path, rng):
    root = tmp_path / "ds"
    norm_traces().save_dataset(root)
    traces_file = sorted((root / "traces").rglob("*.jsonl"))[0]
    ghosts = [measured(NORM, "GHOST", {"batch_size": 8}, 0.1, uid=f"g{i}") for i in range(2)]
    with traces_file.open("a") as f:
        for ghost in ghosts:
            f.write(dumps(ghost.to_dict(), indent=None) + "\n")
    with pytest.warns(ApplyWarning, match=r"2 trace\(s\) in .*ds name solutions the dataset does not hold"):
        handle = enable_apply(root)
    assert handle.counts.unknown_solution == 2 and handle.counts.used == 2
    assert tag_of(rng) == 1.0


def test_opforge_apply_is_one_name_for_the_function_and_the_package(rng):
    import opforge.apply as package
    from opforge import apply as imported

    for form in (opforge.apply, package, imported):
        x = rng.randn(4, 64)
        assert form("rmsnorm_h64_f32", args=(x, rng.randn(64), 1e-6), fallback=lambda h, w, e: h) is x

        @form("rmsnorm_h64_f32")
        def norm(hidden_states, weight, eps):
            return hidden_states

        assert norm(x, None, 1e-6) is x
    assert package.enable_apply is opforge.enable_apply and opforge.ApplyConfig is package.ApplyConfig


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    for name in ("OPFORGE_ENABLE_TRACING", "FIB_ENABLE_TRACING", "FLASHINFER_BENCH_ENABLE_TRACING"):
        full.pop(name, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                          timeout=120)


def test_the_environment_switch_enables_apply_at_import(tmp_path):
    norm_traces().save_dataset(tmp_path / "ds")
    # The subprocess routes on its default device: traces from this CPU name the CPU, so GPUs
    # are hidden from it.
    code = """
        import torch, opforge
        from opforge import _hooks
        y = opforge.rmsnorm(torch.randn(8, 64), torch.randn(64), 1e-6)
        print(_hooks.active, sorted(set(y.flatten().tolist()))[:2])
    """
    env = {"OPFORGE_ENABLE_APPLY": "1", "OPFORGE_DATASET_PATH": str(tmp_path / "ds"),
           CACHE_DIR_VAR: str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    done = _run(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "[1.0]"]
    done = _run(code, {**env, "OPFORGE_DATASET_PATH": str(tmp_path / "nowhere")})
    assert done.returncode == 0, done.stderr
    assert "OPFORGE_ENABLE_APPLY is set but apply stays off" in done.stderr and str(tmp_path / "nowhere") in done.stderr
    assert done.stdout.split()[0] == "False"


def test_counts_report_what_the_traces_gave(tmp_path):
    handle = enable_apply(norm_traces())
    assert handle.hardware == HW
    assert handle.counts.used == 2 and handle.counts.unknown_solution == 0
    assert "1 Definition(s) routed" in repr(handle)
    assert json.dumps(handle.choices(NORM.name, batch_size=8)) == json.dumps(["A", f"{NORM.name}_builtin"])
