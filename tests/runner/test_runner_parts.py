"""The runner's parts on their own: messages to workers, settings layers and config files, the
CPU timer and host loop (the benchmark scripts' timer too), and how a measurement becomes a
Performance (floor, suspect, speedups)."""

from __future__ import annotations

import math

import pytest
import torch

from opforge.bench import BenchmarkConfig, Settings, _wire
from opforge.bench.performance import performance
from opforge.bench.timing import host_loop_ms, time_cpu
from opforge.trace.templates import TEMPLATES

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32, torch.int64, torch.bool,
          torch.uint8]


def _random(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen).to(dtype)


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_cross_bit_for_bit(tmp_path, dtype, spill):
    gen = torch.Generator().manual_seed(len(str(dtype)))
    big = _random((700, 1031), dtype, gen)  # over the spill size for every dtype but the 1-byte ones
    small = _random((3, 5), dtype, gen)
    strided = big[::3, 1::2]  # a view: sent as its own contiguous values
    message = {"op": "check", "input_sets": [[big, small, strided, 1e-6, None]], "empty": big[:0]}
    data = _wire.dumps(message, tmp_path if spill else None)
    got = _wire.loads(data, tmp_path if spill else None)
    for sent, received in zip(message["input_sets"][0][:3], got["input_sets"][0][:3]):
        assert received.dtype == sent.dtype and received.shape == sent.shape
        assert torch.equal(received.view(torch.uint8) if dtype.itemsize == 1 else received, sent.contiguous()
                           .view(torch.uint8) if dtype.itemsize == 1 else sent)
    assert got["input_sets"][0][3:] == [1e-6, None] and got["empty"].shape == (0, 1031)
    big_bytes = big.numel() * big.element_size()
    spilled = spill and big_bytes >= _wire.SPILL_BYTES
    assert (len(data) < big_bytes // 2) == spilled  # a spilled tensor goes through a file, not the socket
    assert list(tmp_path.iterdir()) == []  # every file removed once mapped


def test_settings_layers_and_the_command_line():
    norm = TEMPLATES["rmsnorm"].definition(dtype="bfloat16", hidden_size=4096)
    other = TEMPLATES["scale"].definition(dtype="bfloat16", hidden_size=4096)
    config = BenchmarkConfig(defaults=Settings(iterations=50), op_types={"rmsnorm": {"iterations": 70, "warmup": 3}},
                             definition_settings={norm.name: {"iterations": 90}}, overrides={"warmup": 7})
    s = config.settings_for(norm)
    assert (s.iterations, s.warmup) == (90, 7)
    assert (config.settings_for(other).iterations, config.settings_for(other).warmup) == (50, 7)
    assert config.baseline_for(norm) == f"{norm.name}_builtin"
    assert BenchmarkConfig(baseline="mine").baseline_for(norm) == "mine"
    assert BenchmarkConfig(baseline=None).baseline_for(norm) is None


@pytest.mark.parametrize("layer, message", [
    ({"op_type": {"rmsnorm": {"iterations": 0}}}, "op_type.rmsnorm"),
    ({"definition": {"x": {"no_such_setting": 1}}}, "no_such_setting"),
    ({"definition": {"x": {"atol": 0.1}}}, "give both"),
    ({"defaults": {"input_sets": 2}}, "input_sets"),
    ({"overrides": {"timeout_s": -1}}, "overrides"),
    ({"unknown_key": 1}, "unknown_key"),
])
def test_bad_settings_are_refused_with_where(tmp_path, layer, message):
    import json

    path = tmp_path / "bench.json"
    path.write_text(json.dumps(layer))
    with pytest.raises(ValueError, match=message):
        BenchmarkConfig.load(path)


def test_config_files_in_toml_and_json(tmp_path):
    toml = tmp_path / "bench.toml"
    toml.write_text('seed = 5\nbaseline = "none_here"\n[defaults]\niterations = 20\n'
                    '[op_type.rmsnorm]\niterations = 30\n[definition.rmsnorm_h4096]\natol = 0.1\nrtol = 0.0\n')
    config = BenchmarkConfig.load(toml)
    norm = TEMPLATES["rmsnorm"].definition(dtype="bfloat16", hidden_size=4096)
    assert config.seed == 5 and config.settings_for(norm).iterations == 30
    assert config.settings_for(norm).tolerance == (0.1, 0.0)
    (tmp_path / "bad.toml").write_text("seed = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        BenchmarkConfig.load(tmp_path / "bad.toml")
    with pytest.raises(ValueError, match="cannot read"):
        BenchmarkConfig.load(tmp_path / "missing.toml")


def test_cpu_timer_counts_and_stops_on_budget():
    calls = []
    t = time_cpu(lambda x: calls.append(x), [[1], [2], [3]], warmup=2, iterations=40, max_time_s=10)
    assert t["iterations"] == 40 and len(calls) == 42 and calls[:5] == [1, 2, 1, 2, 3]
    assert t["min_ms"] <= t["p10_ms"] <= t["median_ms"] <= t["p90_ms"] <= t["max_ms"]
    import time

    slow = time_cpu(lambda: time.sleep(0.01), [[]], warmup=0, iterations=1000, max_time_s=0.15)
    assert 10 <= slow["iterations"] < 30 and slow["median_ms"] >= 10


def test_host_loop_times_back_to_back_calls_with_the_collector_paused():
    import gc
    import time

    seen = []

    def call(x):
        seen.append((x, gc.isenabled()))

    per_call = host_loop_ms(call, (7,), cuda=False, calls=50, repeats=3, warmup=4)
    assert len(seen) == 4 + 3 * 50 and {x for x, _ in seen} == {7}
    assert [on for _, on in seen[4:]] == [False] * 150  # paused in the timed loops only
    assert [on for _, on in seen[:4]] == [gc.isenabled()] * 4 and gc.isenabled()
    assert 0 < per_call < 1.0
    # Sized by time: a 1 ms call gets the 100-call minimum; the result is per call.
    slow = host_loop_ms(lambda: time.sleep(0.001), cuda=False, target_s=0.01, repeats=1, warmup=0)
    assert 1.0 <= slow < 5.0


def test_the_benchmark_scripts_time_with_the_runners_timer(monkeypatch):
    """bench/timing.py converts units and nothing else: its device time is time_cpu's median (on
    a CPU), its copy ceiling calibrate_copy's, its host loop host_loop_ms."""
    import importlib.util
    from pathlib import Path

    from opforge.bench import timing

    path = Path(__file__).resolve().parents[2] / "bench" / "timing.py"
    spec = importlib.util.spec_from_file_location("bench_timing", path)
    scripts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scripts)
    asked = []
    monkeypatch.setattr(timing, "time_cpu", lambda call, sets, **kw: asked.append(kw) or {"median_ms": 0.25})
    monkeypatch.setattr(timing, "calibrate_copy", lambda device: {"gbps": 12.5, "bytes": 1, "median_ms": 1.0})
    monkeypatch.setattr(timing, "host_loop_ms", lambda call, args, **kw: 0.004)
    assert scripts.device_time_us(lambda: None, [()], False, target_s=0.3) == 250.0
    assert asked == [{"warmup": 3, "iterations": 2000, "max_time_s": 0.3, "cuda_graph": False, "host_timing": False}]
    assert scripts.copy_bandwidth_gbps(False) == 12.5
    assert scripts.host_loop_us(lambda: None, (), False) == 4.0 == scripts.cpu_call_overhead_us(lambda: None)


def test_the_calibration_copies_what_the_environment_asks(monkeypatch):
    from opforge.bench import timing
    from opforge.bench.device import SetupError, resolve_devices

    monkeypatch.delenv(timing.CALIBRATION_BYTES_ENV, raising=False)
    default = timing.calibrate_copy(torch.device("cpu"))
    assert default["bytes"] == timing.CPU_CALIBRATION_BYTES == 256 << 20 and default["gbps"] > 0
    # Whole pages, rounded down; an explicit size still wins over the environment.
    monkeypatch.setenv(timing.CALIBRATION_BYTES_ENV, str(3 << 20 | 100))
    assert timing.calibrate_copy(torch.device("cpu"))["bytes"] == 3 << 20
    assert timing.calibrate_copy(torch.device("cpu"), 1 << 20)["bytes"] == 1 << 20
    for bad in ("lots", "1.5e6", "-4096", "0", "4095"):
        monkeypatch.setenv(timing.CALIBRATION_BYTES_ENV, bad)
        with pytest.raises(ValueError, match=f"OPFORGE_CALIBRATION_BYTES='{bad}': give a whole number of bytes, "
                                             "at least 4096"):
            timing.calibrate_copy(torch.device("cpu"))
        # A run says so before it starts a worker.
        with pytest.raises(SetupError, match="OPFORGE_CALIBRATION_BYTES"):
            resolve_devices(["cpu"])


def _performance(latency_ms, reference_ms=2.0, baseline_ms=None):
    norm = TEMPLATES["rmsnorm"].definition(dtype="bfloat16", hidden_size=4096)
    axes = {"batch_size": 256, "hidden_size": 4096}
    timing = {"median_ms": latency_ms, "p10_ms": latency_ms, "p90_ms": latency_ms, "max_ms": latency_ms,
              "iterations": 100, "method": "host_clock"}
    perf = performance(norm, axes, timing, {"gbps": 100.0}, Settings(), reference_ms=reference_ms, baseline="base",
                       baseline_ms=baseline_ms)
    return perf, norm.bytes_moved(axes)


def test_performance_numbers_and_the_physical_floor():
    p, nbytes = _performance(0.1, baseline_ms=0.2)
    assert math.isclose(p.achieved_gbps, nbytes / 0.1e6) and math.isclose(p.percent_of_peak, p.achieved_gbps)
    assert p.speedup_factor == 20.0 and p.baseline_speedup_factor == 2.0 and p.baseline_solution == "base"
    assert p.suspect is None and math.isclose(p.timing["floor_ms"], nbytes / 100e6)
    fast, _ = _performance(nbytes / 100e6 / 1.2)  # 120% of the copy bandwidth
    assert fast.suspect.startswith("faster than the physical floor") and "120%" in fast.suspect
    zero, _ = _performance(0.0)
    assert zero.suspect and zero.speedup_factor == 0.0 and zero.achieved_gbps is None
    unbased, _ = _performance(0.1)
    assert unbased.baseline_solution is None and unbased.baseline_speedup_factor is None
