"""Solutions opforge ships for its built-in Definitions beside the builtin ones (which run
opforge's own ops): kernels in other languages, each one self-contained source file in this
package (it imports nothing of opforge, so it runs wherever the Solution is built).

A shipped Solution embeds its file's text, so the built-in dataset's copy is this package's
file (tests/trace/test_builtin_dataset.py fails when the two differ; regenerate the dataset).
Importing this package imports none of the kernels or their languages' packages.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from ..trace.solution import BuildSpec, Solution, SourceFile

AUTHOR = "opforge"


@dataclass(frozen=True)
class ShippedKernel:
    """One source file of this package solving every Definition of a template."""

    file: str
    entry: str
    language: str
    #: The Solution's name is ``<definition>_<suffix>``.
    suffix: str
    description: str
    destination_passing_style: bool = True
    target_hardware: tuple = ("cuda",)


#: The shipped kernels per template name prefix of the Definitions they solve.
SHIPPED = {
    "nvfp4_gemv": (
        ShippedKernel(
            file="nvfp4_gemv_triton.py", entry="triton_kernel", language="triton", suffix="triton",
            description="Triton NVFP4 GEMV: FP4 and E4M3 decoded in registers, 16-value block dot products "
                        "scaled once per block, fp32 accumulation, K split over programs when rows x "
                        "batches are too few to fill the GPU. Reads the plain scales.",
        ),
    ),
    "gqa_paged_decode": (
        ShippedKernel(
            # "python", which FlashInfer-Bench reads (its language list has no "pytorch").
            file="gqa_paged_decode_torch.py", entry="run", language="python", suffix="torch",
            description="Plain PyTorch, batched: every request's tokens gathered into a padded block, fp32 "
                        "logits of each query head against its KV head in one matmul, masked softmax, one "
                        "rounding. A checking baseline (not tuned), on CPU and GPU.",
            destination_passing_style=False, target_hardware=("cpu", "cuda"),
        ),
        ShippedKernel(
            file="gqa_paged_decode_triton.py", entry="run", language="triton", suffix="triton",
            description="Triton paged GQA decode: one program per request, KV head and token slice, every query "
                        "head of the KV head in one tensor-core tile (each KV row read once), pages looked up per "
                        "block of 32 tokens, online softmax in fp32; splits merged in PyTorch.",
            destination_passing_style=False,
        ),
    ),
}


def source_text(file: str) -> str:
    """The text of one of this package's kernel files."""
    return resources.files(__package__).joinpath(file).read_text(encoding="utf-8")


def shipped_solutions(definition, prefix: str) -> list[Solution]:
    """The shipped Solutions for ``definition``, one of the Definitions of the template named
    ``prefix`` (none for templates without shipped kernels)."""
    return [
        Solution(
            name=f"{definition.name}_{kernel.suffix}",
            definition=definition.name,
            author=AUTHOR,
            description=kernel.description,
            spec=BuildSpec(language=kernel.language, target_hardware=list(kernel.target_hardware),
                           entry_point=f"{kernel.file}::{kernel.entry}",
                           destination_passing_style=kernel.destination_passing_style),
            sources=[SourceFile(path=kernel.file, content=source_text(kernel.file))],
        )
        for kernel in SHIPPED.get(prefix, ())
    ]


__all__ = ["AUTHOR", "SHIPPED", "ShippedKernel", "shipped_solutions", "source_text"]
