"""Correctness checks a solution cannot talk its way past.

``check_call`` runs one call and judges it against reference outputs:
- destination-passing outputs are poisoned first (NaN, or the dtype's largest integer), so an
  element the solution never writes cannot pass by accident;
- every tensor input is compared bit for bit with a copy taken before the call; changing an
  input fails the call unless the Definition lets an output live in that input (``aliases``)
  and the change is that output;
- a returned output that shares memory with an input (not allowed by ``aliases``) or with
  another output fails;
- shapes and dtypes must match exactly; values must satisfy ``|got - ref| <= atol + rtol·|ref|``
  elementwise (per-output tolerances from the Definition, else DEFAULT_TOLERANCES), NaN only
  where the reference has NaN and infinities only where it has the same infinity.
The max absolute / relative errors and the fraction of elements within tolerance are recorded.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..trace import Correctness, EvaluationStatus

#: (atol, rtol) by output dtype when the Definition declares no tolerance for an output.
DEFAULT_TOLERANCES = {
    "float32": (1e-5, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "float8_e4m3fn": (0.125, 0.125),
    "float8_e5m2": (0.25, 0.25),
}


@dataclass
class Check:
    status: EvaluationStatus
    correctness: Optional[Correctness] = None
    log: str = ""

    def __post_init__(self):
        # A Trace needs errors for INCORRECT_NUMERICAL; a call judged wrong before any value
        # was compared (it changed an input, its outputs overlap) has none to give.
        if self.status == EvaluationStatus.INCORRECT_NUMERICAL and self.correctness is None:
            self.correctness = Correctness(max_relative_error=float("nan"), max_absolute_error=float("nan"))

    @property
    def passed(self) -> bool:
        return self.status == EvaluationStatus.PASSED


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included), on the tensors' own device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    as_int = _SAME_SIZE_INT.get(a.element_size())
    if as_int is None or a.is_complex():
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def poisoned_like_spec(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An output buffer full of values no correct kernel leaves behind."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).max, dtype=dtype, device=device)


def _tolerance(definition, name: str) -> tuple[float, float]:
    tol = definition.tolerance(name)
    if tol is not None:
        return tol.atol, tol.rtol
    return DEFAULT_TOLERANCES.get(definition.outputs[name].dtype.value, (0.0, 0.0))


def compare_outputs(definition, got, want, *, tolerance: Optional[tuple[float, float]] = None) -> Check:
    """Judge outputs (a tensor or a tuple in the Definition's output order) against the reference's."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    names = list(definition.outputs)
    if len(got) != len(names):
        return Check(EvaluationStatus.INCORRECT_SHAPE, log=f"returned {len(got)} output(s); expected {len(names)}: {names}")
    max_abs = max_rel = 0.0
    fractions = {}
    failures = []
    for name, g, w in zip(names, got, want):
        if not isinstance(g, torch.Tensor):
            # A worker sends a non-tensor output as its type's name.
            what = g if isinstance(g, str) else type(g).__name__
            return Check(EvaluationStatus.INCORRECT_SHAPE, log=f"{name}: returned {what}, not a tensor")
        if tuple(g.shape) != tuple(w.shape):
            return Check(EvaluationStatus.INCORRECT_SHAPE, log=f"{name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
        if g.dtype != w.dtype:
            return Check(EvaluationStatus.INCORRECT_DTYPE, log=f"{name}: dtype {g.dtype}, expected {w.dtype}")
        atol, rtol = tolerance if tolerance is not None else _tolerance(definition, name)
        # In fp64 where the reference lives (a GPU compares 100M-element outputs in milliseconds).
        g64, w64 = g.detach().to(w.device, torch.float64), w.detach().to(torch.float64)
        both_nan = torch.isnan(g64) & torch.isnan(w64)
        same_inf = torch.isinf(w64) & (g64 == w64)
        finite = torch.isfinite(g64) & torch.isfinite(w64)
        diff = torch.where(finite, (g64 - w64).abs(), torch.zeros_like(g64))
        within = both_nan | same_inf | (finite & (diff <= atol + rtol * w64.abs()))
        bad_special = ~(both_nan | same_inf | finite)  # NaN or inf where the reference has none
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            rel = diff / w64.abs().clamp_min(torch.finfo(torch.float32).tiny)
            max_rel = max(max_rel, float(torch.where(finite, rel, torch.zeros_like(rel)).max()))
        if bad_special.any():
            max_abs = max_rel = float("nan")
        fractions[name] = float(within.double().mean()) if within.numel() else 1.0
        if not bool(within.all()):
            count = int((~within).sum())
            failures.append(f"{name}: {count} of {within.numel()} elements outside atol={atol:g}, rtol={rtol:g}"
                            + (" (NaN/inf where the reference has none)" if bad_special.any() else ""))
    correctness = Correctness(max_relative_error=max_rel, max_absolute_error=max_abs,
                              extra={"fraction_within_tolerance": fractions})
    if failures:
        return Check(EvaluationStatus.INCORRECT_NUMERICAL, correctness, "; ".join(failures))
    return Check(EvaluationStatus.PASSED, correctness)


@dataclass
class CallRecord:
    """What one call did, as seen next to it: the outputs (a tuple), the inputs it changed, which
    outputs share memory with an input or an earlier output, and the error if the call raised.
    The runner makes these in its worker processes and judges them in the parent (``judge``),
    which alone holds the reference outputs."""

    outputs: Optional[tuple] = None
    changed: list = field(default_factory=list)  # names of inputs whose bits changed
    shared: list = field(default_factory=list)  # (output name, "input"|"output", other name)
    error: Optional[str] = None

    def to_wire(self) -> dict:
        """Plain data and CPU tensors for the runner (see _wire); an output that is not a
        tensor travels as its type's name."""
        outputs = None if self.outputs is None else tuple(
            o.detach().cpu() if isinstance(o, torch.Tensor) else type(o).__qualname__ for o in self.outputs)
        return {"outputs": outputs, "changed": list(self.changed), "shared": [list(s) for s in self.shared],
                "error": self.error}

    @classmethod
    def from_wire(cls, data) -> "CallRecord":
        """The record a worker sent, checked field by field: ValueError for anything a real
        worker does not send (the runner makes that the solution's failure)."""
        if not isinstance(data, dict) or set(data) != {"outputs", "changed", "shared", "error"}:
            raise ValueError(f"not a call record: {str(data)[:200]}")
        outputs, changed, shared, error = data["outputs"], data["changed"], data["shared"], data["error"]
        if outputs is not None and not (isinstance(outputs, tuple)
                                        and all(isinstance(o, (torch.Tensor, str)) for o in outputs)):
            raise ValueError("call record: outputs must be a tuple of tensors or type names")
        if not (isinstance(changed, list) and all(isinstance(n, str) for n in changed)):
            raise ValueError("call record: changed must be a list of input names")
        if not (isinstance(shared, list) and all(isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) for x in s)
                                                 for s in shared)):
            raise ValueError("call record: shared must be a list of (output, kind, name)")
        if error is not None and not isinstance(error, str):
            raise ValueError("call record: error must be text")
        return cls(outputs, changed, [tuple(s) for s in shared], error)


def run_call(fn: Callable, definition, inputs: list, *, outputs: Optional[list] = None) -> CallRecord:
    """Call ``fn`` on ``inputs`` (Definition order). With ``outputs`` (destination passing) they
    are poisoned first and ``fn(*inputs, *outputs)`` fills them."""
    input_names = list(definition.inputs)
    output_names = list(definition.outputs)
    tensors_in = {n: v for n, v in zip(input_names, inputs) if isinstance(v, torch.Tensor)}
    before = {n: v.clone() for n, v in tensors_in.items()}
    try:
        if outputs is not None:
            for o in outputs:
                o.copy_(poisoned_like_spec(o.shape, o.dtype, o.device))
            fn(*inputs, *outputs)
            got = tuple(outputs)
        else:
            got = fn(*inputs)
            got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if any(v.is_cuda for v in tensors_in.values()):
            torch.cuda.synchronize()
    except Exception as exc:  # the solution's failure is the result
        tail = "".join(traceback.format_exception(exc)[-6:])
        return CallRecord(error=f"{type(exc).__name__}: {exc}\n{tail}")
    shared = []
    for oi, (oname, out) in enumerate(zip(output_names, got)):
        if not isinstance(out, torch.Tensor):
            continue
        shared += [(oname, "input", iname) for iname, tin in tensors_in.items() if _shares_memory(out, tin)]
        shared += [(oname, "output", other_name) for other_name, other in zip(output_names[oi + 1:], got[oi + 1:])
                   if isinstance(other, torch.Tensor) and _shares_memory(out, other)]
    changed = [n for n, v in tensors_in.items() if not _same_bits(v, before[n])]
    return CallRecord(got, changed, shared)


def judge(definition, record: CallRecord, reference_outputs, *, tolerance: Optional[tuple[float, float]] = None) -> Check:
    """The verdict on a CallRecord (see the module doc); ``tolerance`` (atol, rtol) overrides
    the Definition's for every output."""
    if record.error is not None:
        return Check(EvaluationStatus.RUNTIME_ERROR, log=record.error)
    aliases = definition.aliases or {}
    written_into = set()
    for oname, kind, other in record.shared:
        if kind == "output":
            return Check(EvaluationStatus.INCORRECT_NUMERICAL, log=f"outputs {oname} and {other} share memory")
        if aliases.get(oname) != other:
            return Check(EvaluationStatus.INCORRECT_NUMERICAL, log=f"output {oname} shares memory with input {other}")
        written_into.add(other)
    # Inputs an output was (legitimately) written into may change; no other input may.
    for iname in record.changed:
        if iname not in written_into:
            return Check(EvaluationStatus.INCORRECT_NUMERICAL, log=f"the solution modified its input {iname}")
    return compare_outputs(definition, record.outputs, reference_outputs, tolerance=tolerance)


def check_call(fn: Callable, definition, inputs: list, reference_outputs, *,
               destination_passing: bool = False, tolerance: Optional[tuple[float, float]] = None) -> Check:
    """Call ``fn`` on ``inputs`` (Definition order) and judge it (see the module doc). For
    destination passing, ``fn(*inputs, *outputs)`` fills poisoned outputs allocated here."""
    want = reference_outputs if isinstance(reference_outputs, tuple) else (reference_outputs,)
    outputs = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in want] if destination_passing else None
    return judge(definition, run_call(fn, definition, inputs, outputs=outputs), want, tolerance=tolerance)
