"""opforge's own ahead-of-time compiled ops as solutions, run by calling the op directly.

Two records name one: the python file opforge generates (``main.py::run``, recognised only when
it is exactly that file; opforge.trace.own_op) and the older ``builtin`` record (a JSON adapter,
``builtin.json::<op>``), which is turned into the former first. Either way the solution's
source is never imported: the call it describes is checked against the Definition and the
op's signature, and the op is called with the Definition's inputs under the op's parameter
names, the constants, and its results put in the Definition's order, as the generated file
does. Value-returning; they run wherever this opforge build runs: CPU, and the GPUs its
CUDA_ARCH_LIST covers (checked before anything runs).
"""

from __future__ import annotations

from typing import Optional

from ...trace.own_op import AdapterError, OwnOp, check_own_op, is_legacy, legacy_adapter, read_own_op, resolve_own_op
from ..checks import POSITIONAL
from ..errors import ENTRY_POINT_ERROR, SIGNATURE_ERROR, UNSUPPORTED, BuildError
from . import Loaded


def _build_error(solution, exc: AdapterError) -> BuildError:
    return BuildError(ENTRY_POINT_ERROR if exc.entry else SIGNATURE_ERROR, solution.name, str(exc))


def own_op_of(solution, definition) -> Optional[OwnOp]:
    """The own-op call ``solution`` makes for ``definition``, checked; None for any other
    solution. BuildError for a legacy record or a recognised file that cannot make it."""
    try:
        if is_legacy(solution):
            op, adapter = legacy_adapter(solution)
            return resolve_own_op(definition, op, adapter.get("inputs"), adapter.get("constants"),
                                  adapter.get("outputs"))
        own = read_own_op(solution)
        if own is not None:
            check_own_op(own, definition)
        return own
    except AdapterError as exc:
        raise _build_error(solution, exc) from None


def check_device(solution, device) -> None:
    """An own op runs on CPU always, on a GPU only when this build has code for it."""
    if device.kind != "cuda":
        return
    from ... import _ext

    problem = _ext.arch_problem(device.index)
    if problem is not None:
        raise BuildError(UNSUPPORTED, solution.name, f"opforge's own ops cannot run here: {problem}")


def load(solution, own: OwnOp) -> Loaded:
    from ... import ops

    op = getattr(ops, own.op)
    symbol = own.op
    outputs = list(own.outputs)
    # (op parameter, position among the Definition's inputs) of each input the op takes.
    taken = [(param, i) for i, param in enumerate(own.inputs.values()) if param is not None]
    constants = dict(own.constants)
    order = [outputs.index(n) for n in own.returns]

    def call(*args):
        kwargs = {param: args[i] for param, i in taken}
        result = op(**kwargs, **constants)
        values = result if isinstance(result, tuple) else (result,)
        if len(values) != len(outputs):
            raise ValueError(f"solution {solution.name!r}: opforge.{symbol} returned {len(values)} value(s); "
                             f"its adapter lists {len(outputs)}: {outputs}")
        picked = tuple(values[i] for i in order)
        return picked[0] if len(picked) == 1 else picked

    call.__name__ = f"builtin_{symbol}"
    return Loaded(call, calling=POSITIONAL)
