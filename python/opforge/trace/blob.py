"""Safetensors blobs holding workload inputs.

FlashInfer-Trace stores them under ``blob/workloads/<op_type>/<definition>/
<definition>_<uuid>.safetensors`` and refers to them from a workload input as
``{"type": "safetensors", "path": <path relative to the dataset root>, "tensor_key": <key>}``.
A blob is never read or written outside the dataset folder nor through a symbolic link (see
_paths.py). Checking a blob reads its header only; the tensor is read when it is needed.
torch is imported only here, when a blob is read or written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from . import _io
from ._paths import dataset_path, name_problem
from .dtypes import DType
from .errors import BlobError, DatasetPathError, MissingBlobError
from .workload import BLOB_SUFFIX, SafetensorsInput

PathLike = Union[str, Path]


def blob_path(root: Optional[PathLike], relative: str) -> Path:
    """Where a blob is: ``relative`` under the dataset ``root``, refused (BlobError) if that
    leads out of the dataset (see _paths.dataset_path)."""
    if root is None:
        raise BlobError(f"safetensors input {relative!r} is relative, but the TraceSet has no root folder")
    try:
        return dataset_path(Path(root), relative)
    except DatasetPathError as exc:
        raise BlobError(f"safetensors path refused: {exc}") from None


_HEADER_DTYPES = {
    "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F4": "float4_e2m1", "I64": "int64", "I32": "int32", "I16": "int16",
    "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


def read_safetensors_header(path: PathLike) -> dict:
    """The JSON header of a safetensors file ({key: {"dtype", "shape", "data_offsets"}}),
    read without torch and without reading the tensors. ValueError if the file is not a
    safetensors file or its header is larger than _io.MAX_RECORD_BYTES."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError("file is shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        room = os.fstat(handle.fileno()).st_size - 8
        if size <= 1 or size > room:
            raise ValueError(f"implausible header length {size} (the file has {room} bytes after it)")
        if size > _io.MAX_RECORD_BYTES:
            raise ValueError(f"header is {size} bytes, more than the {_io.MAX_RECORD_BYTES} read "
                             "(opforge.trace._io.MAX_RECORD_BYTES)")
        raw = handle.read(size)
    if len(raw) != size:
        raise ValueError("file ends inside the header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def check_safetensors_input(root: Optional[PathLike], spec: SafetensorsInput,
                            expected_shape: Optional[Sequence[int]] = None,
                            expected_dtype: Optional[Union[DType, str]] = None, *, where: str = "") -> Path:
    """Check, from the file's header alone (no torch), that a safetensors input exists, holds
    ``tensor_key`` and has the expected shape and dtype. Returns the file's path; raises
    BlobError naming the file, the key and what differs. safetensors stores FP4 tensors as F4
    and counts 4-bit values: the header's last dimension is twice the declared (torch) one, two
    values per float4_e2m1fn_x2 element, for either FP4 spelling of the Definition."""
    prefix = f"{where}: " if where else ""
    try:
        path = blob_path(root, spec.path)
    except BlobError as exc:
        raise BlobError(f"{prefix}{exc}") from None
    if not path.is_file():
        raise MissingBlobError(f"{prefix}safetensors file {spec.path} not found (looked at {path})")
    try:
        header = read_safetensors_header(path)
    except (OSError, ValueError) as exc:
        raise BlobError(f"{prefix}{spec.path} is not a readable safetensors file: {exc}") from None
    entry = header.get(spec.tensor_key)
    if not isinstance(entry, dict):
        raise BlobError(f"{prefix}{spec.path} has no tensor {spec.tensor_key!r} (keys: {', '.join(header) or 'none'})")
    got_dtype = _HEADER_DTYPES.get(str(entry.get("dtype")), str(entry.get("dtype")))
    want = DType(expected_dtype) if expected_dtype is not None else None
    fp4 = want is not None and want.is_fp4
    if want is not None and got_dtype != want.value and not (fp4 and got_dtype == DType.FLOAT4_E2M1.value):
        raise BlobError(f"{prefix}{spec.path}[{spec.tensor_key!r}] has dtype {got_dtype}, expected {want.value}")
    if expected_shape is not None:
        want_shape = list(expected_shape)
        if fp4 and want_shape:
            want_shape[-1] *= 2
        if list(entry.get("shape", [])) != want_shape:
            raise BlobError(f"{prefix}{spec.path}[{spec.tensor_key!r}] has shape {tuple(entry.get('shape', []))}, "
                            f"expected {tuple(want_shape)}")
    return path


def load_safetensors_input(root: Optional[PathLike], spec: SafetensorsInput,
                           expected_shape: Optional[Sequence[int]] = None,
                           expected_dtype: Optional[Union[DType, str]] = None,
                           *, where: str = "", device: str = "cpu"):
    """Read the tensor a safetensors input refers to, after check_safetensors_input.

    ``where`` prefixes error messages (e.g. "rmsnorm_h4096: workload <uuid>: inputs.weight").
    Raises BlobError for a missing or unreadable file, a missing key, or a tensor of another
    shape or dtype.
    """
    path = check_safetensors_input(root, spec, expected_shape, expected_dtype, where=where)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as handle:
            return handle.get_tensor(spec.tensor_key)
    except Exception as exc:  # the safetensors and torch errors of a damaged file vary
        prefix = f"{where}: " if where else ""
        raise BlobError(f"{prefix}{spec.path}[{spec.tensor_key!r}] could not be read: {exc}") from None


def save_safetensors_blob(root: PathLike, relative_path: str, tensors: Mapping[str, object]) -> str:
    """Write tensors (moved to CPU, made contiguous) to ``root/relative_path`` (written whole,
    see _io.write_atomic); refuses to overwrite an existing file or to write outside ``root``.
    Returns ``relative_path``."""
    from safetensors.torch import save_file

    path = blob_path(root, relative_path)
    if path.exists():
        raise BlobError(f"safetensors file {relative_path} already exists")
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    _io.write_atomic(path, lambda tmp: save_file(cpu, str(tmp)))
    return relative_path


def workload_blob_relpath(op_type: str, definition: str, workload_uuid: str) -> str:
    """FlashInfer-Trace's place for a workload's blob, relative to the dataset root."""
    problem = name_problem(f"{definition}_{workload_uuid}", "blob file name", BLOB_SUFFIX)
    if problem:
        raise ValueError(f"{definition}: workload uuid {workload_uuid!r}: {problem}")
    return f"blob/workloads/{op_type}/{definition}/{definition}_{workload_uuid}{BLOB_SUFFIX}"
