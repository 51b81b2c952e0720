"""The op template of every built-in op (one module per op family, named like the op's module)."""

import functools
import re
from typing import Optional

from ..schema import Definition
from ..template import DTYPE_SUFFIX
from . import activation, norm, scale

#: Every built-in template, by name prefix.
TEMPLATES = {t.name_prefix: t for t in (*norm.TEMPLATES, *activation.TEMPLATES, *scale.TEMPLATES)}


@functools.lru_cache(maxsize=None)
def definition_for_name(name: str) -> Optional[Definition]:
    """The Definition the op templates make under ``name`` (``rmsnorm_h64``,
    ``fused_add_rmsnorm_h4096_eps_f16``, ``silu_and_mul_d96``), or None when no built-in op call
    is ever named so. Cached and shared: copy it (``model_copy``) before changing it."""
    for prefix in sorted(TEMPLATES, key=len, reverse=True):  # gemma_rmsnorm before rmsnorm
        if not name.startswith(prefix + "_"):
            continue
        template = TEMPLATES[prefix]
        const = template.const_axes[0]  # every built-in template names one constant axis
        found = re.match(re.escape(template.axes[const].abbrev) + r"(\d+)", name[len(prefix) + 1:])
        if found is None:
            continue
        value = int(found.group(1))
        for dtype in DTYPE_SUFFIX:
            for options in ({}, *({option: True} for option in template.options)):
                try:
                    if template.name(dtype, **{const: value}, **options) == name:
                        return template.definition(dtype, **{const: value}, **options)
                except ValueError:  # a value the template refuses: not one of its names
                    continue
    return None


__all__ = ["TEMPLATES", "definition_for_name"]
