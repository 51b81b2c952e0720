"""Templates of the RMSNorm family.

Names that the public FlashInfer-Trace dataset already defines (``rmsnorm_h4096``,
``fused_add_rmsnorm_h7168``, ``gemma_rmsnorm_h2048``, ...) are generated exactly as published:
inputs ``hidden_states`` (+ ``residual``) and ``weight``, one output ``output``, eps fixed inside
the reference (1e-5 at hidden 4096, 1e-6 elsewhere), so solutions move between the two unchanged.
Every other name makes eps an explicit scalar input and, for the fused add, also declares the
updated residual as an output ``residual_out`` (which may be written in place of ``residual``).
"""

from __future__ import annotations

from ... import ops
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

#: Hidden sizes the public dataset defines, per name prefix.
PUBLIC_HIDDEN = {
    "rmsnorm": {128, 512, 1536, 2048, 2560, 2880, 3072, 3584, 4096, 5120, 5376, 6144, 7168, 8192, 16384},
    "fused_add_rmsnorm": {2048, 2560, 2880, 3072, 3584, 4096, 5120, 5376, 6144, 7168, 8192, 16384},
    "gemma_rmsnorm": {256, 2048},
    "gemma_fused_add_rmsnorm": {2048},
}


def public_eps(prefix: str, hidden: int) -> float | None:
    """The eps a public Definition bakes into its reference, or None for a name it lacks."""
    if hidden not in PUBLIC_HIDDEN[prefix]:
        return None
    return 1e-5 if hidden == 4096 and not prefix.startswith("gemma") else 1e-6


def _reference(prefix: str, add: bool, gemma: bool, public):
    def source(consts: dict) -> str:
        hidden = consts["hidden_size"]
        eps = public_eps(prefix, hidden) if public(consts) else None
        args = "hidden_states, residual, weight" if add else "hidden_states, weight"
        lines = ["import torch", "", "", "@torch.no_grad()"]
        lines.append(f"def run({args}{'' if eps is not None else ', eps'}):")
        lines.append(f"    assert hidden_states.shape[-1] == {hidden}")
        if eps is not None:
            lines.append(f"    eps = {eps!r}")
        lines.append("    x = hidden_states.to(torch.float32)" + (" + residual.to(torch.float32)" if add else ""))
        lines.append("    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)")
        scale = "(1.0 + weight.to(torch.float32))" if gemma else "weight.to(torch.float32)"
        lines.append(f"    y = (x * inv_rms) * {scale}")
        if add and eps is None:
            lines.append("    return y.to(hidden_states.dtype), x.to(hidden_states.dtype)")
        else:
            lines.append("    return y.to(hidden_states.dtype)")
        return "\n".join(lines) + "\n"

    return source


def _template(prefix: str, op, add: bool, gemma: bool, what: str) -> TraceTemplate:
    rows = ["batch_size", "hidden_size"]
    inputs = {"hidden_states": Tensor(rows, param="input")}
    if add:
        inputs["residual"] = Tensor(rows)
    inputs["weight"] = Tensor(["hidden_size"])
    inputs["eps"] = Scalar(description="added to the mean square before the reciprocal square root")
    outputs = {"output": Tensor(rows, param="out", dtype_from="hidden_states")}
    if add:
        outputs["residual_out"] = Tensor(rows, dtype_from="hidden_states",
                                         description="input + residual rounded to the dtype (the new residual)")

    def public(consts) -> bool:
        return public_eps(prefix, consts["hidden_size"]) is not None and not consts.get("eps_input")

    def suffix(consts) -> str:
        # A public size with eps as an input is a name of its own beside the public one.
        return "_eps" if consts.get("eps_input") and public_eps(prefix, consts["hidden_size"]) is not None else ""

    def description(consts) -> str:
        eps = public_eps(prefix, consts["hidden_size"]) if public(consts) else None
        fixed = f" Epsilon is fixed at {eps:g}." if eps is not None else " Epsilon is the scalar input eps."
        return f"{what} with hidden_size={consts['hidden_size']}.{fixed}"

    def omitted(consts) -> tuple:
        return ("eps", "residual_out") if public(consts) else ()

    def extras(consts) -> dict:
        # Public names stay exactly as published; ours say which outputs may overwrite inputs.
        if public(consts):
            return {}
        aliases = {"output": "hidden_states"}
        if add:
            aliases["residual_out"] = "residual"
        return {"aliases": aliases}

    return TraceTemplate(
        op_type="rmsnorm",
        name_prefix=prefix,
        op=op,
        axes={"batch_size": Var(), "hidden_size": Const(abbrev="h")},
        inputs=inputs,
        outputs=outputs,
        reference=_reference(prefix, add, gemma, public),
        description=description,
        tags=["status:verified", f"fi_api:opforge.{prefix}"] + (["fused"] if add else []),
        omit=omitted,
        extras=extras,
        options=("eps_input",),
        option_suffix=suffix,
    )


rmsnorm_template = _template("rmsnorm", ops.rmsnorm, add=False, gemma=False, what="Root Mean Square Normalization")
gemma_rmsnorm_template = _template("gemma_rmsnorm", ops.gemma_rmsnorm, add=False, gemma=True,
                                   what="Gemma-style RMSNorm ((1 + weight) scaling)")
fused_add_rmsnorm_template = _template("fused_add_rmsnorm", ops.fused_add_rmsnorm, add=True, gemma=False,
                                       what="Fused residual add + RMSNorm (the norm sees the unrounded fp32 sum)")
gemma_fused_add_rmsnorm_template = _template("gemma_fused_add_rmsnorm", ops.gemma_fused_add_rmsnorm, add=True,
                                             gemma=True, what="Gemma-style fused residual add + RMSNorm")

TEMPLATES = [rmsnorm_template, gemma_rmsnorm_template, fused_add_rmsnorm_template, gemma_fused_add_rmsnorm_template]
