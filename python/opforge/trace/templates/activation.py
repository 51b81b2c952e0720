"""Templates of the gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.

input ``[batch_size, 2 * intermediate_size]`` holds ``[x, gate]``; output
``[batch_size, intermediate_size]`` is ``act(x) * gate`` (fp32 math, rounded once).
"""

from __future__ import annotations

from ... import ops
from ..template import Const, Tensor, TraceTemplate, Var

_FORMULAS = {
    "silu": "torch.nn.functional.silu(x)",
    "gelu": "torch.nn.functional.gelu(x)",
    "gelu_tanh": "torch.nn.functional.gelu(x, approximate='tanh')",
}


def _reference(activation: str):
    def source(consts: dict) -> str:
        d = consts["intermediate_size"]
        return "\n".join([
            "import torch",
            "",
            "",
            "@torch.no_grad()",
            "def run(input):",
            f"    assert input.shape[-1] == {2 * d}",
            f"    x = input[..., :{d}].to(torch.float32)",
            f"    gate = input[..., {d}:].to(torch.float32)",
            f"    return ({_FORMULAS[activation]} * gate).to(input.dtype)",
        ]) + "\n"

    return source


def _derive(values: dict) -> dict:
    if "intermediate_size" in values:
        return {"gated_size": 2 * values["intermediate_size"]}
    if "gated_size" in values:
        return {"intermediate_size": values["gated_size"] // 2}
    return {}


def _template(activation: str, op) -> TraceTemplate:
    name = f"{activation}_and_mul"
    return TraceTemplate(
        op_type="activation",
        name_prefix=name,
        op=op,
        axes={"batch_size": Var(), "intermediate_size": Const(abbrev="d"), "gated_size": Const(abbrev="")},
        inputs={"input": Tensor(["batch_size", "gated_size"], description="[x, gate], 2 * intermediate_size wide")},
        outputs={"output": Tensor(["batch_size", "intermediate_size"], param="out", dtype_from="input")},
        reference=_reference(activation),
        description=lambda c: f"{name}: act(x) * gate for intermediate_size={c['intermediate_size']}.",
        tags=["status:verified", f"fi_api:opforge.{name}", "fused"],
        derive=_derive,
        extras=lambda c: {"constraints": ["gated_size == 2 * intermediate_size"]},
    )


silu_and_mul_template = _template("silu", ops.silu_and_mul)
gelu_and_mul_template = _template("gelu", ops.gelu_and_mul)
gelu_tanh_and_mul_template = _template("gelu_tanh", ops.gelu_tanh_and_mul)

TEMPLATES = [silu_and_mul_template, gelu_and_mul_template, gelu_tanh_and_mul_template]
