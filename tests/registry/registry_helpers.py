"""Helpers of the registry tests: a small Definition, Solutions written inline, C++ sources,
and the ``cache`` fixture (a fresh build cache per test; test modules import it by name)."""

from __future__ import annotations

import textwrap

import pytest

from opforge.registry import CACHE_DIR_VAR
from opforge.trace import AxisConst, AxisVar, BuildSpec, Definition, Solution, SourceFile, TensorSpec

CACHE_VAR = CACHE_DIR_VAR


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty build cache for one test."""
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_VAR, str(path))
    return path

MUL_REFERENCE = """
import torch

def run(x, w):
    return x * w
"""


def mul_definition(name: str = "mul_h8", outputs=("y",)) -> Definition:
    """``y = x * w`` over rows of 8 (fp32); with two outputs the second is ``x + w``."""
    reference = MUL_REFERENCE if len(outputs) == 1 else "def run(x, w):\n    return x * w, x + w\n"
    return Definition(
        name=name,
        op_type="mul",
        axes={"batch": AxisVar(), "hidden": AxisConst(value=8)},
        inputs={"x": TensorSpec(shape=["batch", "hidden"], dtype="float32"),
                "w": TensorSpec(shape=["hidden"], dtype="float32")},
        outputs={o: TensorSpec(shape=["batch", "hidden"], dtype="float32") for o in outputs},
        reference=reference,
    )


def solution(name: str, sources, *, entry: str = "kernel.py::run", language: str = "python",
             dps: bool = False, target=("cpu",), deps=(), binding=..., definition: str = "mul_h8") -> Solution:
    """A Solution of ``definition``; ``sources`` is one text (kernel.py) or {path: text}.
    ``binding``: by default "torch" for cpp / cuda (the sources here are torch extensions), none
    for the others; None leaves it unset (then tvm-ffi, as in FlashInfer-Bench)."""
    if binding is ...:
        binding = "torch" if language in ("cpp", "cuda") else None
    if isinstance(sources, str):
        sources = {entry.split("::")[0]: sources}
    return Solution(
        name=name,
        definition=definition,
        author="tests",
        spec=BuildSpec(language=language, target_hardware=list(target), entry_point=entry,
                       dependencies=list(deps), destination_passing_style=dps, binding=binding),
        sources=[SourceFile(path=p, content=textwrap.dedent(c)) for p, c in sources.items()],
    )


# --- C++ sources ------------------------------------------------------------------------------

#: pybind11 module, value-returning; includes only what it uses (torch/extension.h would take
#: four times as long to compile). A header beside it checks that sibling headers are found.
CPP_PYBIND_MUL = {
    "kernel.cpp": """
        #include <torch/csrc/utils/pybind.h>
        #include "mul.h"

        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
          m.def("run", &mul, pybind11::arg("x"), pybind11::arg("w"));
        }
    """,
    "mul.h": """
        #pragma once
        #include <ATen/ops/mul.h>
        inline at::Tensor mul(const at::Tensor& x, const at::Tensor& w) { return at::mul(x, w); }
    """,
}

#: torch library op, destination-passing (no Python module at all).
CPP_TORCH_OP_MUL = """
    #include <torch/library.h>
    #include <ATen/ops/mul.h>

    void run(const at::Tensor& x, const at::Tensor& w, at::Tensor y) { at::mul_out(y, x, w); }

    TORCH_LIBRARY(opforge_test_mul, m) { m.def("run(Tensor x, Tensor w, Tensor(a!) y) -> ()", &run); }
"""

#: A module on Python's C API alone: compiles in about a second. ``body`` defines ``run``.
CPP_C_API = """
    #include <Python.h>
    #define CAT2(a, b) a##b
    #define CAT(a, b) CAT2(a, b)
    #define STR2(a) #a
    #define STR(a) STR2(a)

    {body}

    static PyMethodDef methods[] = {{
        {{"{symbol}", run, METH_VARARGS, "{symbol}(x, w)\\n\\nMultiplies x by w."}},
        {{nullptr, nullptr, 0, nullptr}}}};
    static PyModuleDef module = {{PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods}};
    PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)() {{ return PyModule_Create(&module); }}
"""

C_API_MUL_BODY = """
    static PyObject* run(PyObject*, PyObject* args) {
      PyObject *x, *w;
      if (!PyArg_ParseTuple(args, "OO", &x, &w)) return nullptr;
      return PyObject_CallMethod(x, "mul", "O", w);
    }
"""


def c_api_source(body: str = C_API_MUL_BODY, symbol: str = "run") -> str:
    return CPP_C_API.format(body=body, symbol=symbol)


#: TVM-FFI, destination-passing, fp32 CPU tensors.
TVM_FFI_CPP_MUL = """
    #include <tvm/ffi/container/tensor.h>
    #include <tvm/ffi/error.h>
    #include <tvm/ffi/function.h>

    void run(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
      TVM_FFI_ICHECK(x.ndim() == 2 && w.ndim() == 1) << "x must be 2-D and w 1-D";
      const float* xp = static_cast<const float*>(x.data_ptr());
      const float* wp = static_cast<const float*>(w.data_ptr());
      float* yp = static_cast<float*>(y.data_ptr());
      for (int64_t r = 0; r < x.size(0); ++r)
        for (int64_t c = 0; c < x.size(1); ++c) yp[r * x.size(1) + c] = xp[r * x.size(1) + c] * wp[c];
    }
    TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);
"""

TVM_FFI_CUDA_MUL = """
    #include <tvm/ffi/container/tensor.h>
    #include <tvm/ffi/function.h>

    __global__ void mul_kernel(const float* x, const float* w, float* y, int64_t rows, int64_t hidden) {
      int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
      if (i < rows * hidden) y[i] = x[i] * w[i % hidden];
    }

    void run(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView y) {
      int64_t n = x.size(0) * x.size(1);
      mul_kernel<<<(n + 255) / 256, 256>>>(static_cast<const float*>(x.data_ptr()),
                                           static_cast<const float*>(w.data_ptr()),
                                           static_cast<float*>(y.data_ptr()), x.size(0), x.size(1));
    }
    TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);
"""
