"""apply: route each call to the fastest solution a dataset measured for its Definition.

    handle = opforge.enable_apply("./my-traces", opforge.ApplyConfig(ahead_of_time=True))

    @opforge.apply("fused_add_rmsnorm_h4096")       # the body is the fallback
    def fused_add_rmsnorm(hidden_states, residual, weight): ...

    out = opforge.apply("rmsnorm_h64", args=(x, w, 1e-6), fallback=my_rmsnorm)   # imperative
    handle.close()                                   # or: with opforge.enable_apply(...):

OPFORGE_ENABLE_APPLY=1 does the same at ``import opforge`` for $OPFORGE_DATASET_PATH.

opforge's own ops (rmsnorm, fused_add_rmsnorm, silu_and_mul, ...) consult apply too: a call
goes to a contributed solution exactly where that solution measured faster than opforge's
kernel on this hardware, for the call's own Definition (hidden size, dtype and constants such as
a public Definition's eps all match; the call's name says them, trace.calls). Where opforge's
kernel won, or nothing was measured, the op runs directly. ``out=`` and in-place contracts hold
whichever solution serves. Calls that name a backend explicitly run that backend.

Choice per call: the fastest solution measured on the call's workload (its variable axis
values), else on its bucket (powers of two by default, the nearest measured one if its own was
never measured), else the Definition's overall best, else the fallback. Only PASSED traces
from this hardware with believable timings count (ApplyConfig.hardware_fallback lets a
Definition measured only elsewhere use another machine's). A solution that fails to build or
raises is reported once (ApplyWarning) and the next choice serves; the model keeps running.

Under torch.compile opforge's ops bypass apply (they compile as themselves) and @apply
functions run their fallback. During CUDA-graph capture nothing is built: enable with
``ApplyConfig(ahead_of_time=True)`` and warm up before capturing.

``opforge.apply`` is both this package and the function: the package's module object is
callable (it forwards to ``apply``), because importing a subpackage makes Python set the parent
attribute to the module, which would otherwise shadow the function.
"""

import sys
import types

from .api import ApplyHandle, apply, disable_apply, enable_apply, enable_apply_from_environment, load_dataset
from .config import ApplyConfig, power_of_two_bucket
from .matching import hardware_name
from .router import ApplyWarning
from .tables import TraceCounts

__all__ = [
    "ApplyConfig",
    "ApplyHandle",
    "ApplyWarning",
    "TraceCounts",
    "apply",
    "disable_apply",
    "enable_apply",
    "enable_apply_from_environment",
    "hardware_name",
    "load_dataset",
    "power_of_two_bucket",
]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return apply(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
