"""The only importer of the compiled extension: build info, streams, the bridge to torch.

The ops hand torch tensors to the bindings as they are. The bindings read each one's DLPack
description through torch's DLPack C exchange API (``torch.Tensor.__dlpack_c_exchange_api__``,
tens of nanoseconds per tensor; torch releases without it go through ``torch._C._to_dlpack``
capsules, about 0.2 us), and ask torch what DLPack cannot say (the storage's size, the
negative bit) before anything runs; after a kernel wrote its outputs they bump the outputs'
version counters, as torch's own in-place ops do. The kernels launch on torch's *current* stream
of the tensors' device, which the bindings ask torch for in C (the exchange API again; stream
handles passed as integers where torch has none), so CUDA-graph capture and user streams work.
Nothing here touches a GPU at import.
"""

from __future__ import annotations

import functools

import torch

from . import _C

CudaError = _C.CudaError


def _version_bump():
    """torch's version-counter bump for a tuple of tensors."""
    bump = torch._C._increment_version
    try:
        bump(())  # torch >= 2.5 takes an iterable of tensors
    except TypeError:  # torch 2.4 takes one tensor

        def bump_each(tensors):
            for t in tensors:
                bump(t)

        return bump_each
    return bump


#: Handle of torch's current CUDA stream on a device index (0 = the legacy default stream).
#: torch's raw accessor skips building a Stream object, which costs about 1 us per call. The
#: bindings ask torch in C for the stream (stream=None); this is their fallback where torch has
#: no DLPack exchange API.
cuda_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)

_C.bind_torch(torch.Tensor, torch._C._to_dlpack, getattr(torch.Tensor, "__dlpack_c_exchange_api__", None),
              _version_bump(), torch._C.is_grad_enabled, cuda_stream)


@functools.cache
def _build_info() -> dict:
    info = dict(_C.build_info())
    archs = info["cuda_archs"]
    info["cuda_archs"] = tuple(a for a in archs.split(";") if a) if archs else ()
    return info


def build_info() -> dict:
    """What this build of opforge contains (a fresh dict each call).

    Keys: ``version``; ``cuda`` (bool: were CUDA kernels compiled in); ``cuda_archs`` (list of
    archs as given to CUDA_ARCH_LIST, e.g. ``["8.0", "9.0a+PTX"]``); ``cuda_version`` (the
    toolkit that compiled them); ``compiler`` (the host C++ compiler); ``commit`` (the source
    commit, "+dirty" when built with uncommitted changes, "" when unknown).
    """
    info = dict(_build_info())
    info["cuda_archs"] = list(info["cuda_archs"])
    return info


def _arch_runs_on(arch: str, cc: int) -> bool:
    """Whether code compiled for ``arch`` ("9.0a", "8.0+PTX") runs on compute capability ``cc``."""
    ptx = arch.endswith("+PTX")
    name = arch[: -len("+PTX")] if ptx else arch
    suffix = name[-1] if name[-1] in "af" else ""
    major, minor = (int(p) for p in name.rstrip("af").split("."))
    target = major * 10 + minor
    if ptx and not suffix:
        return cc >= target  # PTX is JIT-compiled by the driver for any newer GPU
    if suffix == "a":
        return cc == target  # arch-specific code runs only on that exact chip
    if suffix == "f":
        return cc // 10 == major and cc >= target  # family-specific: same major, newer minor
    return cc // 10 == major and cc >= target  # SASS: same major, same or newer minor


@functools.cache
def compute_capability(device_index: int) -> int:
    """Compute capability of a CUDA device as major * 10 + minor (cached; queries the GPU once)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    return major * 10 + minor


def build_runs_on(cc: int) -> bool:
    """Whether this build holds code that a GPU of compute capability ``cc`` runs (never for a
    build without CUDA kernels)."""
    info = _build_info()
    return info["cuda"] and any(_arch_runs_on(a, cc) for a in info["cuda_archs"])


@functools.cache
def arch_problem(device_index: int) -> str | None:
    """Why this build cannot run on ``device_index``, or None when it can (cached per device)."""
    info = _build_info()
    if not info["cuda"]:
        return (
            "this opforge build has no CUDA kernels (built with CUDA_ARCH_LIST=none or without "
            "nvcc); reinstall with nvcc on PATH and CUDA_ARCH_LIST set, e.g. "
            'CUDA_ARCH_LIST="9.0a" pip install opforge'
        )
    cc = compute_capability(device_index)
    if build_runs_on(cc):
        return None
    want = f"{cc // 10}.{cc % 10}" + ("a" if cc >= 90 else "")
    return (
        f"built for {';'.join(info['cuda_archs'])}; this GPU (cuda:{device_index}) is "
        f"{cc // 10}.{cc % 10}; rebuild with CUDA_ARCH_LIST=\"{want}\""
    )
