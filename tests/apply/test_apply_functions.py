"""@apply functions and imperative apply(...): routing by the call's axes, resolvers, the
destination-passing form, signature checks, what falls back, torch.compile, and tracing."""

import warnings

import pytest
import torch

import opforge
from apply_helpers import (axpy_definition, calls_of, counting_reference, dataset, isolated,  # noqa: F401
                           measured, python_solution, tagging, template_definition)
from opforge import intercept
from opforge.apply import ApplyWarning, disable_apply, enable_apply

AXPY = axpy_definition()


def axpy_dataset(latencies: dict, extra=(), definitions=(AXPY,)):
    solutions = [tagging("P", AXPY, 1.0), tagging("Q", AXPY, 2.0), counting_reference("REF", AXPY), *extra]
    traces = [measured(AXPY, s, {"rows": rows}, ms) for rows, by in latencies.items() for s, ms in by.items()]
    return dataset(definitions, solutions, traces)


def axpy(x, b, a):
    return a * x + b


def test_decorated_function_routes_per_workload_and_falls_back_where_nothing_fits(rng):
    @opforge.apply("axpy_d16")
    def my_axpy(x, b, a=2.0):
        return axpy(x, b, a)

    x, b = rng.randn(4, 16), rng.randn(16)
    torch.testing.assert_close(my_axpy(x, b), axpy(x, b, 2.0))  # apply off: the body runs
    handle = enable_apply(axpy_dataset({4: {"P": 1.0, "Q": 2.0, "REF": 3.0}, 32: {"P": 2.0, "Q": 1.0, "REF": 3.0},
                                        256: {"REF": 1.0, "P": 2.0}}))
    assert torch.all(my_axpy(x, b) == 1.0)
    assert torch.all(my_axpy(b=b, x=rng.randn(32, 16), a=0.5) == 2.0)
    torch.testing.assert_close(my_axpy(rng.randn(256, 16), b, 3.0).shape, torch.Size([256, 16]))
    assert calls_of(handle, "axpy_d16", "REF") == 1
    # Calls the Definition does not describe run the body: another dtype, another width.
    x64 = rng.randn(4, 16).double()
    torch.testing.assert_close(my_axpy(x64, b.double(), 2.0), axpy(x64, b.double(), 2.0))
    x8 = rng.randn(4, 8)
    torch.testing.assert_close(my_axpy(x8, rng.randn(8)).shape, torch.Size([4, 8]))
    assert my_axpy.__name__ == "my_axpy" and my_axpy.__wrapped__(x, b, 1.0).shape == x.shape


def test_strided_inputs_reach_solutions_contiguous(rng):
    checking = python_solution("CONTIG", AXPY, """
        def run(x, b, a):
            assert x.is_contiguous() and b.is_contiguous()
            return a * x + b
    """)
    enable_apply(axpy_dataset({4: {"CONTIG": 1.0, "P": 2.0}}, extra=[checking]))
    wide, b = rng.randn(4, 40), rng.randn(32)
    x, b = wide[:, 3:19], b[::2]  # rows of a wider tensor, every other element
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CONTIG serves: no failure to report
        torch.testing.assert_close(opforge.apply("axpy_d16", args=(x, b, 2.0)), axpy(x, b, 2.0))


def test_a_resolver_names_the_definition_from_the_arguments(rng):
    wide = axpy_definition("axpy_d16_wide")
    ts = axpy_dataset({4: {"P": 1.0, "REF": 2.0}})
    ts.add_definition(wide)
    ts.add_solution(tagging("W", wide, 7.0))
    ts.add_workload(wide.name, measured(wide, "W", {"rows": 4}, 1.0).model_copy(update={"solution": None,
                                                                                         "evaluation": None}))
    ts.add_trace(measured(wide, "W", {"rows": 4}, 1.0))
    enable_apply(ts)

    @opforge.apply(lambda x, b, a: "axpy_d16_wide" if a > 1 else "axpy_d16")
    def my_axpy(x, b, a):
        return axpy(x, b, a)

    x, b = rng.randn(4, 16), rng.randn(16)
    assert torch.all(my_axpy(x, b, 2.0) == 7.0)
    assert torch.all(my_axpy(x, b, 0.5) == 1.0)


def test_imperative_calls_value_returning_and_destination_passing(rng):
    x, b = rng.randn(4, 16), rng.randn(16)
    torch.testing.assert_close(opforge.apply("axpy_d16", args=(x, b, 2.0), fallback=axpy), axpy(x, b, 2.0))
    with pytest.raises(RuntimeError, match="no fallback"):
        opforge.apply("axpy_d16", args=(x, b, 2.0))
    handle = enable_apply(axpy_dataset({4: {"REF": 1.0, "P": 2.0}}))
    torch.testing.assert_close(opforge.apply("axpy_d16", (x, b), {"a": 2.0}, fallback=axpy), axpy(x, b, 2.0))
    y = torch.full_like(x, float("nan"))
    assert opforge.apply("axpy_d16", args=(x, b, 2.0, y)) is None  # inputs then outputs
    torch.testing.assert_close(y, axpy(x, b, 2.0))
    assert calls_of(handle, "axpy_d16", "REF") == 2
    assert torch.all(opforge.apply("axpy_d16", args=(rng.randn(4, 16), b, 1.0)) != 1.0)


def test_destination_passing_solutions_and_functions(rng):
    dps = counting_reference("DPS", AXPY, dps=True)
    handle = enable_apply(axpy_dataset({4: {"DPS": 1.0, "P": 2.0}}, extra=[dps]))

    @opforge.apply("axpy_d16")
    def axpy_into(x, b, a, y):
        y.copy_(axpy(x, b, a))

    x, b = rng.randn(4, 16), rng.randn(16)
    y = torch.full_like(x, float("nan"))
    assert axpy_into(x, b, 2.0, y) is None
    torch.testing.assert_close(y, axpy(x, b, 2.0))
    strided = torch.full((4, 32), float("nan"))[:, :16]  # a strided destination: written through a copy
    axpy_into(x, b, 2.0, strided)
    torch.testing.assert_close(strided, axpy(x, b, 2.0))
    torch.testing.assert_close(opforge.apply("axpy_d16", args=(x, b, 2.0)), axpy(x, b, 2.0))  # allocated for it
    assert calls_of(handle, "axpy_d16", "DPS") == 3


def test_signature_mismatch_is_a_type_error_at_decoration_or_at_enable():
    with pytest.raises(TypeError, match=r"rmsnorm_h64_f32.*no parameter for input\(s\) eps"):
        @opforge.apply("rmsnorm_h64_f32")  # one of opforge's own names: known without a dataset
        def norm(hidden_states, weight):
            return hidden_states

    @opforge.apply("axpy_d16")  # unknown until a dataset brings it
    def bad_axpy(x, b, scale):
        return x

    with pytest.raises(TypeError, match=r"bad_axpy.*no parameter for input\(s\) a; parameter\(s\) scale"):
        enable_apply(axpy_dataset({4: {"P": 1.0}}))
    del bad_axpy
    import gc

    gc.collect()
    enable_apply(axpy_dataset({4: {"P": 1.0}}))
    with pytest.raises(TypeError, match="axpy_d16"):
        @opforge.apply("axpy_d16")
        def worse(x, b):
            return x

    @opforge.apply("axpy_d16")  # *args takes the Definition's order
    def positional(*args):
        return axpy(*args)

    assert torch.all(positional(torch.randn(4, 16), torch.randn(16), 1.0) == 1.0)


def test_a_raising_solution_is_blamed_only_when_the_fallback_serves(rng):
    raising = python_solution("BAD", AXPY, """
        def run(x, b, a):
            if a < 0:
                raise ValueError("negative a")
            return x
    """)
    enable_apply(axpy_dataset({4: {"BAD": 1.0}}, extra=[raising]))

    def strict_axpy(x, b, a):
        if a < 0:
            raise ValueError("a must be >= 0")
        return axpy(x, b, a)

    x, b = rng.randn(4, 16), rng.randn(16)
    with pytest.raises(ValueError, match="a must be >= 0"):  # the call was bad: nobody is blamed
        opforge.apply("axpy_d16", args=(x, b, -1.0), fallback=strict_axpy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(opforge.apply("axpy_d16", args=(x, b, 1.0), fallback=strict_axpy), x)
    broken = python_solution("BAD", AXPY, "def run(x, b, a):\n    raise RuntimeError('always')\n")
    disable_apply()
    enable_apply(axpy_dataset({4: {"BAD": 1.0, "P": 2.0}}, extra=[broken]))
    with pytest.warns(ApplyWarning, match="'BAD' of axpy_d16 raised RuntimeError: always"):
        assert torch.all(opforge.apply("axpy_d16", args=(x, b, 1.0), fallback=strict_axpy) == 1.0)


def test_torch_compile_runs_the_fallback(rng):
    enable_apply(axpy_dataset({4: {"P": 1.0}}))

    @opforge.apply("axpy_d16")
    def my_axpy(x, b, a):
        return axpy(x, b, a)

    compiled = torch.compile(lambda x, b: my_axpy(x, b, 2.0), backend="eager", fullgraph=True)
    x, b = rng.randn(4, 16), rng.randn(16)
    torch.testing.assert_close(compiled(x, b), axpy(x, b, 2.0))
    assert torch.all(my_axpy(x, b, 2.0) == 1.0)


class Recorder:
    def __init__(self):
        self.calls = []

    def record(self, call):
        definition = call.make_definition()
        assert definition.name == call.definition and call.key[0] == call.definition
        self.calls.append((call.definition, dict(call.axes), {k: v.clone() if isinstance(v, torch.Tensor) else v
                                                               for k, v in call.inputs.items()}))


def test_tracing_and_apply_together(rng):
    norm = template_definition("fused_add_rmsnorm", hidden_size=64)
    ts = axpy_dataset({4: {"P": 1.0}})
    ts.add_definition(norm)
    ts.add_solution(counting_reference("S", norm))
    ts.add_workload(norm.name, measured(norm, "S", {"batch_size": 4}, 1.0).model_copy(
        update={"solution": None, "evaluation": None}))
    ts.add_trace(measured(norm, "S", {"batch_size": 4}, 1.0))
    recorder = Recorder()
    intercept.set_tracer(recorder)

    @opforge.apply("axpy_d16")
    def my_axpy(x, b, a):
        return axpy(x, b, a)

    x, b = rng.randn(4, 16), rng.randn(16)
    torch.testing.assert_close(my_axpy(x, b, 2.0), axpy(x, b, 2.0))  # apply off: traced, body runs
    assert recorder.calls == []  # axpy_d16 is not known without a dataset: nothing to record
    handle = enable_apply(ts)
    assert torch.all(my_axpy(x, b, 2.0) == 1.0)
    xr, rr, w = rng.randn(4, 64), rng.randn(4, 64), rng.randn(64)
    x0, r0 = xr.clone(), rr.clone()
    opforge.fused_add_rmsnorm(xr, rr, w, 1e-6, out=xr, residual_out=rr)
    assert calls_of(handle, norm.name, "S") == 1
    (name1, axes1, inputs1), (name2, axes2, inputs2) = recorder.calls
    assert (name1, axes1) == ("axpy_d16", {"rows": 4}) and torch.equal(inputs1["x"], x) and inputs1["a"] == 2.0
    assert (name2, axes2) == (norm.name, {"batch_size": 4})
    assert torch.equal(inputs2["hidden_states"], x0) and torch.equal(inputs2["residual"], r0)  # before the write
    disable_apply()
    opforge.apply("rmsnorm_h64_f32", args=(rng.randn(3, 64), w, 1e-6), fallback=lambda h, w, e: h)
    assert recorder.calls[-1][:2] == ("rmsnorm_h64_f32", {"batch_size": 3})  # op names are known without a dataset
