"""The op table shared by the pytest benchmarks (bench_*.py) and roofline.py.

One OpSpec per public op says everything a benchmark needs to know about it:
how to build inputs, how to call opforge, the plain PyTorch formula (used as
the torch-eager peer, as the torch.compile target, and, applied to fp32
copies of the inputs, as the reference), the Liger-Kernel peer if any, and
the byte count.

Shapes are always (rows, hidden) where `hidden` is the width of each output
row: norms and scale read [rows, hidden]; act-and-mul reads [rows, 2*hidden].

Byte formulas count each input read once and each output written once
(R = rows, H = hidden, e = bytes per element):
  scale                          R*H in, R*H out          -> (2*R*H) * e
  rmsnorm, gemma_rmsnorm         x, w in, out             -> (2*R*H + H) * e
  fused_add_rmsnorm (+ gemma)    x, residual, w in;
                                 out, residual_out        -> (4*R*H + H) * e
  *_and_mul                      [R, 2H] in, [R, H] out   -> (3*R*H) * e
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F

EPS = 1e-6
SCALE_FACTOR = 1.7  # not 1.0, so an op that ignores the factor fails the check

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (rtol, atol) against the fp32 reference. bf16/fp16 allow about four roundings
# (peers round intermediates to the input dtype; opforge rounds once).
TOLERANCE = {
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (3e-3, 2e-3),
    torch.float32: (1e-4, 1e-4),
}


# ---------------------------------------------------------------------------
# Plain PyTorch formulas, written the way serving engines write their native
# fallbacks (vLLM's forward_native): norms in fp32, act-and-mul in the input
# dtype. On fp32 inputs each one is the fp32 reference.
# ---------------------------------------------------------------------------

def _rms(s: torch.Tensor, w: torch.Tensor, offset: float) -> torch.Tensor:
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * (w.float() + offset)


def rmsnorm_torch(x, w):
    return _rms(x.float(), w, 0.0).to(x.dtype)


def gemma_rmsnorm_torch(x, w):
    return _rms(x.float(), w, 1.0).to(x.dtype)


def fused_add_rmsnorm_torch(x, r, w):
    s = x.float() + r.float()  # the norm sees the unrounded sum
    return _rms(s, w, 0.0).to(x.dtype), s.to(x.dtype)


def gemma_fused_add_rmsnorm_torch(x, r, w):
    s = x.float() + r.float()
    return _rms(s, w, 1.0).to(x.dtype), s.to(x.dtype)


def silu_and_mul_torch(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_and_mul_torch(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def gelu_tanh_and_mul_torch(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def scale_torch(x):
    return x * SCALE_FACTOR


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str                      # opforge attribute name
    family: str                    # "norm" | "act" | "scale"
    inputs: tuple                  # input kinds, see input_shape()
    extra_args: tuple              # positional args after the tensors (eps, factor)
    out_names: tuple               # keyword names of the outputs, in return order
    formula: Callable              # plain PyTorch; eager peer, compile target, reference
    bytes: Callable[[int, int, int], int]  # (R, H, e) -> bytes moved
    bytes_formula: str             # the same, for humans and the JSON
    liger: Optional[str] = None    # key into liger_peers(), or None

    def opforge_call(self, inputs, outs=None, **kw):
        """Call the public opforge op with outs bound to its out= keywords."""
        import opforge

        if outs is not None:
            kw.update(zip(self.out_names, outs))
        return getattr(opforge, self.name)(*inputs, *self.extra_args, **kw)

    def bound_call(self, inputs, outs=None, **kw):
        """The public opforge op with its arguments (and outs, as its out= keywords) bound once:
        calling it costs what ``opforge.<op>(*inputs, ..., out=...)`` written out costs, which
        is what a host loop must time."""
        import opforge

        if outs is not None:
            kw.update(zip(self.out_names, outs))
        return functools.partial(getattr(opforge, self.name), *inputs, *self.extra_args, **kw)


def _norm_spec(name, formula, add):
    """A norm op: x (and residual) in, out (and residual_out) written, the weight read once."""
    rows = 4 if add else 2
    return OpSpec(name, inputs=("x", "r", "w") if add else ("x", "w"),
                  out_names=("out", "residual_out") if add else ("out",), formula=formula,
                  bytes=lambda R, H, e: (rows * R * H + H) * e, bytes_formula=f"({rows}*R*H + H)*e",
                  liger=name, family="norm", extra_args=(EPS,))

_ACT = dict(family="act", inputs=("x2",), extra_args=(), out_names=("out",),
            bytes=lambda R, H, e: 3 * R * H * e, bytes_formula="3*R*H*e")

SPECS = [
    _norm_spec("rmsnorm", rmsnorm_torch, add=False),
    _norm_spec("fused_add_rmsnorm", fused_add_rmsnorm_torch, add=True),
    _norm_spec("gemma_rmsnorm", gemma_rmsnorm_torch, add=False),
    _norm_spec("gemma_fused_add_rmsnorm", gemma_fused_add_rmsnorm_torch, add=True),
    OpSpec("silu_and_mul", formula=silu_and_mul_torch, liger="silu_and_mul", **_ACT),
    OpSpec("gelu_and_mul", formula=gelu_and_mul_torch, liger=None, **_ACT),
    OpSpec("gelu_tanh_and_mul", formula=gelu_tanh_and_mul_torch, liger="gelu_tanh_and_mul", **_ACT),
    OpSpec("scale", family="scale", inputs=("x",), extra_args=(SCALE_FACTOR,), out_names=("out",),
           formula=scale_torch, bytes=lambda R, H, e: 2 * R * H * e, bytes_formula="2*R*H*e"),
]
SPEC = {s.name: s for s in SPECS}


def specs_of(family: str):
    return [s for s in SPECS if s.family == family]


# ---------------------------------------------------------------------------
# Inputs, outputs, reference check
# ---------------------------------------------------------------------------

def input_shape(kind: str, rows: int, hidden: int):
    return {"x": (rows, hidden), "r": (rows, hidden), "w": (hidden,), "x2": (rows, 2 * hidden)}[kind]


def make_input_sets(spec: OpSpec, rows, hidden, dtype, device, n_sets=1, seed=0):
    """n_sets independent input tuples; each kind is one randn buffer sliced per set.

    One allocation per kind keeps thousands of tiny sets cheap; randn (never
    zeros) so unwritten outputs and wrong indexing show up.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    bufs = [torch.randn((n_sets, *input_shape(k, rows, hidden)), generator=gen,
                        device=device, dtype=torch.float32).to(dtype)
            for k in spec.inputs]
    return [tuple(b[i] for b in bufs) for i in range(n_sets)]


def make_outputs(spec: OpSpec, inputs, fill=None):
    """Preallocated out= tensors; fill=nan poisons them so unwritten elements fail."""
    x = inputs[0]
    shape = (*x.shape[:-1], x.shape[-1] // 2) if spec.family == "act" else x.shape
    outs = [torch.empty(shape, dtype=x.dtype, device=x.device) for _ in spec.out_names]
    if fill is not None:
        for o in outs:
            o.fill_(fill)
    return outs


#: Spacers shift the next small allocations by whole 512-byte steps up to 1 MiB: the address bits
#: that pick L2 slices, within the caching allocator's small-block segments. A one-block decode
#: kernel's time can depend on them (bench/results/2026-11-26_h200_2d9f597_decode_placement/).
SPACER_STEP = 512
SPACER_STEPS = 2048


def placed_copy(inputs, rng):
    """``(spacer, copies)``: a random-sized spacer allocation, then fresh copies of ``inputs``, so
    the copies land at another place in memory than the last ones (keep the spacer alive while
    the copies are used)."""
    spacer = torch.empty(rng.randrange(SPACER_STEPS) * SPACER_STEP, dtype=torch.uint8, device=inputs[0].device)
    return spacer, tuple(t.clone() for t in inputs)


def as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def reference(spec: OpSpec, inputs):
    """The formula on fp32 copies of the inputs: fp32 math, no intermediate rounding."""
    return as_tuple(spec.formula(*(t.float() for t in inputs)))


def check(spec: OpSpec, inputs, result, ref=None):
    """Return None when `result` matches the fp32 reference, else a short reason."""
    ref = reference(spec, inputs) if ref is None else ref
    outs = as_tuple(result)
    if len(outs) != len(ref):
        return f"expected {len(ref)} outputs, got {len(outs)}"
    rtol, atol = TOLERANCE[inputs[0].dtype]
    for name, o, r in zip(spec.out_names, outs, ref):
        if tuple(o.shape) != tuple(r.shape) or o.dtype != inputs[0].dtype:
            return f"{name}: got {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {inputs[0].dtype}"
        of = o.float()
        if not torch.isfinite(of).all():
            return f"{name}: non-finite values (unwritten output?)"
        err = (of - r).abs()
        bad = err > atol + rtol * r.abs()
        if bad.any():
            return f"{name}: {int(bad.sum())} elements off, max abs err {float(err.max()):.3g}"
    return None


# ---------------------------------------------------------------------------
# Liger-Kernel peers (Triton). Each entry: name -> (label, callable with the
# formula's signature). Missing package or failing import -> absent, with the
# reason kept so the report can say n/a and why.
# ---------------------------------------------------------------------------

def liger_peers():
    peers, errors = {}, {}

    def add(name, label, build):
        try:
            peers[name] = (label, build())
        except Exception as e:  # ImportError without triton/liger, or API drift
            errors[name] = f"{type(e).__name__}: {e}"[:200]

    def rms(offset, mode):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        # forward(X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None)
        return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, offset, mode)

    def fused(offset, mode):
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        # forward(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False) -> (Y, X + R)
        return lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, offset, mode)

    def silu():
        # Gate and up in one [..., 2d] tensor, like opforge's input: no copies.
        from liger_kernel.ops.swiglu import swiglu_fused_gate_up_forward
        return lambda x: swiglu_fused_gate_up_forward(x)[1]

    def gelu_tanh():
        # Liger has no one-tensor GEGLU: it takes the two halves, and its
        # ensure_contiguous wrapper copies each (that cost is counted).
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        def call(x):
            d = x.shape[-1] // 2
            return LigerGELUMulFunction.apply(x[..., :d], x[..., d:])
        return call

    add("rmsnorm", "liger", lambda: rms(0.0, "llama"))
    add("gemma_rmsnorm", "liger", lambda: rms(1.0, "gemma"))
    add("fused_add_rmsnorm", "liger", lambda: fused(0.0, "llama"))
    add("gemma_fused_add_rmsnorm", "liger", lambda: fused(1.0, "gemma"))
    add("silu_and_mul", "liger", silu)
    add("gelu_tanh_and_mul", "liger(halves)", gelu_tanh)
    return peers, errors
