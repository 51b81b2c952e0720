"""The trace schema and its storage: FlashInfer-Trace Definitions, Workloads, Solutions and
Traces as validated models, and TraceSet to hold them in memory, in one JSON file or in a
dataset folder. Files are the public FlashInfer-Trace format, read and written unchanged;
opforge's optional fields are documented where they are declared. Nothing here needs a GPU.
torch comes in with the opforge package (``import opforge.trace`` imports ``opforge`` first, and
opforge is a PyTorch library); the schema and storage modules themselves touch it only where
tensors are made (blobs read from headers alone, without torch).
"""

from .blob import (check_safetensors_input, load_safetensors_input, read_safetensors_header,
                   save_safetensors_blob, workload_blob_relpath)
from .dtypes import DType
from .errors import (BlobError, ConstraintError, DatasetPathError, DuplicateError, ExpressionError, LoadError,
                     NotFoundError, SchemaError, UnknownDefinitionError, UnknownSolutionError, WorkloadError)
from .extensions import IndptrDomain, RangeDomain, Tolerance, ValueDomain
from .schema import AxisConst, AxisSpec, AxisVar, Definition, TensorSpec
from .solution import BuildSpec, Solution, SourceFile, SupportedBindings, SupportedLanguages
from .trace import (Correctness, Environment, Evaluation, EvaluationStatus, Performance, Trace,
                    utc_timestamp)
from .traceset import TraceSet
from .workload import InputSpec, RandomInput, SafetensorsInput, ScalarInput, Workload

__all__ = [
    "AxisConst", "AxisSpec", "AxisVar", "BlobError", "BuildSpec", "ConstraintError", "Correctness",
    "DType", "DatasetPathError", "Definition", "DuplicateError", "Environment", "Evaluation",
    "EvaluationStatus", "ExpressionError", "IndptrDomain", "InputSpec", "LoadError", "NotFoundError",
    "Performance", "RandomInput", "RangeDomain", "SafetensorsInput", "ScalarInput", "SchemaError",
    "Solution", "SourceFile", "SupportedBindings", "SupportedLanguages", "TensorSpec", "Tolerance",
    "Trace", "TraceSet", "UnknownDefinitionError", "UnknownSolutionError", "ValueDomain", "Workload",
    "WorkloadError", "check_safetensors_input", "load_safetensors_input", "read_safetensors_header",
    "save_safetensors_blob", "utc_timestamp", "workload_blob_relpath",
]
