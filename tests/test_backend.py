"""opforge.backend: @supported_compute_capability and @backend_requirement, on toy functions
(plain Python, CPU tensors), plus the query helpers on the real ops."""

from __future__ import annotations

import pytest
import torch

import opforge
import opforge.backend as backend_module
from opforge import BackendError, _ext, backend_requirement, supported_compute_capability
from opforge._ext import _arch_runs_on


class Recorder:
    """Check functions that record their calls and pass or fail on demand."""

    def __init__(self, **outcomes):
        self.outcomes = dict(outcomes)  # backend -> True | False | an exception to raise
        self.calls: list[str] = []

    def check(self, name):
        def check(*args, **kwargs):
            self.calls.append(name)
            outcome = self.outcomes.get(name, True)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        check.__name__ = f"check_{name}"
        return check


def make_toy(outcomes=None, order=("fast", "slow"), common=None, auto_by_device=False, ccs=None, traced=None):
    """A decorated function ``toy(x, y=1, *, backend="auto")`` that returns (backend, x, y)."""
    rec = Recorder(**(outcomes or {}))
    heuristic_calls = []

    def heuristic(backends, *args, **kwargs):
        heuristic_calls.append(backends)
        return order

    checks = {}
    for name in ("fast", "slow"):
        check = rec.check(name)
        if ccs and name in ccs:
            check = supported_compute_capability(ccs[name])(check)
        checks[name] = check

    @backend_requirement(checks, common_check=common, heuristic_func=heuristic, traced=traced,
                         auto_by_device=auto_by_device)
    def toy(x, y=1, *, backend="auto"):
        """Toy op."""
        return backend, x, y

    return toy, rec, heuristic_calls


# --- supported_compute_capability ------------------------------------------------------------


def test_supported_compute_capability_marks_and_returns_the_check():
    def check(*args, **kwargs):
        return True

    marked = supported_compute_capability([80, 90.0, "100"])(check)
    assert marked is check
    toy = backend_requirement({"only": marked})(lambda x, *, backend="auto": backend)
    assert [c for c in (70, 80, 86, 90, 100, 120) if toy.is_backend_supported("only", cc=c)] == [80, 90, 100]


def test_cc_marks_do_not_block_cpu_calls():
    """Compute capabilities restrict CUDA calls only: with CPU tensors the check still decides."""
    toy, rec, _ = make_toy(ccs={"fast": [90]})
    assert toy(torch.ones(2))[0] == "fast"
    assert rec.calls == ["fast"]


# --- auto resolution -------------------------------------------------------------------------


def test_auto_runs_the_heuristics_first_backend():
    toy, rec, heuristic_calls = make_toy(order=("slow", "fast"))
    chosen, _, y = toy(torch.ones(2), 5)
    assert (chosen, y) == ("slow", 5)
    assert rec.calls == ["slow"]
    assert heuristic_calls and heuristic_calls[0] == ("fast", "slow")


def test_auto_skips_backends_whose_check_fails():
    toy, rec, _ = make_toy(outcomes={"fast": ValueError("too big")})
    assert toy(torch.ones(2))[0] == "slow"
    assert rec.calls == ["fast", "slow"]


def test_auto_skips_backends_whose_check_returns_false():
    toy, rec, _ = make_toy(outcomes={"fast": False})
    assert toy(torch.ones(2))[0] == "slow"


def test_auto_with_every_backend_failing_raises_backend_error():
    toy, _, _ = make_toy(outcomes={"fast": ValueError("too big"), "slow": TypeError("wrong dtype")})
    with pytest.raises(BackendError) as info:
        toy(torch.ones(2))
    message = str(info.value)
    assert message.startswith("opforge.toy:")
    assert "too big" in message and "wrong dtype" in message


def test_auto_with_one_candidate_reraises_its_error():
    toy, _, _ = make_toy(order=("fast",), outcomes={"fast": TypeError("wrong dtype")})
    with pytest.raises(TypeError, match=r"^opforge\.toy: backend 'fast' wrong dtype"):
        toy(torch.ones(2))


def test_heuristic_returning_nothing_raises_backend_error():
    toy, _, _ = make_toy(order=())
    with pytest.raises(BackendError, match="^opforge.toy: no backend is suitable"):
        toy(torch.ones(2))


def test_heuristic_sees_the_call_arguments():
    seen = []

    def heuristic(backends, *args, **kwargs):
        seen.append((backends, args, kwargs))
        return ("b",) if kwargs.get("y", 0) > 10 else ("a",)

    @backend_requirement({"a": lambda *a, **k: True, "b": lambda *a, **k: True}, heuristic_func=heuristic)
    def toy(x, *, y=0, backend="auto"):
        return backend

    assert toy(1, y=20) == "b"
    assert toy(1) == "a"
    assert seen[0][1] == (1,) and seen[0][2]["y"] == 20


@pytest.mark.parametrize("auto_by_device", [False, True])
def test_first_parameter_by_keyword_in_any_order(auto_by_device):
    """Checks and heuristics find the first parameter in args[0] however the call names it."""
    seen = []

    def common(*args, **kwargs):
        seen.append(("common", args[0]))
        return True

    toy, rec, _ = make_toy(common=common, auto_by_device=auto_by_device)
    t = torch.ones(2)
    assert toy(y=3, x=t) == ("fast", t, 3)
    assert toy(backend="slow", y=4, x=t) == ("slow", t, 4)
    assert toy(y=5, x=t, skip_check=True) == ("fast", t, 5)
    assert seen == [("common", t), ("common", t)]
    assert rec.calls == ["fast", "slow"]


def test_without_heuristic_a_single_backend_is_the_default():
    @backend_requirement({"only": lambda *a, **k: True})
    def toy(x, *, backend="auto"):
        return backend

    assert toy(1) == "only"


# --- explicit backends -----------------------------------------------------------------------


def test_explicit_backend_runs_only_its_check():
    toy, rec, heuristic_calls = make_toy()
    assert toy(torch.ones(2), backend="slow")[0] == "slow"
    assert rec.calls == ["slow"]
    assert heuristic_calls == []


@pytest.mark.parametrize("exc", [ValueError("too big"), TypeError("wrong dtype"), RuntimeError("no GPU")], ids=repr)
def test_failing_explicit_backend_keeps_the_type_and_prefixes_the_op(exc):
    toy, _, _ = make_toy(outcomes={"slow": exc})
    with pytest.raises(type(exc)) as info:
        toy(torch.ones(2), backend="slow")
    assert str(info.value) == f"opforge.toy: backend 'slow' {exc}"


def test_explicit_backend_whose_check_returns_false():
    toy, _, _ = make_toy(outcomes={"slow": False})
    with pytest.raises(BackendError, match="^opforge.toy: backend 'slow' cannot run this call"):
        toy(torch.ones(2), backend="slow")


def test_unknown_backend():
    toy, _, _ = make_toy()
    with pytest.raises(BackendError) as info:
        toy(torch.ones(2), backend="fastest")
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "opforge.toy: unknown backend 'fastest'; accepted: 'auto', 'fast', 'slow'"


def test_other_exceptions_from_checks_propagate_unchanged():
    toy, _, _ = make_toy(outcomes={"fast": KeyError("bug in a check")})
    with pytest.raises(KeyError, match="bug in a check"):
        toy(torch.ones(2))


# --- common check and skip_check -------------------------------------------------------------


def test_common_check_runs_first_and_is_prefixed():
    order = []

    def common(x, y=1, *, backend="auto"):
        order.append("common")
        if y < 0:
            raise ValueError(f"y must be >= 0, got {y}")
        return True

    toy, rec, _ = make_toy(common=common)
    toy(torch.ones(2), 3, backend="fast")
    assert order == ["common"] and rec.calls == ["fast"]
    with pytest.raises(ValueError) as info:
        toy(torch.ones(2), -1, backend="fast")
    assert str(info.value) == "opforge.toy: y must be >= 0, got -1"


def test_common_check_with_compute_capabilities_on_cpu_tensors():
    @supported_compute_capability([90])
    def common(x, *, backend="auto"):
        raise TypeError("x must be bf16")

    toy, _, _ = make_toy(common=common)
    with pytest.raises(TypeError, match="^opforge.toy: x must be bf16"):
        toy(torch.ones(2))
    assert not toy.is_backend_supported("fast", cc=80)
    assert toy.is_backend_supported("fast", cc=90)


@pytest.mark.parametrize("backend", ["auto", "slow"])
def test_skip_check_bypasses_every_check(backend):
    def common(*args, **kwargs):
        raise ValueError("common check ran")

    toy, rec, _ = make_toy(outcomes={"fast": ValueError("x"), "slow": ValueError("y")}, common=common)
    result = toy(torch.ones(2), skip_check=True, backend=backend)
    assert result[0] == ("fast" if backend == "auto" else "slow")  # auto: the heuristic's first
    assert rec.calls == []


def test_skip_check_is_not_passed_to_the_function():
    @backend_requirement({"only": lambda *a, **k: True})
    def toy(x, *, backend="auto", **kwargs):
        return backend, kwargs

    assert toy(1, skip_check=True) == ("only", {})
    assert toy(1, skip_check=False, extra=2) == ("only", {"extra": 2})


# --- positional backend parameter ------------------------------------------------------------


def test_positional_backend_parameter():
    rec = Recorder(fast=ValueError("no"))

    @backend_requirement({"fast": rec.check("fast"), "slow": rec.check("slow")},
                         heuristic_func=lambda backends, *a, **k: backends)
    def toy(x, backend="auto", scale=1):
        return backend, x, scale

    assert toy(1, "slow", 3) == ("slow", 1, 3)
    assert toy(1, "auto", 3) == ("slow", 1, 3)
    assert toy(1) == ("slow", 1, 1)
    assert toy(1, backend="slow") == ("slow", 1, 1)
    with pytest.raises(ValueError, match="^opforge.toy: backend 'fast' no"):
        toy(1, "fast")
    with pytest.raises(BackendError, match="unknown backend 'gpu'"):
        toy(1, "gpu")


# --- auto_by_device --------------------------------------------------------------------------


def test_auto_by_device_chooses_once_per_device():
    toy, rec, heuristic_calls = make_toy(order=("slow", "fast"), auto_by_device=True)
    for _ in range(5):
        assert toy(torch.ones(2))[0] == "slow"
    assert len(heuristic_calls) == 1
    assert rec.calls == ["slow"]
    # explicit backends are still checked on every call
    toy(torch.ones(2), backend="fast")
    toy(torch.ones(2), backend="fast")
    assert rec.calls == ["slow", "fast", "fast"]


def test_auto_by_device_cache_belongs_to_each_function():
    toy_a, _, calls_a = make_toy(auto_by_device=True)
    toy_b, _, calls_b = make_toy(auto_by_device=True, order=("slow",))
    for _ in range(3):
        assert toy_a(torch.ones(2))[0] == "fast"
        assert toy_b(torch.ones(2))[0] == "slow"
    assert len(calls_a) == 1 and len(calls_b) == 1


def test_auto_by_device_does_not_cache_non_tensor_calls():
    toy, _, heuristic_calls = make_toy(auto_by_device=True)
    toy(3)
    toy(3)
    assert len(heuristic_calls) == 2


def test_auto_by_device_does_not_cache_failures():
    toy, rec, heuristic_calls = make_toy(auto_by_device=True, outcomes={"fast": ValueError("a"), "slow": ValueError("b")})
    for _ in range(2):
        with pytest.raises(BackendError):
            toy(torch.ones(2))
    assert len(heuristic_calls) == 2
    rec.outcomes["slow"] = True
    assert toy(torch.ones(2))[0] == "slow"


def test_auto_by_device_never_remembers_an_unchecked_choice():
    """A skip_check=True call takes the heuristic's first backend unchecked; that choice must not
    be reused by later checked calls."""
    toy, rec, _ = make_toy(auto_by_device=True, outcomes={"fast": ValueError("cannot")})
    assert toy(torch.ones(2), skip_check=True)[0] == "fast"
    assert rec.calls == []
    assert toy(torch.ones(2))[0] == "slow"
    assert toy(torch.ones(2))[0] == "slow"


def test_without_auto_by_device_the_heuristic_runs_every_call():
    toy, _, heuristic_calls = make_toy()
    for _ in range(3):
        toy(torch.ones(2))
    assert len(heuristic_calls) == 3


# --- traced ----------------------------------------------------------------------------------


def test_traced_replaces_the_call_while_compiling(monkeypatch):
    seen = []

    def traced(x, y=1, *, backend="auto"):
        seen.append((x, y, backend))
        return "traced"

    toy, rec, _ = make_toy(traced=traced)
    assert toy(1, 2)[0] == "fast"
    monkeypatch.setattr(backend_module, "_is_compiling", lambda: True)
    assert toy(1, 2, skip_check=True) == "traced"
    assert seen == [(1, 2, "auto")]
    assert rec.calls == ["fast"]  # no checks while tracing


# --- queries ---------------------------------------------------------------------------------


def test_query_helpers():
    toy, _, _ = make_toy(ccs={"fast": [90, 100]})
    assert toy.backends == ("fast", "slow")
    assert toy.has_backend("fast") and toy.has_backend("slow") and not toy.has_backend("auto")
    assert toy.has_backend_choices()
    assert toy.is_backend_supported("fast") and not toy.is_backend_supported("medium")
    assert toy.is_backend_supported("fast", cc=90) and not toy.is_backend_supported("fast", cc=80)
    assert toy.is_backend_supported("slow", cc=80)  # no marks: no restriction of its own
    # ... but an unmarked backend (CPU code, a plain-PyTorch formula) does not make a GPU supported
    assert toy.is_compute_capability_supported(90) and toy.is_compute_capability_supported(100)
    assert not toy.is_compute_capability_supported(80) and not toy.is_compute_capability_supported(1)


def test_query_helpers_without_any_mark():
    toy, _, _ = make_toy()
    assert toy.is_backend_supported("fast", cc=80) and toy.is_compute_capability_supported(80)


def test_function_marks_answer_the_queries_and_leave_calls_to_the_check():
    """A mark given as a function (support known only at run time) answers the queries; on a
    call the check itself decides (it can explain why, e.g. with the rebuild command)."""
    asked = []

    def runs_on(cc):
        asked.append(cc)
        return cc >= 90

    toy, rec, _ = make_toy(ccs={"fast": runs_on})
    assert toy.is_backend_supported("fast", cc=90) and not toy.is_backend_supported("fast", cc=80)
    assert toy.is_compute_capability_supported(120) and not toy.is_compute_capability_supported(75)
    assert asked == [90, 80, 120, 75]
    assert toy(torch.ones(2))[0] == "fast" and rec.calls == ["fast"]


def test_query_helpers_when_every_backend_is_marked():
    rec = Recorder()

    @backend_requirement({"a": supported_compute_capability([80])(rec.check("a")),
                          "b": supported_compute_capability([90])(rec.check("b"))},
                         heuristic_func=lambda backends, *a, **k: backends)
    def toy(x, *, backend="auto"):
        return backend

    assert toy.is_compute_capability_supported(80) and toy.is_compute_capability_supported(90)
    assert not toy.is_compute_capability_supported(75)
    assert toy.has_backend_choices()


def test_single_backend_has_no_choices():
    @backend_requirement({"only": lambda *a, **k: True})
    def toy(x, *, backend="auto"):
        return backend

    assert not toy.has_backend_choices()
    assert toy.backends == ("only",)


def test_no_backends_only_a_common_check():
    @supported_compute_capability([90])
    def common(x):
        if x < 0:
            raise ValueError("x < 0")
        return True

    @backend_requirement({}, common_check=common)
    def toy(x):
        return x * 2

    assert toy(2) == 4
    with pytest.raises(ValueError, match="^opforge.toy: x < 0"):
        toy(-1)
    assert toy.is_compute_capability_supported(90) and not toy.is_compute_capability_supported(80)
    assert toy.backends == () and not toy.has_backend_choices()


def test_wrapper_keeps_name_and_doc():
    toy, _, _ = make_toy()
    assert toy.__name__ == "toy" and toy.__doc__ == "Toy op."


# --- mistakes in a declaration ---------------------------------------------------------------


def test_checks_without_backend_parameter_are_refused():
    with pytest.raises(TypeError, match="no 'backend' parameter"):
        backend_requirement({"a": lambda *a, **k: True})(lambda x: x)


def test_auto_default_with_several_backends_needs_a_heuristic():
    with pytest.raises(TypeError, match="heuristic_func"):

        @backend_requirement({"a": lambda *a, **k: True, "b": lambda *a, **k: True})
        def toy(x, *, backend="auto"):
            return backend


# --- the real ops ----------------------------------------------------------------------------

REAL_OPS = [opforge.scale, opforge.rmsnorm, opforge.gemma_rmsnorm, opforge.fused_add_rmsnorm,
            opforge.gemma_fused_add_rmsnorm, opforge.silu_and_mul, opforge.gelu_and_mul, opforge.gelu_tanh_and_mul]


CCS = (1, 60, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, 130, 900)


@pytest.mark.parametrize("op", REAL_OPS, ids=lambda f: f.__name__)
def test_real_ops_declare_their_backends(op):
    assert op.backends == ("cuda", "cpu", "torch")
    assert op.has_backend("cuda") and op.has_backend("cpu") and op.has_backend("torch")
    assert not op.has_backend("triton")
    assert op.has_backend_choices()
    assert op.is_backend_supported("cpu", cc=60) and op.is_backend_supported("torch", cc=90)  # no GPU code


@pytest.mark.parametrize("op", REAL_OPS, ids=lambda f: f.__name__)
def test_real_ops_answer_from_this_build(op):
    """Compute capabilities come from what this build holds, not from a fixed list."""
    archs = opforge.build_info()["cuda_archs"] if opforge.build_info()["cuda"] else []
    expected = {cc for cc in CCS if any(_arch_runs_on(a, cc) for a in archs)}
    assert {cc for cc in CCS if op.is_compute_capability_supported(cc)} == expected
    assert {cc for cc in CCS if op.is_backend_supported("cuda", cc=cc)} == expected


def _simulate_build(monkeypatch, archs: str | None):
    info = dict(_ext._build_info())
    info["cuda"] = archs is not None
    info["cuda_archs"] = tuple(archs.split(";")) if archs else ()
    monkeypatch.setattr(_ext, "_build_info", lambda: info)


@pytest.mark.parametrize("archs, supported", [
    (None, set()),  # CPU-only build: no GPU at all
    ("9.0a", {90}),  # arch-specific code runs on that chip only
    ("8.0;9.0a", {80, 86, 87, 89, 90}),  # SASS 8.0 runs on 8.x
    ("9.0a+PTX", {90}),  # arch-specific PTX is not JIT-compiled for newer GPUs
    ("9.0+PTX", {90, 100, 103, 110, 120, 121, 130, 900}),  # PTX: any newer GPU, even unreleased ones
    ("8.0;9.0a;10.0f;12.0", {80, 86, 87, 89, 90, 100, 103, 120, 121}),
])
@pytest.mark.parametrize("op", REAL_OPS, ids=lambda f: f.__name__)
def test_real_ops_answer_from_the_build_archs(monkeypatch, op, archs, supported):
    _simulate_build(monkeypatch, archs)
    assert {cc for cc in CCS if op.is_compute_capability_supported(cc)} == supported
    assert {cc for cc in CCS if op.is_backend_supported("cuda", cc=cc)} == supported
    assert op.is_backend_supported("cuda") and op.has_backend("cuda")  # the backend exists either way


def test_real_op_auto_on_cpu_picks_cpu_backend(monkeypatch):
    """auto never falls back to the plain-PyTorch backend on its own: on CPU it is the C++ op
    (the binding launching), from the fast entry and from the checked path alike."""
    from opforge.ops import norm as norm_module

    seen = []

    class Spy:
        def norm(self, *args):
            seen.append("launch" if args[8] else "validate")  # (out, input, ..., stream, launch, ...)
            return original.norm(*args)

    original = norm_module._C
    monkeypatch.setattr(norm_module, "_C", Spy())
    choices = opforge.rmsnorm.__wrapped__.auto_choice
    saved = dict(choices)
    choices.clear()  # as in a fresh process
    try:
        x, w = torch.randn(2, 8), torch.randn(8)
        opforge.rmsnorm(x, w)  # the fast entry: the binding picks the kernel for the tensors' device
        opforge.rmsnorm.__wrapped__(x, w)  # the checked path resolves "auto" for the CPU
        assert choices == {-1: "cpu"}
        opforge.rmsnorm(x, w, backend="torch")
        opforge.rmsnorm(x, w, backend="cpu")
    finally:
        choices.update(saved)
    assert seen == ["launch", "launch", "validate", "launch"]


# --- the fast entries of the built-in ops --------------------------------------------------


def _fast_cases(name):
    x, w, r = torch.randn(3, 8), torch.randn(8), torch.randn(3, 8)
    g = torch.randn(3, 16)
    return {op: (getattr(opforge, op), calls) for op, _, calls in [
        ("rmsnorm", None, [
            ((x, w.double()), {}),                         # dtypes differ
            ((x, torch.randn(7)), {}),                     # weight size
            ((x, "w"), {}),                                # not a tensor
            ((x, None), {}),
            ((x, w), {"out": torch.empty(2, 8)}),          # out shape
            ((x, w), {"out": x[:, :4]}),
            ((x, w, 1e-6, x.t()), {}),                     # out strides
            ((x.clone().requires_grad_(), w), {}),         # grad
            ((x, w), {"out": "o"}),
            ((x, w, "eps"), {}),
        ]),
        ("fused_add_rmsnorm", None, [
            ((x, r[:2], w), {}),
            ((x, r, w), {"residual_out": torch.empty(3, 8, dtype=torch.float64)}),
            ((x, "r", w), {}),
            ((x, r.clone().requires_grad_(), w), {}),
        ]),
        ("silu_and_mul", None, [
            ((torch.randn(3, 15),), {}),                   # odd last dimension
            ((g,), {"out": torch.empty(3, 16)}),
            ((g.clone().requires_grad_(),), {}),
            ((torch.ones(3, 16, dtype=torch.int32),), {}),
        ]),
        ("scale", None, [
            ((x, 0.5), {"out": torch.empty(3, 9)}),
            ((x.clone().requires_grad_(), 0.5), {}),
            ((x, "half"), {}),
        ]),
    ]}[name]


def _outcome(fn, args, kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # the comparison is of what the user sees
        return type(e), str(e)
    return None


@pytest.mark.parametrize("name", ["rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "scale"])
def test_fast_entry_refuses_what_the_checked_path_refuses(name):
    """The one-frame entry of a plain call skips the Python checks: the binding must refuse every
    bad call with the same error type and message as the checked path (which runs them)."""
    op, calls = _fast_cases(name)
    for args, kwargs in calls:
        fast, checked = _outcome(op, args, kwargs), _outcome(op.__wrapped__, args, kwargs)
        assert fast is not None, (name, args, kwargs)
        assert fast == checked, (name, fast, checked)


def test_fast_entry_hands_unusual_calls_to_the_checked_path(monkeypatch):
    """Explicit backends, keyword-only first arguments, int eps, tracing/apply hooks and tensor
    subclasses go through the checked wrapper; plain calls do not."""
    from opforge.ops import norm as norm_module

    calls = []
    checked = opforge.rmsnorm.__wrapped__

    def spy(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return checked(*args, **kwargs)

    x, w = torch.randn(2, 8), torch.randn(8)
    fast = norm_module._fast_norm(spy, False)
    torch.testing.assert_close(fast(x, w, 1e-6), opforge.rmsnorm(x, w, 1e-6, backend="torch"))
    assert calls == []
    fast(x, w, 1e-6, backend="cpu")
    fast(x, w, 1)                                     # int eps: the checked path converts it
    fast(torch.nn.Parameter(x, requires_grad=False), w)
    monkeypatch.setattr(norm_module._hooks, "active", True)
    monkeypatch.setattr(norm_module._hooks, "handler", lambda name, unhooked, args, kwargs: unhooked(*args, **kwargs))
    fast(x, w)
    assert calls == ["cpu", "auto", "auto", "auto"]
