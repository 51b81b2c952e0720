"""Bad arguments give clear errors: the right exception type, and a message that starts with the
op's public name and names the offending argument (and what was wrong with it).

The cases are generated from one table of valid arguments per op: each case breaks one thing.
Checks made by the compiled bindings also hold for backend="cpu" / "torch" and with
skip_check=True, and a rejected call writes nothing to its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import opforge
from opforge import _C, _ext
from conftest import DEVICES, written_late_on_a_side_stream

ROWS, H = 4, 8


@dataclass(frozen=True)
class Spec:
    name: str  # public name: messages start with "opforge.<name>:"
    fn: Callable
    make: Callable[[], dict]  # valid arguments, the first one the input tensor
    kind: str  # "scale", "norm", "add_norm" or "act"


def _norm_args():
    return {"input": torch.randn(ROWS, H), "weight": torch.randn(H), "eps": 1e-6, "out": _nan(ROWS, H)}


def _add_norm_args():
    return {"input": torch.randn(ROWS, H), "residual": torch.randn(ROWS, H), "weight": torch.randn(H), "eps": 1e-6,
            "out": _nan(ROWS, H), "residual_out": _nan(ROWS, H)}


def _act_args():
    return {"input": torch.randn(ROWS, 2 * H), "out": _nan(ROWS, H)}


def _scale_args():
    return {"x": torch.randn(ROWS, H), "factor": 0.5, "out": _nan(ROWS, H)}


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


SPECS = {
    "scale": Spec("scale", opforge.scale, _scale_args, "scale"),
    "rmsnorm": Spec("rmsnorm", opforge.rmsnorm, _norm_args, "norm"),
    "gemma_rmsnorm": Spec("gemma_rmsnorm", opforge.gemma_rmsnorm, _norm_args, "norm"),
    "fused_add_rmsnorm": Spec("fused_add_rmsnorm", opforge.fused_add_rmsnorm, _add_norm_args, "add_norm"),
    "gemma_fused_add_rmsnorm": Spec("gemma_fused_add_rmsnorm", opforge.gemma_fused_add_rmsnorm, _add_norm_args,
                                    "add_norm"),
    "silu_and_mul": Spec("silu_and_mul", opforge.silu_and_mul, _act_args, "act"),
    "gelu_and_mul": Spec("gelu_and_mul", opforge.gelu_and_mul, _act_args, "act"),
    "gelu_tanh_and_mul": Spec("gelu_tanh_and_mul", opforge.gelu_tanh_and_mul, _act_args, "act"),
}
OUTPUTS = ("out", "residual_out")


def invoke(spec: Spec, args: dict, **extra):
    first, *rest = args
    return spec.fn(args[first], **{k: args[k] for k in rest}, **extra)


@dataclass(frozen=True)
class Case:
    op: str
    what: str
    change: Callable[[dict], None]  # breaks the valid arguments in place
    exc: type
    needles: tuple = ()  # substrings the message must contain besides the op name
    compiled: bool = True  # found by the compiled bindings (so also with skip_check=True)

    def param(self):
        return pytest.param(self, id=f"{self.op}-{self.what}")


def _set(name, make):
    def change(args):
        args[name] = make(args)

    return change


def _wrong_shape(spec: Spec, name: str):
    return {
        "weight": lambda a: torch.randn(H + 1),
        "residual": lambda a: torch.randn(ROWS, H + 1),
        "residual_out": lambda a: _nan(ROWS, H + 1),
        "out": lambda a: _nan(ROWS, 2 * H) if spec.kind == "act" else _nan(ROWS, H + 1),
    }[name]


def _strided_last_dim(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    return wide[..., ::2]


def _cases():
    cases = []
    for spec in SPECS.values():
        op = spec.name
        valid = spec.make()
        tensors = [k for k, v in valid.items() if isinstance(v, torch.Tensor)]
        first = tensors[0]

        # the input's dtype is not supported (all tensors of that dtype)
        for dt, label in [(torch.float64, "float64"), (torch.int32, "int32"), (torch.bool, "bool"),
                          (torch.complex64, "complex64")]:
            def change(args, dt=dt, tensors=tuple(tensors)):
                for k in tensors:
                    args[k] = torch.zeros(args[k].shape, dtype=dt)

            cases.append(Case(op, f"dtype-{label}", change, TypeError, (first, label, "float16, bfloat16, float32")))

        for name in tensors:
            # not a tensor at all (checked in Python: skip_check=True skips it)
            cases.append(Case(op, f"{name}-list", _set(name, lambda a: [1.0, 2.0]), TypeError, (name, "list"),
                              compiled=False))
            # the op has no backward: a tensor that needs grad is refused while grad mode is on
            cases.append(Case(op, f"{name}-requires-grad", _set(name, lambda a, n=name: a[n].clone().requires_grad_()),
                              ValueError, (name, "grad"), compiled=False))
            # last dimension not contiguous
            cases.append(Case(op, f"{name}-last-dim-stride-2", _set(name, lambda a, n=name: _strided_last_dim(a[n])),
                              ValueError, (name, "contiguous")))
            if name == first:
                continue
            # another tensor's dtype differs from the input's
            cases.append(Case(op, f"{name}-dtype-mismatch", _set(name, lambda a, n=name: a[n].half()), TypeError,
                              (name, "float16", first)))
            # wrong shape
            cases.append(Case(op, f"{name}-wrong-shape", _set(name, _wrong_shape(spec, name)), ValueError, (name,)))
            # on another device than the input (a meta tensor is the other device a CPU machine has)
            cases.append(Case(op, f"{name}-on-meta", _set(name, lambda a, n=name: a[n].to("meta")), ValueError,
                              (name, "meta")))
        for name in tensors:
            # storage freed, or shrunk below what the view reaches (reading or writing it would crash
            # or corrupt the heap): the compiled bindings refuse it, whatever skip_check says
            cases.append(Case(op, f"{name}-storage-freed", _set(name, lambda a, n=name: _freed(a[n])), ValueError,
                              (name, "storage", "holds 0 bytes")))
            cases.append(Case(op, f"{name}-storage-shrunk", _set(name, lambda a, n=name: _shrunk(a[n])), ValueError,
                              (name, "storage")))
            # a negative-bit view: its memory holds the negated values
            cases.append(Case(op, f"{name}-negative-bit", _set(name, lambda a, n=name: _negative_view(a[n])),
                              ValueError, (name, "negative-bit", "resolve_neg")))
            # a conjugate-bit view (complex only): refused by its dtype
            cases.append(Case(op, f"{name}-conjugate-bit", _set(name, lambda a, n=name: _conjugate_view(a[n])),
                              TypeError, (name, "complex64")))

        # the input's rows cannot be addressed with one row stride
        def non_collapsible(args, spec=spec, first=first):
            w_in = args[first].shape[-1]
            args[first] = torch.randn(4, 3, w_in)[:, :2].transpose(0, 1)  # [2, 4, w], rows 3w / w apart
            w_out = w_in // 2 if spec.kind == "act" else w_in
            for o in OUTPUTS:
                if o in args:
                    args[o] = _nan(2, 4, w_out)
            if "residual" in args:
                args["residual"] = torch.randn(2, 4, w_in)

        cases.append(Case(op, "input-rows-not-evenly-strided", non_collapsible, ValueError, (first, "evenly")))

        def out_non_collapsible(args, first=first):
            w_in, w_out = args[first].shape[-1], args["out"].shape[-1]
            args[first] = torch.randn(2, 4, w_in)
            if "residual" in args:
                args["residual"] = torch.randn(2, 4, w_in)
                args["residual_out"] = _nan(2, 4, w_in)
            args["out"] = _nan(4, 3, w_out)[:, :2].transpose(0, 1)  # [2, 4, w], rows 3w / w apart

        cases.append(Case(op, "out-rows-not-evenly-strided", out_non_collapsible, ValueError, ("out", "evenly")))

        # out rows that overlap each other (expanded / broadcast)
        cases.append(Case(op, "out-expanded", _set("out", lambda a: _nan(1, a["out"].shape[-1]).expand(*a["out"].shape)),
                          ValueError, ("out", "overlap")))

        # out overlaps the input without being the same view of it
        def out_overlaps_input(args, first=first):
            src = args[first]
            buf = torch.randn(src.numel() + 1)
            args[first] = buf[1:].view(src.shape)
            n = args["out"].numel()
            args["out"] = buf[:n].view(args["out"].shape)

        cases.append(Case(op, "out-partly-overlaps-input", out_overlaps_input, ValueError, ("out", "overlaps", first)))

        if spec.kind in ("norm", "add_norm"):
            cases.append(Case(op, "input-0d", _0d_norm, ValueError, ("input", "0-d")))
            cases.append(Case(op, "weight-2d", _set("weight", lambda a: torch.randn(1, H)), ValueError, ("weight",)))
            cases.append(Case(op, "out-is-weight", _out_is_weight, ValueError, ("out", "weight")))
            for eps in (-1.0, float("nan"), float("inf")):
                cases.append(Case(op, f"eps-{eps}", _set("eps", lambda a, e=eps: e), ValueError, ("eps",)))
            for eps, label in (("1e-6", "str"), (None, "NoneType"), (True, "bool")):
                cases.append(Case(op, f"eps-{label}", _set("eps", lambda a, e=eps: e), TypeError, ("eps", label),
                                  compiled=False))
            # too large for a float: named, not a bare OverflowError
            cases.append(Case(op, "eps-10**400", _set("eps", lambda a: 10**400), ValueError, ("eps", "401 digits"),
                              compiled=False))
            # a double, but infinite once rounded to the kernels' float32
            cases.append(Case(op, "eps-1e39", _set("eps", lambda a: 1e39), ValueError, ("eps", "1e+39", "float32")))
        if spec.kind == "add_norm":
            cases.append(Case(op, "residual_out-is-out", _set("residual_out", lambda a: a["out"]), ValueError,
                              ("residual_out", "out")))
            cases.append(Case(op, "residual_out-partly-overlaps-residual", _res_out_overlaps_residual, ValueError,
                              ("residual_out", "residual")))
            cases.append(Case(op, "out-partly-overlaps-residual", _out_overlaps_residual, ValueError,
                              ("out", "residual")))
        if spec.kind == "act":
            cases.append(Case(op, "odd-last-dim", _odd_act, ValueError, ("input", "even")))
            cases.append(Case(op, "out-inside-input", _set("out", lambda a: a["input"][:, :H]), ValueError,
                              ("out", "overlaps")))
            cases.append(Case(op, "input-0d", _0d_act, ValueError, ("input",)))
        if spec.kind == "scale":
            for factor in ("2", None, True, torch.tensor(2.0)):
                label = type(factor).__name__
                cases.append(Case(op, f"factor-{label}", _set("factor", lambda a, f=factor: f), TypeError,
                                  ("factor", label), compiled=False))
            for factor, label in ((10**400, "10**400"), (-(10**400), "-10**400")):
                cases.append(Case(op, f"factor-{label}", _set("factor", lambda a, f=factor: f), ValueError,
                                  ("factor", "401 digits"), compiled=False))
    return cases


def _freed(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.untyped_storage().resize_(0)
    return t


def _shrunk(t: torch.Tensor) -> torch.Tensor:
    """A view one row into its buffer, whose storage is then shrunk to the view's own size: enough
    bytes for its elements, but not from where it starts."""
    row = t.shape[-1]
    buf = torch.full((t.numel() + row,), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[row:].view(t.shape)
    view.copy_(t)
    view.untyped_storage().resize_(t.numel() * t.element_size())
    return view


def _negative_view(t: torch.Tensor) -> torch.Tensor:
    """A view that reads as ``t`` while its memory holds ``-t`` (torch's negative bit)."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.allclose(view, t, equal_nan=True)
    return view


def _conjugate_view(t: torch.Tensor) -> torch.Tensor:
    view = torch.complex(t, torch.zeros_like(t)).conj()
    assert view.is_conj()
    return view


def _0d_norm(args):
    args["input"] = torch.tensor(1.0)
    args["weight"] = torch.randn(1)
    for k in ("out", "residual_out"):
        args.pop(k, None)
    if "residual" in args:
        args["residual"] = torch.tensor(2.0)


def _0d_act(args):
    args["input"] = torch.tensor(1.0)
    args.pop("out")


def _out_is_weight(args):
    args["input"] = torch.randn(1, H)
    for k in ("residual", "residual_out"):
        if k in args:
            args[k] = torch.randn(1, H)
    args["out"] = args["weight"].view(1, H)


def _res_out_overlaps_residual(args):
    buf = torch.randn(ROWS * H + 1)
    args["residual"] = buf[1:].view(ROWS, H)
    args["residual_out"] = buf[:-1].view(ROWS, H)


def _out_overlaps_residual(args):
    buf = torch.randn(ROWS * H + 1)
    args["residual"] = buf[1:].view(ROWS, H)
    args["out"] = buf[:-1].view(ROWS, H)


def _odd_act(args):
    args["input"] = torch.randn(ROWS, 2 * H - 1)
    args["out"] = _nan(ROWS, H - 1)


CASES = _cases()
COMPILED = [c for c in CASES if c.compiled]


def _run_case(case: Case, **extra):
    spec = SPECS[case.op]
    args = spec.make()
    original = dict(args)
    case.change(args)
    with pytest.raises(case.exc) as info:
        invoke(spec, args, **extra)
    message = str(info.value)
    assert message.startswith(f"opforge.{case.op}:"), f"message does not start with the op name: {message!r}"
    for needle in case.needles:
        assert needle in message, f"{needle!r} not in message {message!r}"
    # Validation happens before anything is written: untouched outputs are still all NaN.
    for name in OUTPUTS:
        t = original.get(name)
        if t is not None and args.get(name) is t:
            assert torch.isnan(t).all(), f"{name} was written by a rejected call"
    return info.value


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_bad_argument(case):
    _run_case(case)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("case", [c.param() for c in COMPILED])
def test_bad_argument_other_backends(case, backend):
    """The compiled validation also guards backend="cpu" and backend="torch" (plain PyTorch)."""
    _run_case(case, backend=backend)


@pytest.mark.parametrize("case", [c.param() for c in COMPILED])
def test_bad_argument_with_skip_check(case):
    """skip_check=True skips only the Python checks: the compiled bindings still refuse."""
    _run_case(case, skip_check=True)


@pytest.mark.parametrize("op", list(SPECS))
def test_unknown_backend(op):
    spec = SPECS[op]
    with pytest.raises(opforge.BackendError) as info:
        invoke(spec, spec.make(), backend="triton")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith(f"opforge.{op}:") and "'triton'" in message
    for name in ("'auto'", "'cuda'", "'cpu'", "'torch'"):
        assert name in message


@pytest.mark.parametrize("op", list(SPECS))
def test_cuda_backend_on_cpu_tensors(op):
    spec = SPECS[op]
    with pytest.raises(ValueError) as info:
        invoke(spec, spec.make(), backend="cuda")
    message = str(info.value)
    assert message.startswith(f"opforge.{op}:") and "CUDA" in message and "cpu" in message


@pytest.mark.parametrize("op", list(SPECS))
def test_requires_grad_is_fine_without_grad_mode(op):
    """Tensors that require grad (nn.Parameter weights) are accepted under no_grad."""
    spec = SPECS[op]
    args = spec.make()
    first = next(iter(args))
    args[first] = args[first].requires_grad_()
    if "weight" in args:
        args["weight"] = torch.nn.Parameter(args["weight"])
    with torch.no_grad():
        invoke(spec, args)


@pytest.mark.parametrize("op", list(SPECS))
def test_exact_in_place_alias_is_allowed_where_documented(op):
    """out=input is allowed for scale and the norms, refused for act-and-mul (different widths)."""
    spec = SPECS[op]
    args = spec.make()
    first = next(iter(args))
    if spec.kind == "act":
        args["out"] = args[first][:, :H]
        with pytest.raises(ValueError, match="overlaps"):
            invoke(spec, args)
        return
    args["out"] = args[first]
    if spec.kind == "add_norm":
        args["residual_out"] = args["residual"]
    assert invoke(spec, args) is not None


@pytest.mark.parametrize("op", list(SPECS))
def test_disjoint_interleaved_output_is_accepted(op):
    """out and input as disjoint column ranges of one buffer (rows interleaved in memory, but no
    element shared) do not overlap: the call must run and give the result of separate tensors."""
    spec = SPECS[op]
    args = spec.make()
    first = next(iter(args))
    expected = invoke(spec, {**args, "out": None, **({"residual_out": None} if "residual_out" in args else {})})
    expected = expected[0] if isinstance(expected, tuple) else expected
    w_in, w_out = args[first].shape[-1], args["out"].shape[-1]
    buf = torch.full((ROWS, w_in + w_out), float("nan"))
    buf[:, :w_in] = args[first]
    args[first], args["out"] = buf[:, :w_in], buf[:, w_in:]
    result = invoke(spec, args)
    got = result[0] if isinstance(result, tuple) else result
    assert got is args["out"]
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.int8, torch.uint8, torch.int64, torch.complex128, torch.float8_e4m3fn,
              torch.float8_e5m2], ids=str)
def test_unsupported_dtype_is_named_as_torch_names_it(dtype):
    with pytest.raises(TypeError) as info:
        opforge.scale(torch.zeros(4, 8, dtype=dtype), 2.0)
    message = str(info.value)
    assert str(dtype).removeprefix("torch.") in message, message
    assert "accepted: float16, bfloat16, float32" in message


# --- devices ---------------------------------------------------------------------------------


def _device_mix_cases():
    params = []
    for spec in SPECS.values():
        valid = spec.make()
        tensors = [k for k, v in valid.items() if isinstance(v, torch.Tensor)]
        for name in tensors[1:]:
            for input_device in ("cuda", "cpu"):
                params.append(pytest.param(spec.name, name, input_device, marks=pytest.mark.gpu,
                                           id=f"{spec.name}-{name}-input-on-{input_device}"))
    return params


@pytest.mark.parametrize("op, name, input_device", _device_mix_cases())
def test_tensors_on_different_devices(op, name, input_device):
    spec = SPECS[op]
    args = spec.make()
    other = "cpu" if input_device == "cuda" else "cuda"
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            args[k] = v.to(other if k == name else input_device)
    with pytest.raises(ValueError) as info:
        invoke(spec, args)
    message = str(info.value)
    assert message.startswith(f"opforge.{op}:") and name in message
    assert "cpu" in message and "cuda:0" in message


@pytest.mark.skipif(
    not torch.cuda.is_available() or opforge.build_info()["cuda"],
    reason="needs a CUDA device and an opforge build without CUDA kernels",
)
@pytest.mark.parametrize("op", list(SPECS))
def test_cuda_tensor_on_a_build_without_cuda(op):
    spec = SPECS[op]
    args = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in spec.make().items()}
    with pytest.raises(RuntimeError) as info:
        invoke(spec, args)
    message = str(info.value)
    assert message.startswith(f"opforge.{op}:") and "CUDA_ARCH_LIST" in message


# --- arguments only torch can vouch for: every op, every tensor, every path ------------------


def _tensor_names(spec: Spec) -> list[str]:
    return [k for k, v in spec.make().items() if isinstance(v, torch.Tensor)]


def _each_tensor():
    return [pytest.param(op, name, id=f"{op}-{name}") for op, spec in SPECS.items() for name in _tensor_names(spec)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("skip_check", [False, True])
@pytest.mark.parametrize("op, name", _each_tensor())
def test_freed_or_shrunk_storage_is_refused(op, name, skip_check, device):
    spec = SPECS[op]
    for damage, needle in ((_freed, "holds 0 bytes"), (_shrunk, "storage")):
        args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in spec.make().items()}
        args[name] = damage(args[name])
        with pytest.raises(ValueError) as info:
            invoke(spec, args, skip_check=skip_check)
        message = str(info.value)
        assert message.startswith(f"opforge.{op}: {name} ") and needle in message, message


@pytest.mark.parametrize("op, name", [p for p in _each_tensor() if p.values[1] not in ("input", "x")])
def test_non_tensor_is_refused_with_skip_check(op, name):
    """skip_check=True skips the Python type checks; the bindings still name what is wrong."""
    spec = SPECS[op]
    args = spec.make()
    args[name] = [1.0, 2.0]
    with pytest.raises(TypeError, match=f"^opforge.{op}: {name} must be a torch.Tensor, got list"):
        invoke(spec, args, skip_check=True)


@pytest.mark.parametrize("op", list(SPECS))
def test_non_tensor_first_argument_with_skip_check(op):
    spec = SPECS[op]
    args = spec.make()
    args[next(iter(args))] = [1.0, 2.0]
    with pytest.raises(TypeError, match=f"^opforge.{op}: .*torch.Tensor, got list"):
        invoke(spec, args, skip_check=True)


@pytest.mark.parametrize("op, name", _each_tensor())
def test_sparse_tensor_is_refused(op, name):
    spec = SPECS[op]
    args = spec.make()
    args[name] = args[name].to_sparse()
    for skip_check in (False, True):
        with pytest.raises((ValueError, TypeError)) as info:
            invoke(spec, args, skip_check=skip_check)
        assert str(info.value).startswith(f"opforge.{op}:") and name in str(info.value)


# --- keywords in any order -------------------------------------------------------------------


def _results(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("skip_check", [False, True])
@pytest.mark.parametrize("backend", [None, "cpu", "torch"])
@pytest.mark.parametrize("op", list(SPECS))
def test_keywords_in_any_order(op, backend, skip_check):
    spec = SPECS[op]
    args = spec.make()
    for name in OUTPUTS:
        args.pop(name, None)
    extra = {} if backend is None else {"backend": backend}
    expected = invoke(spec, args, **extra)
    for order in (list(reversed(args)), sorted(args), [*list(args)[1:], next(iter(args))]):
        got = spec.fn(**{k: args[k] for k in order}, **extra, skip_check=skip_check)
        for g, e in zip(_results(got), _results(expected)):
            assert torch.equal(g, e)


def test_keywords_in_any_order_example():
    x, w = torch.randn(ROWS, H), torch.randn(H)
    assert torch.equal(opforge.rmsnorm(eps=1e-6, weight=w, input=x), opforge.rmsnorm(x, w, 1e-6))
    assert torch.equal(opforge.scale(factor=2.0, x=x), x * 2)


# --- the DLPack capsule export (torch releases without the DLPack C exchange API) ------------


@pytest.fixture
def export_spy():
    """Rebinds the extension's bridge with a spy on the capsule export; yields ``bind(api)`` (api:
    the exchange API capsule or None) and the list of tensors exported through capsules."""
    exported = []

    def to_dlpack(t):
        exported.append(t)
        return torch._C._to_dlpack(t)

    def bind(api):
        _C.bind_torch(torch.Tensor, to_dlpack, api, _ext._version_bump(), torch._C.is_grad_enabled, _ext.cuda_stream)

    yield bind, exported
    _C.bind_torch(torch.Tensor, torch._C._to_dlpack, getattr(torch.Tensor, "__dlpack_c_exchange_api__", None),
                  _ext._version_bump(), torch._C.is_grad_enabled, _ext.cuda_stream)


@pytest.mark.skipif(not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"), reason="torch has no DLPack exchange API")
def test_exchange_api_is_used_where_torch_has_it(export_spy):
    bind, exported = export_spy
    bind(torch.Tensor.__dlpack_c_exchange_api__)
    opforge.rmsnorm(torch.randn(ROWS, H), torch.randn(H))
    assert exported == []


@pytest.mark.parametrize("case", [c.param() for c in COMPILED if any(
    w in c.what for w in ("storage", "negative", "meta", "dtype-float64", "wrong-shape", "overlaps", "expanded"))])
def test_capsule_export_refuses_bad_arguments(export_spy, case):
    bind, exported = export_spy
    bind(None)
    _run_case(case, skip_check=True)


@pytest.mark.parametrize("op", list(SPECS))
def test_capsule_export_computes_the_same(export_spy, op):
    spec = SPECS[op]
    args = spec.make()
    expected = invoke(spec, {**args, "out": None, **({"residual_out": None} if "residual_out" in args else {})})
    bind, exported = export_spy
    bind(None)
    got = invoke(spec, args)
    assert exported, "the capsule export was not used"
    for g, e in zip(_results(got), _results(expected)):
        assert torch.equal(g, e)


@pytest.mark.parametrize("problem", ["freed", "shrunk", "negative-bit", "requires-grad"])
@pytest.mark.parametrize("call", ["fused_add_rmsnorm", "scale"])
def test_an_in_place_call_checks_the_tensor_it_passes_twice(call, problem):
    """out=input (and residual_out=residual) reuse the first reading of that tensor object: its
    checks must still refuse what a separate out= would be refused for."""
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)
    bad = {"freed": _freed, "shrunk": _shrunk, "negative-bit": _negative_view,
           "requires-grad": lambda t: t.clone().requires_grad_()}[problem]
    words = {"freed": "storage", "shrunk": "storage", "negative-bit": "negative-bit", "requires-grad": "requires grad"}
    if call == "scale":
        x = bad(x)
        with pytest.raises(ValueError, match=words[problem]):
            opforge.scale(x, 2.0, out=x)
        return
    for which in ("input", "residual"):
        a, b = (bad(x), r.clone()) if which == "input" else (x.clone(), bad(r))
        with pytest.raises(ValueError, match=words[problem]) as info:
            opforge.fused_add_rmsnorm(a, b, w, 1e-6, out=a, residual_out=b)
        assert which in str(info.value)


def test_an_in_place_call_gives_what_separate_outputs_give():
    x, r, w = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64)
    want_out, want_res = opforge.fused_add_rmsnorm(x, r, w, 1e-6)
    a, b = x.clone(), r.clone()
    got_out, got_res = opforge.fused_add_rmsnorm(a, b, w, 1e-6, out=a, residual_out=b)
    assert got_out is a and got_res is b
    assert torch.equal(got_out, want_out) and torch.equal(got_res, want_res)
    y = x.clone()
    assert opforge.scale(y, 3.0, out=y) is y and torch.equal(y, opforge.scale(x, 3.0))


class _Liar(torch.Tensor):
    """A tensor subclass whose methods answer that all is well."""

    @property
    def requires_grad(self):
        return False

    def is_neg(self):
        return False

    def untyped_storage(self):
        return torch.UntypedStorage(1 << 20)

    def storage_offset(self):
        return 0


@pytest.mark.parametrize("problem", ["freed", "shrunk", "negative-bit", "requires-grad"])
def test_a_tensor_subclass_cannot_talk_its_way_past_the_checks(problem):
    """The binding asks torch's own Tensor methods about the storage, the negative bit and grad,
    not whatever a subclass puts in their place."""
    x, w = torch.randn(4, 8), torch.randn(8)
    bad = {"freed": _freed, "shrunk": _shrunk, "negative-bit": _negative_view,
           "requires-grad": lambda t: t.clone().requires_grad_()}[problem](x)
    liar = bad.as_subclass(_Liar)
    assert not liar.requires_grad and not liar.is_neg() and liar.untyped_storage().nbytes() == 1 << 20
    words = {"freed": "storage", "shrunk": "storage", "negative-bit": "negative-bit", "requires-grad": "requires grad"}
    for call in (lambda: opforge.rmsnorm(liar, w), lambda: opforge.rmsnorm(x.clone(), w, out=liar),
                 lambda: opforge.scale(liar, 2.0, skip_check=True)):
        with pytest.raises(ValueError, match=words[problem]):
            call()


@pytest.mark.gpu
def test_without_the_exchange_api_kernels_run_on_the_current_stream(export_spy):
    """Where torch has no DLPack exchange API the binding asks Python for the current stream: the
    kernel still runs after earlier work on a user stream (the input is written there after a
    long sleep, so a kernel launched on another stream would read zeros)."""
    bind, exported = export_spy
    bind(None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(64, 4096, device="cuda", generator=gen).bfloat16()
    w = torch.randn(4096, device="cuda", generator=gen).bfloat16()
    want = opforge.rmsnorm(x0, w, backend="torch")
    x = torch.empty_like(x0)
    got = written_late_on_a_side_stream(x, x0, lambda: opforge.rmsnorm(x, w))
    assert exported, "the capsule export was not used"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
