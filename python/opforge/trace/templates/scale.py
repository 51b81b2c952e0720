"""Template of scale: ``output = x * factor`` over rows of ``hidden_size`` (fp32 math)."""

from __future__ import annotations

from ... import ops
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

scale_template = TraceTemplate(
    op_type="elementwise",
    name_prefix="scale",
    op=ops.scale,
    axes={"batch_size": Var(), "hidden_size": Const(abbrev="h")},
    inputs={"x": Tensor(["batch_size", "hidden_size"]), "factor": Scalar()},
    outputs={"output": Tensor(["batch_size", "hidden_size"], param="out", dtype_from="x")},
    reference=lambda c: "\n".join([
        "import torch",
        "",
        "",
        "@torch.no_grad()",
        "def run(x, factor):",
        f"    assert x.shape[-1] == {c['hidden_size']}",
        "    return (x.to(torch.float32) * factor).to(x.dtype)",
    ]) + "\n",
    description=lambda c: f"Element-wise scale by a scalar factor, rows of hidden_size={c['hidden_size']}.",
    tags=["status:verified", "fi_api:opforge.scale"],
    extras=lambda c: {"aliases": {"output": "x"}},
)

TEMPLATES = [scale_template]
