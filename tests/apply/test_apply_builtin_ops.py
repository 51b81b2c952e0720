"""opforge's own ops consult apply: per-workload routing, buckets, the Definition's best, which
traces count, failing solutions, the ops' out= / in-place contracts, and what must not route."""

import pytest
import torch

import opforge
from apply_helpers import (OTHER_HW, builtin, calls_of, counting_reference, dataset, isolated,  # noqa: F401
                           measured, python_solution, tagging, template_definition)
from conftest import assert_close, ref_residual, ref_rmsnorm
from opforge import _hooks, intercept
from opforge.apply import ApplyConfig, ApplyWarning, disable_apply, enable_apply

NORM = template_definition("rmsnorm", hidden_size=64)  # rmsnorm_h64_f32: eps is an input
OWN = builtin(NORM).name


def norm_dataset(latencies: dict, extra_solutions=(), **trace_options):
    """rmsnorm_h64_f32 with tagging solutions A (1.0), B (2.0), C (3.0) and opforge's own;
    ``latencies``: batch -> {solution: ms}."""
    solutions = [tagging("A", NORM, 1.0), tagging("B", NORM, 2.0), tagging("C", NORM, 3.0), builtin(NORM),
                 *extra_solutions]
    traces = [measured(NORM, s, {"batch_size": b}, ms, **trace_options)
              for b, by_solution in latencies.items() for s, ms in by_solution.items()]
    return dataset([NORM], solutions, traces)


def served_by(rng, batch, shape=None) -> float | None:
    """The tag of the solution that served an rmsnorm call (None: the real op served)."""
    x, w = rng.randn(*(shape or (batch, 64))), rng.randn(64)
    y = opforge.rmsnorm(x, w, 1e-6)
    assert y.shape == x.shape
    tags = torch.unique(y)
    if len(tags) == 1 and float(tags[0]) in (1.0, 2.0, 3.0):
        return float(tags[0])
    assert_close(y, ref_rmsnorm(x, w, 1e-6), what="rmsnorm by opforge's own op")
    return None


def test_each_workload_goes_to_its_fastest_solution(rng):
    enable_apply(norm_dataset({4: {"A": 1.0, "B": 2.0, OWN: 3.0},
                               16: {"A": 2.0, "B": 1.0, OWN: 3.0},
                               64: {"A": 2.0, "B": 3.0, OWN: 1.0}}))
    assert _hooks.active
    assert served_by(rng, 4) == 1.0
    assert served_by(rng, 4, shape=(2, 2, 64)) == 1.0  # leading dimensions fold into the batch
    assert served_by(rng, 16) == 2.0
    assert served_by(rng, 64) is None  # opforge's own kernel measured fastest there


def test_unseen_sizes_use_their_power_of_two_bucket_or_the_nearest_measured_one(rng):
    handle = enable_apply(norm_dataset({8: {"A": 1.0, "B": 2.0, OWN: 3.0}, 64: {"A": 2.0, "B": 1.0, OWN: 3.0}}))
    assert served_by(rng, 5) == 1.0  # bucket 8
    assert served_by(rng, 40) == 2.0  # bucket 64
    assert served_by(rng, 100) == 2.0  # bucket 128 never measured: 64 is nearest
    assert served_by(rng, 2) == 1.0  # bucket 2: 8 is nearer than 64
    assert handle.choices(NORM.name, batch_size=100) == ["B", "A", f"{NORM.name}_builtin"]  # bucket 64 order


def test_the_definitions_best_serves_sizes_without_a_bucket(rng):
    latencies = {8: {"A": 1.0, "B": 2.0, OWN: 3.0}, 16: {"A": 1.0, "B": 2.0, OWN: 3.0}, 64: {"C": 0.5, "A": 2.0}}
    enable_apply(norm_dataset(latencies), ApplyConfig(nearest_bucket=False))
    # Bucket 1024 was never measured; A passed on the most workloads, so it is the overall best.
    assert served_by(rng, 1000) == 1.0
    assert served_by(rng, 64) == 3.0
    disable_apply()
    no_buckets = {NORM.name: lambda axes: None}
    enable_apply(norm_dataset(latencies), ApplyConfig(buckets=no_buckets))
    assert served_by(rng, 9) == 1.0
    disable_apply()
    enable_apply(norm_dataset(latencies), ApplyConfig(buckets=no_buckets, use_definition_best=False))
    assert served_by(rng, 9) is None  # nothing chosen: the op itself
    assert served_by(rng, 8) == 1.0


def test_traces_from_other_hardware_count_only_when_allowed_and_never_over_this_ones(rng):
    other = norm_dataset({8: {"A": 1.0, OWN: 2.0}}, hardware=OTHER_HW)
    handle = enable_apply(other)
    assert served_by(rng, 8) is None
    assert handle.counts.other_hardware == 2 and handle.counts.used == 0
    disable_apply()
    handle = enable_apply(other, ApplyConfig(hardware_fallback=True))
    assert served_by(rng, 8) == 1.0 and handle.counts.used == 2
    disable_apply()
    both = norm_dataset({8: {"A": 1.0, "B": 2.0, OWN: 3.0}}, hardware=OTHER_HW)
    for trace in norm_dataset({8: {"A": 3.0, "B": 1.0, OWN: 2.0}}).traces[NORM.name]:
        both.add_trace(trace.model_copy(update={"workload": trace.workload.model_copy(update={"uuid": "here"})}))
    enable_apply(both, ApplyConfig(hardware_fallback=True))
    assert served_by(rng, 8) == 2.0
    disable_apply()
    enable_apply(other, ApplyConfig(hardware=OTHER_HW))  # naming the hardware outright
    assert served_by(rng, 8) == 1.0


def test_suspect_failed_and_superseded_traces_are_not_used(rng):
    traces = [measured(NORM, "A", {"batch_size": 8}, 0.1, suspect="faster than the copy floor"),
              measured(NORM, "C", {"batch_size": 8}, 0.2, status="INCORRECT_NUMERICAL"),
              measured(NORM, "B", {"batch_size": 8}, 1.0),
              measured(NORM, OWN, {"batch_size": 8}, 2.0),
              measured(NORM, "C", {"batch_size": 16}, 0.2),
              measured(NORM, OWN, {"batch_size": 16}, 2.0),
              measured(NORM, "C", {"batch_size": 16}, 0.2, status="RUNTIME_ERROR")]  # a later run failed
    ts = dataset([NORM], [tagging("A", NORM, 1.0), tagging("B", NORM, 2.0), tagging("C", NORM, 3.0),
                          builtin(NORM)], traces)
    handle = enable_apply(ts)
    assert served_by(rng, 8) == 2.0
    assert served_by(rng, 16) is None
    # 1000: bucket 16 is the nearest measured; C failed there, so opforge's own op serves. C
    # failed somewhere, so it is not among the overall best either.
    assert served_by(rng, 1000) is None
    assert handle.choices(NORM.name, batch_size=1000) == [f"{NORM.name}_builtin"]
    assert handle.router.rankings[NORM.name].best == (OWN, "B")
    counts = handle.counts
    assert (counts.suspect, counts.failed, counts.superseded, counts.used) == (1, 2, 1, 3)


def test_a_winner_that_raises_is_reported_once_and_the_next_choice_serves(rng):
    raising = python_solution("R", NORM, """
        def run(hidden_states, weight, eps):
            raise RuntimeError("this kernel is broken")
    """)
    handle = enable_apply(norm_dataset({8: {"R": 0.5, "A": 1.0, OWN: 2.0}}, extra_solutions=[raising]))
    with pytest.warns(ApplyWarning, match=r"'R' of rmsnorm_h64_f32 raised RuntimeError: this kernel is broken"):
        assert served_by(rng, 8) == 1.0
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert served_by(rng, 8) == 1.0
    assert handle.choices(NORM.name, batch_size=8) == ["A", f"{NORM.name}_builtin"]


def test_a_winner_that_fails_to_build_is_reported_once_and_the_next_choice_serves(rng):
    unbuildable = python_solution("U", NORM, """
        import a_module_that_does_not_exist
        def run(hidden_states, weight, eps):
            return hidden_states
    """)
    enable_apply(norm_dataset({8: {"U": 0.5, OWN: 2.0, "A": 3.0}}, extra_solutions=[unbuildable]))
    with pytest.warns(ApplyWarning, match="'U' of rmsnorm_h64_f32 failed to build"):
        assert served_by(rng, 8) is None
    assert served_by(rng, 8) is None


def test_ahead_of_time_builds_report_at_enable():
    unbuildable = python_solution("U", NORM, "import a_module_that_does_not_exist\ndef run(hidden_states, weight, eps):\n"
                                             "    return hidden_states\n")
    with pytest.warns(ApplyWarning, match="'U' of rmsnorm_h64_f32 failed to build"):
        handle = enable_apply(norm_dataset({8: {"U": 0.5, "A": 1.0, OWN: 2.0}}, extra_solutions=[unbuildable]),
                              ApplyConfig(ahead_of_time=True))
    assert handle.runnable(NORM.name, "A") is not None


def test_a_bad_call_raises_the_ops_own_error_and_blames_no_solution(rng):
    enable_apply(norm_dataset({8: {"A": 1.0, OWN: 2.0}}))
    with pytest.raises((ValueError, TypeError)):
        opforge.rmsnorm(rng.randn(8, 64), rng.randn(64).to(torch.float64), 1e-6)  # weight dtype refused
    assert served_by(rng, 8) == 1.0


def test_capture_builds_nothing_and_ahead_of_time_makes_the_solution_ready(rng, monkeypatch):
    from opforge.apply.router import Router

    monkeypatch.setattr(Router, "_capturing", lambda self: True)
    enable_apply(norm_dataset({8: {"A": 1.0, OWN: 2.0}}))
    assert served_by(rng, 8) is None  # A not built yet: passed over, the op serves
    disable_apply()
    enable_apply(norm_dataset({8: {"A": 1.0, OWN: 2.0}}), ApplyConfig(ahead_of_time=True))
    assert served_by(rng, 8) == 1.0


@pytest.mark.parametrize("hidden,dtype", [(64, "float32"), (2048, "bfloat16")])
def test_out_and_in_place_contracts_of_fused_add_hold_when_a_solution_serves(rng, hidden, dtype):
    """fused_add_rmsnorm_h64_f32 has eps and residual_out; the public fused_add_rmsnorm_h2048
    has neither (eps 1e-6 baked in, the residual made by the op's contract)."""
    definition = template_definition("fused_add_rmsnorm", dtype=dtype, hidden_size=hidden)
    handle = enable_apply(dataset([definition], [counting_reference("S", definition), builtin(definition)],
                                  [measured(definition, "S", {"batch_size": 4}, 1.0),
                                   measured(definition, builtin(definition).name, {"batch_size": 4}, 2.0)]))
    torch_dtype = getattr(torch, dtype)
    x, r, w = (rng.randn(4, hidden, dtype=torch_dtype), rng.randn(4, hidden, dtype=torch_dtype),
               rng.randn(hidden, dtype=torch_dtype))
    expect_out, expect_res = ref_rmsnorm(x, w, 1e-6, residual=r), ref_residual(x, r)

    out, res = opforge.fused_add_rmsnorm(x, r, w, 1e-6)  # new tensors
    assert calls_of(handle, definition.name, "S") == 1
    assert_close(out, expect_out, what="out")
    assert torch.equal(res, expect_res)

    dest_out, dest_res = torch.empty_like(x), torch.empty_like(r)
    got = opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=dest_out, residual_out=dest_res)
    assert got[0] is dest_out and got[1] is dest_res
    assert_close(dest_out, expect_out, what="out=")
    assert torch.equal(dest_res, expect_res)

    xv, rv = x.view(2, 2, hidden).clone(), r.view(2, 2, hidden).clone()  # in place, 3-D like a model
    got = opforge.fused_add_rmsnorm(xv, rv, w, 1e-6, out=xv, residual_out=rv)
    assert got[0] is xv and got[1] is rv
    assert calls_of(handle, definition.name, "S") == 3
    assert_close(xv.view(4, hidden), expect_out, what="in-place out")
    assert torch.equal(rv.view(4, hidden), expect_res)
    disable_apply()
    own_out, own_res = opforge.fused_add_rmsnorm(x, r, w, 1e-6)
    assert torch.equal(own_res, expect_res)
    assert_close(own_out, expect_out, what="opforge's own")


def test_a_destination_passing_solution_serves_value_and_out_calls(rng):
    handle = enable_apply(dataset([NORM], [counting_reference("D", NORM, dps=True), builtin(NORM)],
                                  [measured(NORM, "D", {"batch_size": 8}, 1.0), measured(NORM, OWN, {"batch_size": 8}, 2.0)]))
    x, w = rng.randn(8, 64), rng.randn(64)
    assert_close(opforge.rmsnorm(x, w, 1e-6), ref_rmsnorm(x, w, 1e-6))
    out = torch.full_like(x, float("nan"))
    assert opforge.rmsnorm(x, w, 1e-6, out=out) is out
    assert_close(out, ref_rmsnorm(x, w, 1e-6))
    padded = torch.randn(8, 80)[:, :64]  # strided rows: the solution gets a contiguous copy
    padded.copy_(x)
    assert_close(opforge.rmsnorm(padded, w, 1e-6), ref_rmsnorm(x, w, 1e-6))
    assert calls_of(handle, NORM.name, "D") == 3


def test_calls_whose_eps_differs_from_the_public_definition_are_not_routed(rng):
    public = template_definition("rmsnorm", dtype="bfloat16", hidden_size=4096)
    assert public.name == "rmsnorm_h4096" and "eps" not in public.inputs  # eps 1e-5 baked in
    enable_apply(dataset([public], [tagging("T", public, 1.0), builtin(public)],
                         [measured(public, "T", {"batch_size": 2}, 1.0),
                          measured(public, builtin(public).name, {"batch_size": 2}, 2.0)]))
    x, w = rng.randn(2, 4096, dtype=torch.bfloat16), rng.randn(4096, dtype=torch.bfloat16)
    assert torch.all(opforge.rmsnorm(x, w, 1e-5) == 1.0)
    y = opforge.rmsnorm(x, w, 1e-6)  # rmsnorm_h4096_eps: another Definition
    assert_close(y, ref_rmsnorm(x, w, 1e-6))
    assert_close(opforge.rmsnorm(x.float(), w.float(), 1e-5), ref_rmsnorm(x, w, 1e-5))  # rmsnorm_h4096_f32


def test_a_dataset_definition_named_like_an_op_but_different_gets_no_op_calls(rng):
    fixed_eps = template_definition("rmsnorm", hidden_size=64).model_copy(update={
        "reference": NORM.reference.replace("def run(hidden_states, weight, eps):",
                                            "def run(hidden_states, weight, eps):\n    eps = 1e-2")})
    with pytest.warns(ApplyWarning, match="rmsnorm_h64_f32.*not routed"):
        handle = enable_apply(dataset([fixed_eps], [tagging("T", fixed_eps, 1.0)],
                                      [measured(fixed_eps, "T", {"batch_size": 8}, 1.0)]))
    assert list(handle.mismatched) == [NORM.name]
    assert served_by(rng, 8) is None

    @opforge.apply(NORM.name)  # the dataset's own Definition still serves functions named for it
    def my_norm(hidden_states, weight, eps):
        return hidden_states

    assert torch.all(my_norm(rng.randn(8, 64), rng.randn(64), 1e-6) == 1.0)


def test_explicit_backends_and_other_devices_run_the_op(rng):
    enable_apply(norm_dataset({8: {"A": 1.0, OWN: 2.0}}))
    x, w = rng.randn(8, 64), rng.randn(64)
    assert_close(opforge.rmsnorm(x, w, 1e-6, backend="torch"), ref_rmsnorm(x, w, 1e-6))
    assert_close(opforge.rmsnorm(x, w, 1e-6, backend="cpu"), ref_rmsnorm(x, w, 1e-6))
    assert served_by(rng, 8) == 1.0


def test_disable_and_closing_restore_direct_calls(rng):
    ts = norm_dataset({8: {"A": 1.0, OWN: 2.0}})
    outer = enable_apply(ts)
    with enable_apply(norm_dataset({8: {"B": 1.0, OWN: 2.0}})) as inner:
        assert inner.active and not outer.active
        assert served_by(rng, 8) == 2.0
    assert outer.active and served_by(rng, 8) == 1.0
    outer.close()
    assert not _hooks.active and intercept.router() is None
    assert served_by(rng, 8) is None
    enable_apply(ts)
    enable_apply(ts)
    disable_apply()
    assert not _hooks.active and _hooks.handler is None and intercept.router() is None
    assert served_by(rng, 8) is None


def test_builtin_op_routing_can_be_left_off(rng):
    enable_apply(norm_dataset({8: {"A": 1.0, OWN: 2.0}}), ApplyConfig(route_builtin_ops=False))
    assert not _hooks.active
    assert served_by(rng, 8) is None
