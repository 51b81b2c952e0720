"""Element types of tensors in the trace schema (the FlashInfer-Trace ``dtype`` strings)."""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    """A tensor element type. The value is the JSON spelling.

    ``float8_e4m3`` (the spelling of early FlashInfer-Trace files) is read as ``float8_e4m3fn``.

    FP4 E2M1 has two spellings of one meaning: ``float4_e2m1`` (FlashInfer-Bench's, the only one
    its schema accepts) and ``float4_e2m1fn_x2`` (torch's name). Either is a
    ``torch.float4_e2m1fn_x2`` tensor (two values per byte, the lower index in the low nibble)
    whose declared shape is its torch shape: each element is a byte holding two values
    (``itemsize`` 1), and the packed dimension may be any one (NVFP4 GEMV packs K, the middle of
    [M, K/2, L]). FlashInfer-Bench builds FP4 inputs from the declared shape as it is, and the
    public Definitions are written so (embedding_v128256_d4096_mxfp4's reference asserts its
    [128256, 4096] weight shape).

    ``uint8`` (raw bytes: packed FP4 pairs or E8M0 scales, as some public MoE Definitions declare
    them) is not in FlashInfer-Bench 0.1.2's list; opforge reads it.
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT8_E4M3FN = "float8_e4m3fn"
    FLOAT8_E5M2 = "float8_e5m2"
    FLOAT4_E2M1 = "float4_e2m1"
    FLOAT4_E2M1FN_X2 = "float4_e2m1fn_x2"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"

    @classmethod
    def _missing_(cls, value):
        if value == "float8_e4m3":
            return cls.FLOAT8_E4M3FN
        return None

    def __str__(self) -> str:
        return self.value

    @property
    def itemsize(self) -> float:
        """Bytes per element of a declared shape (1 for FP4: an element packs two values)."""
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in (DType.INT64, DType.INT32, DType.INT16, DType.INT8, DType.UINT8)

    @property
    def is_fp4(self) -> bool:
        """Either spelling of FP4 E2M1 (see the class doc)."""
        return self in (DType.FLOAT4_E2M1, DType.FLOAT4_E2M1FN_X2)

    def to_torch(self):
        """The torch dtype (imports torch)."""
        import torch

        name = _TORCH_NAMES[self]
        dtype = getattr(torch, name, None)
        if dtype is None:
            raise ValueError(f"dtype {self.value} needs torch.{name}, which torch {torch.__version__} lacks")
        return dtype

    @classmethod
    def from_torch(cls, dtype) -> "DType":
        """The DType of a torch dtype; ValueError for one the schema has no name for. A
        ``torch.float4_e2m1fn_x2`` tensor's shape counts bytes: float4_e2m1fn_x2."""
        name = str(dtype).removeprefix("torch.")
        if name == "float4_e2m1fn_x2":
            return cls.FLOAT4_E2M1FN_X2
        for member, torch_name in _TORCH_NAMES.items():
            if torch_name == name:
                return member
        raise ValueError(f"torch dtype {dtype} has no trace dtype (supported: {', '.join(m.value for m in cls)})")


_ITEMSIZE = {
    DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT8_E4M3FN: 1, DType.FLOAT8_E5M2: 1,
    DType.FLOAT4_E2M1: 1, DType.FLOAT4_E2M1FN_X2: 1, DType.INT64: 8, DType.INT32: 4, DType.INT16: 2, DType.INT8: 1,
    DType.UINT8: 1, DType.BOOL: 1,
}
_FLOATS = frozenset({DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT8_E4M3FN, DType.FLOAT8_E5M2,
                     DType.FLOAT4_E2M1, DType.FLOAT4_E2M1FN_X2})
_TORCH_NAMES = {
    DType.FLOAT32: "float32", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16",
    DType.FLOAT8_E4M3FN: "float8_e4m3fn", DType.FLOAT8_E5M2: "float8_e5m2",
    DType.FLOAT4_E2M1: "float4_e2m1fn_x2", DType.FLOAT4_E2M1FN_X2: "float4_e2m1fn_x2", DType.INT64: "int64", DType.INT32: "int32",
    DType.INT16: "int16", DType.INT8: "int8", DType.UINT8: "uint8", DType.BOOL: "bool",
}
