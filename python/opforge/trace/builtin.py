"""The built-in dataset: a Definition, a few Workloads and the builtin Solution (opforge's own
op) for every built-in op at common model sizes, shipped inside the wheel (opforge/data/builtin/, FlashInfer-Trace folder layout) and used
wherever no dataset path is given.

Regenerate the shipped files after changing a template:
    python -m opforge.trace.builtin --write python/opforge/data/builtin
(tests/trace/test_builtin_dataset.py fails while the shipped files differ from the templates).
"""

from __future__ import annotations

import argparse
import uuid
from importlib import resources
from pathlib import Path

from .schema import Definition
from .workload import RandomInput, ScalarInput, Workload
from .templates import TEMPLATES

HIDDEN_SIZES = (2048, 4096, 5120, 7168, 8192)
BATCH_SIZES = (1, 8, 64, 512, 8192)
DTYPE = "bfloat16"
#: Values of the scalar inputs in the shipped workloads.
SCALARS = {"eps": 1e-6, "factor": 0.5}
#: Workload uuids are derived from the definition and the axis values, so regenerating the
#: dataset gives byte-identical files.
_NAMESPACE = uuid.UUID("0b5c2f4e-8f1d-4c1e-9a57-6f7e2b1d3c90")


def builtin_definitions() -> list[Definition]:
    definitions = []
    for template in TEMPLATES.values():
        const = template.const_axes[0]  # every built-in template has one named constant axis
        for size in HIDDEN_SIZES:
            definitions.append(template.definition(dtype=DTYPE, **{const: size}))
    return definitions


def builtin_workloads(definition: Definition) -> list[Workload]:
    workloads = []
    for batch in BATCH_SIZES:
        inputs = {
            name: ScalarInput(value=SCALARS[name]) if spec.shape is None else RandomInput()
            for name, spec in definition.inputs.items()
        }
        key = f"{definition.name}/batch_size={batch}"
        workloads.append(
            Workload(uuid=str(uuid.uuid5(_NAMESPACE, key)), axes={"batch_size": batch}, inputs=inputs, seed=batch)
        )
    return workloads


def template_of(definition: Definition):
    """The template that generates ``definition`` (by name prefix), or None."""
    first = next((spec for spec in definition.inputs.values() if spec.shape is not None), None)
    dtype = first.dtype.value if first is not None else DTYPE
    for prefix in sorted(TEMPLATES, key=len, reverse=True):
        template = TEMPLATES[prefix]
        const = template.const_axes[0]
        axis = definition.axes.get(const)
        if axis is None or getattr(axis, "value", None) is None:
            continue
        for options in ({}, *({option: True} for option in template.options)):
            try:
                name = template.name(dtype, **{const: axis.value}, **options)
            except ValueError:  # a dtype no template name covers
                return None
            if definition.name == name:
                return template
    return None


def builtin_solution_for(definition: Definition):
    """The Solution that runs opforge's own op for ``definition`` (one of a template's names,
    ours or the public dataset's), or None when no built-in op computes it."""
    from ..registry.solutions import builtin_solution

    template = template_of(definition)
    if template is None:
        return None
    inputs = {key: template.param_of(key) for key in definition.inputs if template.param_of(key) != key}
    omitted = [key for key, spec in template.inputs.items() if key not in definition.inputs]
    # Public names bake eps into the reference; the op gets the same value as a constant.
    constants = {}
    if "eps" in omitted:
        from .templates.norm import public_eps

        constants["eps"] = public_eps(template.name_prefix, definition.axes["hidden_size"].value)
    # What the op returns, in order; None drops a value the Definition has no output for (the
    # public fused-add names have no residual_out).
    outputs = [key if key in definition.outputs else None for key in template.outputs]
    return builtin_solution(definition, template.name_prefix, inputs=inputs or None, constants=constants or None,
                            outputs=outputs)


def build_trace_set():
    from .traceset import TraceSet

    trace_set = TraceSet()
    for definition in builtin_definitions():
        trace_set.add_definition(definition)
        trace_set.add_solution(builtin_solution_for(definition))
        for workload in builtin_workloads(definition):
            trace_set.add_workload(definition.name, workload)
    return trace_set


def builtin_dataset_path() -> Path:
    """Where the shipped built-in dataset lives inside the installed package."""
    return Path(str(resources.files("opforge") / "data" / "builtin"))


def load_builtin_trace_set():
    """The shipped built-in dataset as a TraceSet (the default wherever no dataset is given)."""
    from .traceset import TraceSet

    return TraceSet.from_path(builtin_dataset_path(), strict=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="DIR", required=True, help="folder to write the dataset into")
    args = parser.parse_args(argv)
    build_trace_set().save_dataset(Path(args.write), overwrite=True)
    print(f"wrote {len(builtin_definitions())} definitions to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
