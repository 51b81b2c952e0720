"""The op template of every built-in op (one module per op family, named like the op's module)."""

from . import activation, norm, scale

#: Every built-in template, by name prefix.
TEMPLATES = {t.name_prefix: t for t in (*norm.TEMPLATES, *activation.TEMPLATES, *scale.TEMPLATES)}

__all__ = ["TEMPLATES"]
