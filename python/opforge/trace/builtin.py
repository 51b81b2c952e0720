"""The built-in dataset: a Definition, a few Workloads and the builtin Solution (opforge's own
op) for every built-in op at common model sizes, plus the kernels opforge ships in other
languages (opforge.solutions), shipped inside the wheel (opforge/data/builtin/,
FlashInfer-Trace folder layout) and used wherever no dataset path is given.

Regenerate the shipped files after changing a template:
    python -m opforge.trace.builtin --write python/opforge/data/builtin
(tests/trace/test_builtin_dataset.py fails while the shipped files differ from the templates).
"""

from __future__ import annotations

import argparse
import inspect
import math
import uuid
import zlib
from importlib import resources
from pathlib import Path

from .schema import Definition
from .workload import RandomInput, ScalarInput, Workload
from .templates import TEMPLATES, named_axes

HIDDEN_SIZES = (2048, 4096, 5120, 7168, 8192)
BATCH_SIZES = (1, 8, 64, 512, 8192)
#: NVFP4 GEMV (M, K): the task's speed shapes (7168 x 16384, 4096 x 7168, 7168 x 2048), small M
#: (DeepSeek-V3's router is 256 x 7168) and an M that is no multiple of 128 (gpt-oss's 2880).
NVFP4_GEMV_SHAPES = ((7168, 16384), (4096, 7168), (7168, 2048), (128, 7168), (256, 7168), (2880, 4096))
NVFP4_GEMV_BATCHES = (1, 4, 8)
#: Paged GQA decode (num_qo_heads, num_kv_heads, head_dim, page_size): the FlashInfer-Trace names
#: of Llama-3.1-8B (h32_kv8), Llama-3.1-70B and Qwen shards (h32_kv4, h16_kv2), Mixtral 8x22B
#: (h48_kv8) and h24_kv8.
PAGED_DECODE_SHAPES = ((32, 8, 128, 1), (32, 4, 128, 1), (32, 8, 128, 64), (32, 4, 128, 64), (16, 2, 128, 64),
                       (24, 8, 128, 64), (48, 8, 128, 1))
#: Their workloads: (batch, tokens per request on average). The runner cuts kv_indptr at random
#: points, so lengths vary inside a batch and a request may be empty.
PAGED_DECODE_MIXES = ((1, 512), (1, 8192), (8, 2048), (32, 1024), (64, 512), (128, 256))
#: Per template (by name prefix) whose sizes are not HIDDEN_SIZES x BATCH_SIZES: the constant
#: axes of its Definitions and the values of the variable axis of their workloads (or, for
#: templates in WORKLOAD_AXES, what that function turns into the variable axes).
SIZES = {
    "nvfp4_gemv": ([{"M": m, "K": k} for m, k in NVFP4_GEMV_SHAPES], NVFP4_GEMV_BATCHES),
    "gqa_paged_decode": ([{"num_qo_heads": h, "num_kv_heads": kv, "head_dim": d, "page_size": ps}
                          for h, kv, d, ps in PAGED_DECODE_SHAPES], PAGED_DECODE_MIXES),
}
DTYPE = "bfloat16"
#: Templates with Definitions in more dtypes than DTYPE.
DTYPES = {"gqa_paged_decode": ("bfloat16", "float16")}
#: Values of the scalar inputs in the shipped workloads.
SCALARS = {"eps": 1e-6, "factor": 0.5}


def _paged_decode_axes(definition: Definition, mix: tuple) -> dict:
    """A (batch, average tokens) mix as the variable axes: whole pages, in a pool a quarter
    larger than the batch uses (the runner draws distinct pages from it, in random order)."""
    batch, tokens = mix
    pages = batch * tokens // definition.axes["page_size"].value
    return {"batch_size": batch, "num_pages": pages + pages // 4 + 1, "len_indptr": batch + 1, "num_kv_indices": pages}


#: Templates whose workloads have several variable axes: a function of the Definition and one
#: entry of its sizes' workload list, giving the variable axes.
WORKLOAD_AXES = {"gqa_paged_decode": _paged_decode_axes}


def _scalar(definition: Definition, name: str) -> float:
    if name == "sm_scale":
        return 1.0 / math.sqrt(definition.axes["head_dim"].value)
    return SCALARS[name]
#: Workload uuids are derived from the definition and the axis values, so regenerating the
#: dataset gives byte-identical files.
_NAMESPACE = uuid.UUID("0b5c2f4e-8f1d-4c1e-9a57-6f7e2b1d3c90")


def builtin_sizes(template) -> tuple[list[dict], tuple]:
    """The built-in dataset's sizes for ``template``: the constant axes of each Definition, and
    the values of the variable axis that each gets a workload for."""
    if template.name_prefix in SIZES:
        return SIZES[template.name_prefix]
    (axis,) = named_axes(template)
    return [{axis: size} for size in HIDDEN_SIZES], BATCH_SIZES


def builtin_definitions() -> list[Definition]:
    return [template.definition(dtype=dtype, **consts)
            for template in TEMPLATES.values() for dtype in DTYPES.get(template.name_prefix, (DTYPE,))
            for consts in builtin_sizes(template)[0]]


def builtin_workload_axes(definition: Definition) -> list[dict]:
    """The variable axes of each of the built-in workloads of ``definition``."""
    template = template_of(definition)
    values = builtin_sizes(template)[1] if template is not None else BATCH_SIZES
    to_axes = WORKLOAD_AXES.get(template.name_prefix) if template is not None else None
    if to_axes is not None:
        return [to_axes(definition, value) for value in values]
    (axis,) = definition.var_axes  # the other built-in Definitions have one variable axis
    return [{axis: value} for value in values]


def builtin_workloads(definition: Definition) -> list[Workload]:
    workloads = []
    for axes in builtin_workload_axes(definition):
        inputs = {
            name: ScalarInput(value=_scalar(definition, name)) if spec.shape is None else RandomInput()
            for name, spec in definition.inputs.items()
        }
        label = ",".join(f"{axis}={value}" for axis, value in axes.items())
        key = f"{definition.name}/{label}"
        # One variable axis: its value is the seed (as the shipped files have it).
        seed = next(iter(axes.values())) if len(axes) == 1 else zlib.crc32(key.encode()) & 0x7FFFFFFF
        workloads.append(Workload(uuid=str(uuid.uuid5(_NAMESPACE, key)), axes=axes, inputs=inputs, seed=seed))
    return workloads


def template_of(definition: Definition):
    """The template that generates ``definition`` (by name prefix), or None."""
    first = next((spec for spec in definition.inputs.values() if spec.shape is not None), None)
    dtype = first.dtype.value if first is not None else DTYPE
    for prefix in sorted(TEMPLATES, key=len, reverse=True):
        template = TEMPLATES[prefix]
        axes = [definition.axes.get(axis) for axis in named_axes(template)]
        if any(getattr(axis, "value", None) is None for axis in axes):
            continue
        consts = {name: axis.value for name, axis in zip(named_axes(template), axes)}
        for options in ({}, *({option: True} for option in template.options)):
            try:
                name = template.name(dtype, **consts, **options)
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
    # Definition input -> op parameter where they differ; None for an input the op does not
    # take (another layout of data it reads, e.g. NVFP4's blocked scales).
    params = inspect.signature(template.op).parameters
    inputs = {}
    for key in definition.inputs:
        param = template.param_of(key)
        if param not in params:
            inputs[key] = None
        elif param != key:
            inputs[key] = param
    omitted = [key for key, spec in template.inputs.items() if key not in definition.inputs]
    # Public names bake eps into the reference; the op gets the same value as a constant.
    constants = {}
    if "eps" in omitted:
        from .templates.norm import public_eps

        constants["eps"] = public_eps(template.name_prefix, definition.axes["hidden_size"].value)
    # What the op returns, in order; None drops a value the Definition has no output for (the
    # public fused-add names have no residual_out).
    outputs = [key if key in definition.outputs else None for key in template.outputs]
    # The op by its own name (the name prefix of gqa_paged_decode_* is FlashInfer-Trace's, not the op's).
    return builtin_solution(definition, template.op.__name__, inputs=inputs or None, constants=constants or None,
                            outputs=outputs)


def build_trace_set():
    from ..solutions import shipped_solutions
    from .traceset import TraceSet

    trace_set = TraceSet()
    for definition in builtin_definitions():
        trace_set.add_definition(definition)
        trace_set.add_solution(builtin_solution_for(definition))
        for solution in shipped_solutions(definition, template_of(definition).name_prefix):
            trace_set.add_solution(solution)
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
