"""The one-tuple convention: an entry with exactly one parameter (``def kernel(data: input_t) ->
output_t``) gets the Definition's values as one tuple, inputs then outputs for
destination-passing style; registries carry the defaults a seed-style registration leaves out."""

from __future__ import annotations

import pytest
import torch
from torch.utils.dlpack import from_dlpack

from opforge.registry import SIGNATURE_ERROR, BuildError, Registry, build, register_solution
from opforge.trace import AxisConst, AxisVar, Definition, TensorSpec
from registry_helpers import cache, mul_definition, solution  # noqa: F401 (cache is a fixture)


def _inputs(rows: int = 3):
    return torch.randn(rows, 8), torch.randn(8)


def _dps_registry(definition="mul_h8") -> Registry:
    return Registry(definition=definition, destination_passing_style=True)


def test_destination_passing_tuple_is_inputs_then_outputs():
    seen = []

    def kernel(data):
        seen.append(data)
        x, w, y = data
        torch.mul(x, w, out=y)
        return y

    reg = _dps_registry()
    reg.register("tuple_dps", kernel, "seed style", "pytorch")
    run = reg.build("tuple_dps", mul_definition(), "cpu")
    assert run.calling == "tuple" and run.destination_passing_style and not run.by_name
    x, w = _inputs()
    out = run(x, w)
    torch.testing.assert_close(out, x * w)
    assert type(seen[0]) is tuple and len(seen[0]) == 3
    assert seen[0][0] is x and seen[0][1] is w and seen[0][2] is out  # the buffer it filled is what comes back

    y = torch.full((3, 8), float("nan"))
    assert run.call_into(x, w, y) is None
    torch.testing.assert_close(y, x * w)
    assert seen[1][2] is y  # the caller's buffer, not a copy


@pytest.mark.parametrize("ret", ["None", "outputs", "list", "dict", "dlpack"])
def test_destination_passing_tuple_may_return_its_outputs_or_none(ret):
    def kernel(data):
        x, w, y, z = data
        torch.mul(x, w, out=y)
        torch.add(x, w, out=z)
        return {"None": None, "outputs": (y, z), "list": [y, z], "dict": {"z": z, "y": y},
                # the same memory back through DLPack, as a compiled extension hands it back
                "dlpack": (from_dlpack(y), from_dlpack(z))}[ret]

    two = mul_definition("mul2_h8", outputs=("y", "z"))
    reg = _dps_registry("mul2_h8")
    reg.register("two_outputs", kernel)
    x, w = _inputs(rows=5)
    y, z = reg.build("two_outputs", two, "cpu")(x, w)
    torch.testing.assert_close(y, x * w)
    torch.testing.assert_close(z, x + w)


@pytest.mark.parametrize("ret", ["new", "swapped", "short", "input"])
def test_destination_passing_tuple_returning_other_values_is_an_error(ret):
    """A kernel that computes into a new tensor and returns it has left its output unwritten:
    that is said at the call, not found later as garbage in the buffer."""
    def kernel(data):
        x, w, y, z = data
        torch.mul(x, w, out=y)
        torch.add(x, w, out=z)
        return {"new": (x * w, z), "swapped": (z, y), "short": y, "input": (x, z)}[ret]

    reg = _dps_registry("mul2_h8")
    reg.register("bad_return", kernel)
    run = reg.build("bad_return", mul_definition("mul2_h8", outputs=("y", "z")), "cpu")
    x, w = _inputs()
    with pytest.raises(ValueError, match="'bad_return': returned a value that is not its output y, z"):
        run(x, w)
    with pytest.raises(ValueError, match="not its output y, z"):
        run.call_into(x, w, torch.empty(3, 8), torch.empty(3, 8))


@pytest.mark.parametrize("ret", ["tensor", "tuple", "dict"])
def test_value_returning_tuple_is_the_inputs(ret):
    seen = []

    def kernel(data):
        seen.append(data)
        x, w = data
        y = x * w
        return {"tensor": y, "tuple": (y,), "dict": {"y": y}}[ret]

    reg = Registry(definition="mul_h8")
    reg.register("tuple_value", kernel, "value-returning", "pytorch")
    run = reg.build("tuple_value", mul_definition(), "cpu")
    assert run.calling == "tuple" and not run.destination_passing_style
    x, w = _inputs()
    torch.testing.assert_close(run(x, w), x * w)
    torch.testing.assert_close(run(w=w, x=x), x * w)  # the Definition's order, whatever the call's
    assert type(seen[-1]) is tuple and seen[-1][0] is x and seen[-1][1] is w


def test_tuple_entry_from_sources(cache):
    """The python builder: a Solution whose entry takes one annotated parameter."""
    src = '''
        import torch

        input_t = tuple
        output_t = torch.Tensor

        def kernel(data: input_t) -> output_t:
            x, w, y = data
            return torch.mul(x, w, out=y)
    '''
    run = build(solution("tuple_src", src, entry="kernel.py::kernel", dps=True), mul_definition(), "cpu")
    assert run.calling == "tuple"
    x, w = _inputs(rows=4)
    torch.testing.assert_close(run(x, w), x * w)


def _one_input_definition() -> Definition:
    return Definition(name="neg_h8", op_type="neg", axes={"rows": AxisVar(), "hidden": AxisConst(value=8)},
                      inputs={"x": TensorSpec(shape=["rows", "hidden"], dtype="float32")},
                      outputs={"y": TensorSpec(shape=["rows", "hidden"], dtype="float32")},
                      reference="def run(x):\n    return -x\n")


def test_one_input_value_returning_gets_the_tensor_itself():
    # One value to pass: one parameter takes it as it always has (a one-tuple would break
    # every plain kernel of a one-input Definition).
    reg = Registry(definition="neg_h8")
    reg.register("neg", lambda data: -data)
    run = reg.build("neg", _one_input_definition(), "cpu")
    assert run.calling == "positional"
    x = torch.randn(2, 8)
    torch.testing.assert_close(run(x), -x)


def test_one_input_destination_passing_gets_a_tuple():
    def kernel(data):
        x, y = data
        torch.neg(x, out=y)

    reg = _dps_registry("neg_h8")
    reg.register("neg_dps", kernel)
    run = reg.build("neg_dps", _one_input_definition(), "cpu")
    assert run.calling == "tuple"
    x = torch.randn(6, 8)
    torch.testing.assert_close(run(x), -x)


@pytest.mark.parametrize("fn, calling", [
    (lambda data, *rest: data * rest[0], "positional"),  # *args: takes the values one by one
    (lambda x, w: x * w, "by_name"),
    (lambda a, b: a * b, "positional"),
])
def test_only_a_single_parameter_means_a_tuple(fn, calling):
    reg = Registry(definition="mul_h8")
    reg.register("fn", fn)
    run = reg.build("fn", mul_definition(), "cpu")
    assert run.calling == calling
    x, w = _inputs()
    torch.testing.assert_close(run(x, w), x * w)


def test_single_parameter_with_required_keyword_is_refused():
    def kernel(data, *, block):
        return data[0]

    reg = Registry(definition="mul_h8")
    reg.register("kw", kernel)
    with pytest.raises(BuildError, match=r"required keyword-only parameter\(s\) block") as info:
        reg.build("kw", mul_definition(), "cpu")
    assert info.value.kind == SIGNATURE_ERROR


# --- registries: the defaults a seed-style registration leaves out ----------------------------


def test_registry_defaults_and_overrides():
    reg = _dps_registry()
    dps = reg.register("dps_by_default", lambda data: None)
    assert dps.definition == "mul_h8" and dps.spec.destination_passing_style
    value = reg.register("value", lambda data: data[0] * data[1], destination_passing_style=False)
    assert not value.spec.destination_passing_style
    plain = Registry(definition="mul_h8").register("plain", lambda x, w: x * w)
    assert not plain.spec.destination_passing_style  # a registry's default is value-returning


def test_with_defaults_shares_the_solutions():
    base = Registry()
    task = base.with_defaults(definition="mul_h8", destination_passing_style=True)
    task.register("in_task", lambda data: None, "from the task's registry", "pytorch")
    base.register("in_base", lambda x, w: x * w, definition="mul_h8")
    assert base.names() == task.names() == ["in_task", "in_base"]
    assert base.get("in_task").spec.destination_passing_style and base.get("in_task").definition == "mul_h8"
    assert not base.get("in_base").spec.destination_passing_style
    assert base.definition is None and not base.destination_passing_style  # the base keeps its own defaults
    again = task.with_defaults(destination_passing_style=False)
    assert again.definition == "mul_h8" and not again.destination_passing_style
    base.unregister("in_task")
    assert "in_task" not in task


def test_decorator_takes_the_registry_defaults():
    reg = _dps_registry()

    @register_solution(registry=reg)
    def decorated(data):
        x, w, y = data
        torch.mul(x, w, out=y)
        return y

    @register_solution(registry=reg, destination_passing_style=False)
    def decorated_value(data):
        return data[0] * data[1]

    assert reg.get("decorated").spec.destination_passing_style and reg.get("decorated").definition == "mul_h8"
    x, w = _inputs()
    for name in ("decorated", "decorated_value"):
        torch.testing.assert_close(reg.build(name, mul_definition(), "cpu")(x, w), x * w)
