"""TracingConfig's policies on real op calls: what each dump policy saves (read back equal to the
inputs as they were before an in-place op ran), what each dedup policy keeps, and the refusal of
bad arguments."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracing_helpers import GATHER, GatherCall, blob, kinds, load, workloads  # noqa: E402

import opforge  # noqa: E402
from opforge import _hooks, intercept  # noqa: E402
from opforge.trace import Workload  # noqa: E402
from opforge.tracing import TracingConfig, enable_tracing, record  # noqa: E402

H = 96  # no public Definition: eps is an input, fused_add declares residual_out
NORM, ADD_NORM, SILU = f"rmsnorm_h{H}_f32", f"fused_add_rmsnorm_h{H}_f32", f"silu_and_mul_d{H}_f32"


def trace(tmp_path, configs, **kw):
    return enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=configs, **kw)


# --- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,error,match", [
    ({"tensor_dump_policy": "dump_some"}, ValueError, "'dump_some' is not one of dump_all, dump_none, dump_non_float"),
    ({"tensor_dump_policy": 5}, TypeError, "not int"),
    ({"tensor_dump_policy": ["weight", "weight"]}, ValueError, "names an input twice"),
    ({"tensor_dump_policy": ["weight", 3]}, TypeError, "lists 3"),
    ({"dedup_policy": "keep_some"}, ValueError, "'keep_some' is not one of keep_all, shape_only, keep_first_k"),
    ({"dedup_policy": 1.5}, TypeError, "not float"),
    ({"dedup_policy": "keep_first_k", "k": 0}, ValueError, "k=0"),
    ({"dedup_policy": "keep_first_k", "k": -2}, ValueError, "k >= 1"),
    ({"dedup_policy": "keep_first_k", "k": 2.0}, TypeError, "k must be an integer"),
    ({"dedup_policy": "keep_first_k", "k": True}, TypeError, "k must be an integer"),
    ({"dedup_policy": "shape_only", "k": 3}, ValueError, "only with dedup_policy='keep_first_k'"),
])
def test_bad_configs_are_refused_with_what_was_given(kwargs, error, match):
    with pytest.raises(error, match=match):
        TracingConfig(**kwargs)


def test_good_configs_are_normalized():
    assert TracingConfig().tensor_dump_policy == "dump_non_float" and TracingConfig().dedup_policy == "shape_only"
    assert TracingConfig(dedup_policy="keep_first_k").k == 1
    assert TracingConfig(tensor_dump_policy=["weight"]).tensor_dump_policy == ("weight",)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"tracing_configs": {NORM: TracingConfig(tensor_dump_policy=["weight", "bias"])}}, ValueError,
     r"rmsnorm_h96_f32: tensor_dump_policy names 'bias', which is not an input \(inputs: hidden_states, weight, eps\)"),
    ({"tracing_configs": {NORM: "dump_all"}}, TypeError, "must be a TracingConfig, not str"),
    ({"tracing_configs": [NORM]}, TypeError, "must be a dict"),
    ({"max_pending_bytes": 0}, ValueError, "max_pending_bytes=0"),
    ({"max_pending_workloads": 2.5}, TypeError, "max_pending_workloads must be an integer"),
    ({"dataset_path": "elsewhere"}, TypeError, "not both"),
])
def test_bad_enable_arguments_are_refused_before_anything_is_installed(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        trace(tmp_path, kwargs.pop("tracing_configs", None), **kwargs)
    assert intercept.tracer() is None and not _hooks.active


def test_a_list_naming_missing_inputs_of_an_unknown_definition_is_refused_at_its_first_call(tmp_path, rng):
    bad = TracingConfig(tensor_dump_policy=["table", "indices"])
    with trace(tmp_path, {GATHER.name: bad}) as tracer:
        with pytest.warns(RuntimeWarning, match="names 'indices', which is not an input.*gather_rows_h8 is not traced"):
            record(GatherCall(rng.randn(5, 8), torch.tensor([1, 4], dtype=torch.int32), 0.5))
        record(GatherCall(rng.randn(5, 8), torch.tensor([0], dtype=torch.int32), 0.5))  # said once
    assert tracer.stats()[GATHER.name]["kept"] == 0
    assert not (tmp_path / "ds" / "workloads").exists()


# --- dump policies -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy,saved", [
    ("dump_all", {"hidden_states", "weight"}),
    ("dump_none", set()),
    ("dump_non_float", set()),
    (["weight"], {"weight"}),
])
def test_dump_policies_on_rmsnorm(tmp_path, rng, policy, saved):
    x, w = rng.randn(2, 3, H), rng.randn(H)
    with trace(tmp_path, {NORM: TracingConfig(tensor_dump_policy=policy)}):
        opforge.rmsnorm(x, w, eps=1e-5)
    (workload,) = workloads(tmp_path / "ds", NORM)
    assert workload.axes == {"batch_size": 6}
    expected = {"hidden_states": "random", "weight": "random", "eps": "scalar"}
    expected.update({name: "safetensors" for name in saved})
    assert kinds(workload) == expected and workload.inputs["eps"].value == 1e-5
    ts = load(tmp_path / "ds")
    if "hidden_states" in saved:
        assert torch.equal(blob(ts, NORM, workload, "hidden_states"), x.reshape(6, H))
    if "weight" in saved:
        assert torch.equal(blob(ts, NORM, workload, "weight"), w)
    blobs = list((tmp_path / "ds" / "blob").rglob("*.safetensors"))
    assert len(blobs) == (1 if saved else 0)


def test_dump_non_float_saves_integer_tensors_only(tmp_path, rng):
    table = rng.randn(7, 8)
    index = torch.randint(0, 7, (4,), dtype=torch.int32, generator=rng.generator("cpu"))
    with trace(tmp_path, {GATHER.name: TracingConfig()}):
        record(GatherCall(table, index, 0.25))
    ts = load(tmp_path / "ds")
    (trace_,) = ts.get_workloads(GATHER.name)
    assert kinds(trace_.workload) == {"table": "random", "index": "safetensors", "scale": "scalar"}
    assert torch.equal(blob(ts, GATHER.name, trace_.workload, "index"), index)
    assert ts.definitions[GATHER.name] == GATHER  # a Definition from outside the templates, written as given
    assert not ts.get_solutions(GATHER.name)  # no built-in op computes it


def test_in_place_fused_add_rmsnorm_saves_the_inputs_before_the_op(tmp_path, rng):
    x, r, w = rng.randn(4, H), rng.randn(4, H), rng.randn(H)
    before = []
    with trace(tmp_path, {ADD_NORM: TracingConfig("dump_all", "keep_all")}):
        for _ in range(5):  # each call overwrites x and r, which the next call reads
            before.append((x.clone(), r.clone()))
            opforge.fused_add_rmsnorm(x, r, w, out=x, residual_out=r)
    ts = load(tmp_path / "ds")
    saved = [t.workload for t in ts.get_workloads(ADD_NORM)]
    assert len(saved) == 5
    for (x0, r0), workload in zip(before, saved):
        assert torch.equal(blob(ts, ADD_NORM, workload, "hidden_states"), x0)
        assert torch.equal(blob(ts, ADD_NORM, workload, "residual"), r0)
        assert torch.equal(blob(ts, ADD_NORM, workload, "weight"), w)
    assert not torch.equal(x, before[-1][0])  # the op did run in place


def test_in_place_rmsnorm_and_strided_silu_inputs(tmp_path, rng):
    x, w = rng.randn(3, H), rng.randn(H)
    wide = rng.randn(2, 3, 2 * H + 5)
    gate = wide[..., : 2 * H]  # rows of a wider tensor: the blob holds exactly the view's values
    x0 = x.clone()
    with trace(tmp_path, {NORM: TracingConfig("dump_all"), SILU: TracingConfig("dump_all")}):
        opforge.rmsnorm(x, w, out=x)
        opforge.silu_and_mul(gate)
    ts = load(tmp_path / "ds")
    (norm,), (silu,) = ts.get_workloads(NORM), ts.get_workloads(SILU)
    assert torch.equal(blob(ts, NORM, norm.workload, "hidden_states"), x0)
    assert silu.workload.axes == {"batch_size": 6}
    assert torch.equal(blob(ts, SILU, silu.workload, "input"), gate.reshape(6, 2 * H))


# --- dedup policies ----------------------------------------------------------------------------


def _norm_calls(rng, rows):
    w = rng.randn(H)
    calls = [(rng.randn(n, H), w) for n in rows]
    for x, weight in calls:
        opforge.rmsnorm(x, weight)
    return calls


def _kept(tmp_path, name=NORM):
    ts = load(tmp_path / "ds")
    return ts, [t.workload for t in ts.get_workloads(name)]


def test_keep_all_keeps_every_call(tmp_path, rng):
    with trace(tmp_path, {NORM: TracingConfig("dump_all", "keep_all")}) as tracer:
        calls = _norm_calls(rng, [3, 3, 5, 3])
    ts, kept = _kept(tmp_path)
    assert [w.axes["batch_size"] for w in kept] == [3, 3, 5, 3]
    assert all(torch.equal(blob(ts, NORM, w, "hidden_states"), x) for w, (x, _) in zip(kept, calls))
    assert len({w.uuid for w in kept}) == 4
    assert tracer.stats()[NORM] == {"calls": 4, "kept": 4, "dumped": 4, "dropped": 0, "written": 4, "unfit": 0,
                                    "write_errors": 0}


def test_shape_only_keeps_the_first_call_of_each_shape(tmp_path, rng):
    with trace(tmp_path, {NORM: TracingConfig("dump_all", "shape_only")}) as tracer:
        calls = _norm_calls(rng, [3, 5, 3, 3, 7, 5])
    ts, kept = _kept(tmp_path)
    assert [w.axes["batch_size"] for w in kept] == [3, 5, 7]
    for w, index in zip(kept, (0, 1, 4)):  # the first call of each shape, not a later one
        assert torch.equal(blob(ts, NORM, w, "hidden_states"), calls[index][0])
    assert len(list((tmp_path / "ds" / "blob").rglob("*.safetensors"))) == 3  # nothing copied for the rest
    assert tracer.stats()[NORM]["calls"] == 6 and tracer.stats()[NORM]["kept"] == 3


def test_keep_first_k_keeps_the_first_three_calls(tmp_path, rng):
    with trace(tmp_path, {NORM: TracingConfig("dump_all", "keep_first_k", k=3)}) as tracer:
        calls = _norm_calls(rng, [2, 4, 2, 6, 2, 8])
    ts, kept = _kept(tmp_path)
    assert [w.axes["batch_size"] for w in kept] == [2, 4, 2]
    assert all(torch.equal(blob(ts, NORM, w, "hidden_states"), x) for w, (x, _) in zip(kept, calls))
    assert tracer.stats()[NORM]["calls"] == 6 and tracer.stats()[NORM]["kept"] == 3


def test_a_callable_dedup_policy_sees_a_workload_without_copies_and_keys_it(tmp_path, rng):
    seen = []

    def parity(workload):
        seen.append(workload)
        return workload.axes["batch_size"] % 2

    with trace(tmp_path, {NORM: TracingConfig("dump_all", parity)}) as tracer:
        calls = _norm_calls(rng, [1, 2, 3, 4, 5])
    ts, kept = _kept(tmp_path)
    assert [w.axes["batch_size"] for w in kept] == [1, 2]
    assert torch.equal(blob(ts, NORM, kept[1], "hidden_states"), calls[1][0])
    assert len(seen) == 5 and all(isinstance(w, Workload) for w in seen)
    assert all(kinds(w) == {"hidden_states": "random", "weight": "random", "eps": "scalar"} for w in seen)
    assert tracer.stats()[NORM]["kept"] == 2


def test_a_failing_dedup_callable_is_said_once_and_the_model_runs(tmp_path, rng):
    def broken(workload):
        raise KeyError("no such axis")

    x, w = rng.randn(2, H), rng.randn(H)
    with trace(tmp_path, {NORM: TracingConfig(dedup_policy=broken)}) as tracer:
        with pytest.warns(RuntimeWarning, match="recording a call of rmsnorm_h96_f32: KeyError"):
            y = opforge.rmsnorm(x, w)
        opforge.rmsnorm(x, w)
    assert torch.equal(y, opforge.rmsnorm(x, w))
    assert tracer.stats()[NORM]["kept"] == 0


def test_default_config_traces_every_definition_one_workload_per_shape(tmp_path, rng, capsys):
    with trace(tmp_path, None) as tracer:
        _norm_calls(rng, [2, 2, 3])
        opforge.silu_and_mul(rng.randn(4, 2 * H))
        opforge.scale(rng.randn(4, H), 0.5)
    stats = tracer.stats()
    assert {n: (s["calls"], s["kept"], s["dumped"]) for n, s in stats.items()} == {
        NORM: (3, 2, 0), SILU: (1, 1, 0), f"scale_h{H}_f32": (1, 1, 0)}
    ts = load(tmp_path / "ds")
    assert sorted(ts.definitions) == sorted(stats)
    assert all(len(ts.get_solutions(name)) == 1 for name in stats)  # opforge's builtin solution beside each
    err = capsys.readouterr().err
    assert f"opforge tracing:   {NORM}: 3 calls, 2 workloads kept, 0 payloads dumped, 0 dropped" in err
