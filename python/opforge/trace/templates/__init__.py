"""The op template of every built-in op (one module per op family, named like the op's module)."""

import functools
import re
from typing import Optional

from ..schema import Definition
from ..template import DTYPE_SUFFIX
from . import activation, norm, nvfp4, paged_decode_attention, scale

#: Every built-in template, by name prefix.
TEMPLATES = {t.name_prefix: t for t in (*norm.TEMPLATES, *activation.TEMPLATES, *scale.TEMPLATES,
                                        *nvfp4.TEMPLATES, *paged_decode_attention.TEMPLATES)}


def named_axes(template) -> list[str]:
    """The constant axes a template's names spell out (``hidden_size`` as h4096; M and K as
    m7168_k16384), in name order."""
    return [axis for axis in template.const_axes if template.axes[axis].abbrev]


@functools.lru_cache(maxsize=None)
def definition_for_name(name: str) -> Optional[Definition]:
    """The Definition the op templates make under ``name`` (``rmsnorm_h64``,
    ``fused_add_rmsnorm_h4096_eps_f16``, ``silu_and_mul_d96``, ``nvfp4_gemv_m4096_k7168``,
    ``gqa_paged_decode_h32_kv8_d128_ps1``), or
    None when no built-in op call is ever named so. Cached and shared: copy it (``model_copy``)
    before changing it."""
    for prefix in sorted(TEMPLATES, key=len, reverse=True):  # gemma_rmsnorm before rmsnorm
        if not name.startswith(prefix + "_"):
            continue
        template = TEMPLATES[prefix]
        axes = named_axes(template)
        pattern = "_".join(re.escape(template.axes[axis].abbrev) + r"(\d+)" for axis in axes)
        found = re.match(pattern, name[len(prefix) + 1:])
        if found is None:
            continue
        consts = {axis: int(value) for axis, value in zip(axes, found.groups())}
        for dtype in DTYPE_SUFFIX:
            for options in ({}, *({option: True} for option in template.options)):
                try:
                    if template.name(dtype, **consts, **options) == name:
                        return template.definition(dtype, **consts, **options)
                except ValueError:  # a value the template refuses: not one of its names
                    continue
    return None


__all__ = ["TEMPLATES", "definition_for_name", "named_axes"]
